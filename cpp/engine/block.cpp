#include "socllm/block.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "socllm/core.h"
#include "socllm/head_pipeline.h"
#include "socllm/kernels.h"

namespace socllm {

namespace {

// Keys the r-th of `rows` causal rows ending at key kv_len sees (at most `window`; 0: no window).
int64_t visible_keys(int64_t r, int64_t rows, int64_t kv_len, int64_t window) {
  const int64_t pos = kv_len - rows + r;
  return pos + 1 - kernels::first_visible_key(pos, window);
}

// (query row, key) pairs of `rows` causal rows ending at key kv_len.
int64_t causal_pairs(int64_t rows, int64_t kv_len, int64_t window = 0) {
  if (window <= 0) return rows * kv_len - rows * (rows - 1) / 2;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) n += visible_keys(r, rows, kv_len, window);
  return n;
}

using npu::SubgraphKind;

constexpr std::array<BlockOpInfo, kNumBlockOps> kBlock = {{
    {BlockOp::AttnNorm, "attn_norm", OpClass::Norm, SubgraphKind::AttnIn, std::nullopt},
    {BlockOp::Qkv, "qkv", OpClass::Linear, SubgraphKind::AttnIn, LinearSite::AttnIn},
    {BlockOp::Rope, "rope", OpClass::Rope, SubgraphKind::Attention, std::nullopt},
    {BlockOp::Attention, "attention", OpClass::Attention, SubgraphKind::Attention, std::nullopt},
    {BlockOp::OProj, "o_proj", OpClass::Linear, SubgraphKind::OProj, LinearSite::AttnOut},
    {BlockOp::AttnResidual, "attn_residual", OpClass::Residual, SubgraphKind::OProj, std::nullopt},
    {BlockOp::FfnNorm, "ffn_norm", OpClass::Norm, SubgraphKind::MlpIn, std::nullopt},
    {BlockOp::GateUp, "gate_up", OpClass::Linear, SubgraphKind::MlpIn, LinearSite::MlpIn},
    {BlockOp::Act, "act", OpClass::Activation, SubgraphKind::MlpAct, std::nullopt},
    {BlockOp::Down, "down", OpClass::Linear, SubgraphKind::Down, LinearSite::MlpAct},
    {BlockOp::FfnResidual, "ffn_residual", OpClass::Residual, SubgraphKind::Down, std::nullopt},
}};

int64_t dtype_bytes(soc::DType d) {
  return d == soc::DType::Int8 ? 1 : d == soc::DType::Fp16 ? 2 : 4;
}

sched::TaskKind task_kind_of(SubgraphKind k) {
  return static_cast<sched::TaskKind>(static_cast<int>(k));
}

// Input and output widths (values per row) of an op.
std::pair<int64_t, int64_t> op_widths(const ModelConfig& c, BlockOp op) {
  const int64_t d = c.d_model;
  switch (op) {
    case BlockOp::AttnNorm:
    case BlockOp::FfnNorm:
    case BlockOp::AttnResidual:
    case BlockOp::FfnResidual: return {d, d};
    case BlockOp::Qkv: return {d, c.qkv_dim()};
    case BlockOp::Rope: return {c.qkv_dim(), c.qkv_dim()};
    case BlockOp::Attention: return {c.qkv_dim(), c.q_dim()};
    case BlockOp::OProj: return {c.q_dim(), d};
    case BlockOp::GateUp: return {d, c.mlp_in_dim()};
    case BlockOp::Act: return {c.mlp_in_dim(), c.d_ff};
    case BlockOp::Down: return {c.d_ff, d};
  }
  return {0, 0};
}

soc::OpDesc elementwise(soc::DType dt, int64_t elements) {
  soc::OpDesc o;
  o.kind = soc::OpKind::Elementwise;
  o.dtype = dt;
  o.elements = elements;
  return o;
}

}  // namespace

std::span<const BlockOpInfo> decoder_block() { return kBlock; }

const BlockOpInfo& block_op(BlockOp op) { return kBlock.at(static_cast<size_t>(op)); }

double weight_bytes_per_param(const quant::LinearScheme& s) {
  switch (s.weights) {
    case quant::WeightFormat::F32: return 4.0;
    case quant::WeightFormat::Int8: return 1.0;
    case quant::WeightFormat::Int4: return 0.5;
  }
  return 4.0;
}

soc::OpDesc describe_op(const ModelConfig& c, const Plan& plan, BlockOp op, int64_t rows,
                        int64_t kv_len, int64_t layer) {
  const BlockOpInfo& info = block_op(op);
  const soc::DType fmt = plan.at(info.op_class).format;
  const auto [in_w, out_w] = op_widths(c, op);
  constexpr auto kGainBytes = static_cast<int64_t>(sizeof(float));
  if (const int64_t window = c.layer_window(layer); window > 0) kv_len = std::min(kv_len, window);
  soc::OpDesc o;
  switch (op) {
    case BlockOp::AttnNorm:
    case BlockOp::FfnNorm:
      o = elementwise(fmt, rows * c.d_model);
      o.weight_bytes = c.d_model * kGainBytes;
      break;
    case BlockOp::Rope:  // rotates q and k (after normalizing every head: QK-norm)
      o = elementwise(fmt, rows * (c.q_dim() + c.kv_dim()) * (c.qk_norm ? 2 : 1));
      if (c.qk_norm) o.weight_bytes = 2 * c.head_dim * kGainBytes;
      break;
    case BlockOp::Attention:
      o.kind = soc::OpKind::Attention;
      o.dtype = fmt;
      o.m = rows;
      o.k = c.head_dim;
      o.n = c.n_heads;
      o.elements = kv_len;
      break;
    case BlockOp::Act: o = elementwise(fmt, rows * c.mlp_in_dim()); break;
    case BlockOp::AttnResidual:
    case BlockOp::FfnResidual:  // the add (after normalizing the branch's output: post-norms)
      o = elementwise(fmt, rows * c.d_model * (c.post_norms ? 2 : 1));
      if (c.post_norms) o.weight_bytes = c.d_model * kGainBytes;
      break;
    case BlockOp::Qkv:
    case BlockOp::OProj:
    case BlockOp::GateUp:
    case BlockOp::Down: {
      o.kind = soc::OpKind::MatMul;
      o.dtype = fmt;
      o.m = rows;
      o.k = in_w;
      o.n = out_w;
      // Per-group quantized activations run on an NPU as one sub-matmul per group plus a float
      // reduction (seed 001 §2.3, Fig. 3b/4).
      const auto& s = plan.linear;
      const int64_t g = s.activations == quant::ActFormat::Int8DynamicPerGroup ? s.group_size : 0;
      o.groups = g > 0 ? std::max<int64_t>(1, (in_w + g - 1) / g) : 1;
      o.weight_bytes =
          static_cast<int64_t>(static_cast<double>(in_w * out_w) * weight_bytes_per_param(s));
      break;
    }
  }
  o.name = info.name;
  o.op_class = op_class_name(info.op_class);
  // Buffers the op reads and writes at its format; attention also reads K and V of kv_len
  // positions and holds the [heads, rows, kv_len] scores.
  int64_t values = rows * (in_w + out_w);
  if (op == BlockOp::Attention) values += 2 * kv_len * c.kv_dim() + c.n_heads * rows * kv_len;
  o.activation_bytes = values * dtype_bytes(fmt);
  return o;
}

npu::StaticGraph describe_subgraph(const ModelConfig& c, const Plan& plan, npu::SubgraphKind kind,
                                   int64_t layer, int64_t rows, int64_t chunk_index) {
  if (rows <= 0)
    throw InvalidArgument("[StaticGraph] rows must be > 0, got " + std::to_string(rows));
  if (layer < 0 || layer >= c.n_layers)
    throw InvalidArgument("[StaticGraph] layer " + std::to_string(layer) + " outside [0, " +
                          std::to_string(c.n_layers) + ")");
  npu::StaticGraph g;
  g.key = {kind, layer, rows, chunk_index};
  const int64_t kv_len = (std::max<int64_t>(chunk_index, 0) + 1) * rows;
  bool first = true;
  for (const BlockOpInfo& info : decoder_block()) {
    if (info.subgraph != kind) continue;
    const auto [in_w, out_w] = op_widths(c, info.op);
    if (first) g.in_cols = in_w;
    first = false;
    g.out_cols = out_w;
    const soc::OpDesc o = describe_op(c, plan, info.op, rows, kv_len, layer);
    g.weight_bytes += o.weight_bytes;
    g.activation_bytes += o.activation_bytes;
  }
  return g;
}

npu::GraphCacheStats graph_census(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                  int64_t chunk_len, bool sharing) {
  if (chunk_len <= 0)
    throw InvalidArgument("[graph_census] chunk_len must be > 0, got " + std::to_string(chunk_len));
  const int64_t rows = prefill_graph_rows(prompt_len, chunk_len);
  npu::GraphCache cache(sharing);
  const int64_t chunks = (prompt_len + rows - 1) / rows;
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int k = 0; k < npu::kSubgraphsPerLayer; ++k)
        cache.acquire(describe_subgraph(c, plan, static_cast<SubgraphKind>(k), l, rows, ch));
  return cache.stats();
}

int64_t prefill_graph_rows(int64_t prompt_len, int64_t chunk_len) {
  if (prompt_len <= 0)
    throw InvalidArgument("[prefill] prompt length must be positive, got " +
                          std::to_string(prompt_len));
  if (chunk_len < 0)
    throw InvalidArgument("[prefill] chunk length must be >= 0, got " + std::to_string(chunk_len));
  if (chunk_len == 0) return prompt_len;
  if (prompt_len >= chunk_len) return chunk_len;
  int64_t rows = kMinGraphRows;
  while (rows < prompt_len) rows *= 2;
  return std::min(rows, chunk_len);
}

std::vector<ShadowLoad> expected_shadow_loads(const ModelConfig& c, const quant::ShadowOptions& o,
                                              double channels) {
  const int64_t L = c.n_layers, n = kNumLinearSites * L;
  const int64_t keep =
      n - static_cast<int64_t>(std::llround(o.pruning_rate * static_cast<double>(n)));
  // kept first: down inputs of evenly spaced layers, then the other inputs layer by layer
  std::vector<int64_t> order;  // input indices in keep order
  const int64_t downs = std::clamp<int64_t>(keep, 1, L);
  std::vector<bool> is_down(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < downs; ++i) {
    const int64_t layer =
        downs == 1 ? 0 : std::llround(static_cast<double>(i) * (L - 1) / (downs - 1));
    const int64_t idx = layer * kNumLinearSites + static_cast<int>(LinearSite::MlpAct);
    if (!is_down[static_cast<size_t>(idx)]) order.push_back(idx);
    is_down[static_cast<size_t>(idx)] = true;
  }
  for (int64_t i = 0; i < n; ++i)
    if (!is_down[static_cast<size_t>(i)]) order.push_back(i);
  std::vector<ShadowLoad> loads(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto& s = loads[static_cast<size_t>(i)];
    s.pruned = true;
    s.outlier_channels = channels;
    s.cold_fetch_bytes =
        cold_fetch_bytes(c, static_cast<LinearSite>(i % kNumLinearSites), channels, o.hot_share);
  }
  for (int64_t i = 0; i < std::max<int64_t>(keep, 0); ++i)
    loads[static_cast<size_t>(order[static_cast<size_t>(i)])].pruned = false;
  return loads;
}

std::string AttentionTimingOptions::resolved_core(const Plan& plan) const {
  if (cpu_core != "auto") return cpu_core;
  return plan.attention.is_fp32() ? std::string() : std::string("mid");
}

void AttentionTimingOptions::validate(const ModelConfig& c) const {
  const std::string f = "[AttentionTimingOptions] ";
  const int64_t n = c.n_layers * c.n_heads;
  if (max_fused_heads < 0)
    throw InvalidArgument(f + "max_fused_heads must be >= 0, got " +
                          std::to_string(max_fused_heads));
  if (!head_ratios.empty() && static_cast<int64_t>(head_ratios.size()) != n)
    throw InvalidArgument(f + "head_ratios has " + std::to_string(head_ratios.size()) +
                          " entries, n_layers x n_heads = " + std::to_string(n));
  for (size_t i = 0; i < head_ratios.size(); ++i)
    if (!(head_ratios[i] > 0 && head_ratios[i] <= 1))
      throw InvalidArgument(f + "head_ratios[" + std::to_string(i) +
                            "] = " + std::to_string(head_ratios[i]) + " (needs (0, 1])");
  if (!head_buckets.empty() && static_cast<int64_t>(head_buckets.size()) != n)
    throw InvalidArgument(f + "head_buckets has " + std::to_string(head_buckets.size()) +
                          " entries, n_layers x n_heads = " + std::to_string(n));
  for (size_t i = 0; i < head_buckets.size(); ++i)
    if (head_buckets[i] < 0)
      throw InvalidArgument(f + "head_buckets[" + std::to_string(i) +
                            "] = " + std::to_string(head_buckets[i]) + " (needs >= 0)");
  if (!(rescore_share >= 0 && rescore_share <= 1))
    throw InvalidArgument(f + "rescore_share must be in [0, 1], got " +
                          std::to_string(rescore_share));
  if (cpu_core != "auto" && !cpu_core.empty() && cpu_core != "mid" && cpu_core != "prime" &&
      cpu_core != "small")
    throw InvalidArgument(f + "cpu_core '" + cpu_core + "' (auto, mid, prime, small or '')");
}

BlockGraphBuilder::BlockGraphBuilder(ModelConfig config, Plan plan,
                                     AttentionTimingOptions attention)
    : c_(std::move(config)),
      plan_(std::move(plan)),
      attn_(std::move(attention)),
      prev_attention_(static_cast<size_t>(c_.n_layers)),
      builds_(static_cast<size_t>(c_.n_layers), -1) {
  c_.validate();
  plan_.validate_placement();
  attn_.validate(c_);
  option_buckets_ = attn_.head_buckets;
  core_ = attn_.resolved_core(plan_);
}

void BlockGraphBuilder::observe_attention(std::span<const int64_t> buckets, int64_t rescored_keys,
                                          int64_t rows, int64_t kv_len) {
  if (static_cast<int64_t>(buckets.size()) != c_.n_layers * c_.n_heads)
    throw ShapeError("[BlockGraphBuilder] observe_attention: " + std::to_string(buckets.size()) +
                     " buckets for " + std::to_string(c_.n_layers) + " layers x " +
                     std::to_string(c_.n_heads) + " heads");
  const bool all_chosen = std::ranges::all_of(buckets, [](int64_t b) { return b >= 0; });
  attn_.head_buckets =
      all_chosen ? std::vector<int64_t>(buckets.begin(), buckets.end()) : option_buckets_;
  if (plan_.attention.certified) {
    double pairs = 0;  // every layer's causal pairs (its window's, on sliding-window layers)
    for (int64_t l = 0; l < c_.n_layers; ++l)
      pairs += static_cast<double>(c_.n_heads) *
               static_cast<double>(causal_pairs(rows, kv_len, c_.layer_window(l)));
    attn_.rescore_share = std::min(1.0, static_cast<double>(rescored_keys) / pairs);
  }
}

namespace {

// Pairs kept by a head at `ratio`: per row, quant::keys_kept of its visible keys.
int64_t kept_pairs(int64_t rows, int64_t kv_len, int64_t window, double ratio, int64_t min_keys) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r)
    n += quant::keys_kept(visible_keys(r, rows, kv_len, window), ratio, min_keys);
  return n;
}

// Block-sparse's scored (query block, key block) pairs: its estimation GEMM and top-k.
int64_t block_sparse_candidates(int64_t rows, int64_t kv_len, int64_t block, int64_t window) {
  int64_t n = 0;
  for (const auto& b : quant::block_sparse_query_blocks(rows, kv_len - rows, block, window))
    n += b.candidates();
  return n;
}

// Block-sparse's attended pairs: per query block the key blocks it keeps (keys_kept over its
// candidates), and per row at most the keys it sees. Exact at keep=1; otherwise it assumes
// full kept blocks inside the row's range (which blocks are kept depends on the data).
int64_t kept_block_pairs(int64_t rows, int64_t kv_len, int64_t block, int64_t window,
                         double ratio) {
  int64_t n = 0;
  for (const auto& b : quant::block_sparse_query_blocks(rows, kv_len - rows, block, window)) {
    const int64_t kept = quant::keys_kept(b.candidates(), ratio, 1) * block;
    for (int64_t r = b.r0; r < b.r0 + b.rows; ++r)
      n += std::min(visible_keys(r, rows, kv_len, window), kept);
  }
  return n;
}

soc::OpDesc attn_op(soc::OpKind kind, const char* name, soc::DType dt, int64_t heads,
                    int64_t head_dim, int64_t elements, const std::string& core) {
  soc::OpDesc o;
  o.kind = kind;
  o.name = name;
  o.op_class = op_class_name(OpClass::Attention);
  o.dtype = dt;
  o.n = heads;
  o.k = head_dim;
  o.elements = elements;
  o.core = core;
  return o;
}

}  // namespace

std::vector<int64_t> BlockGraphBuilder::add_attention_tasks(const std::string& prefix,
                                                            int64_t chunk, int64_t layer,
                                                            int64_t rows, int64_t kv_len,
                                                            const std::vector<int64_t>& deps) {
  using soc::DType;
  using soc::OpKind;
  const auto& a = plan_.attention;
  const int64_t H = c_.n_heads, d = c_.head_dim;
  const soc::Processor P = plan_.at(OpClass::Attention).processor;
  const std::string core = P == soc::Processor::Cpu ? core_ : std::string();
  // The NPU's static-shape score ops compute every key (dense); the CPU's top-k, sparse and
  // block-sparse attention see a sliding-window layer's window only (prefill_attention.cpp).
  const int64_t window = c_.layer_window(layer);
  const int64_t dense = rows * kv_len, causal = causal_pairs(rows, kv_len, window);
  auto ratio = [&](int64_t h) {
    return attn_.head_ratios.empty() ? a.keep
                                     : attn_.head_ratios[static_cast<size_t>(layer * H + h)];
  };
  auto task = [&](const std::string& name, sched::TaskKind kind, soc::Processor p,
                  std::vector<soc::OpDesc> ops, std::vector<int64_t> heads, int64_t bytes,
                  std::vector<int64_t> on) {
    sched::Task t;
    t.name = prefix + name;
    t.kind = kind;
    t.processor = p;
    t.chunk = chunk;
    t.layer = layer;
    t.ops = std::move(ops);
    t.heads = std::move(heads);
    t.working_bytes = bytes;
    t.deps = std::move(on);
    const int64_t build = builds_[static_cast<size_t>(layer)];
    if (build >= 0 && p == soc::Processor::Npu &&
        std::find(t.deps.begin(), t.deps.end(), build) == t.deps.end())
      t.deps.push_back(build);
    return graph_.add(std::move(t));
  };
  if (a.kind == quant::AttentionKind::NpuInt8) {
    // NPU-Full (seed 000 §5 baseline 4): one graph, softmax and mask as NPU element-wise ops.
    std::vector<soc::OpDesc> ops = {
        attn_op(OpKind::NpuLaunch, "launch", DType::Int8, 0, 0, 0, ""),
        attn_op(OpKind::AttnMatMul, "qk", DType::Int8, H, d, dense, ""),
        attn_op(OpKind::Elementwise, "mask", DType::Fp16, 0, 0, H * dense, ""),
        attn_op(OpKind::Elementwise, "softmax", DType::Fp16, 0, 0, H * dense, ""),
        attn_op(OpKind::AttnMatMul, "pv", DType::Int8, H, d, dense, "")};
    return {task("attention", sched::TaskKind::Attention, plan_.at(OpClass::Attention).processor,
                 std::move(ops), {}, 2 * H * dense, deps)};
  }
  std::vector<int64_t> finals;
  if (a.kind == quant::AttentionKind::ShadowAttn) {
    std::vector<int64_t> buckets(static_cast<size_t>(H), 0);
    if (!attn_.head_buckets.empty())
      buckets.assign(attn_.head_buckets.begin() + layer * H,
                     attn_.head_buckets.begin() + (layer + 1) * H);
    const auto launches = sched::fuse_launches(buckets, attn_.max_fused_heads);
    std::vector<int64_t> est_of(static_cast<size_t>(H), -1);
    for (size_t l = 0; l < launches.size(); ++l) {
      const auto& hs = launches[l];
      const auto nh = static_cast<int64_t>(hs.size());
      std::vector<soc::OpDesc> ops = {
          attn_op(OpKind::NpuLaunch, "launch", DType::Int8, 0, 0, 0, ""),
          attn_op(OpKind::AttnMatMul, "qk_estimate", DType::Int8, nh, d, dense, "")};
      const int64_t id = task("estimate.g" + std::to_string(l), sched::TaskKind::Estimate,
                              soc::Processor::Npu, std::move(ops), hs, 4 * nh * dense, deps);
      for (int64_t h : hs) est_of[static_cast<size_t>(h)] = id;
    }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t est = est_of[static_cast<size_t>(h)];
      const std::string hn = ".h" + std::to_string(h);
      std::vector<soc::OpDesc> topk = {
          attn_op(OpKind::TopK, "topk", DType::Fp32, 1, d, causal, core)};
      if (a.certified)  // the uncertain band's keys, rescored in fp32 (attention_scheme.h)
        topk.push_back(attn_op(OpKind::AttnMatMul, "rescore", DType::Fp32, 1, d,
                               std::llround(attn_.rescore_share * static_cast<double>(causal)),
                               core));
      const int64_t tk =
          task("topk" + hn, sched::TaskKind::TopK, P, std::move(topk), {h}, 4 * dense, {est});
      const int64_t kept = kept_pairs(rows, kv_len, window, ratio(h), a.min_keys);
      finals.push_back(task(
          "sparse_attention" + hn, sched::TaskKind::SparseAttention, P,
          {attn_op(OpKind::SparseAttention, "sparse_attention", DType::Fp32, 1, d, kept, core)},
          {h}, 4 * (kept + 2 * rows * d), {est, tk}));  // Eq. 4
    }
    return finals;
  }
  // sparse / block-sparse: every stage on the attention's processor, head after head.
  const bool block = a.kind == quant::AttentionKind::BlockSparse;
  const int64_t B = a.block;
  const int64_t block_pairs = block ? block_sparse_candidates(rows, kv_len, B, window) : 0;
  std::vector<int64_t> on = deps;
  for (int64_t h = 0; h < H; ++h) {
    const std::string hn = ".h" + std::to_string(h);
    std::vector<soc::OpDesc> est_ops;
    if (block) {
      soc::OpDesc pool =
          attn_op(OpKind::Elementwise, "pool", DType::Fp32, 0, 0, (rows + kv_len) * d, core);
      est_ops.push_back(pool);
    }
    est_ops.push_back(attn_op(OpKind::AttnMatMul, "qk_estimate", DType::Fp32, 1, d,
                              block ? block_pairs : causal, core));
    const int64_t est = task("estimate.h" + std::to_string(h), sched::TaskKind::Estimate, P,
                             std::move(est_ops), {h}, 4 * (block ? block_pairs : causal), on);
    const int64_t tk =
        task("topk" + hn, sched::TaskKind::TopK, P,
             {attn_op(OpKind::TopK, "topk", DType::Fp32, 1, d, block ? block_pairs : causal, core)},
             {h}, 4 * (block ? block_pairs : causal), {est});
    const int64_t kept = block ? kept_block_pairs(rows, kv_len, B, window, ratio(h))
                               : kept_pairs(rows, kv_len, window, ratio(h), a.min_keys);
    const int64_t sa =
        task("sparse_attention" + hn, sched::TaskKind::SparseAttention, P,
             {attn_op(OpKind::SparseAttention, "sparse_attention", DType::Fp32, 1, d, kept, core)},
             {h}, 4 * (kept + 2 * rows * d), {est, tk});
    on = {sa};
  }
  return on;
}

void BlockGraphBuilder::add_graph_builds(int64_t rows, double build_ms, double optimize_ms) {
  for (int64_t l = 0; l < c_.n_layers; ++l) {
    sched::Task t;
    t.name = "build.L" + std::to_string(l) + ".r" + std::to_string(rows);
    t.kind = sched::TaskKind::GraphBuild;
    t.processor = soc::Processor::Npu;
    t.layer = l;
    soc::OpDesc op;
    op.kind = soc::OpKind::Fixed;
    op.name = "graph_build";
    op.fixed_us = 1000.0 * (build_ms + optimize_ms) / static_cast<double>(c_.n_layers);
    t.ops.push_back(op);
    if (l > 0) t.deps.push_back(builds_[static_cast<size_t>(l - 1)]);
    builds_[static_cast<size_t>(l)] = graph_.add(std::move(t));
  }
}

void BlockGraphBuilder::add_chunk(int64_t chunk, int64_t rows, int64_t kv_len,
                                  std::span<const ShadowLoad> shadow) {
  if (rows <= 0 || kv_len < rows)
    throw InvalidArgument("[BlockGraphBuilder] chunk " + std::to_string(chunk) + ": rows " +
                          std::to_string(rows) + ", kv_len " + std::to_string(kv_len));
  const bool shadowed = plan_.linear.shadow.has_value();
  if (shadowed && static_cast<int64_t>(shadow.size()) != c_.n_layers * kNumLinearSites)
    throw ShapeError("[BlockGraphBuilder] shadow loads: " + std::to_string(shadow.size()) +
                     " given, " + std::to_string(c_.n_layers * kNumLinearSites) +
                     " (n_layers x 4) expected for plan '" + plan_.name + "'");
  const std::string cp = "c" + std::to_string(chunk) + ".";
  int64_t prev = -1;            // chunks depend on each other only through attention (Eq. 2)
  int64_t pending_shadow = -1;  // shadow task the next task also waits for (Eq. 1 merge)
  std::vector<int64_t> pending_attention;  // head-wise attention tasks the next task waits for
  const auto block = decoder_block();
  // Non-fp32 attention expands into head-wise tasks (add_attention_tasks).
  const bool expand = !plan_.attention.is_fp32();
  for (int64_t l = 0; l < c_.n_layers; ++l) {
    const std::string lp = cp + "L" + std::to_string(l) + ".";
    size_t i = 0;
    while (i < block.size()) {
      if (expand && block[i].op == BlockOp::Attention) {
        std::vector<int64_t> deps;
        if (prev >= 0) deps.push_back(prev);
        if (pending_shadow >= 0) deps.push_back(pending_shadow);
        for (int64_t p : prev_attention_[static_cast<size_t>(l)])  // Eq. 2: KV of earlier chunks
          if (std::find(deps.begin(), deps.end(), p) == deps.end()) deps.push_back(p);
        pending_attention = add_attention_tasks(lp + "attention.", chunk, l, rows, kv_len, deps);
        prev_attention_[static_cast<size_t>(l)] = pending_attention;
        prev = -1;
        pending_shadow = -1;
        ++i;
        continue;
      }
      // One task: consecutive ops of one subgraph placed on one processor.
      const auto sub = block[i].subgraph;
      const auto proc = plan_.at(block[i].op_class).processor;
      size_t j = i;
      while (j < block.size() && block[j].subgraph == sub &&
             plan_.at(block[j].op_class).processor == proc &&
             !(expand && block[j].op == BlockOp::Attention))
        ++j;
      const bool whole = (i == 0 || block[i - 1].subgraph != sub) &&
                         (j == block.size() || block[j].subgraph != sub);
      sched::Task t;
      t.kind = task_kind_of(sub);
      t.name = lp + npu::subgraph_kind_name(sub) + (whole ? "" : std::string(".") + block[i].name);
      t.processor = proc;
      t.chunk = chunk;
      t.layer = l;
      bool has_attention = false;
      std::optional<LinearSite> site;
      BlockOp linear_op = BlockOp::Qkv;
      int64_t act_in = 0, act_out = 0;
      for (size_t k = i; k < j; ++k) {
        t.ops.push_back(describe_op(c_, plan_, block[k].op, rows, kv_len, l));
        if (block[k].op == BlockOp::Attention && proc == soc::Processor::Cpu)
          t.ops.back().core = core_;  // the attention's CPU budget (fp32: "" unless asked)
        has_attention = has_attention || block[k].op == BlockOp::Attention;
        if (block[k].site) {
          site = block[k].site;
          linear_op = block[k].op;
          act_in = t.ops.back().m * t.ops.back().k;
          act_out = t.ops.back().m * t.ops.back().n;
        }
      }
      // Activations alive while the task runs, at fp16 (the NPU/CPU buffers of seed 001 §3.4).
      t.working_bytes = 2 * (act_in + act_out + rows * c_.d_model);
      if (prev >= 0) t.deps.push_back(prev);  // Eq. 3: intra-chunk order
      if (pending_shadow >= 0) t.deps.push_back(pending_shadow);
      t.deps.insert(t.deps.end(), pending_attention.begin(), pending_attention.end());
      // What produced this task's input (a shadow part beside it reads the same input).
      std::vector<int64_t> input_tasks = pending_attention;
      if (prev >= 0) input_tasks = {prev};
      pending_attention.clear();
      if (has_attention)
        for (int64_t p : prev_attention_[static_cast<size_t>(l)])  // Eq. 2: KV of earlier chunks
          if (std::find(t.deps.begin(), t.deps.end(), p) == t.deps.end()) t.deps.push_back(p);
      const int64_t build = builds_[static_cast<size_t>(l)];
      if (build >= 0 && t.processor == soc::Processor::Npu &&
          std::find(t.deps.begin(), t.deps.end(), build) == t.deps.end())
        t.deps.push_back(build);
      prev = graph_.add(std::move(t));
      pending_shadow = -1;
      if (has_attention) prev_attention_[static_cast<size_t>(l)] = {prev};
      // The shadow part of this task's linear reads the same input and runs beside it; the next
      // task adds its result (Eq. 1).
      if (shadowed && site) {
        const ShadowLoad& sl =
            shadow[static_cast<size_t>(l * kNumLinearSites + static_cast<int>(*site))];
        // An unpruned input's CPU part exists in every chunk, outliers or not: the CPU has to scan
        // the input for values beyond t and the NPU graph waits for its answer (our choice; the
        // measured channel count, possibly 0, is its load).
        if (!sl.pruned) {
          sched::Task sh;
          sh.kind = sched::TaskKind::Shadow;
          sh.name = lp + "shadow." + block_op(linear_op).name;
          sh.processor = plan_.at(OpClass::Shadow).processor;
          sh.chunk = chunk;
          sh.layer = l;
          soc::OpDesc o;
          o.kind = soc::OpKind::OutlierMatMul;
          o.name = std::string("shadow.") + block_op(linear_op).name;
          o.op_class = op_class_name(OpClass::Shadow);
          o.dtype = plan_.at(OpClass::Shadow).format;
          o.m = rows;
          o.k = static_cast<int64_t>(std::ceil(sl.outlier_channels));
          o.n = op_widths(c_, linear_op).second;
          o.bytes = static_cast<int64_t>(sl.cold_fetch_bytes);
          sh.ops = {o};
          sh.working_bytes = 4 * (o.m * o.k + o.m * o.n) + o.bytes;
          sh.deps = input_tasks;
          pending_shadow = graph_.add(std::move(sh));
        }
      }
      i = j;
    }
  }
  last_ = {prev};  // what the LM head waits for: the last task, and a shadow part beside it
  if (pending_shadow >= 0) last_.push_back(pending_shadow);
}

void BlockGraphBuilder::add_lm_head(int64_t rows) {
  sched::Task t;
  t.kind = sched::TaskKind::LmHead;
  t.name = "lm_head";
  const OpPlacement& p = plan_.at(OpClass::LmHead);
  t.processor = p.processor;
  // Final norm, then the LM head for the last position(s): a GEMV that streams its weights at
  // the DRAM rate (memory-bound, unlike the batched matmuls of Table 3).
  soc::OpDesc norm = elementwise(p.format, rows * c_.d_model);
  norm.name = "final_norm";
  norm.op_class = op_class_name(OpClass::LmHead);
  norm.weight_bytes = c_.d_model * static_cast<int64_t>(sizeof(float));
  soc::OpDesc head;
  head.kind = soc::OpKind::MemoryCopy;
  head.name = "lm_head";
  head.op_class = op_class_name(OpClass::LmHead);
  head.dtype = p.format;
  head.bytes = c_.vocab_size * c_.d_model * dtype_bytes(p.format);
  head.weight_bytes = head.bytes;
  t.ops = {norm, head};
  t.working_bytes = 4 * rows * (c_.d_model + c_.vocab_size);
  t.deps = last_;
  last_ = {graph_.add(std::move(t))};
}

int64_t linear_out_width(const ModelConfig& c, LinearSite site) {
  for (const BlockOpInfo& info : decoder_block())
    if (info.site == site) return op_widths(c, info.op).second;
  return 0;
}

int64_t linear_params_per_block(const ModelConfig& c) {
  int64_t n = 0;
  for (const BlockOpInfo& info : decoder_block())
    if (info.site) {
      const auto [in_w, out_w] = op_widths(c, info.op);
      n += in_w * out_w;
    }
  return n;
}

double cold_fetch_bytes(const ModelConfig& c, LinearSite site, double channels, double hot_share) {
  return channels * (1.0 - hot_share) * static_cast<double>(linear_out_width(c, site)) *
         sizeof(float);
}

int64_t prefill_resident_bytes(const ModelConfig& c, const Plan& plan, int64_t prompt_len) {
  const double per_param = weight_bytes_per_param(plan.linear);
  const int64_t kv = 2 * c.n_layers * prompt_len * c.kv_dim() * 2;
  return static_cast<int64_t>(static_cast<double>(c.n_layers * linear_params_per_block(c)) *
                              per_param) +
         c.vocab_size * c.d_model * 2 + kv;
}

sched::TaskGraph prefill_task_graph(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                    int64_t chunk_len, const PrefillGraphOptions& opts) {
  const int64_t rows = prefill_graph_rows(prompt_len, chunk_len);
  if (prompt_len > c.context_length)
    throw ContextOverflow("[prefill_task_graph] prompt of " + std::to_string(prompt_len) +
                          " tokens exceeds the model's context length " +
                          std::to_string(c.context_length));
  if (chunk_len > c.context_length)
    throw InvalidArgument("[prefill_task_graph] chunk length " + std::to_string(chunk_len) +
                          " exceeds the model's context length " +
                          std::to_string(c.context_length));
  const int64_t chunks = (prompt_len + rows - 1) / rows;
  if (!opts.shadow_per_chunk.empty() &&
      static_cast<int64_t>(opts.shadow_per_chunk.size()) != chunks)
    throw ShapeError("[prefill_task_graph] " + std::to_string(opts.shadow_per_chunk.size()) +
                     " chunks of shadow loads for " + std::to_string(chunks) + " chunks");
  std::vector<ShadowLoad> expected = opts.expected;
  if (plan.linear.shadow && expected.empty())
    expected = expected_shadow_loads(c, *plan.linear.shadow);
  BlockGraphBuilder b(c, plan, opts.attention);
  if (opts.build_ms > 0 || opts.optimize_ms > 0)
    b.add_graph_builds(rows, opts.build_ms, opts.optimize_ms);
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const auto& loads =
        opts.shadow_per_chunk.empty() ? expected : opts.shadow_per_chunk[static_cast<size_t>(ch)];
    b.add_chunk(
        ch, rows, (ch + 1) * rows,
        plan.linear.shadow ? std::span<const ShadowLoad>(loads) : std::span<const ShadowLoad>());
  }
  b.add_lm_head(1);
  sched::TaskGraph g = b.take();
  g.meta = prefill_graph_meta(c, plan, prompt_len, chunk_len);
  return g;
}

nlohmann::json prefill_graph_meta(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                  int64_t chunk_len) {
  Plan as_run = plan;  // the plan as the prefill ran it: with this chunk length
  as_run.chunk_len = chunk_len;
  return {{"config", c.name.empty() ? c.arch : c.name},
          {"plan", as_run.to_json()},
          {"prompt_len", prompt_len},
          {"chunk_len", chunk_len},
          {"graph_rows", prefill_graph_rows(prompt_len, chunk_len)},
          {"resident_bytes", prefill_resident_bytes(c, plan, prompt_len)}};
}

}  // namespace socllm
