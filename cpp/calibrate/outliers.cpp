// Step outliers (llm.npu's shadow outlier execution, seed 001 §3.3): each linear input's outlier
// threshold t from the act-scales histogram (the NPU's scale is then t / 127), then a second pass
// over the same windows counting per channel the values beyond it (hot channels, Fig. 11;
// outlier importance, Fig. 12).
//   percentile (default, p = 99.99): the p-th percentile of |x| over all calibration values of
//     the input (our choice where the paper says "profiling a large corpora": ~0.01% of values
//     are outliers, 1-25 channels per 512-token window on SmolLM2, Fig. 10's sparsity);
//   maxmin: the calibration maximum (plain symmetric max-min).
#include <string>

#include "calibrate/steps.h"
#include "core/core.h"

namespace socllm::calibrate {

namespace {

void check(const std::string& step, const nlohmann::json& o) {
  const double p = o["percentile"].get<double>();
  require_option(p > 0.0 && p <= 100.0, step, o, "percentile", "in (0, 100]");
}

void run(StepContext& ctx) {
  const std::string method = ctx.options["outlier_threshold"].get<std::string>();
  const double p = ctx.options["percentile"].get<double>();
  const double frac = method == "maxmin" ? 1.0 : p / 100.0;
  const ModelConfig& c = ctx.engine.model().config();
  Calibration counted = Calibration::empty_for(c);
  counted.rotation = ctx.stats.rotation;  // observed on the same (rotated) model
  for (int s = 0; s < kNumLinearSites; ++s) {
    const auto site = static_cast<LinearSite>(s);
    std::vector<float> t(static_cast<size_t>(c.n_layers));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      t[static_cast<size_t>(l)] = ctx.stats.abs_percentile(l, site, frac);
      if (!(t[static_cast<size_t>(l)] > 0))
        throw InvalidArgument(std::string("[calibrate] outliers: site ") + linear_site_name(site) +
                              " has a zero outlier threshold in layer " + std::to_string(l) +
                              " (all-zero activations?)");
    }
    counted.set_outlier_thresholds(site, t);
  }
  ctx.for_each_window([&](const auto& w) { ctx.engine.observe_activations({w}, counted); });
  for (int s = 0; s < kNumLinearSites; ++s)
    for (const auto& spec : Calibration::schema())
      if (std::string(spec.step) == "outliers") {
        auto from = counted.array(spec.name, static_cast<LinearSite>(s));
        auto to = ctx.stats.array(spec.name, static_cast<LinearSite>(s));
        if (from.f) *to.f = *from.f;
        if (from.i) *to.i = *from.i;
      }
  ctx.provenance["outlier_method"] = method;
  ctx.provenance["outlier_percentile"] = method == "percentile" ? p : 100.0;
}

const bool kRegistered = register_step({
    "outliers",
    "llm.npu's outlier thresholds and per-channel outlier counts (seed 001 §3.3)",
    20,
    {"act_absmax", "abs_hist"},
    {"outlier_method", "outlier_percentile"},
    {{"outlier_threshold",
      "percentile",
      "how a linear input's outlier threshold is set: a percentile of |x| or the calibration max",
      {"percentile", "maxmin"}},
     {"percentile", 99.99, "the |x| percentile of the percentile method, in %"}},
    run,
    check,
});

}  // namespace

}  // namespace socllm::calibrate
