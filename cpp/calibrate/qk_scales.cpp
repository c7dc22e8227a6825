// Step qk-scales (shadowAttn, seed 000 §3.3): per calibration window the max |x| of every head's
// post-RoPE Q, K and V at every layer; a head's scale is max / 127 (per-head INT8, Fig. 7). The
// bucket grid is derived at plan time (attention/shadow_attn.cpp), so bucket count and step are
// plan options, not calibration output; npu-int8 takes its static Q/K/V scales from here too.
#include "calibrate/steps.h"

namespace socllm::calibrate {

namespace {

void run(StepContext& ctx) {
  // the windows' maxima are appended: a step run again starts over
  ctx.stats.q_absmax.clear();
  ctx.stats.k_absmax.clear();
  ctx.stats.v_absmax.clear();
  ctx.for_each_window([&](const auto& w) { ctx.engine.observe_attention_scales({w}, ctx.stats); });
}

const bool kRegistered = register_step({
    "qk-scales",
    "per-window max |Q|, |K|, |V| of every head (shadowAttn's scale buckets, §3.3; npu-int8's "
    "static scales)",
    50,
    {},
    {},
    window_options(),
    run,
    check_window_options,
});

}  // namespace

}  // namespace socllm::calibrate
