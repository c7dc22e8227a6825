// Core layer: how fast one host thread learns that another finished a piece of work, by four
// waiting methods, measured on this machine (issue 15 item 5; seed 002 §4.2). The "device" is a
// thread that busy-works for work_us and then raises a completion flag, as a GPU kernel fills
// its output tensor and flag; the host waits for that flag:
//   condvar     std::condition_variable (the flag set under its mutex, then notify_one);
//   futex       Linux futex(FUTEX_WAIT) on the flag word, FUTEX_WAKE after setting it;
//   spin        busy polling of the flag (one core burnt for the whole wait);
//   sleep-poll  HeteroLLM's fast synchronization: sleep for the predicted waiting time minus a
//               margin (usleep's granularity, 80-100 µs on mobile SoCs per the seed), then poll.
// Per handoff: latency from the flag being raised to the host seeing it, the host's own CPU
// time during its wait (CLOCK_THREAD_CPUTIME_ID) and the wait's wall time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace socllm {

enum class WaitMethod { CondVar, Futex, Spin, SleepPoll };
std::string wait_method_name(WaitMethod m);  // condvar | futex | spin | sleep-poll
WaitMethod wait_method_from_name(const std::string& s);
std::vector<std::string> wait_method_names();

struct HandoffOptions {
  WaitMethod method = WaitMethod::CondVar;
  int64_t iterations = 1000;  // measured handoffs (after `warmup` unmeasured ones)
  int64_t warmup = 20;
  double work_us = 200.0;          // the device's busy work per handoff
  double predicted_us = -1.0;      // sleep-poll's predicted wait; < 0 = work_us (a perfect guess)
  double sleep_margin_us = 100.0;  // sleep-poll sleeps predicted - margin, then polls
};

struct HandoffSamples {
  std::vector<double> latency_us;     // flag raised -> host sees it
  std::vector<double> waiter_cpu_us;  // the host thread's CPU time in its wait
  std::vector<double> wait_us;        // the host's whole wait (start signal -> flag seen)
};

// Runs the handoffs on two threads (the caller's and one it starts). InvalidArgument for
// iterations < 1, warmup < 0, a negative or non-finite work, prediction or margin, or futex on
// a system without futexes.
HandoffSamples measure_handoff(const HandoffOptions& o);

}  // namespace socllm
