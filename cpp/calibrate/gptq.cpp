// Step gptq (Frantar et al. 2023; issue 39): GPTQ's Hessian H = XᵀX / n of every linear input,
// observed on the act-scales windows in fp32 (the inputs of the model as loaded, or rotated:
// the step runs on the engine of the calibration's rotation). Our choice: the fp32 model's
// inputs for every layer, where the paper quantizes layer by layer and feeds each the outputs of
// the quantized layers before it; one pass then serves every plan and bit width, and a plan's
// rounding=gptq quantizes its weights against these H at prepare time (quant/gptq.h).
#include <string>

#include "calibrate/steps.h"
#include "core/core.h"

namespace socllm::calibrate {

namespace {

void run(StepContext& ctx) {
  const ModelConfig& c = ctx.engine.model().config();
  Calibration seen = Calibration::empty_for(c);
  seen.rotation = ctx.stats.rotation;
  for (int s = 0; s < kNumLinearSites; ++s) {
    const int64_t w = seen.width[s];
    seen.hessian[s].assign(static_cast<size_t>(c.n_layers * w * w), 0.0f);
  }
  ctx.for_each_window([&](const auto& w) { ctx.engine.observe_activations({w}, seen); });
  seen.finish_hessians();
  ctx.stats.hessian = std::move(seen.hessian);
  ctx.stats.hessian_rows = seen.hessian_rows;
  ctx.provenance["hessian_rows"] = seen.hessian_rows;
}

const bool kRegistered = register_step({
    "gptq",
    "GPTQ's Hessians XᵀX / n of every linear input (Frantar et al. 2023), for rounding=gptq",
    80,
    {"act_absmax"},
    {"hessian_rows"},
    {},
    run,
});

}  // namespace

}  // namespace socllm::calibrate
