// Residual-stream rotations (issue 39, QuaRot §4.1): the maps are orthogonal and are what their
// matrices say, and the rotated tiny model computes the same logits in fp32.
#include "quant/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "calibrate/steps.h"
#include "core/core.h"
#include "engine/engine.h"
#include "expect_error.h"
#include "plan/plan.h"
#include "tiny_model.h"

namespace q = socllm::quant;
using socllm::Engine;
using socllm::Plan;

// Q Qᵀ = I, and apply_rows(x) = x Q computed in double from matrix(), for both kinds and sizes
// with and without a Paley factor.
TEST(Rotation, RowMapsAreOrthogonalAndMatchTheirMatrices) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto kind : {q::RotationKind::Hadamard, q::RotationKind::Random})
    for (int64_t d : {8, 12, 576}) {
      const q::ResidualRotation rot(kind, d, 5);
      const auto Q = rot.matrix();
      for (int64_t i = 0; i < d; i += 7)
        for (int64_t j = 0; j < d; j += 5) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += double{Q[i * d + c]} * Q[j * d + c];
          ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << q::rotation_name(kind) << " d " << d;
        }
      const int64_t rows = 3, ld = d + 2;
      std::vector<float> x(static_cast<size_t>(rows * ld));
      for (auto& v : x) v = nd(rng);
      std::vector<float> y = x;
      rot.apply_rows(y.data(), rows, ld);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < d; ++j) {
          double ref = 0;
          for (int64_t c = 0; c < d; ++c) ref += double{x[r * ld + c]} * Q[c * d + j];
          ASSERT_NEAR(y[r * ld + j], ref, 2e-5 * std::sqrt(double(d))) << q::rotation_name(kind);
        }
      // another seed, another map
      EXPECT_NE(q::ResidualRotation(kind, d, 6).matrix(), Q);
    }
}

// Every rotation a plan can ask for, run through the engine's routing (Engine::for_rotation):
// the same logits as the plain model in fp32 (QuaRot's computational invariance), on a rotated
// model whose weights did change (unit norm gains and its own head for a residual rotation; the
// down weights for the online rotation, which the block must then apply: down_rotate is recorded).
TEST(Rotation, EveryPlanRotationComputesTheSameLogits) {
  const auto model = tiny_model::load_tiny_model("rotation");
  const Engine engine(model);
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 3, 9, 2, 7, 11, 4}};
  const auto want = engine.logits(seqs, Plan());
  float scale = 0;
  for (float v : want[0].data) scale = std::max(scale, std::abs(v));
  for (const std::string parts :
       {"rotate=fold", "rotate=hadamard,rotate_seed=3", "rotate=random,rotate_seed=3",
        "rotate_down=hadamard", "rotate_heads=hadamard",
        "rotate=hadamard,rotate_down=hadamard,rotate_heads=hadamard"}) {
    const Plan plan = Plan::parse("fp32:" + parts);
    const Engine& rotated = engine.for_rotation(plan.rotation);
    ASSERT_NE(&rotated, &engine) << parts;
    const socllm::Model& m = rotated.model();
    EXPECT_EQ(m.rotation(), plan.rotation.name());
    EXPECT_EQ(m.config().to_json(), model->config().to_json());
    if (plan.rotation.residual) {
      EXPECT_NE(m.lm_head().data, m.embed_tokens().data) << parts;
      for (float g : m.layer(1).ffn_norm.data) EXPECT_EQ(g, 1.0f);
    }
    const bool rotates_stream =
        plan.rotation.residual && *plan.rotation.residual != q::RotationKind::Fold;
    EXPECT_EQ(m.layer(0).w_down.data != model->layer(0).w_down.data,
              rotates_stream || plan.rotation.online_down)
        << parts;
    EXPECT_EQ(m.layer(0).wqkv.data != model->layer(0).wqkv.data,
              plan.rotation.residual || plan.rotation.heads)
        << parts;
    const auto got = engine.logits(seqs, plan);
    ASSERT_EQ(got[0].shape, want[0].shape);
    for (size_t i = 0; i < want[0].data.size(); ++i)
      ASSERT_NEAR(got[0].data[i], want[0].data[i], 1e-5f * scale) << parts;
    // the online rotation is an op of the run and of its graph, and nothing else's
    const std::vector<int32_t> prompt = seqs[0];
    const auto run = engine.prefill(prompt, plan, false, true, 0, true);
    const bool recorded = std::any_of(run.records.begin(), run.records.end(),
                                      [](const auto& r) { return r.op == "down_rotate"; });
    EXPECT_EQ(recorded, plan.rotation.online_down) << parts;
    bool timed = false;
    for (const auto& t : run.graph.tasks())
      for (const auto& o : t.ops) timed |= o.name == "down_rotate";
    EXPECT_EQ(timed, plan.rotation.online_down) << parts;
  }
  // the rotated engines are kept: one per rotation
  EXPECT_EQ(&engine.for_rotation(Plan::parse("fp32:rotate_down=hadamard").rotation),
            &engine.for_rotation(Plan::parse("fp32:rotate_down=hadamard").rotation));
}

// Names and plans agree: from_name inverts name(), the plan's JSON carries its parts.
TEST(Rotation, SpecNamesRoundTripThroughPlans) {
  for (const std::string name : {"none", "fold", "hadamard,seed=7", "random,seed=0,down", "heads",
                                 "hadamard,seed=2,down,heads"})
    EXPECT_EQ(q::RotationSpec::from_name(name).name(), name);
  const Plan p = Plan::parse("w8a8:rotate=hadamard,rotate_seed=7,rotate_heads=hadamard");
  EXPECT_EQ(p.rotation.name(), "hadamard,seed=7,heads");
  EXPECT_EQ(Plan::from_json(p.to_json()).rotation, p.rotation);
  EXPECT_FALSE(Plan::parse("w8a8").to_json().contains("rotate"));
}

// Statistics go to the engine of their rotation; a rotated plan without them names the command.
TEST(Rotation, CalibrationServesThePlansOfItsRotation) {
  const auto model = tiny_model::load_tiny_model("rotation_calibration");
  Engine engine(model);
  const Plan rotated = Plan::parse("w8a8:rotate=hadamard,rotate_down=hadamard");
  expect_error<socllm::InvalidArgument>(
      [&] { engine.prepare(rotated); },
      "rotation 'hadamard,seed=0,down' (socllm calibrate --rotate hadamard --rotate-seed 0 "
      "--rotate-down hadamard");
  const Engine& re = engine.for_rotation(rotated.rotation);
  auto stats =
      std::make_shared<socllm::Calibration>(socllm::Calibration::empty_for(model->config()));
  // statistics of the plain model cannot be gathered on the rotated one
  expect_error<socllm::InvalidArgument>([&] { re.observe_activations({{1, 2, 3}}, *stats); },
                                        "rotation 'none'");
  stats->rotation = re.model().rotation();
  // the steps that observe into statistics of their own keep the rotation (outliers, gptq)
  for (const char* step : {"act-scales", "outliers", "gptq"})
    socllm::calibrate::run_step(step, re, *stats, {{1, 2, 3, 4, 5, 6}}, {}, {});
  EXPECT_TRUE(stats->has_outlier_stats() && stats->has_hessians());
  engine.set_calibration(stats);
  EXPECT_EQ(engine.calibration(), nullptr);  // not the plain model's
  EXPECT_EQ(engine.calibrated_rotations(), std::vector<std::string>{"hadamard,seed=0,down"});
  EXPECT_NE(engine.prepare(rotated), nullptr);
  expect_error<socllm::InvalidArgument>([&] { engine.prepare(Plan::parse("w8a8")); },
                                        "none is loaded");
  engine.set_calibration(nullptr);
  EXPECT_TRUE(engine.calibrated_rotations().empty());
}

TEST(Rotation, ErrorsNameTheValue) {
  expect_error<socllm::InvalidArgument>([] { q::rotation_from_name("givens"); }, "'givens'");
  expect_error<socllm::InvalidArgument>([] { q::RotationSpec::from_name("hadamard,givens"); },
                                        "'givens'");
  expect_error<socllm::InvalidArgument>([] { q::RotationSpec::from_name("down,hadamard"); },
                                        "'down,hadamard'");
  expect_error<socllm::InvalidArgument>(
      [] { q::ResidualRotation(q::RotationKind::Hadamard, 9, 0); }, "size 9");
  expect_error<socllm::InvalidArgument>([] { Plan::parse("w8a8:rotate_seed=3"); }, "rotate_seed=3");
  expect_error<socllm::InvalidArgument>([] { Plan::parse("w8a8:rotate_down=random"); }, "'random'");
  const auto model = tiny_model::load_tiny_model("rotation_errors");
  const auto once = q::rotate_model(model, q::RotationSpec::from_name("fold"));
  expect_error<socllm::InvalidArgument>(
      [&] { q::rotate_model(once, q::RotationSpec::from_name("down")); }, "transformed already");
  const std::string path = (tiny_model::fresh_dir("rotation_post_norms") / "m.h5").string();
  tiny_model::write_tiny_model(path, tiny_model::kLayers, 2, /*post_norms=*/true);
  const auto gemma_like = socllm::Model::load(path);
  expect_error<socllm::Unsupported>(
      [&] { q::rotate_model(gemma_like, q::RotationSpec::from_name("hadamard,seed=0")); },
      "post norms");
  // the rotations inside the block keep a post-normed model's function
  const Engine g(gemma_like);
  const std::vector<std::vector<int32_t>> seqs = {{3, 1, 4, 1, 5, 9}};
  const auto want = g.logits(seqs, Plan());
  const auto got = g.logits(seqs, Plan::parse("fp32:rotate_down=hadamard,rotate_heads=hadamard"));
  for (size_t i = 0; i < want[0].data.size(); ++i)
    ASSERT_NEAR(got[0].data[i], want[0].data[i], 1e-4f);
}
