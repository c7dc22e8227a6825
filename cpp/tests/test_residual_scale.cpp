// residual_scale (issue 39 item 3): the stream scaled by c with eps·c² in the norms reading it is
// the same function (on a llama block and on a post-normed Gemma-like one); a stream beyond
// binary16 makes an fp16 residual op name itself, and residual_scale=auto, from the calibrated
// stream maximum, brings it back under the range with the fp32 answer.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "calibrate/steps.h"
#include "core/core.h"
#include "engine/engine.h"
#include "expect_error.h"
#include "plan/plan.h"
#include "tiny_model.h"

using socllm::Engine;
using socllm::Plan;

namespace {
float max_rel_diff(const socllm::TensorF32& a, const socllm::TensorF32& b) {
  float m = 0, scale = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    m = std::max(m, std::abs(a.data[i] - b.data[i]));
    scale = std::max(scale, std::abs(b.data[i]));
  }
  return m / scale;
}
}  // namespace

TEST(ResidualScale, ScaledStreamComputesTheSameLogits) {
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 3, 9, 2, 7, 11, 4}};
  const std::string path = (tiny_model::fresh_dir("residual_scale_post") / "m.h5").string();
  tiny_model::write_tiny_model(path, tiny_model::kLayers, 2, /*post_norms=*/true);
  for (const auto& model :
       {tiny_model::load_tiny_model("residual_scale"), socllm::Model::load(path)}) {
    const Engine e(model);
    const auto want = e.logits(seqs, Plan());
    for (const char* c : {"0.25", "0.3", "1024"}) {
      const auto got = e.logits(seqs, Plan::parse(std::string("fp32:residual_scale=") + c));
      EXPECT_LT(max_rel_diff(got[0], want[0]), 1e-5f) << c;
    }
    // the scale reaches the numerics: without eps·c² (c tiny, eps dominant) they would differ
    EXPECT_LT(max_rel_diff(e.logits(seqs, Plan::parse("fp32:residual_scale=1e-3"))[0], want[0]),
              1e-4f);
  }
}

TEST(ResidualScale, AutoKeepsAnFp16StreamInRange) {
  const auto base = tiny_model::load_tiny_model("residual_scale_big");
  // the same model with embeddings 2^17 larger: a stream beyond binary16's 65504
  socllm::TensorF32 embed = base->embed_tokens();
  for (float& v : embed.data) v *= 131072.0f;
  std::vector<socllm::LayerWeights> layers;
  for (int64_t l = 0; l < base->config().n_layers; ++l) layers.push_back(base->layer(l));
  const auto big = base->with_weights(embed, {}, base->final_norm(), layers, {"big", false});
  Engine e(big);
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 3, 9, 2, 7, 11, 4}};
  expect_error<socllm::Unsupported>([&] { e.logits(seqs, Plan::parse("fp32:residual=fp16")); },
                                    "residual");
  expect_error<socllm::InvalidArgument>(
      [&] { e.logits(seqs, Plan::parse("fp32:residual=fp16,residual_scale=auto")); },
      "--steps act-scales");
  auto stats = std::make_shared<socllm::Calibration>(socllm::Calibration::empty_for(big->config()));
  stats->rotation = big->rotation();
  socllm::calibrate::run_step("act-scales", e, *stats, seqs, {}, {});
  ASSERT_EQ(stats->residual_absmax.size(), size_t(big->config().n_layers + 1));
  const float m = *std::max_element(stats->residual_absmax.begin(), stats->residual_absmax.end());
  EXPECT_GT(m, 65504.0f);
  e.set_calibration(stats);
  const Plan autoscaled = Plan::parse("fp32:residual=fp16,residual_scale=auto");
  // the largest power of two that puts the maximum under kAutoResidualMax
  const float c = e.residual_scale(autoscaled);
  EXPECT_LE(m * c, Plan::kAutoResidualMax);
  EXPECT_GT(m * c * 2, Plan::kAutoResidualMax);
  EXPECT_EQ(std::log2(c), std::round(std::log2(c)));
  const auto want = e.logits(seqs, Plan());
  EXPECT_LT(max_rel_diff(e.logits(seqs, autoscaled)[0], want[0]), 2e-2f);
  expect_error<socllm::InvalidArgument>([] { Plan::parse("fp32:residual_scale=-1"); },
                                        "residual_scale must be auto or a number > 0, got -1");
}
