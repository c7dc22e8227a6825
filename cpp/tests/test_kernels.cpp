// fp32 kernels against plain scalar references, over sizes 0, 1, odd, and blocks.
#include <gtest/gtest.h>

#include <tuple>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/core.h"
#include "expect_error.h"
#include "kernels/kernels.h"

namespace k = socllm::kernels;

namespace {
std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// out[T, H*hd] for queries at positions past..past+T-1 over L = past+T keys (naive, double).
std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<float>& kk,
                                   const std::vector<float>& vv, int64_t T, int64_t past, int64_t H,
                                   int64_t Hkv, int64_t hd, int64_t window = 0) {
  std::vector<float> out(static_cast<size_t>(T * H * hd));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv), vis = past + t + 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, vis - window) : 0;
      std::vector<double> s(static_cast<size_t>(vis));
      double mx = -1e300;
      for (int64_t j = 0; j < vis; ++j) {
        if (j < first) {
          s[j] = -1e300;  // outside the window: exp underflows to 0
          continue;
        }
        double acc = 0;
        for (int64_t i = 0; i < hd; ++i)
          acc += double(q[t * H * hd + h * hd + i]) * kk[j * Hkv * hd + g * hd + i];
        s[j] = acc / std::sqrt(double(hd));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < vis; ++j) acc += s[j] / sum * vv[j * Hkv * hd + g * hd + i];
        out[t * H * hd + h * hd + i] = static_cast<float>(acc);
      }
    }
  return out;
}
}  // namespace

TEST(Linear, MatchesScalarOverSizes) {
  for (int64_t T : {0, 1, 3, 17}) {
    for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 5}, {64, 33}}) {
      auto x = randn(static_cast<size_t>(std::max<int64_t>(T, 1) * in), 1);
      auto W = randn(static_cast<size_t>(out * in), 2);
      auto b = randn(static_cast<size_t>(out), 3);
      std::vector<float> y(static_cast<size_t>(std::max<int64_t>(T, 1) * out), 0.5f);
      k::linear(x.data(), T, in, in, W.data(), out, b.data(), y.data(), out, /*accumulate=*/true);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < out; ++o) {
          double ref = 0.5 + b[o];
          for (int64_t i = 0; i < in; ++i) ref += double(x[t * in + i]) * W[o * in + i];
          EXPECT_NEAR(y[t * out + o], ref, 1e-4 * (1 + std::abs(ref)))
              << T << " " << in << " " << out;
        }
      if (T == 0) EXPECT_EQ(y[0], 0.5f);  // nothing written for an empty batch
    }
  }
}

TEST(RmsNorm, HandComputed) {
  // x = [3, 4]: mean(x^2) = 12.5, so y = x / sqrt(12.5 + eps) * w.
  std::vector<float> x{3, 4}, w{1, 2}, y(2);
  k::rms_norm(x.data(), w.data(), 1, 2, 0.0, y.data());
  EXPECT_NEAR(y[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], 2 * 4 / std::sqrt(12.5), 1e-6);
}

TEST(Rope, PositionZeroIsIdentityAndRotationPreservesNorm) {
  const int64_t H = 3, hd = 8;
  std::vector<float> inv(hd / 2);
  k::rope_inv_freq(10000.0, hd, inv.data());
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], std::pow(10000.0, -2.0 / 8), 1e-7);
  auto x = randn(static_cast<size_t>(2 * H * hd), 4);
  auto y = x;
  std::vector<int64_t> pos{0, 5};
  k::rope_neox(y.data(), 2, H, hd, H * hd, pos.data(), inv.data());
  for (int64_t i = 0; i < H * hd; ++i) EXPECT_EQ(y[i], x[i]);
  // Row 1: pair (i, i + hd/2) rotated by angle 5 * inv[i].
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const float* a = x.data() + H * hd + h * hd;
      const float* b = y.data() + H * hd + h * hd;
      double ang = 5.0 * inv[i];
      EXPECT_NEAR(b[i], a[i] * std::cos(ang) - a[i + hd / 2] * std::sin(ang), 1e-5);
      EXPECT_NEAR(b[i + hd / 2], a[i + hd / 2] * std::cos(ang) + a[i] * std::sin(ang), 1e-5);
    }
}

TEST(SiluMul, HandComputed) {
  std::vector<float> gu{0.0f, 2.0f, 3.0f, -1.0f}, out(2);  // T=1, d_ff=2: gate [0,2], up [3,-1]
  k::silu_mul(gu.data(), 1, 2, out.data());
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2.0 / (1 + std::exp(-2.0)) * -1.0, 1e-6);
}

namespace {
// attention_causal on random Q/K/V against naive_attention, to 2e-5 per element.
void expect_attention_matches_naive(int64_t H, int64_t Hkv, int64_t hd, int64_t T, int64_t past,
                                    int64_t window, uint32_t seed) {
  const int64_t L = past + T;
  auto q = randn(static_cast<size_t>(T * H * hd), seed);
  auto kk = randn(static_cast<size_t>(L * Hkv * hd), seed + 1);
  auto vv = randn(static_cast<size_t>(L * Hkv * hd), seed + 2);
  std::vector<float> out(static_cast<size_t>(T * H * hd)),
      scratch(static_cast<size_t>(k::attention_scratch_floats(T, L, H, Hkv, hd)));
  k::attention_causal(q.data(), H * hd, kk.data(), vv.data(), Hkv * hd, T, past, H, Hkv, hd,
                      out.data(), H * hd, scratch.data(), window);
  auto ref = naive_attention(q, kk, vv, T, past, H, Hkv, hd, window);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], ref[i], 2e-5) << H << "/" << Hkv << "x" << hd << ", T " << T << ", past "
                                      << past << ", window " << window;
}
}  // namespace

TEST(Attention, MatchesNaiveWithGqaAndPast) {
  for (auto [T, past] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 0}, {5, 0}, {1, 9}, {300, 0}, {130, 70}, {700, 0}, {3, 1000}, {129, 257}})
    expect_attention_matches_naive(4, 2, 16, T, past, 0, 5);
}

TEST(Attention, RealHeadShapesMatchNaive) {
  // The micro-kernels' tails: SmolLM2's 9/3 heads of 64, Gemma 3's 4/1 of 256, and head sizes
  // that are no multiple of a vector (padded P·V columns), over the tile-row and key-chunk edges.
  for (auto [H, Hkv, hd, T, past] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{{9, 3, 64, 261, 0},
                                                                            {9, 3, 64, 1, 300},
                                                                            {4, 1, 256, 77, 40},
                                                                            {5, 5, 20, 70, 3},
                                                                            {6, 2, 72, 33, 0}})
    expect_attention_matches_naive(H, Hkv, hd, T, past, 0, 21);
}

TEST(Attention, SlidingWindowMatchesNaive) {
  // Gemma 3's local layers: each query sees its last `window` keys, itself included.
  for (auto [T, past, window] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{40, 0, 8},
                                                                                   {1, 30, 8},
                                                                                   {300, 0, 64},
                                                                                   {130, 70, 100},
                                                                                   {10, 0, 512},
                                                                                   {1100, 0, 512},
                                                                                   {2, 900, 512},
                                                                                   {300, 0, 1}})
    expect_attention_matches_naive(4, 1, 16, T, past, window, 11);
}

TEST(Attention, ScratchStopsGrowingWithKeysAndLargeScoresStayFinite) {
  // The online softmax keeps only a key block of scores per row: the scratch of a 4096-key
  // prefix equals that of a 256-key one. Scores far apart (a key block whose max exceeds the
  // running max by ~80) must rescale, not overflow.
  EXPECT_EQ(k::attention_scratch_floats(64, 4096, 9, 3, 64),
            k::attention_scratch_floats(64, 256, 9, 3, 64));
  const int64_t H = 1, Hkv = 1, hd = 4, T = 1, past = 299, L = past + T;
  std::vector<float> q(hd, 1.0f), kk(static_cast<size_t>(L * hd), 0.0f),
      vv(static_cast<size_t>(L * hd), 0.0f), out(hd),
      scratch(static_cast<size_t>(k::attention_scratch_floats(T, L, H, Hkv, hd)));
  for (int64_t c = 0; c < hd; ++c) {
    kk[static_cast<size_t>(280 * hd + c)] = 40.0f;  // score 80 (x 1/sqrt(4)) in the last block
    vv[static_cast<size_t>(280 * hd + c)] = 3.0f;
    vv[static_cast<size_t>(5 * hd + c)] = -1.0f;
  }
  k::attention_causal(q.data(), hd, kk.data(), vv.data(), hd, T, past, H, Hkv, hd, out.data(), hd,
                      scratch.data());
  // softmax: key 280 has weight 1 / (1 + 299 e^-80), i.e. 1 in float
  for (int64_t c = 0; c < hd; ++c) EXPECT_FLOAT_EQ(out[static_cast<size_t>(c)], 3.0f);
}

TEST(GeluTanhMul, HandComputed) {
  std::vector<float> gu{0.0f, 1.0f, 3.0f, -2.0f}, out(2);  // gate [0, 1], up [3, -2]
  k::gelu_tanh_mul(gu.data(), 1, 2, out.data());
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  const double g1 = 0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * (1 + 0.044715)));
  EXPECT_NEAR(out[1], g1 * -2.0, 1e-6);  // 0.841192 x -2
}

TEST(Sigmoid, RelativeErrorBelow1e6AboveTheClamp) {
  double worst = 0;
  for (float z = -87.0f; z <= 30.0f; z += 0.0013f) {
    const double ref = 1.0 / (1.0 + std::exp(-static_cast<double>(z)));
    worst = std::max(worst, std::abs(k::sigmoid(z) - ref) / ref);
  }
  EXPECT_LT(worst, 1e-6);
}

// Against x / (1 + exp(-2v)) in double (the tanh form in double cancels for x << 0). The
// kernel rounds 2v to float first, which alone moves sigmoid(2v) by up to ~2.4e-7 |2v|
// relative; below 2v = -87 the sigmoid is at exp_nonpositive's clamp (absolute ~1.6e-38 |x|).
TEST(GeluTanhMul, MatchesDoubleReferenceEverywhere) {
  const double c = std::sqrt(2.0 / M_PI);
  std::vector<float> xs;
  for (float x = -12.0f; x <= 12.0f; x += 1.37e-3f) xs.push_back(x);
  const auto n = static_cast<int64_t>(xs.size());
  for (const float up : {1.0f, -2.5f}) {
    std::vector<float> gu(xs), out(xs.size());
    gu.resize(2 * xs.size(), up);
    k::gelu_tanh_mul(gu.data(), 1, n, out.data());
    int checked = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double x = xs[i], z = 2.0 * c * (x + 0.044715 * x * x * x);
      const double ref = x / (1.0 + std::exp(-z)) * up;
      if (z > -87.0) {
        ASSERT_LE(std::abs(out[i] - ref), (1e-6 + 3e-7 * std::abs(z)) * std::abs(ref))
            << "x " << x << " up " << up;
        ++checked;
      } else {
        ASSERT_LE(std::abs(out[i]), 1e-36) << "x " << x;
      }
      // transformers' fp32 tanh form: the same up to its rounding (1 + tanh cancels: absolute)
      const float xf = xs[i], cf = static_cast<float>(c);
      const float tanh_form =
          0.5f * xf * (1.0f + std::tanh(cf * (xf + 0.044715f * xf * xf * xf))) * up;
      ASSERT_LE(std::abs(out[i] - tanh_form), 4e-6) << "x " << x << " up " << up;
    }
    EXPECT_GT(checked, static_cast<int>(xs.size()) / 2);
  }
}

TEST(GeluTanhMul, NonFiniteAndHugeInputs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // gate [NaN, 1e20, -1e20, -200], up [1, 3, 1, 1]; x^3 overflows to +-inf for +-1e20
  std::vector<float> gu{nan, 1e20f, -1e20f, -200.0f, 1.0f, 3.0f, 1.0f, 1.0f}, out(4);
  k::gelu_tanh_mul(gu.data(), 1, 4, out.data());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_FLOAT_EQ(out[1], 3e20f);       // gelu(x) = x for x >> 0
  EXPECT_LE(std::abs(out[2]), 2e-18f);  // ~0 for x << 0: 1.6e-38 |x| at the clamp
  EXPECT_LE(std::abs(out[3]), 1e-35f);
  EXPECT_EQ(k::sigmoid(inf), 1.0f);
  EXPECT_LT(k::sigmoid(-inf), 1e-37f);
  EXPECT_EQ(k::sigmoid(0.0f), 0.5f);
  EXPECT_TRUE(std::isnan(k::sigmoid(nan)));
}

TEST(Attention, ChunkedEqualsFull) {
  // Causality: queries processed in two calls (second with past) equal one call.
  const int64_t H = 2, Hkv = 1, hd = 8, T = 40, split = 23;
  auto q = randn(static_cast<size_t>(T * H * hd), 8);
  auto kk = randn(static_cast<size_t>(T * Hkv * hd), 9);
  auto vv = randn(static_cast<size_t>(T * Hkv * hd), 10);
  std::vector<float> full(q.size()), part(q.size()),
      s(static_cast<size_t>(k::attention_scratch_floats(T, T, H, Hkv, hd)));
  k::attention_causal(q.data(), H * hd, kk.data(), vv.data(), Hkv * hd, T, 0, H, Hkv, hd,
                      full.data(), H * hd, s.data());
  k::attention_causal(q.data(), H * hd, kk.data(), vv.data(), Hkv * hd, split, 0, H, Hkv, hd,
                      part.data(), H * hd, s.data());
  k::attention_causal(q.data() + split * H * hd, H * hd, kk.data(), vv.data(), Hkv * hd, T - split,
                      split, H, Hkv, hd, part.data() + split * H * hd, H * hd, s.data());
  for (size_t i = 0; i < full.size(); ++i) ASSERT_NEAR(full[i], part[i], 1e-5);
}

TEST(LogSoftmax, MatchesScalarAndIsShiftInvariant) {
  std::vector<float> lg{1.0f, 2.0f, 3.0f, 1000.0f, 1001.0f, 1002.0f};
  std::vector<int32_t> tgt{2, 0};
  std::vector<float> lp(2);
  k::log_softmax_gather(lg.data(), 2, 3, 3, tgt.data(), lp.data());
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(lp[0], 3.0 - lse, 1e-6);
  EXPECT_NEAR(lp[1], 1.0 - lse, 1e-5);  // large logits: no overflow
}

TEST(Argmax, FirstOnTies) {
  std::vector<float> x{1, 3, 3, 2};
  EXPECT_EQ(k::argmax(x.data(), 4), 1);
}

TEST(ExpNonpositive, RelativeErrorBelow3e7) {
  double worst = 0;
  for (float x = -87.0f; x <= 0.0f; x += 0.0013f) {
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(k::exp_nonpositive(x) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(k::exp_nonpositive(0.0f), 1.0f);
  EXPECT_LT(k::exp_nonpositive(-1000.0f), 1e-37f);  // clamped, finite, ~0
}

// C/G-Sparse's estimate: every causal score against a double-precision dot product, over head
// sizes on and off the vector width, row counts off the micro-kernel's 6, keys off the panel
// width, and rows that start after earlier keys; shapes outside the panels are errors.
TEST(CausalScoresF32, MatchesDoubleDotProducts) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t hd : {64, 40, 16, 7})
    for (auto [before, rows] : {std::pair<int64_t, int64_t>{0, 70}, {45, 13}, {100, 1}}) {
      const int64_t L = before + rows, ldk = hd + 3, P = k::KeyPanelsF32::panel_keys();
      const int64_t lds = (L + P - 1) / P * P + 5;
      std::vector<float> keys(static_cast<size_t>(L * ldk)), q(static_cast<size_t>(rows * hd));
      for (auto& x : keys) x = nd(rng);
      for (auto& x : q) x = nd(rng);
      const k::KeyPanelsF32 panels(keys.data(), ldk, L, hd);
      std::vector<float> S(static_cast<size_t>(rows * lds), NAN);
      k::causal_scores_f32(q.data(), rows, panels, before, S.data(), lds);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j <= before + r; ++j) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < hd; ++c) {
            ref += double{q[r * hd + c]} * keys[j * ldk + c];
            mag += std::abs(double{q[r * hd + c]} * keys[j * ldk + c]);
          }
          ASSERT_NEAR(S[r * lds + j], ref, 1e-6 * mag + 1e-7)
              << "hd " << hd << " before " << before << " row " << r << " key " << j;
        }
    }
  const std::vector<float> keys(64 * 8, 1.0f), q(8, 1.0f);
  const k::KeyPanelsF32 panels(keys.data(), 8, 64, 8);
  std::vector<float> S(1024);
  expect_error<socllm::ShapeError>(
      [&] { k::causal_scores_f32(q.data(), 1, panels, 64, S.data(), 128); }, "65 of 64 keys");
  expect_error<socllm::ShapeError>(
      [&] { k::causal_scores_f32(q.data(), 1, panels, 40, S.data(), 8); }, "lds 8");
  expect_error<socllm::ShapeError>([&] { k::KeyPanelsF32(keys.data(), 4, 64, 8); }, "row stride 4");
}
