// Residual-stream rotations (issue 39, QuaRot §4.1): the maps are orthogonal and are what their
// matrices say, and the rotated tiny model computes the same logits in fp32.
#include "quant/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

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

// The rotated model: unit norm gains, its own head, the same config, and the same logits as the
// original in fp32 (QuaRot's computational invariance); kind None folds the gains alone.
TEST(Rotation, RotatedTinyModelComputesTheSameLogits) {
  const auto model = tiny_model::load_tiny_model("rotation");
  const Engine plain(model);
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 3, 9, 2, 7, 11, 4}};
  const auto want = plain.logits(seqs, Plan());
  for (auto kind : {q::RotationKind::None, q::RotationKind::Hadamard, q::RotationKind::Random}) {
    const auto rotated =
        q::rotate_residual(*model, q::ResidualRotation(kind, model->config().d_model, 3));
    EXPECT_EQ(rotated->config().to_json(), model->config().to_json());
    EXPECT_NE(rotated->lm_head().data, rotated->embed_tokens().data);
    for (float g : rotated->layer(1).ffn_norm.data) EXPECT_EQ(g, 1.0f);
    EXPECT_NE(rotated->layer(0).wqkv.data, model->layer(0).wqkv.data);
    const auto got = Engine(rotated).logits(seqs, Plan());
    ASSERT_EQ(got[0].shape, want[0].shape);
    float scale = 0;
    for (float v : want[0].data) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < want[0].data.size(); ++i)
      ASSERT_NEAR(got[0].data[i], want[0].data[i], 1e-5f * scale) << q::rotation_name(kind);
  }
}

TEST(Rotation, ErrorsNameTheValue) {
  expect_error<socllm::InvalidArgument>([] { q::rotation_from_name("givens"); }, "'givens'");
  expect_error<socllm::InvalidArgument>(
      [] { q::ResidualRotation(q::RotationKind::Hadamard, 9, 0); }, "size 9");
  const auto model = tiny_model::load_tiny_model("rotation_errors");
  expect_error<socllm::ShapeError>(
      [&] { q::rotate_residual(*model, q::ResidualRotation(q::RotationKind::Random, 12, 0)); },
      "size 12 for d_model 8");
  const std::string path = (tiny_model::fresh_dir("rotation_post_norms") / "m.h5").string();
  tiny_model::write_tiny_model(path, tiny_model::kLayers, 2, /*post_norms=*/true);
  const auto gemma_like = socllm::Model::load(path);
  expect_error<socllm::Unsupported>(
      [&] {
        q::rotate_residual(*gemma_like, q::ResidualRotation(q::RotationKind::Hadamard, 8, 0));
      },
      "post norms");
}
