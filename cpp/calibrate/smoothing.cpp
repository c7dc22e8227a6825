// Step smoothing (EdgeFlow's NPU-aware smoothing, seed 004 §4.1): the input exponent α of every
// linear input, by grid search over α = 0, 0.1, ..., 1 minimising the relative output error of
// the quantized linear (the edgeflow plan at `bits`, output_quant, its input divided by
// S_I^α at run time) against fp32, on sampled rows of the act-scales windows (the caller picks
// `smoothing_rows` rows of each of the first `smoothing_windows` windows). Every layer, site and
// grid point in one call.
#include <cmath>
#include <exception>

#include "calibrate/steps.h"
#include "core/core.h"

namespace socllm::calibrate {

namespace {

// y [rows, out] of one linear of `plan` built alone with the step's statistics.
std::vector<float> forward(const Engine& e, const Plan& plan, int64_t layer, LinearSite site,
                           const TensorF32& x, std::optional<double> alpha,
                           const Calibration& stats) {
  const auto lin = e.prepare_linear(plan, layer, site, alpha, &stats);
  const int64_t rows = x.dim(0), out = lin->out();
  std::vector<float> y(static_cast<size_t>(rows * out));
  const quant::RowSegment all{0, rows};
  lin->forward(x.ptr(), rows, y.data(), out, false, {&all, 1});
  return y;
}

void run(StepContext& ctx) {
  const double bits = ctx.options["bits"].get<double>();
  const std::string oq = ctx.options["output_quant"].get<std::string>();
  const Plan plan =
      Plan::parse("edgeflow:bits=" + json_text(bits) + ",output_quant=" + oq + ",alpha=0");
  const ModelConfig& c = ctx.engine.model().config();
  // the linear inputs at the sampled rows, per layer and site, all windows stacked
  std::vector<std::array<std::vector<float>, kNumLinearSites>> X(static_cast<size_t>(c.n_layers));
  for (size_t w = 0; w < ctx.windows.size(); ++w) {
    const auto inputs = ctx.engine.linear_inputs(ctx.windows[w], ctx.rows_of(w));
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int s = 0; s < kNumLinearSites; ++s) {
        const auto& t = inputs[static_cast<size_t>(l)][static_cast<size_t>(s)];
        auto& dst = X[static_cast<size_t>(l)][static_cast<size_t>(s)];
        dst.insert(dst.end(), t.data.begin(), t.data.end());
      }
  }
  const int64_t G = Calibration::kSmoothAlphaGrid;
  // α_i = i / (G - 1), rounded to 6 digits so that the grid prints as 0, 0.1, ..., 1
  auto grid_alpha = [G](int64_t i) {
    return std::round(static_cast<double>(i) / static_cast<double>(G - 1) * 1e6) / 1e6;
  };
  for (int s = 0; s < kNumLinearSites; ++s) {
    const auto site = static_cast<LinearSite>(s);
    const int64_t in = linear_site_width(c, site);
    std::vector<float> alpha(static_cast<size_t>(c.n_layers)),
        error(static_cast<size_t>(c.n_layers * G));
    // layers in parallel: each builds its own quantized linears (one weight quantization per
    // grid point, most of the step's time) from the shared, read-only model and statistics
    std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic)
    for (int64_t l = 0; l < c.n_layers; ++l) {
      try {
        const auto& xs = X[static_cast<size_t>(l)][static_cast<size_t>(s)];
        TensorF32 x({static_cast<int64_t>(xs.size()) / in, in});
        x.data = xs;
        const auto y = forward(ctx.engine, Plan(), l, site, x, std::nullopt, ctx.stats);
        double den = 0;
        for (float v : y) den += static_cast<double>(v) * v;
        if (den == 0) den = 1;
        int64_t best = 0;
        for (int64_t i = 0; i < G; ++i) {
          const auto yq = forward(ctx.engine, plan, l, site, x, grid_alpha(i), ctx.stats);
          double num = 0;
          for (size_t j = 0; j < y.size(); ++j) {
            const double d = static_cast<double>(yq[j]) - y[j];
            num += d * d;
          }
          error[static_cast<size_t>(l * G + i)] = static_cast<float>(num / den);
          if (error[static_cast<size_t>(l * G + i)] < error[static_cast<size_t>(l * G + best)])
            best = i;
        }
        alpha[static_cast<size_t>(l)] = static_cast<float>(grid_alpha(best));
      } catch (...) {
#pragma omp critical
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    ctx.stats.smooth_alpha[static_cast<size_t>(s)] = alpha;
    ctx.stats.smooth_alpha_error[static_cast<size_t>(s)] = error;
    ctx.progress(s + 1, kNumLinearSites, "linear sites");
  }
  nlohmann::json grid = nlohmann::json::array();
  for (int64_t i = 0; i < G; ++i) grid.push_back(grid_alpha(i));
  ctx.provenance["smoothing_bits"] = bits;
  ctx.provenance["smoothing_output_quant"] = oq;
  ctx.provenance["smoothing_grid"] = grid.dump();
  ctx.provenance["smoothing_windows"] = ctx.options["smoothing_windows"];
  ctx.provenance["smoothing_rows"] = ctx.options["smoothing_rows"];
}

const bool kRegistered = register_step({
    "smoothing",
    "EdgeFlow's NPU-aware smoothing: the input exponent alpha of every linear input by grid "
    "search over [0, 1] minimising the quantized output error (seed 004 §4.1)",
    60,
    {"act_absmax", "out_absmax"},
    {"smoothing_bits", "smoothing_output_quant", "smoothing_windows", "smoothing_rows",
     "smoothing_grid"},
    {bits_option(),
     {"output_quant",
      "int8",
      "the NPU's static output quantization the search models",
      {"none", "int8", "int16"}},
     sample_options()[0],
     sample_options()[1]},
    run,
    check_sample_options,
});

}  // namespace

}  // namespace socllm::calibrate
