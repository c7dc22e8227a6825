#include "core/handoff.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <iterator>
#include <mutex>
#include <thread>

#include "core/core.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace socllm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kNames[] = {"condvar", "futex", "spin", "sleep-poll"};

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void busy_for_us(double us) {
  const double end = now_us() + us;
  while (now_us() < end) cpu_relax();
}

#if defined(__linux__)
void futex_wait(std::atomic<int32_t>& word, int32_t expected) {
  syscall(SYS_futex, reinterpret_cast<int32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}
void futex_wake(std::atomic<int32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<int32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}
#endif

void check_non_negative(double v, const char* what) {
  if (!std::isfinite(v) || v < 0.0)
    throw InvalidArgument(std::string("[handoff] ") + what + " must be finite and >= 0, got " +
                          std::to_string(v));
}

}  // namespace

std::string wait_method_name(WaitMethod m) { return kNames[static_cast<int>(m)]; }

std::vector<std::string> wait_method_names() { return {std::begin(kNames), std::end(kNames)}; }

WaitMethod wait_method_from_name(const std::string& s) {
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (s == kNames[i]) return static_cast<WaitMethod>(i);
  throw InvalidArgument("[handoff] unknown wait method '" + s +
                        "' (known: condvar, futex, spin, sleep-poll)");
}

HandoffSamples measure_handoff(const HandoffOptions& o) {
  if (o.iterations < 1)
    throw InvalidArgument("[handoff] iterations must be >= 1, got " + std::to_string(o.iterations));
  if (o.warmup < 0)
    throw InvalidArgument("[handoff] warmup must be >= 0, got " + std::to_string(o.warmup));
  check_non_negative(o.work_us, "work_us");
  check_non_negative(o.sleep_margin_us, "sleep_margin_us");
  if (!std::isfinite(o.predicted_us))
    throw InvalidArgument("[handoff] predicted_us must be finite, got " +
                          std::to_string(o.predicted_us));
#if !defined(__linux__)
  if (o.method == WaitMethod::Futex) throw InvalidArgument("[handoff] futex waiting needs Linux");
#endif
  const double predicted = o.predicted_us < 0.0 ? o.work_us : o.predicted_us;
  const int64_t total = o.warmup + o.iterations;

  std::atomic<int32_t> start{0}, done{0};
  std::atomic<double> raised_at_us{0.0};
  std::mutex m;
  std::condition_variable cv;

  // The device: waits (spinning, as a busy accelerator would not sleep) for handoff k, works,
  // stamps the time and raises the flag the host's method waits on.
  std::thread device([&] {
    for (int32_t k = 1; k <= total; ++k) {
      while (start.load(std::memory_order_acquire) != k) cpu_relax();
      busy_for_us(o.work_us);
      raised_at_us.store(now_us(), std::memory_order_relaxed);
      switch (o.method) {
        case WaitMethod::CondVar: {
          {
            std::lock_guard<std::mutex> lk(m);
            done.store(k, std::memory_order_release);
          }
          cv.notify_one();
          break;
        }
        case WaitMethod::Futex:
          done.store(k, std::memory_order_release);
#if defined(__linux__)
          futex_wake(done);
#endif
          break;
        case WaitMethod::Spin:
        case WaitMethod::SleepPoll: done.store(k, std::memory_order_release); break;
      }
    }
  });

  HandoffSamples out;
  out.latency_us.reserve(static_cast<size_t>(o.iterations));
  out.waiter_cpu_us.reserve(static_cast<size_t>(o.iterations));
  out.wait_us.reserve(static_cast<size_t>(o.iterations));
  const auto sleep_for =
      std::chrono::duration<double, std::micro>(std::max(0.0, predicted - o.sleep_margin_us));
  for (int32_t k = 1; k <= total; ++k) {
    const double cpu0 = thread_cpu_us();
    const double t0 = now_us();
    start.store(k, std::memory_order_release);
    switch (o.method) {
      case WaitMethod::CondVar: {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return done.load(std::memory_order_acquire) == k; });
        break;
      }
      case WaitMethod::Futex:
#if defined(__linux__)
        for (int32_t v; (v = done.load(std::memory_order_acquire)) != k;) futex_wait(done, v);
#endif
        break;
      case WaitMethod::SleepPoll:
        if (sleep_for.count() > 0.0) std::this_thread::sleep_for(sleep_for);
        [[fallthrough]];
      case WaitMethod::Spin:
        while (done.load(std::memory_order_acquire) != k) cpu_relax();
        break;
    }
    const double seen = now_us();
    const double cpu1 = thread_cpu_us();
    if (k > o.warmup) {
      out.latency_us.push_back(seen - raised_at_us.load(std::memory_order_relaxed));
      out.waiter_cpu_us.push_back(cpu1 - cpu0);
      out.wait_us.push_back(seen - t0);
    }
  }
  device.join();
  return out;
}

}  // namespace socllm
