// Sparse attention (seed 000): top-k, buckets, Eq. 3 ratios and the per-layer kernels against
// hand-computed cases and a scalar reference written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "attention/attention_scheme.h"
#include "core/core.h"
#include "expect_error.h"
#include "kernels/gemm_s8.h"
#include "kernels/kernels.h"
#include "kernels/sparse_attention.h"
#include "plan/plan.h"

namespace q = socllm::attention;
namespace k = socllm::kernels;
using socllm::InvalidArgument;
using socllm::Plan;
using socllm::ShapeError;

TEST(SparseAttention, TopkTiesGoToEarlierKeys) {
  const std::vector<float> s{1, 3, 3, 2, 3};
  std::vector<int32_t> idx(5);
  std::vector<float> buf;
  ASSERT_EQ(k::topk_indices(s.data(), 5, 2, idx.data(), buf), 2);
  EXPECT_EQ(idx[0], 1);  // the three 3s tie: keys 1 and 2, not 4
  EXPECT_EQ(idx[1], 2);
  ASSERT_EQ(k::topk_indices(s.data(), 5, 4, idx.data(), buf), 4);
  EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + 4), (std::vector<int32_t>{1, 2, 3, 4}));
  const std::vector<int32_t> si{-5, 7, 7, 0};
  std::vector<int32_t> ibuf;
  ASSERT_EQ(k::topk_indices(si.data(), 4, 3, idx.data(), ibuf), 3);
  EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(k::topk_indices(si.data(), 4, 9, idx.data(), ibuf), 4);  // k clamped to n
  EXPECT_EQ(k::topk_indices(si.data(), 4, 0, idx.data(), ibuf), 0);
}

// The top k by a full stable sort (descending value, ties by index), indices ascending.
template <class T>
std::vector<int32_t> reference_topk(const std::vector<T>& s, int64_t k) {
  std::vector<int32_t> order(s.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
  order.resize(static_cast<size_t>(std::clamp<int64_t>(k, 0, static_cast<int64_t>(s.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

// Long rows take the histogram selection: every length, k, tie density and extreme value agrees
// with the sort, for int32 scores and for floats (signed zeros tie, as they compare equal).
TEST(SparseAttention, TopkRadixPathEqualsStableSort) {
  std::mt19937 rng(7);
  std::vector<int32_t> idx;
  std::vector<float> fbuf;
  std::vector<int32_t> ibuf;
  for (int64_t n : {255, 256, 257, 1000, 4096}) {
    idx.resize(static_cast<size_t>(n));
    for (int distinct : {1, 3, 50, 1 << 30}) {
      std::uniform_int_distribution<int32_t> pick(-distinct, distinct);
      std::vector<int32_t> si(static_cast<size_t>(n));
      std::vector<float> sf(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        si[j] = pick(rng);
        sf[j] = distinct == 1 ? (j % 2 ? 0.0f : -0.0f) : static_cast<float>(si[j]) * 0.37f;
      }
      si[3] = INT32_MIN, si[5] = INT32_MAX;
      if (distinct > 3) sf[4] = -INFINITY, sf[6] = INFINITY;
      for (int64_t kk : {int64_t{1}, int64_t{2}, n / 5, n / 2, n - 1, n}) {
        const int64_t mi = k::topk_indices(si.data(), n, kk, idx.data(), ibuf);
        EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + mi), reference_topk(si, kk))
            << "int32 n " << n << " k " << kk << " distinct " << distinct;
        const int64_t mf = k::topk_indices(sf.data(), n, kk, idx.data(), fbuf);
        EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + mf), reference_topk(sf, kk))
            << "float n " << n << " k " << kk << " distinct " << distinct;
      }
    }
  }
}

TEST(SparseAttention, KeysKeptPerRow) {
  EXPECT_EQ(q::keys_kept(10, 0.2, 1), 2);
  EXPECT_EQ(q::keys_kept(11, 0.2, 1), 3);  // ceil(2.2)
  EXPECT_EQ(q::keys_kept(3, 0.2, 1), 1);   // ceil(0.6)
  EXPECT_EQ(q::keys_kept(3, 0.2, 8), 3);   // min_keys, capped by the visible keys
  EXPECT_EQ(q::keys_kept(100, 1.0, 1), 100);
  EXPECT_EQ(q::keys_kept(100, 0.0, 1), 1);
}

TEST(SparseAttention, BucketGridAndChoice) {
  const auto o9 = q::bucket_offsets(9);
  ASSERT_EQ(o9.size(), 9u);
  EXPECT_EQ(o9[0], (std::pair<int, int>{0, 0}));
  for (const auto& [a, b] : o9) EXPECT_TRUE(std::abs(a) <= 1 && std::abs(b) <= 1);
  const auto o5 = q::bucket_offsets(5);  // the origin and its four axis neighbours
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(std::abs(o5[i].first) + std::abs(o5[i].second), 1);
  EXPECT_EQ(q::bucket_offsets(25).back(), (std::pair<int, int>{2, 2}));
  expect_error<InvalidArgument>([] { q::bucket_offsets(0); }, "got 0");
  // λ̄ = (0.1, 0.2), σ = 0.5: the input (0.21, 0.09) is nearest <0.2, 0.1> = <λ̄Q/σ, λ̄K·σ>
  std::vector<float> bq, bk;
  for (const auto& [a, b] : o9) {
    bq.push_back(0.1f * static_cast<float>(std::pow(0.5, a)));
    bk.push_back(0.2f * static_cast<float>(std::pow(0.5, b)));
  }
  const auto i = q::nearest_bucket(0.21f, 0.09f, bq, bk);
  EXPECT_FLOAT_EQ(bq[i], 0.2f);
  EXPECT_FLOAT_EQ(bk[i], 0.1f);
  EXPECT_EQ(q::nearest_bucket(0.1f, 0.2f, bq, bk), 0);
}

TEST(SparseAttention, HeadRatiosFollowEq3) {
  // 2 layers x 2 heads; products c = h * l: {0.5*2, 1.5*2, 1*1, 0*1} = {1, 3, 1, 0}
  const std::vector<float> h{0.5f, 1.5f, 1.0f, -0.2f}, l{2.0f, 1.0f};
  // clamp to [min, max] of the positive products: c = {1, 3, 1, 1} (the head whose removal
  // helped gets the floor); ratio = 0.3 * 4 * c / 6 = {0.2, 0.6, 0.2, 0.2}
  auto r = q::head_keep_ratios(h, l, 2, 0.3, 1.0);
  EXPECT_NEAR(r[0], 0.2, 1e-12);
  EXPECT_NEAR(r[1], 0.6, 1e-12);
  EXPECT_NEAR(r[2], 0.2, 1e-12);
  EXPECT_NEAR(r[3], 0.2, 1e-12);
  // clamp at the 2/3 quantile of the positive products {1, 1, 3}: c = {1, 1, 1, 1}, uniform
  r = q::head_keep_ratios(h, l, 2, 0.3, 0.6);
  for (double x : r) EXPECT_NEAR(x, 0.3, 1e-12);
  // clamp 0.5: floor and cap are both the median of {1, 1, 3}, every head at keep
  r = q::head_keep_ratios(h, l, 2, 0.3, 0.5);
  for (double x : r) EXPECT_NEAR(x, 0.3, 1e-12);
  // below 0.5 the floor would pass the cap: refused
  expect_error<InvalidArgument>([&] { q::head_keep_ratios(h, l, 2, 0.3, 0.49); }, "0.49");
  // keep 0.6: 0.6 * 4 * 3/6 = 1.2 > 1 -> head 1 at 1, the other 1.4 shared 1:1:1
  r = q::head_keep_ratios(h, l, 2, 0.6, 1.0);
  EXPECT_NEAR(r[1], 1.0, 1e-12);
  EXPECT_NEAR(r[0], 1.4 / 3, 1e-12);
  EXPECT_NEAR(std::accumulate(r.begin(), r.end(), 0.0) / 4, 0.6, 1e-12);
  // keep 1: every head at 1
  r = q::head_keep_ratios(h, l, 2, 1.0, 0.95);
  for (double x : r) EXPECT_NEAR(x, 1.0, 1e-12);
  expect_error<ShapeError>([&] { q::head_keep_ratios(h, l, 3, 0.2, 1.0); }, "3 heads");
}

TEST(SparseAttention, SchemeParsingAndErrors) {
  auto s = q::AttentionScheme::parse("shadow-attn:keep=0.3,buckets=5");
  EXPECT_EQ(s.name(), "shadow-attn");
  EXPECT_DOUBLE_EQ(s.number("keep"), 0.3);
  EXPECT_EQ(s.integer("buckets"), 5);
  EXPECT_EQ(s.text("ratios"), "calibrated");  // shadow-attn's default
  EXPECT_EQ(s.integer("certified"), 0);       // defaults filled from the scheme's options
  EXPECT_EQ(q::AttentionScheme::parse("sparse").text("ratios"), "uniform");
  EXPECT_EQ(q::AttentionScheme::from_json(s.to_json()).to_json(), s.to_json());
  expect_error<InvalidArgument>([] { q::AttentionScheme::parse("sparse:keep=0"); }, "keep");
  expect_error<InvalidArgument>([] { q::AttentionScheme::parse("sparse:keep=1.5"); }, "1.5");
  expect_error<InvalidArgument>([] { q::AttentionScheme::parse("shadow-attn:buckets=0"); },
                                "buckets");
  expect_error<InvalidArgument>([] { q::AttentionScheme::parse("shadow-attn:step=-1"); }, "-1");
  expect_error<InvalidArgument>([] { q::AttentionScheme::parse("sparse:buckets=9"); },
                                "no option 'buckets'");
  expect_error<InvalidArgument>([] { q::AttentionScheme::parse("dense"); }, "'dense'");
  // in plans: JSON, text with routed options, and placement that cannot run it
  Plan p = Plan::parse("w8a8:attention=shadow-attn:keep=0.1,buckets=3");
  EXPECT_EQ(p.attention.integer("buckets"), 3);
  EXPECT_DOUBLE_EQ(p.attention.number("keep"), 0.1);
  EXPECT_TRUE(p.needs_calibration());
  EXPECT_EQ(Plan::from_json(p.to_json()).to_json(), p.to_json());
  EXPECT_FALSE(Plan::parse("fp32:attention=sparse").needs_calibration());
  EXPECT_EQ(Plan::parse("fp32:attention=npu-int8").at(socllm::OpClass::Attention).processor,
            socllm::soc::Processor::Npu);
  EXPECT_TRUE(Plan::parse("fp32:attention=gpu").attention.is_fp32());
  expect_error<InvalidArgument>([] { Plan::parse("fp32:keep=0.2"); }, "attention scheme");
  expect_error<InvalidArgument>(
      [] {
        Plan::from_json(
            {{"name", "fp32"}, {"attention", "sparse"}, {"placement", {{"attention", "npu"}}}});
      },
      "static NPU graph");
}

namespace {

struct Inputs {
  int64_t H = 4, G = 2, T = 37, past = 0, hd = 8;
  std::vector<float> q, kk, v;  // engine rows: q [T, H*hd], k/v [past+T, G*hd]
};

Inputs random_inputs(int64_t past, uint32_t seed) {
  Inputs in;
  in.past = past;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  in.q.resize(static_cast<size_t>(in.T * in.H * in.hd));
  in.kk.resize(static_cast<size_t>((past + in.T) * in.G * in.hd));
  in.v.resize(in.kk.size());
  for (auto* v : {&in.q, &in.kk, &in.v})
    for (float& x : *v) x = n(rng);
  return in;
}

// Scalar reference: softmax over the given keys of one (head, row), in double.
std::vector<double> ref_row(const Inputs& in, int64_t h, int64_t t,
                            const std::vector<int32_t>& keys) {
  const int64_t g = h / (in.H / in.G), ldkv = in.G * in.hd;
  std::vector<double> s, out(static_cast<size_t>(in.hd), 0.0);
  double mx = -INFINITY, sum = 0;
  for (int32_t j : keys) {
    double dot = 0;
    for (int64_t d = 0; d < in.hd; ++d)
      dot += double(in.q[t * in.H * in.hd + h * in.hd + d]) * in.kk[j * ldkv + g * in.hd + d];
    s.push_back(dot / std::sqrt(double(in.hd)));
    mx = std::max(mx, s.back());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const double p = std::exp(s[i] - mx);
    sum += p;
    for (int64_t d = 0; d < in.hd; ++d) out[d] += p * in.v[keys[i] * ldkv + g * in.hd + d];
  }
  for (double& x : out) x /= sum;
  return out;
}

std::vector<float> run(const q::AttentionScheme& s, const q::LayerConsts& c, const Inputs& in,
                       q::Trace* tr = nullptr) {
  std::vector<float> out(in.q.size());
  q::prefill_attention(s, c, in.q.data(), in.H * in.hd, in.kk.data(), in.v.data(), in.G * in.hd,
                       {in.T, in.past, in.H, in.G, in.hd}, out.data(), in.H * in.hd, tr);
  return out;
}

}  // namespace

TEST(SparseAttention, KeepOneEqualsFullAttentionForEveryKind) {
  for (int64_t past : {0, 29}) {
    const Inputs in = random_inputs(past, 7);
    const auto full = run(q::AttentionScheme{}, {}, in);
    for (const char* spec : {"sparse:keep=1", "block-sparse:keep=1,block=8",
                             "shadow-attn:keep=1,scales=dynamic,ratios=uniform"}) {
      const auto s = q::AttentionScheme::parse(spec);
      const auto got = run(s, q::uniform_layer_consts(s, in.H), in);
      for (size_t i = 0; i < full.size(); ++i) ASSERT_NEAR(got[i], full[i], 2e-6) << spec;
    }
  }
}

TEST(SparseAttention, SelectedKeysAreTheTopkOfTheEstimateAndAttentionIsExactOverThem) {
  const Inputs in = random_inputs(13, 3);
  const auto s = q::AttentionScheme::parse("sparse:keep=0.25");
  q::Trace tr;
  const auto out = run(s, q::uniform_layer_consts(s, in.H), in, &tr);
  const int64_t ldkv = in.G * in.hd;
  for (int64_t h = 0; h < in.H; ++h)
    for (int64_t t = 0; t < in.T; ++t) {
      const int64_t visible = in.past + t + 1, g = h / 2;
      const auto& keys = tr.keys[h * in.T + t];
      ASSERT_EQ(static_cast<int64_t>(keys.size()), q::keys_kept(visible, 0.25, 1));
      // every selected score >= every unselected one (fp32 estimate)
      std::vector<double> sc(static_cast<size_t>(visible));
      for (int64_t j = 0; j < visible; ++j)
        for (int64_t d = 0; d < in.hd; ++d)
          sc[j] += double(in.q[t * in.H * in.hd + h * in.hd + d]) * in.kk[j * ldkv + g * in.hd + d];
      double worst_in = INFINITY, best_out = -INFINITY;
      std::vector<bool> sel(static_cast<size_t>(visible));
      for (int32_t j : keys) sel[j] = true, worst_in = std::min(worst_in, sc[j]);
      for (int64_t j = 0; j < visible; ++j)
        if (!sel[j]) best_out = std::max(best_out, sc[j]);
      EXPECT_GE(worst_in, best_out - 1e-5);
      const auto ref = ref_row(in, h, t, keys);
      for (int64_t d = 0; d < in.hd; ++d)
        ASSERT_NEAR(out[t * in.H * in.hd + h * in.hd + d], ref[d], 1e-5);
    }
}

TEST(SparseAttention, ShadowAttnPicksTheNearestBucketAndRanksByInt8Scores) {
  const Inputs in = random_inputs(0, 11);
  auto s = q::AttentionScheme::parse("shadow-attn:keep=0.2,buckets=9,ratios=uniform");
  q::LayerConsts c = q::uniform_layer_consts(s, in.H);
  c.buckets = 9;
  for (int64_t h = 0; h < in.H; ++h)
    for (const auto& [a, b] : q::bucket_offsets(9)) {
      c.bucket_q.push_back(0.02f * static_cast<float>(std::pow(0.5, a)));
      c.bucket_k.push_back(0.03f * static_cast<float>(std::pow(0.5, b)));
    }
  q::Trace tr;
  run(s, c, in, &tr);
  const int64_t ldkv = in.G * in.hd;
  for (int64_t h = 0; h < in.H; ++h) {
    const int64_t b = tr.bucket[h];
    ASSERT_EQ(b, q::nearest_bucket(tr.input_q[h], tr.input_k[h], {c.bucket_q.data() + h * 9, 9},
                                   {c.bucket_k.data() + h * 9, 9}));
    // the selection of the last row equals top-k of the int8 scores computed here
    const int64_t t = in.T - 1, g = h / 2;
    const float bq = c.bucket_q[h * 9 + b], bk = c.bucket_k[h * 9 + b];
    auto q8 = [](float x, float s) {
      return static_cast<int32_t>(std::clamp(std::nearbyint(x / s), -127.0f, 127.0f));
    };
    std::vector<int32_t> sc(static_cast<size_t>(in.T)), idx(sc.size()), buf;
    for (int64_t j = 0; j < in.T; ++j)
      for (int64_t d = 0; d < in.hd; ++d)
        sc[j] += q8(in.q[t * in.H * in.hd + h * in.hd + d], bq) *
                 q8(in.kk[j * ldkv + g * in.hd + d], bk);
    const int64_t n = k::topk_indices(sc.data(), in.T, q::keys_kept(in.T, 0.2, 1), idx.data(), buf);
    EXPECT_EQ(tr.keys[h * in.T + t], std::vector<int32_t>(idx.begin(), idx.begin() + n));
  }
}

TEST(SparseAttention, ChunkedEqualsWholeAndNpuInt8MatchesScalarReference) {
  // a chunk's queries against all keys so far equal the same rows of the whole prompt
  const Inputs whole = random_inputs(0, 5);
  Inputs tail = whole;
  const int64_t split = 20;
  tail.past = split;
  tail.T = whole.T - split;
  tail.q.assign(whole.q.begin() + split * whole.H * whole.hd, whole.q.end());
  // (shadow-attn with one static bucket: with several, a chunk's own λQ picks its bucket)
  for (const char* spec : {"sparse:keep=0.3", "block-sparse:keep=0.5,block=8",
                           "shadow-attn:keep=0.3,buckets=1,ratios=uniform"}) {
    const auto s = q::AttentionScheme::parse(spec);
    auto c = q::uniform_layer_consts(s, whole.H);
    c.buckets = 1;
    c.bucket_q.assign(static_cast<size_t>(whole.H), 0.02f);
    c.bucket_k.assign(static_cast<size_t>(whole.H), 0.03f);
    const auto a = run(s, c, whole);
    const auto b = run(s, c, tail);
    for (size_t i = 0; i < b.size(); ++i)
      ASSERT_NEAR(b[i], a[split * whole.H * whole.hd + i], 1e-6) << spec;
  }
  // npu-int8: int8 Q·K, fp32 softmax, fp16 then uint8 P, exact P·V
  const auto s = q::AttentionScheme::parse("npu-int8");
  q::LayerConsts c;
  c.static_q = 0.03f, c.static_k = 0.025f, c.static_v = 0.02f;
  const auto out = run(s, c, whole);
  const int64_t ldkv = whole.G * whole.hd, hd = whole.hd;
  auto q8 = [](float x, float sc) {
    return static_cast<int32_t>(std::clamp(std::nearbyint(x / sc), -127.0f, 127.0f));
  };
  for (int64_t h = 0; h < whole.H; ++h)
    for (int64_t t = 0; t < whole.T; t += 6) {
      const int64_t g = h / 2;
      std::vector<float> p(static_cast<size_t>(t + 1));
      float mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        int32_t acc = 0;
        for (int64_t d = 0; d < hd; ++d)
          acc += q8(whole.q[t * whole.H * hd + h * hd + d], c.static_q) *
                 q8(whole.kk[j * ldkv + g * hd + d], c.static_k);
        p[j] = static_cast<float>(acc) * c.static_q * c.static_k / std::sqrt(float(hd));
        mx = std::max(mx, p[j]);
      }
      for (auto& x : p) sum += x = std::exp(x - mx);
      for (int64_t d = 0; d < hd; ++d) {
        int32_t acc = 0;
        for (int64_t j = 0; j <= t; ++j) {
          const float pj = static_cast<float>(static_cast<_Float16>(p[j] / sum));
          acc += static_cast<int32_t>(std::nearbyint(pj * 255.0f)) *
                 q8(whole.v[j * ldkv + g * hd + d], c.static_v);
        }
        // the kernel's exp is a polynomial (rel. error < 2e-7): a uint8 P may round the other
        // way on a tie, so allow one step of P for one key
        EXPECT_NEAR(out[t * whole.H * hd + h * hd + d], acc * c.static_v / 255.0f,
                    127 * c.static_v / 255.0f + 1e-6);
      }
    }
  expect_error<InvalidArgument>([&] { run(s, {}, whole); }, "qk-scales");
}

// The hinted top-k (consecutive rows passing a TopkHint) against the sort, on rows that grow by
// one key like a causal block's: correlated rows (the band path), unrelated rows and hints far
// off (widened bands, then the whole-row selection), ties, signed zeros and infinities.
TEST(SparseAttention, HintedTopkEqualsStableSortOnEveryPath) {
  std::mt19937 rng(11);
  int64_t band_rows = 0, fallback_rows = 0;
  for (int distinct : {2, 40, 1 << 30})
    for (bool correlated : {true, false}) {
      std::uniform_int_distribution<int32_t> pick(-distinct, distinct);
      std::vector<int32_t> base(1200);
      for (auto& x : base) x = pick(rng);
      k::TopkHint ih, fh;
      for (int64_t n = 40; n <= 1200; n += 7) {  // rows below and above kHintedMinN (64)
        std::vector<int32_t> si(base.begin(), base.begin() + n);
        if (!correlated)
          for (auto& x : si) x = pick(rng);
        std::vector<float> sf(si.size());
        for (int64_t j = 0; j < n; ++j)
          sf[j] = distinct == 2 && j % 3 == 0 ? -0.0f : static_cast<float>(si[j]) * 0.37f;
        if (n % 5 == 0) si[n / 2] = INT32_MIN, si[n / 3] = INT32_MAX, sf[n / 2] = -INFINITY;
        if (n % 11 == 0) {  // a hint from elsewhere: the band misses on both sides
          const double far = n % 2 ? 1e12 : -1e12;
          ih = {true, far, 0, 1, 0};
          fh = {true, -far, 0, 1, 0};
        }
        for (int64_t kk : {n / 5, n / 2, n - 3}) {
          std::vector<int32_t> idx(static_cast<size_t>(kk), -1);
          const int64_t mi = k::topk_indices(si.data(), n, kk, idx.data(), ih);
          ASSERT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + mi), reference_topk(si, kk))
              << "int32 n " << n << " k " << kk << " distinct " << distinct;
          (ih.valid ? band_rows : fallback_rows) += 1;
          std::fill(idx.begin(), idx.end(), -1);
          const int64_t mf = k::topk_indices(sf.data(), n, kk, idx.data(), fh);
          ASSERT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + mf), reference_topk(sf, kk))
              << "float n " << n << " k " << kk << " distinct " << distinct;
        }
      }
    }
  // both paths ran: the band (the hint stays valid) and the whole-row fallback (it is dropped)
  EXPECT_GT(band_rows, 100);
  EXPECT_GT(fallback_rows, 0);
}

namespace {
// Queries and keys like a prefill's: consecutive queries close to each other, keys from a few
// directions, so rows' scores shift and scale from row to row as the fused band expects.
struct FusedCase {
  int64_t T = 0, L = 0, hd = 0;
  std::vector<int8_t> q8, k8;  // [T, hd], [L, hd]
  std::vector<int32_t> S;      // [T, L] exact scores
};
FusedCase fused_case(int64_t T, int64_t L, int64_t hd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  FusedCase c{T, L, hd, {}, {}, {}};
  std::vector<double> drift(static_cast<size_t>(hd));
  for (auto& x : drift) x = nd(rng);
  const auto clamp8 = [](double x) {
    return static_cast<int8_t>(std::clamp(std::lround(x), -127L, 127L));
  };
  for (int64_t i = 0; i < T; ++i) {
    const double scale = i == T / 2 ? 6.0 : 1.0;  // one query far off: its band misses
    for (int64_t d = 0; d < hd; ++d) {
      drift[d] = 0.97 * drift[d] + 0.25 * nd(rng);
      c.q8.push_back(clamp8(scale * 12 * (drift[d] + 0.3 * nd(rng))));
    }
  }
  for (int64_t j = 0; j < L; ++j)
    for (int64_t d = 0; d < hd; ++d) c.k8.push_back(clamp8(20 * nd(rng) + (d % 3 == 0 ? 15 : 0)));
  c.S.resize(static_cast<size_t>(T * L));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < L; ++j) {
      int32_t dot = 0;
      for (int64_t d = 0; d < hd; ++d) dot += int32_t{c.q8[i * hd + d]} * c.k8[j * hd + d];
      c.S[static_cast<size_t>(i * L + j)] = dot;
    }
  return c;
}
}  // namespace

// The top-k fused into the estimate equals the stable sort on every row: on every INT8 GEMM path
// producing the tiles, causal and windowed rows, rows too short for a band, a query whose band
// misses, and rows whose given mean is far off on either side (a band above every key: rescored;
// below: the k-th ranked among the keys above the band).
TEST(SparseAttention, FusedTopkEqualsStableSortOnEveryPath) {
  const int64_t T = 700, hd = 40, chunk = 24;
  const FusedCase c = fused_case(T, T, hd, 5);
  const k::KeyPrefixSums sums(c.k8.data(), hd, T, hd);
  for (k::Isa isa : k::supported_isas())
    for (int64_t window : {int64_t{0}, int64_t{300}}) {
      std::vector<k::PackedWeightsS8> tiles;
      for (int64_t c0 = 0; c0 < T; c0 += k::kFusedTileKeys)
        tiles.emplace_back(c.k8.data() + c0 * hd, hd, std::min(k::kFusedTileKeys, T - c0), hd, isa);
      k::TopkHint hint;
      k::FusedTopkStats stats;
      for (int64_t r0 = 0; r0 < T; r0 += chunk) {
        const int64_t n = std::min(chunk, T - r0);
        std::vector<k::FusedTopkRow> spec;
        for (int64_t i = r0; i < r0 + n; ++i) {
          const int64_t lo = k::first_visible_key(i, window), cnt = i + 1 - lo;
          double qn = 0;
          for (int64_t d = 0; d < hd; ++d) qn += double{1} * c.q8[i * hd + d] * c.q8[i * hd + d];
          double mean = sums.mean_score(c.q8.data() + i * hd, lo, i + 1);
          if (i % 97 == 50) mean += 1e7;  // a band above every key
          if (i % 97 == 80) mean -= 1e7;  // a band below every key
          spec.push_back({lo, cnt, std::max<int64_t>(1, cnt / 5), mean, std::sqrt(qn)});
        }
        const auto tile = [&](int64_t ra, int64_t rb, int64_t key0, int64_t cols, int32_t* S,
                              int64_t lds) {
          k::gemm_s8s8s32_packed_cols(c.q8.data() + (r0 + ra) * hd, hd,
                                      tiles[key0 / k::kFusedTileKeys], S, lds, rb - ra, cols, isa);
        };
        const auto row_scores = [&](int64_t r, int32_t* s) {
          const int64_t i = r0 + r;
          std::copy_n(c.S.data() + i * T + spec[r].lo, spec[r].n, s);
        };
        std::vector<int32_t> idx(static_cast<size_t>(n * T), -1);
        std::vector<int64_t> offs(static_cast<size_t>(n + 1));
        k::fused_topk_rows(spec.data(), n, tile, row_scores, hint, idx.data(), offs.data(), &stats);
        for (int64_t r = 0; r < n; ++r) {
          const auto& row = spec[static_cast<size_t>(r)];
          const std::vector<int32_t> s(c.S.begin() + (r0 + r) * T + row.lo,
                                       c.S.begin() + (r0 + r) * T + row.lo + row.n);
          ASSERT_EQ(std::vector<int32_t>(idx.begin() + offs[r], idx.begin() + offs[r + 1]),
                    reference_topk(s, row.k))
              << k::isa_name(isa) << " window " << window << " row " << r0 + r;
        }
      }
      EXPECT_GT(stats.fused_rows, T / 2) << k::isa_name(isa);
      EXPECT_GT(stats.missed_rows, 0) << k::isa_name(isa);
      EXPECT_GT(stats.rescored_rows, 0) << k::isa_name(isa);  // the short rows
    }
}

// Float scores (C/G-Sparse's kind): ties, signed zeros and infinities rank as the sort does.
TEST(SparseAttention, FusedTopkFloatScoresEqualStableSort) {
  const int64_t T = 400, hd = 16;
  const FusedCase c = fused_case(T, T, hd, 9);
  std::vector<float> S(c.S.size());
  for (size_t j = 0; j < S.size(); ++j)
    S[j] = c.S[j] % 7 == 0 ? -0.0f : static_cast<float>(c.S[j] / 64) * 0.37f;  // many ties
  S[static_cast<size_t>(300 * T + 10)] = INFINITY;
  S[static_cast<size_t>(301 * T + 11)] = -INFINITY;
  const k::KeyPrefixSums sums(c.k8.data(), hd, T, hd);
  k::TopkHint hint;
  k::FusedTopkStats stats;
  for (int64_t r0 = 0; r0 < T; r0 += 24) {
    const int64_t n = std::min<int64_t>(24, T - r0);
    std::vector<k::FusedTopkRow> spec;
    for (int64_t i = r0; i < r0 + n; ++i) {
      double qn = 0;
      for (int64_t d = 0; d < hd; ++d) qn += double{1} * c.q8[i * hd + d] * c.q8[i * hd + d];
      spec.push_back({0, i + 1, (i + 1) / 3,
                      sums.mean_score(c.q8.data() + i * hd, 0, i + 1) * 0.37 / 64, std::sqrt(qn)});
    }
    const auto tile = [&](int64_t ra, int64_t rb, int64_t key0, int64_t cols, float* St,
                          int64_t lds) {
      for (int64_t r = ra; r < rb; ++r)
        std::copy_n(S.data() + (r0 + r) * T + key0, cols, St + (r - ra) * lds);
    };
    const auto row_scores = [&](int64_t r, float* s) {
      std::copy_n(S.data() + (r0 + r) * T, spec[r].n, s);
    };
    std::vector<int32_t> idx(static_cast<size_t>(n * T), -1);
    std::vector<int64_t> offs(static_cast<size_t>(n + 1));
    k::fused_topk_rows(spec.data(), n, tile, row_scores, hint, idx.data(), offs.data(), &stats);
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<float> s(S.begin() + (r0 + r) * T, S.begin() + (r0 + r) * T + r0 + r + 1);
      ASSERT_EQ(std::vector<int32_t>(idx.begin() + offs[r], idx.begin() + offs[r + 1]),
                reference_topk(s, spec[r].k))
          << "row " << r0 + r;
    }
  }
  EXPECT_GT(stats.fused_rows, T / 2);
}

// The mean INT8 score from prefix sums against the sum over the keys; ranges outside are errors.
TEST(SparseAttention, KeyPrefixSumsMeanEqualsBruteForce) {
  const FusedCase c = fused_case(3, 300, 24, 3);
  const k::KeyPrefixSums sums(c.k8.data(), 24, 300, 24);
  EXPECT_EQ(sums.keys(), 300);
  for (int64_t i = 0; i < 3; ++i)
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 300}, {17, 18}, {5, 260}}) {
      int64_t sum = 0;
      for (int64_t j = lo; j < hi; ++j) sum += c.S[static_cast<size_t>(i * 300 + j)];
      EXPECT_DOUBLE_EQ(sums.mean_score(c.q8.data() + i * 24, lo, hi),
                       static_cast<double>(sum) / static_cast<double>(hi - lo));
    }
  expect_error<ShapeError>([&] { sums.mean_score(c.q8.data(), 5, 5); }, "keys [5, 5) of 300");
  expect_error<ShapeError>([&] { sums.mean_score(c.q8.data(), 0, 301); }, "of 300");
  expect_error<ShapeError>([&] { k::KeyPrefixSums(c.k8.data(), 10, 300, 24); }, "row stride 10");
}

namespace {
// attend_selected_rows' result by its definition, in double: per row the softmax of
// scale * score over the row's keys, times V.
std::vector<double> reference_attention_rows(const std::vector<float>& q,
                                             const std::vector<float>& kv, int64_t ldkv,
                                             int64_t v_off, int64_t hd,
                                             const std::vector<std::vector<int32_t>>& keys,
                                             const std::vector<float>* scores, int64_t lds,
                                             float scale) {
  std::vector<double> out;
  for (size_t r = 0; r < keys.size(); ++r) {
    std::vector<double> s;
    for (int32_t j : keys[r]) {
      double d = 0;
      if (scores) {
        d = (*scores)[r * lds + j];
      } else {
        for (int64_t c = 0; c < hd; ++c) d += double{q[r * hd + c]} * kv[j * ldkv + c];
      }
      s.push_back(d * scale);
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int64_t c = 0; c < hd; ++c) {
      double o = 0;
      for (size_t t = 0; t < s.size(); ++t) o += s[t] * kv[keys[r][t] * ldkv + v_off + c];
      out.push_back(o / sum);
    }
  }
  return out;
}
}  // namespace

// The blocked gather-attention kernel (rows walked together over key tiles with an online
// softmax) against the definition: head sizes on the vector paths (32, 64, 128: a register's
// worth of keys summed at once; 256: four at once) and off them (40), keys spanning several
// tiles, rows with one key, computed and given scores.
TEST(SparseAttention, BlockedGatherAttentionEqualsReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (int64_t hd : {32, 64, 128, 256, 40})
    for (int given : {0, 1, 2}) {  // computed, by key, by kept pair
      const bool given_scores = given > 0;
      const int64_t L = 1100, rows = 9, ldkv = 2 * hd + 8;  // K then V in each row, padded
      std::vector<float> kv(static_cast<size_t>(L * ldkv)), q(static_cast<size_t>(rows * hd));
      for (auto& x : kv) x = nd(rng);
      for (auto& x : q) x = nd(rng);
      std::vector<std::vector<int32_t>> keys(rows);
      std::vector<int32_t> idx;
      std::vector<int64_t> offs{0};
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t visible = r == 0 ? 1 : L - 13 * r;
        for (int32_t j = 0; j < visible; ++j)
          if (r == 0 || rng() % 5 == 0 || j == visible - 1) keys[r].push_back(j);
        idx.insert(idx.end(), keys[r].begin(), keys[r].end());
        offs.push_back(static_cast<int64_t>(idx.size()));
      }
      std::vector<float> scores(static_cast<size_t>(rows * L));
      for (auto& x : scores) x = nd(rng) * 4.0f;
      std::vector<float> pair_scores;
      for (int64_t r = 0; r < rows; ++r)
        for (int32_t j : keys[r]) pair_scores.push_back(scores[r * L + j]);
      const float scale = 0.125f;
      std::vector<float> out(static_cast<size_t>(rows * (hd + 3)), NAN);
      k::attend_selected_rows(q.data(), hd, kv.data(), kv.data() + hd, ldkv, hd, idx.data(),
                              offs.data(), rows, scale,
                              given == 0   ? nullptr
                              : given == 1 ? scores.data()
                                           : pair_scores.data(),
                              L, out.data(), hd + 3, given == 2);
      const auto ref = reference_attention_rows(q, kv, ldkv, hd, hd, keys,
                                                given_scores ? &scores : nullptr, L, scale);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < hd; ++c)
          ASSERT_NEAR(out[r * (hd + 3) + c], ref[r * hd + c],
                      2e-5 * (1 + std::abs(ref[r * hd + c])))
              << "hd " << hd << " row " << r << " dim " << c << " given scores " << given;
    }
}
