// Private to the fp32 kernels: when a loop is worth the OpenMP team.
#pragma once

#include <cstdint>

namespace socllm::kernels {

// Below this many elements a loop runs on the calling thread: waking the OpenMP team costs
// more than the loop (decode is mostly such loops), and every barrier is a chance to wait
// on a descheduled thread when the cores are shared.
constexpr int64_t kMinParallelElems = int64_t{1} << 15;

}  // namespace socllm::kernels
