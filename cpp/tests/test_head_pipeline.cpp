// shadowAttn's head-wise NPU-CPU pipeline (head_pipeline.h, seed 000 §3.4): Algorithm 1 on hand
// examples, the optimum against an independent brute force, the head-wise task graph (Eq. 4,
// fused launches) and the simulator replaying a plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <set>

#include "block/block.h"
#include "expect_error.h"
#include "sched/head_pipeline.h"
#include "sim/simulate.h"
#include "small_config.h"

using namespace socllm;
using sched::HeadPipelinePlanner;
using sched::HeadPipelineProblem;
using sched::HeadPolicy;

namespace {

// Two heads in their own buckets, each launch 2 ms: head 0 light on the CPU (top-k 1, attention
// 1), head 1 heavy (top-k 1, attention 4). Times in ms.
HeadPipelineProblem two_heads(bool shared) {
  HeadPipelineProblem p;
  p.topk_us = {1, 1};
  p.qkv_us = {1, 4};
  p.launches = {{0}, {1}};
  p.launch_us = {2, 2};
  p.shared_cpu = shared;
  return p;
}

double plan_ms(const HeadPipelineProblem& p, HeadPolicy policy) {
  return HeadPipelinePlanner().plan(p, policy).latency_us;
}

// Every launch order x every head order within launches, by std::next_permutation.
double brute_force(const HeadPipelineProblem& p) {
  std::vector<int64_t> lo(p.launches.size());
  std::iota(lo.begin(), lo.end(), 0);
  double best = 1e300;
  do {
    std::vector<std::vector<int64_t>> hs;
    for (int64_t l : lo) {
      auto v = p.launches[static_cast<size_t>(l)];
      std::sort(v.begin(), v.end());
      hs.push_back(v);
    }
    std::function<void(size_t)> rec = [&](size_t i) {
      if (i == hs.size()) {
        std::vector<int64_t> ho;
        for (const auto& v : hs) ho.insert(ho.end(), v.begin(), v.end());
        best = std::min(best, sched::pipeline_latency_us(p, lo, ho));
        return;
      }
      do rec(i + 1);
      while (std::next_permutation(hs[i].begin(), hs[i].end()));
    };
    rec(0);
  } while (std::next_permutation(lo.begin(), lo.end()));
  return best;
}

ModelConfig small() { return small_llama_config(); }

// Round numbers so that durations are easy to read.
soc::DeviceProfile profile() {
  auto n = [](double v) { return nlohmann::json{{"value", v}, {"unit", "x"}, {"source", "test"}}; };
  nlohmann::json cm;
  for (const char* p : {"npu", "cpu", "gpu"})
    for (const char* d : {"int8", "fp16", "fp32"}) {
      cm[p][std::string(d) + "_overhead_us"] = n(10);
      cm[p][std::string(d) + "_compute_gops"] = n(100);
      cm[p][std::string(d) + "_weight_gbps"] = n(10);
    }
  for (const char* t : {"tile_m", "tile_n", "tile_k"}) cm["npu"][t] = n(1);
  cm["npu"]["elementwise_gelems"] = n(1);
  cm["npu"]["launch_us"] = n(100);
  cm["npu"]["int8_attn_matmul_gops"] = n(1);
  cm["cpu_core"]["mid"]["topk_gscores"] = n(0.5);
  cm["cpu_core"]["mid"]["fp32_attn_matmul_gops"] = n(2);
  cm["cpu_core"]["mid"]["fp32_sparse_attention_gops"] = n(1);
  cm["cpu_core"]["mid"]["fp32_fused_sparse_attention_gops"] = n(1);
  cm["cpu_core"]["mid"]["fp32_attention_gops"] = n(1);
  cm["memory"]["dram_gbps"] = n(10);
  for (const char* s : {"cpu_npu_us", "gpu_npu_us", "cpu_gpu_us"}) cm["sync"][s] = n(7);
  for (const char* w : {"npu_w", "cpu_w", "gpu_w"}) cm["power"][w] = n(1);
  return soc::DeviceProfile::from_json({{"name", "test"}, {"cost_model", cm}}, "test");
}

Plan shadow_plan() { return Plan::parse("w8a8:attention=shadow-attn,ratios=uniform"); }

}  // namespace

TEST(HeadPipeline, PaperThreeStageModelByHand) {
  // Three stages as in seed 000 Fig. 9 (top-k and attention overlap).
  const auto p = two_heads(false);
  // Sequential: L0 [0,2] k0 [2,3] q0 [3,4] | L1 [4,6] k1 [6,7] q1 [7,11].
  EXPECT_DOUBLE_EQ(plan_ms(p, HeadPolicy::Sequential), 11);
  // Head order: L0 [0,2] L1 [2,4]; k0 [2,3] q0 [3,4]; k1 [4,5] q1 [5,9].
  EXPECT_DOUBLE_EQ(plan_ms(p, HeadPolicy::Pipelined), 9);
  // Algorithm 1's first step prefers head 0 (its attention ends at 4 < 7): 9, not the optimum.
  const auto g = HeadPipelinePlanner().plan(p, HeadPolicy::Greedy);
  EXPECT_DOUBLE_EQ(g.latency_us, 9);
  EXPECT_EQ(g.launch_order, (std::vector<int64_t>{0, 1}));
  // Reordered (Fig. 9(4)): L1 [0,2] L0 [2,4]; k1 [2,3] q1 [3,7]; k0 [4,5] q0 [7,8].
  const auto o = HeadPipelinePlanner().plan(p, HeadPolicy::Optimal);
  EXPECT_DOUBLE_EQ(o.latency_us, 8);
  EXPECT_EQ(o.launch_order, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(o.head_order, (std::vector<int64_t>{1, 0}));
}

TEST(HeadPipeline, SharedCoreAndSyncByHand) {
  auto p = two_heads(true);
  p.sync_us = 0.5;
  // L0 [0,2] L1 [2,4]; k0 [2.5,3.5] q0 [3.5,4.5]; k1 [4.5,5.5] q1 [5.5,9.5] (one core).
  EXPECT_DOUBLE_EQ(plan_ms(p, HeadPolicy::Pipelined), 9.5);
  // Sequential: 2 + .5 + 2 | + .5 + 2 + .5 + 5 = 12.5 (CPU->NPU hand-over too).
  EXPECT_DOUBLE_EQ(plan_ms(p, HeadPolicy::Sequential), 12.5);
  EXPECT_LE(plan_ms(p, HeadPolicy::Optimal), plan_ms(p, HeadPolicy::Greedy));
}

TEST(HeadPipeline, FusedLaunchInnerGreedyByHand) {
  // Both heads in one 3 ms launch (seed 000 §3.4: two fused heads take 3 ms): C/GPUPlan puts
  // head 0 first (its attention ends at 5 < 8): k0 [3,4] q0 [4,5] k1 [4,5] q1 [5,9].
  auto p = two_heads(false);
  p.launches = {{0, 1}};
  p.launch_us = {3};
  const auto g = HeadPipelinePlanner().plan(p, HeadPolicy::Greedy);
  EXPECT_DOUBLE_EQ(g.latency_us, 9);
  EXPECT_EQ(g.head_order, (std::vector<int64_t>{0, 1}));
}

TEST(HeadPipeline, OptimumEqualsBruteForceAndBoundsGreedy) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.1, 5.0);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 2 + trial % 6;  // 2..7 heads
    std::vector<int64_t> bucket(static_cast<size_t>(n));
    for (auto& b : bucket) b = static_cast<int64_t>(rng() % 3);
    HeadPipelineProblem p;
    p.launches = sched::fuse_launches(bucket, 1 + trial % 3);
    for (int h = 0; h < n; ++h) {
      p.topk_us.push_back(u(rng));
      p.qkv_us.push_back(u(rng));
    }
    for (const auto& l : p.launches)
      p.launch_us.push_back(1.5 + 0.6 * static_cast<double>(l.size()));
    p.shared_cpu = trial % 2 == 0;
    p.sync_us = trial % 4 < 2 ? 0.0 : 0.4;
    const double opt = plan_ms(p, HeadPolicy::Optimal), greedy = plan_ms(p, HeadPolicy::Greedy);
    EXPECT_NEAR(opt, brute_force(p), 1e-9) << "trial " << trial;
    EXPECT_LE(opt, greedy + 1e-9);
    EXPECT_LE(opt, plan_ms(p, HeadPolicy::Pipelined) + 1e-9);
    EXPECT_LE(greedy, plan_ms(p, HeadPolicy::Sequential) + 1e-9);
    // A plan's latency is its orders' latency under the model.
    const auto g = HeadPipelinePlanner().plan(p, HeadPolicy::Greedy);
    EXPECT_DOUBLE_EQ(sched::pipeline_latency_us(p, g.launch_order, g.head_order), g.latency_us);
  }
}

TEST(HeadPipeline, FuseLaunchesOnlyWithinABucket) {
  const std::vector<int64_t> b = {0, 1, 0, 0, 1};
  EXPECT_EQ(sched::fuse_launches(b, 2), (std::vector<std::vector<int64_t>>{{0, 2}, {1, 4}, {3}}));
  EXPECT_EQ(sched::fuse_launches(b, 0), (std::vector<std::vector<int64_t>>{{0, 2, 3}, {1, 4}}));
  EXPECT_EQ(sched::fuse_launches(b, 1).size(), 5u);
  EXPECT_THROW(sched::fuse_launches(b, -1), InvalidArgument);
}

TEST(HeadPipeline, BadInputsAreTypedErrors) {
  expect_error<InvalidArgument>([] { sched::head_policy_from_name("fastest"); }, "fastest");
  auto p = two_heads(true);
  p.qkv_us = {1};
  expect_error<InvalidArgument>([&] { HeadPipelinePlanner().plan(p, HeadPolicy::Greedy); },
                                "qkv_us");
  p = two_heads(true);
  p.launches = {{0}, {0}};
  expect_error<InvalidArgument>([&] { p.validate(); }, "two launches");
  p = two_heads(true);
  p.topk_us[1] = -1;
  expect_error<InvalidArgument>([&] { p.validate(); }, "topk_us[1]");
  AttentionTimingOptions o;
  o.head_ratios = {0.5};
  expect_error<InvalidArgument>([&] { o.validate(small()); }, "head_ratios");
  o.head_ratios.assign(8, 1.5);
  expect_error<InvalidArgument>([&] { o.validate(small()); }, "1.5");
}

TEST(HeadPipelineGraph, Eq4DependenciesAndFusedLaunchesPerBucket) {
  GraphOptions o;
  o.attention.head_buckets = {0, 1, 0, 1, /*layer 1*/ 2, 2, 2, 2};
  o.attention.max_fused_heads = 4;
  const auto g = prefill_task_graph(small(), shadow_plan(), 32, 0, o);
  std::map<int64_t, std::vector<int64_t>> est_heads;  // layer -> heads seen in launches
  for (const auto& t : g.tasks()) {
    if (t.kind == sched::TaskKind::Estimate) {
      EXPECT_EQ(t.processor, soc::Processor::Npu);
      std::set<int64_t> buckets;
      for (int64_t h : t.heads)
        buckets.insert(o.attention.head_buckets[static_cast<size_t>(t.layer * 4 + h)]);
      EXPECT_EQ(buckets.size(), 1u) << t.name << " fuses heads of different buckets";
      est_heads[t.layer].insert(est_heads[t.layer].end(), t.heads.begin(), t.heads.end());
    }
    if (t.kind == sched::TaskKind::TopK) {  // ζnpu <- ζtopk
      ASSERT_EQ(t.deps.size(), 1u);
      const auto& e = g.at(t.deps[0]);
      EXPECT_EQ(e.kind, sched::TaskKind::Estimate);
      EXPECT_NE(std::find(e.heads.begin(), e.heads.end(), t.heads[0]), e.heads.end());
    }
    if (t.kind == sched::TaskKind::SparseAttention) {  // ζnpu, ζtopk <- ζqkv
      ASSERT_EQ(t.deps.size(), 2u);
      EXPECT_EQ(g.at(t.deps[0]).kind, sched::TaskKind::Estimate);
      EXPECT_EQ(g.at(t.deps[1]).kind, sched::TaskKind::TopK);
      EXPECT_EQ(g.at(t.deps[1]).heads, t.heads);
    }
  }
  // Layer 0: buckets {0,2} and {1,3}: two launches; layer 1: one launch of four heads.
  int launches0 = 0, launches1 = 0;
  for (const auto& t : g.tasks())
    if (t.kind == sched::TaskKind::Estimate) (t.layer == 0 ? launches0 : launches1) += 1;
  EXPECT_EQ(launches0, 2);
  EXPECT_EQ(launches1, 1);
  for (auto& [l, hs] : est_heads) {
    std::sort(hs.begin(), hs.end());
    EXPECT_EQ(hs, (std::vector<int64_t>{0, 1, 2, 3})) << "layer " << l;
  }
  // The next task (o_proj) waits for every head's attention.
  for (const auto& t : g.tasks())
    if (t.kind == sched::TaskKind::OProj) {
      int n = 0;
      for (int64_t d : t.deps) n += g.at(d).kind == sched::TaskKind::SparseAttention;
      EXPECT_EQ(n, 4) << t.name;
    }
}

TEST(HeadPipelineGraph, SimulatorReplaysThePlannersLatency) {
  const auto dev = profile();
  for (const char* policy : {"sequential", "pipelined", "greedy", "optimal"}) {
    SimOptions o;
    o.head_policy = policy;
    o.policy = "in-order";
    o.attention.head_buckets = {0, 1, 1, 2, 0, 0, 1, 1};
    o.attention.max_fused_heads = 2;
    o.attention.head_ratios = {0.1, 0.9, 0.3, 0.5, 1.0, 0.2, 0.6, 0.4};
    const auto r = simulate_request(small(), shadow_plan(), dev, 48, 0, o);
    ASSERT_EQ(r.head_plans.size(), 2u) << policy;
    EXPECT_EQ(r.graph.meta.at("head_policy"), policy);
    for (const auto& hp : r.head_plans) {
      const int64_t layer = hp["layer"];
      // The pipeline starts when the first launch may (its rope + the CPU->NPU hand-over) and
      // ends with the last head's attention.
      double start = 1e300, end = 0;
      for (const auto& t : r.graph.tasks()) {
        if (t.layer != layer) continue;
        const auto& s = r.timeline.spans[static_cast<size_t>(t.id)];
        if (t.kind == sched::TaskKind::Estimate) start = std::min(start, s.start_us);
        if (t.kind == sched::TaskKind::SparseAttention) end = std::max(end, s.end_us);
      }
      EXPECT_NEAR(end - start, hp["plan"]["latency_us"].get<double>(), 1e-6)
          << policy << " layer " << layer;
    }
  }
  // A plan planned for another device is refused, not timed on this one.
  expect_error<InvalidArgument>(
      [&] {
        simulate_request(small(),
                         Plan::parse("w8a8:attention=shadow-attn,ratios=uniform,"
                                     "device=snapdragon-8elite"),
                         dev, 48, 0, {});
      },
      "planned for device 'snapdragon-8elite', not 'test'");
  // Policies order as they must on the simulated prefill.
  auto ms = [&](const char* policy) {
    SimOptions o;
    o.head_policy = policy;
    o.attention.max_fused_heads = 1;
    o.attention.head_ratios = {0.1, 0.9, 0.3, 0.5, 1.0, 0.2, 0.6, 0.4};
    return simulate_request(small(), shadow_plan(), dev, 64, 0, o).timeline.makespan_us;
  };
  EXPECT_LE(ms("optimal"), ms("greedy") + 1e-6);
  EXPECT_LE(ms("greedy"), ms("sequential") + 1e-6);
  EXPECT_LT(ms("pipelined"), ms("sequential"));
}

TEST(HeadPipelineGraph, OptionsChangeTheTimeline) {
  const auto dev = profile();
  // seed 000's C/G-Full: fp32 attention on the CPU.
  const Plan full =
      Plan::parse("w8a8").placed(OpClass::Attention, soc::Processor::Cpu, soc::DType::Fp32);
  auto run = [&](const SimOptions& o, bool fp32 = false) {
    return simulate_request(small(), fp32 ? full : shadow_plan(), dev, 64, 0, o)
        .timeline.makespan_us;
  };
  SimOptions base;
  SimOptions fused = base;
  fused.attention.max_fused_heads = 1;  // no fusion: more launches
  EXPECT_NE(run(base), run(fused));
  SimOptions ratios = base;
  ratios.attention.head_ratios.assign(8, 0.9);
  EXPECT_GT(run(ratios), run(base));
  // fp32 attention on one mid core (seed 000's C/G-Full) instead of the whole CPU.
  SimOptions mid = base;
  mid.attention.cpu_core = "mid";
  EXPECT_NE(run(base, true), run(mid, true));
  mid.attention.cpu_core = "big";
  expect_error<InvalidArgument>([&] { run(mid, true); }, "big");
}

TEST(HeadPipelineGraph, ShadowAttnTimesItsOwnFusedKernel) {
  // seed 000 §4: shadowAttn's sparse attention is a kernel of its own; C/G-Sparse's is the
  // vanilla fp32 one. With the fused rate 4x the vanilla one, each of shadowAttn's kept pairs
  // takes a quarter of C/G-Sparse's: 4 ops per pair and dim at 4 vs 1 Gop/s (ms = ops / 1e3).
  auto j = profile().json();
  j["cost_model"]["cpu_core"]["mid"]["fp32_fused_sparse_attention_gops"]["value"] = 4.0;
  const auto dev = soc::DeviceProfile::from_json(j, "test");
  const int64_t d = small().head_dim;
  for (const auto& [plan, gops] : {std::pair{"w8a8:attention=shadow-attn,ratios=uniform", 4.0},
                                   std::pair{"w8a8:attention=sparse", 1.0}}) {
    SimOptions o;
    o.policy = "in-order";
    const auto r = simulate_request(small(), Plan::parse(plan), dev, 32, 0, o);
    int seen = 0;
    for (const auto& t : r.graph.tasks()) {
      if (t.kind != sched::TaskKind::SparseAttention) continue;
      ASSERT_EQ(t.ops.size(), 1u) << plan;
      const auto& s = r.timeline.spans[static_cast<size_t>(t.id)];
      const double ops = 4.0 * static_cast<double>(t.ops[0].elements * d);
      EXPECT_NEAR(s.end_us - s.start_us, ops / (gops * 1e3), 1e-9) << plan << " " << t.name;
      ++seen;
    }
    EXPECT_GT(seen, 0) << plan;
  }
  // A profile without the fused rate names the entry it lacks.
  auto k = profile().json();
  k["cost_model"]["cpu_core"]["mid"].erase("fp32_fused_sparse_attention_gops");
  expect_error<InvalidArgument>(
      [&] {
        simulate_request(small(), shadow_plan(), soc::DeviceProfile::from_json(k, "test"), 32, 0,
                         {});
      },
      "fp32_fused_sparse_attention_gops");
}
