// The calibration step registry (calibrate/steps.h): what the steps declare, option checking,
// needs, and steps run on a tiny model against hand computations; the cold-start cost of a
// channel (sim/cold_start.h) from a profile's numbers by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "calibrate/steps.h"
#include "expect_error.h"
#include "sim/cold_start.h"
#include "tiny_model.h"

using namespace socllm;
using namespace socllm::calibrate;

TEST(CalibrationSteps, EverySchemaArrayHasARegisteredWriter) {
  std::set<std::string> names;
  for (const StepInfo* s : steps()) names.insert(s->name);
  EXPECT_EQ(names, (std::set<std::string>{"act-scales", "outliers", "pruning-rate",
                                          "head-importance", "qk-scales", "attention-clamp",
                                          "smoothing", "bitwidths", "gptq"}));
  for (const auto& spec : Calibration::schema()) EXPECT_TRUE(names.count(spec.step)) << spec.name;
  // every need is an array some step writes, or an attribute
  for (const StepInfo* s : steps())
    for (const auto& need : s->needs) {
      bool written = false;
      for (const StepInfo* w : steps())
        for (const auto& x : writes(*w)) written |= x == need;
      EXPECT_TRUE(written) << s->name << " needs " << need;
    }
  EXPECT_EQ(writes(step("smoothing")),
            (std::vector<std::string>{"smooth_alpha", "smooth_alpha_error", "attr:smoothing_bits",
                                      "attr:smoothing_output_quant", "attr:smoothing_windows",
                                      "attr:smoothing_rows", "attr:smoothing_grid"}));
  expect_error<InvalidArgument>([] { step("blending"); }, "unknown step 'blending'");
}

TEST(CalibrationSteps, OptionsAreCheckedAndDefaulted) {
  const StepInfo& o = step("outliers");
  const auto d = options_with_defaults(o, nlohmann::json::object());
  EXPECT_EQ(d["outlier_threshold"], "percentile");
  EXPECT_DOUBLE_EQ(d["percentile"].get<double>(), 99.99);
  // an integer given for a float option is taken as the number it is
  EXPECT_TRUE(options_with_defaults(o, {{"percentile", 99}})["percentile"].is_number_float());
  expect_error<InvalidArgument>([&] { options_with_defaults(o, {{"alpha", 1}}); },
                                "has no option 'alpha' (its options: outlier_threshold, "
                                "percentile)");
  expect_error<InvalidArgument>([&] { options_with_defaults(o, {{"percentile", "high"}}); },
                                "'percentile' must be a number, got \"high\"");
  expect_error<InvalidArgument>([&] { options_with_defaults(o, {{"percentile", 100.5}}); },
                                "'percentile' must be in (0, 100], got 100.5");
  expect_error<InvalidArgument>(
      [&] { options_with_defaults(o, {{"outlier_threshold", "median"}}); },
      "must be one of percentile, maxmin, got \"median\"");
  expect_error<InvalidArgument>(
      [] { options_with_defaults(step("act-scales"), {{"samples", 2.5}}); },
      "'samples' must be an integer, got 2.5");
  expect_error<InvalidArgument>(
      [] { options_with_defaults(step("pruning-rate"), {{"pruning_plan", "w8a8"}}); },
      "'pruning_plan' must be shadow-outlier");
  expect_error<InvalidArgument>([] { options_with_defaults(step("bitwidths"), {{"bits", 0.5}}); },
                                "'bits' must be in [1, 8]");
}

TEST(CalibrationSteps, RunChecksNeedsAndParts) {
  const Engine e(tiny_model::load_tiny_model("calibrate_needs"));
  Calibration stats = Calibration::empty_for(e.model().config());
  const std::vector<std::vector<int32_t>> windows = {{1, 2, 3, 4}};
  expect_error<InvalidArgument>([&] { run_step("outliers", e, stats, windows, {}, {}); },
                                "needs 'act_absmax', which step 'act-scales' writes");
  expect_error<InvalidArgument>([&] { run_step("pruning-rate", e, stats, windows, {}, {}); },
                                "has no C++ part");
  run_step("act-scales", e, stats, windows, {}, {});
  expect_error<ShapeError>([&] { run_step("smoothing", e, stats, windows, {{0}, {1}}, {}); },
                           "2 row lists for 1");
}

// No row lists: every row of every window is sampled, the same as listing them all.
TEST(CalibrationSteps, NoRowListsSampleEveryRow) {
  const Engine e(tiny_model::load_tiny_model("calibrate_all_rows"));
  const std::vector<std::vector<int32_t>> windows = {{3, 1, 4, 1, 5}, {9, 2, 6}};
  Calibration all = Calibration::empty_for(e.model().config());
  run_step("act-scales", e, all, windows, {}, {});
  Calibration listed = all;
  run_step("smoothing", e, all, windows, {}, {{"bits", 4.0}});
  run_step("smoothing", e, listed, windows, {{0, 1, 2, 3, 4}, {0, 1, 2}}, {{"bits", 4.0}});
  ASSERT_TRUE(all.has_smoothing());
  for (int s = 0; s < kNumLinearSites; ++s) {
    EXPECT_EQ(all.smooth_alpha[static_cast<size_t>(s)],
              listed.smooth_alpha[static_cast<size_t>(s)]);
    EXPECT_EQ(all.smooth_alpha_error[static_cast<size_t>(s)],
              listed.smooth_alpha_error[static_cast<size_t>(s)]);
  }
}

// Step act-scales: per-channel max |x| of the first linear input (RMSNorm of the embedding times
// attn_norm at layer 0) over every token of every window, by hand.
TEST(CalibrationSteps, ActScalesIsTheMaximumOfTheNormedEmbedding) {
  const auto m = tiny_model::load_tiny_model("calibrate_act_scales");
  const Engine e(m);
  const auto& c = m->config();
  Calibration stats = Calibration::empty_for(c);
  const std::vector<std::vector<int32_t>> windows = {{3, 1, 4, 1, 5}, {9, 2, 6}};
  int64_t calls = 0;
  run_step("act-scales", e, stats, windows, {}, {},
           [&](int64_t done, int64_t total, const std::string&) {
             EXPECT_EQ(total, 2);
             EXPECT_EQ(done, ++calls);
           });
  EXPECT_EQ(calls, 2);
  std::vector<double> want(static_cast<size_t>(c.d_model), 0.0);
  for (const auto& w : windows)
    for (int32_t t : w) {
      const float* x = m->embed_tokens().ptr() + t * c.d_model;
      double ss = 0;
      for (int64_t j = 0; j < c.d_model; ++j) ss += static_cast<double>(x[j]) * x[j];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(c.d_model) + c.rms_eps);
      for (int64_t j = 0; j < c.d_model; ++j)
        want[static_cast<size_t>(j)] =
            std::max(want[static_cast<size_t>(j)],
                     std::abs(x[j] * r * m->layer(0).attn_norm.data[static_cast<size_t>(j)]));
    }
  const auto got = stats.absmax(0, LinearSite::AttnIn);
  for (int64_t j = 0; j < c.d_model; ++j)
    EXPECT_NEAR(got[static_cast<size_t>(j)], want[static_cast<size_t>(j)], 1e-5) << j;
  EXPECT_EQ(stats.tokens, 8);
}

// Step bitwidths: per-tensor stores no bit-widths (the plan allocates its own); global-ttft
// stores every channel's, spending at most the per-tensor allocation's modelled time.
TEST(CalibrationSteps, BitwidthScopes) {
  const Engine e(tiny_model::load_tiny_model("calibrate_bitwidths"));
  const auto& c = e.model().config();
  Calibration stats = Calibration::empty_for(c);
  const std::vector<std::vector<int32_t>> windows = {{3, 1, 4, 1, 5, 9, 2, 6}};
  run_step("act-scales", e, stats, windows, {}, {});
  run_step("smoothing", e, stats, windows, {{0, 2, 5, 7}}, {{"bits", 4.0}});
  auto p = run_step("bitwidths", e, stats, {}, {}, {{"bits", 4.0}});
  EXPECT_FALSE(stats.has_channel_bits());
  auto rep = nlohmann::json::parse(p["bitwidth_report"].get<std::string>());
  EXPECT_EQ(rep["tensors"], c.n_layers * 7);
  for (const auto& r : rep["per_tensor"]) EXPECT_NEAR(r["mean_bits"].get<double>(), 4.0, 0.07);
  expect_error<InvalidArgument>(
      [&] { run_step("bitwidths", e, stats, {}, {}, {{"bit_scope", "global-ttft"}}); },
      "needs sampled windows");
  p = run_step("bitwidths", e, stats, windows, {{0, 2, 5, 7}},
               {{"bits", 4.0}, {"bit_scope", "global-ttft"}});
  ASSERT_TRUE(stats.has_channel_bits());
  EXPECT_EQ(stats.channel_bits[0].size(), static_cast<size_t>(c.n_layers * c.qkv_dim()));
  rep = nlohmann::json::parse(p["bitwidth_report"].get<std::string>())["global_ttft"];
  EXPECT_LE(rep["global_s"].get<double>(), rep["budget_s"].get<double>() * (1 + 1e-12));
  EXPECT_LE(rep["global_weighted_error"].get<double>(),
            rep["per_tensor_weighted_error"].get<double>());
  for (const auto& site : stats.channel_bits)
    for (int64_t b : site) EXPECT_TRUE(b >= 1 && b <= 8) << b;
}

// sim/cold_start.h: one channel of n weights at B bits from a profile's numbers by hand.
TEST(ChannelColdStartCost, ByHand) {
  const nlohmann::json j = {
      {"name", "t"},
      {"cost_model",
       {{"memory", {{"flash_gbps", {{"value", 2.0}, {"source", "test"}}}}},
        {"cpu", {{"unpack_weightlet_gweights_s", {{"value", 0.5}, {"source", "test"}}}}}}},
      {"processors",
       {{"cpu_all",
         {{"unpack_weightlet_relative_time_by_bits",
           {{"value", {3.0, 2.0, 1.5, 1.0, 1.0, 1.25, 1.5, 0.5}}, {"source", "test"}}}}}}}};
  const auto dev = soc::DeviceProfile::from_json(j, "test");
  const std::vector<int64_t> n = {1000, 8};
  const auto t = channel_cold_start_cost(dev, n);
  ASSERT_EQ(t.seconds.size(), 16u);
  // 1000 weights at 3 bits: 375 bytes + 4.375 metadata at 2 GB/s, 1000 weights at 0.5 G/s x 1.5
  EXPECT_NEAR(t.seconds[2], (375 + 4.375) / 2e9 + 1000 / 0.5e9 * 1.5, 1e-15);
  EXPECT_NEAR(t.seconds[8 + 7], (8 + 4.375) / 2e9 + 8 / 0.5e9 * 0.5, 1e-15);
  auto bad = j;
  bad["processors"]["cpu_all"]["unpack_weightlet_relative_time_by_bits"]["value"] = {1, 2};
  expect_error<FormatError>(
      [&] { channel_cold_start_cost(soc::DeviceProfile::from_json(bad, "bad"), n); },
      "must list 8 numbers");
  bad["processors"] = nlohmann::json::object();
  expect_error<soc::MissingData>(
      [&] { channel_cold_start_cost(soc::DeviceProfile::from_json(bad, "bad"), n); },
      "has no /processors/cpu_all/unpack_weightlet_relative_time_by_bits");
}

// act_percentile (issue 39): the static scale maps the calibrated |x| at that percentile to 127
// (the histogram's bin edge, below the maximum), clipping beyond it; 100 is the maximum.
TEST(CalibrationSteps, StaticScaleAtAPercentile) {
  const Engine e(tiny_model::load_tiny_model("act_percentile"));
  Calibration stats = Calibration::empty_for(e.model().config());
  run_step("act-scales", e, stats, {{1, 5, 3, 9, 2, 7, 11, 4, 6, 8, 10, 12}}, {}, {});
  for (int s = 0; s < kNumLinearSites; ++s) {
    const auto site = static_cast<LinearSite>(s);
    const auto max = e.prepare_linear(Plan::parse("w8a8"), 1, site, {}, &stats);
    const auto all = e.prepare_linear(Plan::parse("w8a8:act_percentile=100"), 1, site, {}, &stats);
    const auto p90 = e.prepare_linear(Plan::parse("w8a8:act_percentile=90"), 1, site, {}, &stats);
    EXPECT_FLOAT_EQ(all->static_act_scale(), max->static_act_scale());
    EXPECT_LT(p90->static_act_scale(), max->static_act_scale());
    // 90% of the observed |x| lie below the clip (counted from the histogram's bins)
    const auto m = stats.absmax(1, site);
    float top = 0;
    for (float v : m) top = std::max(top, v);
    EXPECT_FLOAT_EQ(max->static_act_scale(), top / 127.0f);
    // counted from the inputs themselves: at least 90% of |x| lie at or below the clip, and
    // fewer than 90% a histogram bin (1.1%) lower
    const std::vector<int32_t> win = {1, 5, 3, 9, 2, 7, 11, 4, 6, 8, 10, 12};
    std::vector<int64_t> rows(win.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    const auto x = e.linear_inputs(win, rows)[1][s];
    const float clip = p90->static_act_scale() * 127.0f;
    double below = 0, below_lower = 0;
    for (float v : x.data) {
      below += std::abs(v) <= clip;
      below_lower += std::abs(v) <= clip / 1.012f;
    }
    EXPECT_GE(below / x.data.size(), 0.9);
    EXPECT_LT(below_lower / x.data.size(), 0.9);
  }
  expect_error<InvalidArgument>([] { Plan::parse("smoothquant:act_percentile=99"); },
                                "without an input smoothing");
  expect_error<InvalidArgument>([] { Plan::parse("w8a8:act_percentile=0"); }, "(0, 100]");
}
