// Step act-scales (seed 001 §2.3): the fp32 model over the calibration windows, recording for
// every linear input the per-channel max |x| and a histogram of |x| (static scales: max-min),
// and for every linear output the per-channel max |y| (EdgeFlow's output smoothing, seed 004).
#include "calibrate/steps.h"

namespace socllm::calibrate {

namespace {

void run(StepContext& ctx) {
  const auto n = static_cast<int64_t>(ctx.windows.size());
  for (int64_t i = 0; i < n; ++i) {
    ctx.engine.observe_activations({ctx.windows[static_cast<size_t>(i)]}, ctx.stats);
    ctx.progress(i + 1, n, "windows");
  }
}

const bool kRegistered = register_step({
    "act-scales",
    "per-channel max |x| and |x| histograms of every linear input (static scales), and max |y| "
    "of every linear output channel (EdgeFlow's output smoothing)",
    10,
    {},
    {},
    window_options(),
    run,
    check_window_options,
});

}  // namespace

}  // namespace socllm::calibrate
