#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/core.h"

extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_corename(void);
char* openblas_get_config(void);
}

namespace socllm {
namespace {
std::atomic<int> g_threads{0};
// Threads allowed per logical CPU: 2-4x oversubscription is still a sane experiment, beyond it
// only contention (issue 12 saw OpenBLAS spin at 64 threads and libgomp abort at 32 on 2 CPUs).
constexpr int kMaxThreadsPerCpu = 4;
}  // namespace

int max_num_threads() {
  const int cpus = std::max(1u, std::thread::hardware_concurrency());
  return kMaxThreadsPerCpu * cpus;
}

void set_num_threads(int64_t n) {
  if (n < 1 || n > max_num_threads())
    throw InvalidArgument("[set_num_threads] need 1 <= n <= " + std::to_string(max_num_threads()) +
                          " (" + std::to_string(kMaxThreadsPerCpu) + " per CPU), got " +
                          std::to_string(n));
  g_threads = static_cast<int>(n);
  omp_set_num_threads(static_cast<int>(n));
  openblas_set_num_threads(static_cast<int>(n));
}

int num_threads() {
  if (g_threads == 0) set_num_threads(2);  // the brief's default: 2 threads
  return g_threads;
}

std::string blas_corename() { return openblas_get_corename(); }
std::string blas_config() { return openblas_get_config(); }

}  // namespace socllm
