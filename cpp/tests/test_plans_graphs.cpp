// Plans, prepared linears, static graphs, the chunk-sharing cache and calibration statistics,
// checked against hand-computed cases and integer arithmetic written out here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "block/block.h"
#include "calibration/calibration.h"
#include "core/core.h"
#include "npu/static_graph.h"
#include "plan/plan.h"
#include "quant/linear_scheme.h"
#include "quant/shadow_outlier.h"

using namespace socllm;
namespace q = socllm::quant;

namespace {

ModelConfig tiny_config(int64_t layers = 2) {
  return ModelConfig::from_json({{"arch", "llama"},
                                 {"vocab_size", 10},
                                 {"d_model", 8},
                                 {"n_layers", layers},
                                 {"n_heads", 2},
                                 {"n_kv_heads", 1},
                                 {"d_ff", 16},
                                 {"context_length", 64}});
}

// Qwen1.5-1.8B's shapes (python/socllm/configs/qwen1.5-1.8b.json, from its public model card).
ModelConfig qwen15_18b() {
  return ModelConfig::from_json({{"arch", "qwen2"},
                                 {"vocab_size", 151936},
                                 {"d_model", 2048},
                                 {"n_layers", 24},
                                 {"n_heads", 16},
                                 {"n_kv_heads", 16},
                                 {"head_dim", 128},
                                 {"d_ff", 5504},
                                 {"context_length", 32768},
                                 {"qkv_bias", true}});
}

int8_t rne_sat(double v) {  // round half to even, saturate to int8
  const double r = std::nearbyint(v);
  return static_cast<int8_t>(std::max(-128.0, std::min(127.0, r)));
}

}  // namespace

TEST(Plan, PresetsRoundTripThroughJson) {
  for (const std::string& name : Plan::known()) {
    if (name == "custom") continue;
    const Plan p = Plan::from_name(name);
    const Plan back = Plan::from_json(p.to_json());
    EXPECT_EQ(back.to_json(), p.to_json()) << name;
    EXPECT_FALSE(Plan::describe(name).empty()) << name;
  }
}

TEST(Plan, CalibrationNeedsFollowTheScheme) {
  EXPECT_FALSE(Plan::from_name("fp32").needs_calibration());
  EXPECT_TRUE(Plan::from_name("w8a8").needs_calibration());         // static activation scale
  EXPECT_TRUE(Plan::from_name("smoothquant").needs_calibration());  // smoothing factors
  EXPECT_FALSE(Plan::from_name("llm-int8").needs_calibration());    // dynamic per row
  EXPECT_FALSE(Plan::from_name("w4a16").needs_calibration());
  EXPECT_EQ(Plan::from_name("w8a8").linear.activations, q::ActFormat::Int8StaticPerTensor);
  EXPECT_EQ(Plan::from_name("w8a8").linear.weight_granularity, q::Granularity::PerTensor);
}

TEST(Plan, OptionsAndChunkLength) {
  const Plan p = Plan::parse("smoothquant:alpha=0.8,chunk_len=256");
  ASSERT_TRUE(p.linear.smooth_alpha.has_value());
  EXPECT_DOUBLE_EQ(*p.linear.smooth_alpha, 0.8);
  EXPECT_EQ(p.chunk_len, 256);
  EXPECT_DOUBLE_EQ(*Plan::parse("llm-int8").linear.outlier_threshold, 6.0);
  EXPECT_EQ(Plan::parse("w4-group:group_size=64").linear.group_size, 64);
}

TEST(Plan, BadPlansAreTypedErrors) {
  EXPECT_THROW(Plan::parse("smoothquant:alpha=1.5"), InvalidArgument);
  EXPECT_THROW(Plan::parse("smoothquant:beta=1"), InvalidArgument);
  EXPECT_THROW(Plan::parse("w8a8:chunk_len=-1"), InvalidArgument);
  EXPECT_THROW(Plan::parse("{not json"), InvalidArgument);
  nlohmann::json custom = {{"name", "custom"}, {"ops", {{"linear", {{"activations", "int7"}}}}}};
  EXPECT_THROW(Plan::from_json(custom), InvalidArgument);
  custom["ops"] = {{"convolution", "fp32"}};
  EXPECT_THROW(Plan::from_json(custom), InvalidArgument);
  EXPECT_THROW(Plan::from_json({{"name", "custom"}}), InvalidArgument);
}

TEST(PreparedLinear, W8A8EqualsIntegerArithmetic) {
  // y = s_x * s_w * sum_k q(x)_k q(W)_nk + b with a static per-tensor activation scale from the
  // calibration max and a per-tensor weight scale (llm.npu's W8A8 NPU baseline).
  const int64_t out = 3, in = 5, rows = 4;
  std::vector<float> W(out * in), b{0.5f, -1.0f, 0.25f}, x(rows * in);
  for (int64_t i = 0; i < out * in; ++i) W[i] = std::sin(0.7 * i) * (i % 4 == 0 ? 2.0 : 0.5);
  for (int64_t i = 0; i < rows * in; ++i) x[i] = std::cos(1.3 * i) * 3.0;
  x[7] = 9.0f;    // beyond the calibrated range: saturates at 127
  x[13] = -9.0f;  // and at -128
  const std::vector<float> absmax{3.0f, 2.5f, 3.0f, 1.0f, 2.0f};

  q::LinearScheme s = Plan::from_name("w8a8").linear;
  q::PreparedLinear lin(W.data(), out, in, b.data(), s, absmax);
  const double sx = 3.0 / 127.0;
  EXPECT_FLOAT_EQ(lin.static_act_scale(), static_cast<float>(sx));
  double wmax = 0;
  for (float w : W) wmax = std::max(wmax, std::abs(double(w)));
  const double sw = static_cast<float>(wmax) / 127.0f;

  std::vector<float> y(rows * out);
  lin.forward(x.data(), rows, y.data(), out, false, {});
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < out; ++n) {
      int64_t acc = 0;
      for (int64_t k = 0; k < in; ++k)
        acc += int64_t{rne_sat(x[m * in + k] / static_cast<float>(sx))} *
               rne_sat(W[n * in + k] / static_cast<float>(sw));
      const double want =
          double(acc) * double(static_cast<float>(sx)) * double(static_cast<float>(sw)) + b[n];
      EXPECT_NEAR(y[m * out + n], want, 1e-5 * std::max(1.0, std::abs(want))) << m << "," << n;
    }
  EXPECT_EQ(lin.weight_bytes(), out * in + 4 + out * 4);  // int8 W, one fp32 scale, fp32 bias
}

TEST(PreparedLinear, LlmInt8OutlierColumnsRunInFloatPerSegment) {
  // Column 1 exceeds the threshold only in segment [0, 2): there it is exact float; in
  // segment [2, 4) it is quantized with the rest. Padding row 4 never changes rows 0-3.
  const int64_t out = 2, in = 3;
  std::vector<float> W{1.0f, 0.5f, -0.25f, -1.0f, 2.0f, 0.75f};
  std::vector<float> x{0.1f,  8.0f,  -0.3f,   // row 0: outlier in column 1
                       0.2f,  0.4f,  0.6f,    // row 1
                       0.5f,  -0.5f, 0.25f,   // row 2
                       1.0f,  0.3f,  -0.2f,   // row 3
                       100.f, 100.f, 100.f};  // row 4: padding
  q::LinearScheme s = Plan::from_name("llm-int8").linear;
  q::PreparedLinear lin(W.data(), out, in, nullptr, s, std::span<const float>{});
  const std::vector<q::RowSegment> segs{{0, 2}, {2, 4}};
  std::vector<float> y(5 * out), y4(4 * out);
  lin.forward(x.data(), 5, y.data(), out, false, segs);
  lin.forward(x.data(), 4, y4.data(), out, false, segs);
  for (int i = 0; i < 4 * out; ++i) EXPECT_EQ(y[i], y4[i]);

  // Row 0 by hand: column 1 in float (8 * W[n,1]); columns 0, 2 per-row int8 with the row's
  // absmax over the non-outlier columns (0.3), weights per-channel int8.
  const float sxf = 0.3f / 127.0f;
  for (int64_t n = 0; n < out; ++n) {
    const float* w = W.data() + n * in;
    const float swf = std::max({std::abs(w[0]), std::abs(w[1]), std::abs(w[2])}) / 127.0f;
    const int64_t acc = int64_t{rne_sat(0.1f / sxf)} * rne_sat(w[0] / swf) +
                        int64_t{rne_sat(-0.3f / sxf)} * rne_sat(w[2] / swf);
    const double want = double(acc) * sxf * swf + 8.0 * w[1];
    EXPECT_NEAR(y[n], want, 1e-5) << n;
  }
}

TEST(PreparedLinear, MissingOrForeignCalibrationIsAnError) {
  std::vector<float> W(6, 1.0f);
  const q::LinearScheme s = Plan::from_name("w8a8").linear;
  EXPECT_THROW(q::PreparedLinear(W.data(), 2, 3, nullptr, s, std::span<const float>{}), ShapeError);
  const std::vector<float> wrong(4, 1.0f), nan{1.0f, NAN, 1.0f}, zero(3, 0.0f);
  EXPECT_THROW(q::PreparedLinear(W.data(), 2, 3, nullptr, s, wrong), ShapeError);
  EXPECT_THROW(q::PreparedLinear(W.data(), 2, 3, nullptr, s, nan), InvalidArgument);
  EXPECT_THROW(q::PreparedLinear(W.data(), 2, 3, nullptr, s, zero), InvalidArgument);
}

TEST(StaticGraph, RunsOnlyOnItsShape) {
  const ModelConfig c = tiny_config();
  const npu::StaticGraph g =
      describe_subgraph(c, Plan::from_name("w8a8"), npu::SubgraphKind::AttnIn, 0, 16, -1);
  EXPECT_EQ(g.in_cols, c.d_model);
  EXPECT_EQ(g.out_cols, c.q_dim() + 2 * c.kv_dim());
  EXPECT_NO_THROW(g.check_input(16, c.d_model));
  EXPECT_THROW(g.check_input(15, c.d_model), ShapeError);
  EXPECT_THROW(g.check_input(16, c.d_model + 1), ShapeError);
}

TEST(GraphCache, SharedGraphsAreBuiltOnceAttentionPerChunk) {
  const ModelConfig c = tiny_config(1);
  npu::GraphCache cache(/*sharing=*/true);
  for (int64_t chunk = 0; chunk < 3; ++chunk)
    for (int k = 0; k < npu::kSubgraphsPerLayer; ++k)
      cache.acquire(describe_subgraph(c, Plan::from_name("w8a8"), static_cast<npu::SubgraphKind>(k),
                                      0, 8, chunk));
  const npu::GraphCacheStats s = cache.stats();
  EXPECT_EQ(s.requests, 18);
  EXPECT_EQ(s.built_shared, 5);
  EXPECT_EQ(s.built_per_chunk, 3);
  EXPECT_EQ(s.built, 8);
  EXPECT_EQ(s.reused, 10);
  EXPECT_EQ(static_cast<int64_t>(cache.events().size()), s.built);

  npu::GraphCache naive(/*sharing=*/false);
  for (int64_t chunk = 0; chunk < 3; ++chunk)
    naive.acquire(
        describe_subgraph(c, Plan::from_name("w8a8"), npu::SubgraphKind::Down, 0, 8, chunk));
  const int64_t down_bytes =
      describe_subgraph(c, Plan::from_name("w8a8"), npu::SubgraphKind::Down, 0, 8, 0).weight_bytes;
  // int8 weights, 1 byte per parameter and one fp32 per-tensor scale, no norm
  EXPECT_EQ(down_bytes, c.d_ff * c.d_model + 4);
  EXPECT_EQ(naive.stats().built, 3);
  EXPECT_EQ(naive.stats().weight_bytes, 3 * down_bytes);
}

TEST(GraphCache, Qwen15CensusMatchesThePaper) {
  // seed 001 §3.2: 120 of the 144 subgraphs of one chunk of Qwen1.5-1.8B are shareable.
  const ModelConfig c = qwen15_18b();
  const auto one = graph_census(c, Plan::from_name("w8a8"), 256, 256, true);
  EXPECT_EQ(one.built, 144);
  EXPECT_EQ(one.built_shared, 120);
  const auto shared = graph_census(c, Plan::from_name("w8a8"), 1024, 256, true);
  const auto naive = graph_census(c, Plan::from_name("w8a8"), 1024, 256, false);
  EXPECT_EQ(shared.built, 120 + 4 * 24);
  EXPECT_EQ(naive.built, 4 * 144);
  EXPECT_LT(shared.weight_bytes * 3, naive.weight_bytes + 1);  // weights held once, not 4x
  EXPECT_THROW(graph_census(c, Plan::from_name("w8a8"), 1024, 0, true), InvalidArgument);
}

TEST(Calibration, RunningMaxAndModelCheck) {
  const ModelConfig c = tiny_config(2);
  Calibration cal = Calibration::empty_for(c);
  std::vector<float> x(2 * c.d_model, 0.0f);
  x[3] = -4.0f;
  x[c.d_model + 3] = 2.0f;
  x[c.d_model + 5] = 1.5f;
  cal.observe(1, LinearSite::MlpIn, x.data(), 2, c.d_model);
  x[3] = 3.0f;
  cal.observe(1, LinearSite::MlpIn, x.data(), 1, c.d_model);
  const auto m = cal.absmax(1, LinearSite::MlpIn);
  EXPECT_EQ(m[3], 4.0f);
  EXPECT_EQ(m[5], 1.5f);
  EXPECT_EQ(cal.absmax(0, LinearSite::MlpIn)[3], 0.0f);  // other layer untouched
  EXPECT_NO_THROW(cal.check_matches(c));
  EXPECT_THROW(cal.check_matches(tiny_config(3)), ShapeError);
  cal.channel_absmax[0][0] = NAN;
  EXPECT_THROW(cal.check_matches(c), InvalidArgument);
}

TEST(ShadowOutlier, HotChannelsCoverTheShareWithTheFewestChannels) {
  const std::vector<int64_t> counts{5, 0, 3, 2};                                 // 10 outliers
  EXPECT_EQ(q::select_hot_channels(counts, 0.8), (std::vector<int64_t>{0, 2}));  // 8 >= 8
  EXPECT_EQ(q::select_hot_channels(counts, 0.5), (std::vector<int64_t>{0}));     // 5 >= 5
  EXPECT_EQ(q::select_hot_channels(counts, 0.81), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(q::select_hot_channels(counts, 1.0), (std::vector<int64_t>{0, 2, 3}));  // not 1
  EXPECT_TRUE(q::select_hot_channels(counts, 0.0).empty());
  EXPECT_TRUE(q::select_hot_channels(std::vector<int64_t>{0, 0}, 0.8).empty());
  EXPECT_THROW(q::select_hot_channels(counts, 1.5), InvalidArgument);
}

TEST(ShadowOutlier, PruningTakesTheLeastImportant) {
  const std::vector<double> imp{300.0, 130.0, 250.0, 900.0};
  EXPECT_EQ(q::select_pruned(imp, 0.5), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(q::select_pruned(imp, 0.0), (std::vector<bool>(4, false)));
  EXPECT_EQ(q::select_pruned(imp, 1.0), (std::vector<bool>(4, true)));
  EXPECT_EQ(q::select_pruned(imp, 0.85), (std::vector<bool>{true, true, true, false}));  // 3.4 -> 3
  EXPECT_DOUBLE_EQ(q::outlier_importance(10.0, 1.27), 1000.0);  // 10 / (1.27 / 127)
  EXPECT_THROW(q::outlier_importance(1.0, 0.0), InvalidArgument);
}

TEST(ShadowOutlier, SplitClipsAndGathersResidualsPerSegment) {
  // 3 rows x 4 channels, t = 2; segments {0,1} and {1,2}; row 2 is padding.
  std::vector<float> x{1.0f,  5.0f, -0.5f, 2.0f,   // row 0: channel 1 beyond (+3)
                       -3.0f, 1.0f, 0.0f,  -2.5f,  // row 1: channels 0 (-1), 3 (-0.5)
                       9.0f,  9.0f, 9.0f,  9.0f};  // row 2: padding, clipped only
  const std::vector<q::RowSegment> segs{{0, 1}, {1, 2}};
  const auto parts = q::shadow_outlier_split(x.data(), 3, 4, 2.0f, segs);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].cols, (std::vector<int64_t>{1}));
  EXPECT_EQ(parts[0].values, (std::vector<float>{3.0f}));
  EXPECT_EQ(parts[1].row_begin, 1);
  EXPECT_EQ(parts[1].cols, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(parts[1].values, (std::vector<float>{-1.0f, -0.5f}));
  EXPECT_EQ(x, (std::vector<float>{1, 2, -0.5f, 2, -2, 1, 0, -2, 2, 2, 2, 2}));
  EXPECT_THROW(q::shadow_outlier_split(x.data(), 3, 4, 0.0f, segs), InvalidArgument);
}

TEST(Calibration, HistogramPercentileAndOutlierCounts) {
  const ModelConfig c = tiny_config(1);
  Calibration cal = Calibration::empty_for(c);
  // 100 rows of attn_in: channel 0 holds 1..100, the other channels 0.5
  std::vector<float> x(100 * c.d_model, 0.5f);
  for (int r = 0; r < 100; ++r) x[r * c.d_model] = static_cast<float>(r + 1);
  cal.observe(0, LinearSite::AttnIn, x.data(), 100, c.d_model);
  EXPECT_EQ(cal.abs_percentile(0, LinearSite::AttnIn, 1.0), 100.0f);  // exact max
  // 800 values: 700 are 0.5 and 1..100 once each; the 99th percentile (792nd) is 92
  const float p99 = cal.abs_percentile(0, LinearSite::AttnIn, 0.99);
  EXPECT_GE(p99, 92.0f);
  EXPECT_LE(p99, 92.0f * (1.0f + 1.0f / 64));
  EXPECT_THROW(cal.abs_percentile(0, LinearSite::AttnIn, 0.0), InvalidArgument);
  EXPECT_FALSE(cal.has_outlier_stats());
  for (int s = 0; s < kNumLinearSites; ++s)
    cal.set_outlier_thresholds(static_cast<LinearSite>(s), std::vector<float>{50.0f});
  cal.observe(0, LinearSite::AttnIn, x.data(), 100, c.d_model);
  EXPECT_TRUE(cal.has_outlier_stats());
  EXPECT_EQ(cal.outlier_count[0][0], 50);  // 51..100
  EXPECT_EQ(cal.outlier_count[0][1], 0);
  EXPECT_EQ(cal.outlier_seq_channels[0][0], 1);
  const auto cfg = cal.shadow_configs({0.0, 0.8});
  EXPECT_EQ(cfg[0].hot_channels, (std::vector<int64_t>{0}));
  EXPECT_FLOAT_EQ(cfg[0].threshold, 50.0f);
  EXPECT_THROW(cal.set_outlier_thresholds(LinearSite::AttnIn, std::vector<float>{-1.0f}),
               InvalidArgument);
}
