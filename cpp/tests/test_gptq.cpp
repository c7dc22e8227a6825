// GPTQ's rounding (quant/gptq.h, Frantar et al. 2023 Algorithm 1): a hand-computed case, the
// identity Hessian reducing it to round-to-nearest, and the loss it minimises falling against
// round-to-nearest on correlated inputs for every scale kind.
#include "quant/gptq.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "calibrate/steps.h"
#include "core/core.h"
#include "engine/engine.h"
#include "expect_error.h"
#include "plan/plan.h"
#include "quant/bitwidth.h"
#include "quant/quant.h"
#include "tiny_model.h"

namespace q = socllm::quant;

namespace {
std::vector<float> dequant(const q::QuantizedWeights& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  q::dequantize_weights(w, out.data());
  return out;
}
}  // namespace

// Two inputs with correlation 0.9, 3-bit per-tensor scale 0.9 / 3 = 0.3. Row 1's first weight
// 0.4 rounds to 0.3 (error 0.1); OBS moves it onto the second: 0.1 + 0.9 · 0.1 = 0.19, which
// rounds to 1 (0.3) where round-to-nearest gives 0.
TEST(Gptq, HandComputedErrorCompensation) {
  const std::vector<float> W = {0.9f, 0.0f, 0.4f, 0.1f};
  const std::vector<float> H = {1.0f, 0.9f, 0.9f, 1.0f};
  const q::QuantSpec spec{3, q::Granularity::PerTensor, 32};
  const auto g = q::gptq_quantize(W.data(), 2, 2, H, spec, {1e-9, 128, false});
  EXPECT_EQ(g.q, (std::vector<int8_t>{3, 0, 1, 1}));
  ASSERT_EQ(g.scales.size(), 1u);
  EXPECT_FLOAT_EQ(g.scales[0], 0.3f);
  const auto rtn = q::quantize_weights(W.data(), 2, 2, spec);
  EXPECT_EQ(rtn.q, (std::vector<int8_t>{3, 0, 1, 0}));
  EXPECT_LT(q::gptq_objective(W.data(), dequant(g).data(), 2, 2, H),
            q::gptq_objective(W.data(), dequant(rtn).data(), 2, 2, H));
}

// Uncorrelated inputs leave nothing to compensate: the codes are round-to-nearest's; a column
// no input reached is zeroed.
TEST(Gptq, IdentityHessianIsRoundToNearest) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int64_t out = 5, in = 64;
  std::vector<float> W(static_cast<size_t>(out * in)), H(static_cast<size_t>(in * in), 0.0f);
  for (auto& v : W) v = nd(rng);
  for (int64_t j = 0; j < in; ++j) H[j * in + j] = 1.0f;
  for (auto gran : {q::Granularity::PerTensor, q::Granularity::PerChannel})
    for (int bits : {2, 4, 8}) {
      const q::QuantSpec spec{bits, gran, 16};
      EXPECT_EQ(q::gptq_quantize(W.data(), out, in, H, spec, {0.01, 16, false}).q,
                q::quantize_weights(W.data(), out, in, spec).q)
          << bits;
    }
  H[3 * in + 3] = 0.0f;
  const auto g = q::gptq_quantize(W.data(), out, in, H, {8, q::Granularity::PerChannel, 16},
                                  {0.01, 16, false});
  for (int64_t r = 0; r < out; ++r) EXPECT_EQ(g.q[r * in + 3], 0);
}

// Correlated inputs with an outlier channel: GPTQ's loss is below round-to-nearest's at every
// width, scale kind, order and block size, and per-row widths (EdgeFlow) keep each row's.
TEST(Gptq, LossFallsAgainstRoundToNearest) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int64_t out = 12, in = 64, n = 256;
  std::vector<float> X(static_cast<size_t>(n * in)), W(static_cast<size_t>(out * in));
  for (int64_t t = 0; t < n; ++t) {
    const float common = nd(rng);
    for (int64_t j = 0; j < in; ++j)
      X[t * in + j] = 0.7f * common + 0.5f * nd(rng) + (j == 5 ? 4.0f * common : 0.0f);
  }
  for (auto& v : W) v = nd(rng);
  std::vector<float> H(static_cast<size_t>(in * in), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t a = 0; a < in; ++a)
      for (int64_t b = 0; b < in; ++b) H[a * in + b] += X[t * in + a] * X[t * in + b] / n;
  for (auto gran :
       {q::Granularity::PerTensor, q::Granularity::PerChannel, q::Granularity::PerGroup})
    for (int bits = 2; bits <= 8; ++bits)
      for (bool act_order : {false, true})
        for (int64_t block : {8, 128}) {
          const q::QuantSpec spec{bits, gran, 16};
          const auto g = q::gptq_quantize(W.data(), out, in, H, spec, {0.01, block, act_order});
          const auto r = q::quantize_weights(W.data(), out, in, spec);
          EXPECT_LT(q::gptq_objective(W.data(), dequant(g).data(), out, in, H),
                    q::gptq_objective(W.data(), dequant(r).data(), out, in, H))
              << q::granularity_name(gran) << " " << bits << " bits, act_order " << act_order
              << ", block " << block;
        }
  std::vector<uint8_t> row_bits(static_cast<size_t>(out));
  for (int64_t r = 0; r < out; ++r) row_bits[r] = static_cast<uint8_t>(1 + r % 8);
  const auto g = q::gptq_quantize(W.data(), out, in, H, {8, q::Granularity::PerChannel, 16},
                                  {0.01, 32, false}, row_bits);
  double gptq_loss = 0, rtn_loss = 0;
  for (int64_t r = 0; r < out; ++r) {
    std::vector<int8_t> code(static_cast<size_t>(in));
    const float s = q::quantize_row_bits(W.data() + r * in, in, row_bits[r], code.data());
    EXPECT_FLOAT_EQ(g.scales[r], s);
    const int32_t qmax = row_bits[r] == 1 ? 1 : (1 << (row_bits[r] - 1)) - 1;
    std::vector<float> gr(static_cast<size_t>(in)), rr(static_cast<size_t>(in));
    for (int64_t j = 0; j < in; ++j) {
      EXPECT_LE(std::abs(g.q[r * in + j]), qmax + 1);
      gr[j] = g.q[r * in + j] * g.scales[r];
      rr[j] = code[j] * s;
    }
    gptq_loss += q::gptq_objective(W.data() + r * in, gr.data(), 1, in, H);
    rtn_loss += q::gptq_objective(W.data() + r * in, rr.data(), 1, in, H);
  }
  EXPECT_LT(gptq_loss, rtn_loss);
}

TEST(Gptq, BadInputsNameTheValue) {
  const std::vector<float> W = {1, 2, 3, 4}, H = {1, 0, 0, 1};
  const q::QuantSpec spec{4, q::Granularity::PerChannel, 32};
  expect_error<socllm::InvalidArgument>(
      [&] { q::gptq_quantize(W.data(), 2, 2, H, spec, {0.0, 128, false}); }, "damp");
  expect_error<socllm::ShapeError>(
      [&] { q::gptq_quantize(W.data(), 2, 2, std::span(H).first(3), spec, {}); }, "3 values");
  const std::vector<float> Hbad = {1, 0, 0, NAN};
  expect_error<socllm::InvalidArgument>([&] { q::gptq_quantize(W.data(), 2, 2, Hbad, spec, {}); },
                                        "non-finite H at index 3");
  const std::vector<uint8_t> bits = {9, 4};
  expect_error<socllm::InvalidArgument>(
      [&] { q::gptq_quantize(W.data(), 2, 2, H, spec, {}, bits); }, "bit-width 9");
  const std::vector<float> Hneg = {-1, 0, 0, -1};
  expect_error<socllm::InvalidArgument>([&] { q::gptq_quantize(W.data(), 2, 2, Hneg, spec, {}); },
                                        "positive definite");
}

// Step gptq on the tiny model: the stored Hessian is XᵀX / n of the site's fp32 inputs (from
// Engine::linear_inputs, computed apart); a plan with rounding=gptq prepares linears whose
// output error on those inputs is below round-to-nearest's; without the step the plan names it.
TEST(Gptq, CalibrationStepAndPlanRounding) {
  using namespace socllm;
  const Engine e(tiny_model::load_tiny_model("gptq_step"));
  const auto& c = e.model().config();
  Calibration stats = Calibration::empty_for(c);
  const std::vector<std::vector<int32_t>> windows = {{1, 5, 3, 9, 2, 7, 11, 4, 6, 8, 10, 12},
                                                     {2, 4, 6, 8, 1, 3, 5, 7, 9, 11, 13, 15}};
  calibrate::run_step("act-scales", e, stats, windows, {}, {});
  const Plan plan = Plan::parse(
      R"({"name": "custom", "ops": {"linear": {"weights": {"format": "int8", "granularity":
      "per-channel", "bits": 3}, "activations": "fp32"}}, "rounding": "gptq", "gptq_damp": 0.01})");
  expect_error<InvalidArgument>([&] { e.prepare_linear(plan, 0, LinearSite::MlpAct, {}, &stats); },
                                "--steps ...,gptq");
  calibrate::run_step("gptq", e, stats, windows, {}, {});
  EXPECT_EQ(stats.hessian_rows, 24);
  for (int s = 0; s < kNumLinearSites; ++s) {
    const auto site = static_cast<LinearSite>(s);
    const int64_t w = linear_site_width(c, site), out = linear_out_width(c, site);
    // X of both windows, stacked
    std::vector<float> X;
    for (const auto& win : windows) {
      std::vector<int64_t> rows(win.size());
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
      const auto in = e.linear_inputs(win, rows)[1][s];
      X.insert(X.end(), in.data.begin(), in.data.end());
    }
    const int64_t n = static_cast<int64_t>(X.size()) / w;
    const auto H = stats.hessian_of(1, site);
    for (int64_t a = 0; a < w; ++a)
      for (int64_t b = 0; b < w; ++b) {
        double ref = 0;
        for (int64_t t = 0; t < n; ++t) ref += double{X[t * w + a]} * X[t * w + b];
        ASSERT_NEAR(H[a * w + b], ref / n, 1e-4 * (1 + std::abs(ref / n))) << s;
      }
    // the prepared linears' output error on X: GPTQ below round-to-nearest
    const Plan nearest = Plan::parse(
        R"({"name": "custom", "ops": {"linear": {"weights": {"format": "int8", "granularity":
        "per-channel", "bits": 3}, "activations": "fp32"}}})");
    const TensorF32& W = site_weights(e.model().layer(1), site);
    std::vector<double> ref(static_cast<size_t>(n * out), 0.0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t j = 0; j < w; ++j)
          ref[t * out + o] += double{X[t * w + j]} * W.data[o * w + j];
    double err[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const auto lin = e.prepare_linear(k ? plan : nearest, 1, site, {}, &stats);
      std::vector<float> y(static_cast<size_t>(n * out));
      const quant::RowSegment all{0, n};
      lin->forward(X.data(), n, y.data(), out, false, {&all, 1});
      for (size_t i = 0; i < y.size(); ++i) err[k] += (y[i] - ref[i]) * (y[i] - ref[i]);
    }
    EXPECT_LT(err[1], err[0]) << linear_site_name(site);
  }
  expect_error<InvalidArgument>([] { Plan::parse("w8a8:gptq_damp=0.1"); }, "rounding=gptq");
  expect_error<InvalidArgument>([] { Plan::parse("fp32:rounding=gptq"); }, "fp32");
  const Plan p = Plan::parse("w4a16:rounding=gptq,gptq_order=act");
  EXPECT_TRUE(Plan::from_json(p.to_json()).linear.gptq.act_order);
}
