// Step head-importance (shadowAttn, seed 000 §3.2): on calibration windows, the loss increase
// when one head's attention output is zeroed (Eq. 1, headImp) and when a layer's whole attention
// output is zeroed (Eq. 2, layerImp), in nats per token (mean next-token NLL of the window); the
// plans turn them into per-head keep ratios by Eq. 3. The fp32 residual stream entering every
// layer is computed once per window and each ablation runs only the layers from the ablated one
// on (a layer's n_heads + 1 ablations as one batch).
//
// Windows: the paper profiles 128 samples (on a cloud GPU); the default is what finishes for
// SmolLM2-135M within 15 minutes on 2 cores (8 windows of 256 tokens). Exact ablation costs
// n_heads + 1 runs of every layer above each layer plus the LM head: about 155 forward passes a
// window. importance_method=taylor is the first-order estimate of the same loss increases
// (Michel et al. 2019: one backward pass gives every head's gate gradient), computed in Python
// with torch (socllm/calibration/head_importance.py); this C++ part runs the exact ablation.
#include <cmath>

#include "calibrate/steps.h"
#include "core/core.h"

namespace socllm::calibrate {

namespace {

double mean_nll(const std::vector<float>& logprobs) {
  double s = 0;
  for (float x : logprobs) s += x;
  return -s / static_cast<double>(logprobs.size());
}

void run(StepContext& ctx) {
  if (ctx.options["importance_method"].get<std::string>() != "ablation")
    throw InvalidArgument(
        "[calibrate] head-importance: importance_method=" +
        ctx.options["importance_method"].get<std::string>() +
        " is computed by the Python step (socllm calibrate --steps head-importance), not here");
  const ModelConfig& c = ctx.engine.model().config();
  const int64_t L = c.n_layers, H = c.n_heads;
  // one head zeroed per mask, and the whole layer's attention in the last
  std::vector<std::vector<float>> masks(static_cast<size_t>(H + 1), std::vector<float>(H, 1.0f));
  for (int64_t h = 0; h < H; ++h) masks[static_cast<size_t>(h)][static_cast<size_t>(h)] = 0.0f;
  std::fill(masks.back().begin(), masks.back().end(), 0.0f);
  std::vector<double> heads(static_cast<size_t>(L * H), 0.0), layers(static_cast<size_t>(L), 0.0);
  int64_t done = 0;
  for (size_t i = 0; i < ctx.windows.size(); ++i) {
    const auto& w = ctx.windows[i];
    if (w.size() < 2)
      throw InvalidArgument("[calibrate] head-importance: window " + std::to_string(i) + " has " +
                            std::to_string(w.size()) + " tokens (needs at least 2)");
    const auto xs = ctx.engine.layer_inputs(w);
    const double base = mean_nll(ctx.engine.token_logprobs({w}, Plan())[0]);
    for (int64_t l = 0; l < L; ++l) {
      const auto lp = ctx.engine.ablation_logprobs(w, l, xs[static_cast<size_t>(l)], masks);
      for (int64_t h = 0; h < H; ++h)
        heads[static_cast<size_t>(l * H + h)] += mean_nll(lp[static_cast<size_t>(h)]) - base;
      layers[static_cast<size_t>(l)] += mean_nll(lp[static_cast<size_t>(H)]) - base;
    }
    ctx.progress(++done, static_cast<int64_t>(ctx.windows.size()), "windows");
  }
  const double n = static_cast<double>(std::max<size_t>(ctx.windows.size(), 1));
  ctx.stats.head_importance.assign(heads.size(), 0.0f);
  ctx.stats.layer_importance.assign(layers.size(), 0.0f);
  for (size_t i = 0; i < heads.size(); ++i)
    ctx.stats.head_importance[i] = static_cast<float>(heads[i] / n);
  for (size_t i = 0; i < layers.size(); ++i)
    ctx.stats.layer_importance[i] = static_cast<float>(layers[i] / n);
}

const bool kRegistered = register_step({
    "head-importance",
    "shadowAttn's head and layer importance: loss increase when a head's / a layer's attention "
    "output is zeroed (seed 000 Eq. 1, 2), for per-head keep ratios (Eq. 3)",
    40,
    {},
    {},
    {window_options()[0],
     window_options()[3],
     {"importance_samples", int64_t{8}, "windows ablated (the paper: 128, slower)"},
     {"importance_seqlen", int64_t{256}, "tokens per ablated window"},
     {"importance_method",
      "ablation",
      "ablation: Eq. 1-2 exactly (one run per head and layer ablated); taylor: their first-order "
      "estimate from one backward pass per window (needs torch; ~50x cheaper)",
      {"ablation", "taylor"}}},
    run,
    [](const std::string& step, const nlohmann::json& o) {
      check_corpus(step, o);
      require_option(o["seed"].get<int64_t>() >= 0, step, o, "seed", ">= 0");
      require_option(o["importance_samples"].get<int64_t>() >= 1, step, o, "importance_samples",
                     ">= 1");
      require_option(o["importance_seqlen"].get<int64_t>() >= 2, step, o, "importance_seqlen",
                     ">= 2");
    },
});

}  // namespace

}  // namespace socllm::calibrate
