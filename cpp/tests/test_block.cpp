// The block description (block.h): task graphs from a config and a plan, placement in the plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>

#include "block/block.h"
#include "core/core.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "small_config.h"

using namespace socllm;
using soc::DType;
using soc::Processor;

namespace {

ModelConfig small() { return small_llama_config(); }

const sched::Task& find(const sched::TaskGraph& g, const std::string& name) {
  for (const auto& t : g.tasks())
    if (t.name == name) return t;
  throw std::runtime_error("no task " + name);
}

}  // namespace

// The op's work as the cost model sees it (its kind's describe()).
soc::OpDesc describe(const ModelConfig& c, const Plan& plan, BlockOp op, int64_t rows,
                     int64_t kv_len) {
  return block_op_kind(op).describe(block_op(op), c, plan, 0, rows, kv_len).at(0);
}

TEST(BlockDescription, OpsInOrderWithClassesSitesAndSubgraphs) {
  const auto b = decoder_block(small());
  std::vector<std::string> names;
  for (const auto& op : b) names.emplace_back(op.name);
  EXPECT_EQ(names, (std::vector<std::string>{"attn_norm", "qkv", "rope", "attention", "o_proj",
                                             "attn_residual", "ffn_norm", "gate_up", "act", "down",
                                             "ffn_residual"}));
  int linears = 0;
  for (const auto& op : b) linears += op.site.has_value();
  EXPECT_EQ(linears, kNumLinearSites);
  EXPECT_EQ(block_op(BlockOp::Down).site, LinearSite::MlpAct);
  EXPECT_EQ(block_op(BlockOp::Rope).subgraph, SubgraphKind::Attention);
  // Gemma 3's q/k head norms and post-norms are norm ops of their subgraphs
  ModelConfig g = small();
  g.qk_norm = g.post_norms = true;
  std::vector<std::string> gemma;
  for (const auto& op : decoder_block(g)) gemma.emplace_back(op.name);
  EXPECT_EQ(gemma,
            (std::vector<std::string>{"attn_norm", "qkv", "qk_norm", "rope", "attention", "o_proj",
                                      "post_attn_norm", "attn_residual", "ffn_norm", "gate_up",
                                      "act", "down", "post_ffn_norm", "ffn_residual"}));
  for (BlockOp op : {BlockOp::QkNorm, BlockOp::PostAttnNorm, BlockOp::PostFfnNorm})
    EXPECT_EQ(block_op(op).op_class, OpClass::Norm);
  EXPECT_EQ(block_op(BlockOp::QkNorm).subgraph, SubgraphKind::AttnIn);
  // fused tensors: q, k, v rows of the qkv linear; gate, up (up alone for a plain MLP)
  const auto qkv = fused_tensors(small(), LinearSite::AttnIn);
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_EQ(qkv[0].name, "wq");
  EXPECT_EQ(qkv[0].rows + qkv[1].rows + qkv[2].rows, linear_out_width(small(), LinearSite::AttnIn));
  ModelConfig plain = small();
  plain.gated_mlp = false;
  ASSERT_EQ(fused_tensors(plain, LinearSite::MlpIn).size(), 1u);
  EXPECT_EQ(fused_tensors(plain, LinearSite::MlpIn)[0].name, "w_up");
  EXPECT_EQ(linear_out_width(plain, LinearSite::MlpIn), plain.d_ff);
}

TEST(BlockDescription, OpShapesAndBytes) {
  const ModelConfig c = small();
  const Plan w8 = Plan::from_name("w8a8");
  const soc::OpDesc qkv = describe(c, w8, BlockOp::Qkv, 10, 10);
  EXPECT_EQ(qkv.kind, soc::OpKind::MatMul);
  EXPECT_EQ(qkv.m, 10);
  EXPECT_EQ(qkv.k, 64);
  EXPECT_EQ(qkv.n, (4 + 2 * 2) * 16);
  EXPECT_EQ(qkv.dtype, DType::Int8);
  EXPECT_EQ(qkv.weight_bytes, 64 * 128 + 4);         // int8: one byte per weight, one fp32 scale
  EXPECT_EQ(qkv.activation_bytes, 10 * (64 + 128));  // int8 in and out
  const soc::OpDesc att = describe(c, w8, BlockOp::Attention, 8, 24);
  EXPECT_EQ(att.elements, 24);
  EXPECT_EQ(att.dtype, DType::Fp16);
  // q, k, v in; out; K and V of 24 positions; 4 heads x 8 x 24 scores; fp16
  EXPECT_EQ(att.activation_bytes, 2 * (8 * (128 + 64) + 2 * 24 * 32 + 4 * 8 * 24));
  const soc::OpDesc fp = describe(c, Plan::from_name("fp32"), BlockOp::GateUp, 3, 3);
  EXPECT_EQ(fp.dtype, DType::Fp32);
  EXPECT_EQ(fp.weight_bytes, 4 * 64 * 256);
  const soc::OpDesc g32 = describe(c, Plan::from_name("w8-group"), BlockOp::Down, 3, 3);
  EXPECT_EQ(g32.groups, 128 / 32);  // one NPU sub-matmul per group (seed 001 Fig. 3b)
  // W4A16 at groups of 32: 4-bit codes and an fp16 scale per group (4.5 bits per weight)
  const soc::OpDesc w4 = describe(c, Plan::from_name("w4a16"), BlockOp::OProj, 3, 3);
  EXPECT_EQ(w4.weight_bytes, 64 * 64 / 2 + (64 * 64 / 32) * 2);
}

TEST(BlockGraph, DependenciesFollowEq2AndEq3) {
  const ModelConfig c = small();
  const Plan plan = Plan::parse("shadow-outlier");
  std::vector<ShadowLoad> shadow(8);
  for (auto& s : shadow) s.pruned = true;
  shadow[3] = {false, 3.0, 1000.0};  // layer 0, down input: kept
  GraphOptions o;
  o.expected = shadow;
  const auto g = prefill_task_graph(c, plan, 40, 16, o);
  // 3 chunks x (2 layers x 6 subgraphs + 1 shadow) + LM head
  ASSERT_EQ(g.size(), 3 * 13 + 1);
  EXPECT_TRUE(find(g, "c1.L0.attn_in").deps.empty());  // chunk 1 can start at once (out of order)
  const auto& att = find(g, "c1.L1.attention");
  EXPECT_EQ(att.processor, Processor::Cpu);
  ASSERT_EQ(att.deps.size(), 2u);  // Eq. 3 (attn_in of the same chunk), Eq. 2 (previous chunk)
  EXPECT_EQ(g.at(att.deps[0]).name, "c1.L1.attn_in");
  EXPECT_EQ(g.at(att.deps[1]).name, "c0.L1.attention");
  const auto& sh = find(g, "c2.L0.shadow.down");
  EXPECT_EQ(sh.processor, Processor::Cpu);
  EXPECT_EQ(g.at(sh.deps.at(0)).name, "c2.L0.mlp_act");  // reads the down input
  const auto& next = find(g, "c2.L1.attn_in");           // merges the shadow result
  EXPECT_NE(std::find(next.deps.begin(), next.deps.end(), sh.id), next.deps.end());
  EXPECT_EQ(sh.ops.at(0).k, 3);
  EXPECT_EQ(sh.ops.at(0).n, 64);
  EXPECT_EQ(sh.ops.at(0).bytes, 1000);
  EXPECT_EQ(find(g, "c2.L0.attention").ops.at(1).elements, 48);  // KV grows by chunk
  EXPECT_EQ(find(g, "c1.L0.attn_in").processor, Processor::Npu);
  EXPECT_EQ(g.meta["graph_rows"], 16);
  o.expected.resize(3);
  EXPECT_THROW(prefill_task_graph(c, plan, 40, 16, o), ShapeError);
  EXPECT_THROW(prefill_task_graph(c, plan, 0, 16), InvalidArgument);
  EXPECT_THROW(prefill_task_graph(c, plan, 300, 16), ContextOverflow);
  EXPECT_THROW(prefill_task_graph(c, plan, 40, 300), InvalidArgument);
}

TEST(BlockGraph, MovingAnOpClassSplitsItsSubgraph) {
  const ModelConfig c = small();
  const Plan plan = Plan::from_name("w8a8").placed(OpClass::Norm, Processor::Cpu);
  const auto g = prefill_task_graph(c, plan, 16, 16);
  const auto& norm = find(g, "c0.L0.attn_in.attn_norm");
  const auto& qkv = find(g, "c0.L0.attn_in.qkv");
  EXPECT_EQ(norm.processor, Processor::Cpu);
  EXPECT_EQ(qkv.processor, Processor::Npu);
  EXPECT_EQ(qkv.deps, std::vector<int64_t>{norm.id});
  EXPECT_EQ(norm.ops.size(), 1u);
  EXPECT_EQ(norm.ops[0].name, "attn_norm");
  // 2 layers x (6 subgraphs + 2 split norms) + LM head
  EXPECT_EQ(g.size(), 2 * 8 + 1);
  // the whole block on the GPU (fp16 linears: the GPU has no INT8 path): one task per subgraph
  EXPECT_THROW(Plan::from_name("w8a8").all_on(Processor::Gpu), InvalidArgument);
  const auto gg = prefill_task_graph(c, Plan::from_name("w4a16").all_on(Processor::Gpu), 16, 16);
  EXPECT_EQ(gg.size(), 2 * 6 + 1);
  for (const auto& t : gg.tasks())
    if (t.kind != sched::TaskKind::LmHead) EXPECT_EQ(t.processor, Processor::Gpu);
}

TEST(PlanPlacement, PresetsCarryLlmNpuPlacementAndRoundTrip) {
  const Plan w8 = Plan::from_name("w8a8");
  EXPECT_EQ(w8.at(OpClass::Linear).processor, Processor::Npu);
  EXPECT_EQ(w8.at(OpClass::Attention).processor, Processor::Cpu);
  EXPECT_EQ(w8.at(OpClass::Norm).format, DType::Fp16);
  const Plan fp = Plan::from_name("fp32");
  for (const auto& p : fp.placement) EXPECT_EQ(p, (OpPlacement{Processor::Cpu, DType::Fp32}));
  EXPECT_EQ(Plan::from_name("llm-int8").at(OpClass::Linear).processor, Processor::Cpu);
  for (const auto& name : Plan::known()) {
    const Plan p = Plan::from_name(name).placed(OpClass::Attention, Processor::Gpu, DType::Fp16);
    const Plan back = Plan::from_json(p.to_json());
    EXPECT_EQ(back.placement, p.placement) << name;
    EXPECT_EQ(back.to_json(), p.to_json()) << name;
  }
  const Plan moved = Plan::parse("w8a8:attention=gpu,norm=cpu");
  EXPECT_EQ(moved.at(OpClass::Attention).processor, Processor::Gpu);
  EXPECT_EQ(moved.at(OpClass::Norm).processor, Processor::Cpu);
  const Plan dict = Plan::from_json(
      {{"name", "w8a8"}, {"placement", {{"norm", {{"processor", "cpu"}, {"format", "fp32"}}}}}});
  EXPECT_EQ(dict.at(OpClass::Norm), (OpPlacement{Processor::Cpu, DType::Fp32}));
}

TEST(PlanPlacement, OpsAProcessorCannotRunAreRefused) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // a float op in fp32 on the INT8/FP16 NPU
  EXPECT_NE(message([] {
              Plan::from_name("fp32").placed(OpClass::Norm, Processor::Npu);
            }).find("'norm' in fp32 cannot run on the npu"),
            std::string::npos);
  EXPECT_NE(
      message([] { Plan::from_name("fp32").all_on(Processor::Npu); }).find("'linear' in fp32"),
      std::string::npos);
  EXPECT_NE(message([] {
              Plan::from_name("llm-int8").placed(OpClass::Linear, Processor::Npu);
            }).find("cannot run on the npu"),
            std::string::npos);
  EXPECT_NE(message([] {
              Plan::from_name("shadow-outlier").placed(OpClass::Shadow, Processor::Npu);
            }).find("'shadow'"),
            std::string::npos);
  EXPECT_NE(message([] { Plan::parse("w8a8:softmax=gpu"); }).find("softmax"), std::string::npos);
  EXPECT_NE(message([] { Plan::parse("w8a8:attention=tpu"); }).find("tpu"), std::string::npos);
  EXPECT_THROW(
      Plan::from_json({{"name", "w8a8"}, {"placement", {{"linear", {{"format", "fp16"}}}}}}),
      InvalidArgument);  // a linear's format follows its scheme
  // fp16 linears (w4a16) run on the NPU's FP16 path; the shadow part stays fp32 on the CPU
  EXPECT_NO_THROW(Plan::from_name("w4a16").all_on(Processor::Npu));
  const Plan gpu = Plan::from_name("w4a16").all_on(Processor::Gpu);
  EXPECT_EQ(gpu.at(OpClass::Shadow).format, DType::Fp32);
  EXPECT_THROW(Plan::from_name("w4a16").placed(OpClass::Shadow, Processor::Cpu, DType::Fp16),
               InvalidArgument);
  // plans written before placement existed ("norm": "fp32" ...) keep the preset's placement
  const Plan legacy =
      Plan::from_json({{"name", "w8a8"},
                       {"ops", {{"norm", "fp32"}, {"attention", "fp32"}, {"embedding", "fp32"}}}});
  EXPECT_EQ(legacy.placement, Plan::from_name("w8a8").placement);
}

TEST(BlockGraph, GraphRowsForShortPrompts) {
  EXPECT_EQ(prefill_graph_rows(1000, 0), 1000);
  EXPECT_EQ(prefill_graph_rows(1000, 256), 256);
  EXPECT_EQ(prefill_graph_rows(20, 256), 32);
  EXPECT_EQ(prefill_graph_rows(33, 256), 64);
  EXPECT_EQ(prefill_graph_rows(200, 128), 128);
  EXPECT_EQ(prefill_graph_rows(100, 100), 100);
  EXPECT_EQ(prefill_graph_rows(70, 100), 100);  // 128 capped at the chunk length
  EXPECT_THROW(prefill_graph_rows(0, 16), InvalidArgument);
  EXPECT_THROW(prefill_graph_rows(10, -1), InvalidArgument);
}

TEST(BlockGraph, ExpectedShadowLoadsKeepDownInputsFirst) {
  const ModelConfig c = ModelConfig::from_json({{"arch", "llama"},
                                                {"vocab_size", 100},
                                                {"d_model", 64},
                                                {"n_layers", 10},
                                                {"n_heads", 4},
                                                {"n_kv_heads", 2},
                                                {"head_dim", 16},
                                                {"d_ff", 128},
                                                {"context_length", 256}});
  const auto loads = expected_shadow_loads(c, {0.85, 0.8}, 10.0);
  ASSERT_EQ(loads.size(), 40u);
  int kept = 0;
  for (const auto& l : loads) kept += !l.pruned;
  EXPECT_EQ(kept, 40 - 34);               // round(0.85 * 40) = 34 pruned
  EXPECT_FALSE(loads[0 * 4 + 3].pruned);  // down inputs of layers 0 and 9 among the kept
  EXPECT_FALSE(loads[9 * 4 + 3].pruned);
  EXPECT_TRUE(loads[0 * 4 + 0].pruned);
  // 10 channels, 20% cold, fp32 columns of the qkv output (128 values)
  EXPECT_DOUBLE_EQ(loads[0].cold_fetch_bytes, 10 * 0.2 * 128 * 4);
  const auto none = expected_shadow_loads(c, {1.0, 0.8}, 10.0);
  for (const auto& l : none) EXPECT_TRUE(l.pruned);
}

TEST(Kernels, RoundToFp16) {
  std::vector<float> x = {
      1.0f, 1.0f + 1.0f / 4096, 1.0f + 3.0f / 4096, 65504.0f, 70000.0f, -2.0f / 3.0f, 1e-8f};
  kernels::round_to_fp16(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], 1.0f);                  // half an ulp (2^-11): ties to even
  EXPECT_EQ(x[2], 1.0f + 2.0f / 2048);    // 1.5 ulp: rounds up to the even 2 ulp
  EXPECT_EQ(x[3], 65504.0f);              // largest half
  EXPECT_TRUE(std::isinf(x[4]));          // overflows
  EXPECT_NEAR(x[5], -0.66650390625f, 0);  // 0x3955: the nearest half to -2/3
  EXPECT_EQ(x[6], 0.0f);                  // below half the smallest subnormal
}

// The vectorized conversion equals the compiler's scalar binary16 cast bit for bit, over every
// exponent a float has (subnormal halves, ties, overflow, NaN, signed zero), at lengths that
// leave tails after the vector lanes and across parallel blocks; the return value says whether
// every result is finite.
TEST(Kernels, RoundToFp16MatchesScalarCastAndReportsNonFinite) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{4099}, int64_t{70001}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) {
      v = std::bit_cast<float>(bits(rng));
      if (!std::isfinite(v)) v = 0.5f;
      else if (std::abs(v) > 65519.0f) v = std::ldexp(v, -200);  // no overflow yet
    }
    const float specials[] = {0.0f,          -0.0f,         65504.0f,
                              65519.99f,     5.9604645e-8f, 2.9802322e-8f,
                              2.9802326e-8f, 6.1035156e-5f, -1.0f - 1.0f / 2048};
    for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i] = specials[i];
    std::vector<float> want = x;
    for (auto& v : want) v = static_cast<float>(static_cast<_Float16>(v));
    EXPECT_TRUE(kernels::round_to_fp16(x.data(), n)) << n;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(x[static_cast<size_t>(i)]),
                std::bit_cast<uint32_t>(want[static_cast<size_t>(i)]))
          << "n " << n << " index " << i;
    // one value past 65520 (overflows to inf), at the last index: a tail or the last lane
    x.back() = -65520.0f;
    EXPECT_FALSE(kernels::round_to_fp16(x.data(), n)) << n;
    EXPECT_EQ(x.back(), -std::numeric_limits<float>::infinity());
    x.back() = std::numeric_limits<float>::quiet_NaN();
    EXPECT_FALSE(kernels::round_to_fp16(x.data(), n)) << n;
    EXPECT_TRUE(std::isnan(x.back()));
  }
}
