// Step act-scales (seed 001 §2.3): the fp32 model over the calibration windows, recording for
// every linear input the per-channel max |x| and a histogram of |x| (static scales: max-min),
// and for every linear output the per-channel max |y| (EdgeFlow's output smoothing, seed 004).
#include "calibrate/steps.h"

namespace socllm::calibrate {

namespace {

// Observing adds to running maxima and histograms: a caller re-running the step starts from
// fresh statistics (socllm.calibration keeps only what steps independent of act-scales wrote).
void run(StepContext& ctx) {
  ctx.for_each_window([&](const auto& w) { ctx.engine.observe_activations({w}, ctx.stats); });
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
