// Engine layer: the decoder block, described once at operator granularity (DESIGN.md, "one task
// graph, two interpretations").
//
// A llama-family block is the op list below, in execution order. Each op has a class (placed
// by the plan: processor + format, plan.h), a linear site if it is a linear, and the NPU
// subgraph it belongs to (static_graph.h: what one NPU graph executes, seed 001 §3.2):
//
//   subgraph   ops                          subgraph   ops
//   attn_in    attn_norm, qkv               mlp_in     ffn_norm, gate_up
//   attention  rope, attention              mlp_act    act
//   o_proj     o_proj, attn_residual        down       down, ffn_residual
//
// From (config, plan, rows, kv_len) every op gets its shapes, format and bytes (describe_op).
// The engine executes this list op by op (engine.cpp run_blocks walks decoder_block()); the
// task graph groups consecutive ops of one subgraph on one processor into a task, adds the
// shadow-outlier CPU parts and llm.npu's dependencies (Eq. 2/3), and is what the simulator
// times. A prefill that returns its graph builds it with the same builder from what it ran, so
// the executed graph and the config-only graph agree task for task.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "socllm/calibration.h"
#include "socllm/model.h"
#include "socllm/plan.h"
#include "socllm/static_graph.h"
#include "socllm/task_graph.h"

namespace socllm {

enum class BlockOp : int {
  AttnNorm = 0,
  Qkv,
  Rope,
  Attention,
  OProj,
  AttnResidual,
  FfnNorm,
  GateUp,
  Act,
  Down,
  FfnResidual
};
constexpr int kNumBlockOps = 11;

struct BlockOpInfo {
  BlockOp op;
  const char* name;  // "attn_norm", "qkv" ...
  OpClass op_class;
  npu::SubgraphKind subgraph;
  std::optional<LinearSite> site;  // the linear site (linears only)
};

// The ops of one decoder block in execution order.
std::span<const BlockOpInfo> decoder_block();
const BlockOpInfo& block_op(BlockOp op);

// Shapes, format and bytes of one op of `layer` for `rows` rows whose attention covers `kv_len`
// positions, placed as the plan says. Pure function of the config: no weights needed. Gemma 3's
// extra work is in the op that runs it (engine.cpp): the per-head q/k RMSNorm in `rope`, the
// post-attention/post-MLP norm in the residual ops, and a sliding-window layer's attention
// covers at most `sliding_window` keys.
soc::OpDesc describe_op(const ModelConfig& c, const Plan& plan, BlockOp op, int64_t rows,
                        int64_t kv_len, int64_t layer);

// The static graph of one subgraph (its ops' input/output widths, weight and buffer bytes) for a
// chunk of `rows` rows at `chunk_index` (attention covers (chunk_index + 1) * rows positions).
npu::StaticGraph describe_subgraph(const ModelConfig& c, const Plan& plan, npu::SubgraphKind kind,
                                   int64_t layer, int64_t rows, int64_t chunk_index);

// Output width of the linear at a site (its weight's rows), and the linear weights of one block.
int64_t linear_out_width(const ModelConfig& c, LinearSite site);
int64_t linear_params_per_block(const ModelConfig& c);

// Graph census of one chunked prefill from the config alone: the graphs the engine acquires.
npu::GraphCacheStats graph_census(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                  int64_t chunk_len, bool sharing = true);

// Rows of the static graphs a prompt of prompt_len runs on with chunk_len (0: one graph of the
// whole prompt). A prompt shorter than a chunk runs on the smallest pre-built graph that holds
// it: powers of two from kMinGraphRows (the standard graph sizes of seed 002 §5.2.2), capped at
// chunk_len. InvalidArgument for a non-positive prompt or negative chunk.
constexpr int64_t kMinGraphRows = 32;
int64_t prefill_graph_rows(int64_t prompt_len, int64_t chunk_len);

// The CPU work of one shadow-outlier linear input in one chunk.
struct ShadowLoad {
  bool pruned = false;          // CPU part pruned (no task)
  double outlier_channels = 0;  // channels gathered into the dense tensor
  double cold_fetch_bytes = 0;  // float weight columns read from flash
  bool operator==(const ShadowLoad&) const = default;
};

// Expected loads of every input ([layer * kNumLinearSites + site]) when no calibration of the
// model exists (shape-only configs): `channels` outlier channels per input per chunk ("around
// 5-15", seed 001 §3.3 Fig. 10), a share 1 - hot_share of them fetched cold; the pruned inputs
// are round(pruning_rate * n), keeping first the FFN-down inputs of evenly spaced layers (on
// SmolLM2 the profile keeps down-projection inputs almost only: notebooks/02_outliers.ipynb).
constexpr double kDefaultShadowChannels = 10.0;
// Bytes of the fp32 weight columns `channels` outlier channels of a site's input fetch from flash
// when a share hot_share of them is resident.
double cold_fetch_bytes(const ModelConfig& c, LinearSite site, double channels, double hot_share);
std::vector<ShadowLoad> expected_shadow_loads(const ModelConfig& c, const quant::ShadowOptions& o,
                                              double channels = kDefaultShadowChannels);

// How a chunk's attention becomes tasks when the plan's attention is not fp32 (seed 000): the
// attention op of a layer expands into head-wise tasks (the rope stays one task before them):
//   shadow-attn   per fused launch an NPU Estimate task (launch + INT8 Q·Kᵀ of the dense
//                 rows x kv scores of its heads: a static graph computes masked pairs too); per
//                 head a TopK task over its causal scores and a SparseAttention task over the
//                 keys it keeps, with Eq. 4's dependencies (ζnpu <- ζtopk; ζnpu, ζtopk <- ζqkv);
//                 the order of launches and heads is the scheduler's (head_pipeline.h);
//   sparse        per head, on the attention's processor: fp32 Q·Kᵀ estimation over the causal
//                 pairs, top-k, sparse attention, chained in head order (one core, no overlap);
//   block-sparse  the same with Q and K mean-pooled over `block` rows first (an element-wise
//                 pass over the head's Q and K) and block top-k over the pooled causal pairs;
//   npu-int8      one NPU task: a launch, INT8 Q·Kᵀ, mask and softmax as NPU element-wise ops,
//                 INT8 P·V.
// Keys kept per row follow quant::keys_kept with the head's ratio (the plan's keep when no
// per-head ratios are given). The attention's CPU work is timed on one core class.
struct AttentionTimingOptions {
  // Core class of /cost_model/cpu_core the attention's CPU ops are timed on ("mid", "prime",
  // "small"; "" = the whole CPU's /cost_model/cpu rates). "auto": "mid" (seed 000 §4-5: one mid
  // core is the CPU budget of every baseline) for non-fp32 attention, "" for fp32 (today's
  // whole-CPU attention task; pass "mid" to time seed 000's C/G-Full).
  std::string cpu_core = "auto";
  // Heads fused into one NPU launch at most (seed 000 §3.4 measures fused graphs of 1, 2 and 4
  // heads; 0: no limit, 1: no fusion).
  int64_t max_fused_heads = 4;
  // [n_layers * n_heads] keep ratios per query head in (0, 1] (e.g. Eq. 3's from calibration);
  // empty: the plan's keep for every head.
  std::vector<double> head_ratios;
  // [n_layers * n_heads] scale-bucket id of each head (heads of a layer sharing an id may fuse);
  // empty: every head of a layer in one bucket (the upper bound of fusion; our assumption for
  // shape-only configs, since which bucket a head's input falls in is only known at run time).
  std::vector<int64_t> head_buckets;
  // Certified shadow-attn (attention_scheme.h): the share of a head's causal (query, key) pairs
  // rescored in fp32, timed as an fp32 Q·Kᵀ on the top-k task's core. 1 (default for shape-only
  // configs) is the bound's worst case; a recorded prefill uses what the engine rescored.
  double rescore_share = 1.0;
  // The core class the options resolve to for `plan` ("auto" as above).
  std::string resolved_core(const Plan& plan) const;
  // InvalidArgument naming the field: sizes, ratios outside (0, 1], negative buckets or limits.
  void validate(const ModelConfig& c) const;
};

// Builds a prefill task graph chunk by chunk with llm.npu's dependencies (seed 001 §3.4): within
// a chunk each task waits for the previous one (Eq. 3); the task holding a chunk's attention
// waits for the same layer's attention of the previous chunk, whose KV it reads (Eq. 2). A
// shadow task reads the linear's input beside the linear's task; the task after it waits for it
// (Eq. 1's merge).
class BlockGraphBuilder {
 public:
  BlockGraphBuilder(ModelConfig config, Plan plan, AttentionTimingOptions attention = {});
  // Static graphs built at run time before the first chunk (naive NPU execution builds and
  // optimizes one graph per prompt shape, seed 001 §2.2): one NPU task per layer.
  void add_graph_builds(int64_t rows, double build_ms, double optimize_ms);
  // One chunk of `rows` rows (a static graph's padded length) at index `chunk`, whose attention
  // covers `kv_len` positions. shadow: per input [layer * kNumLinearSites + site] (required for
  // plans with shadow outliers, else empty).
  void add_chunk(int64_t chunk, int64_t rows, int64_t kv_len,
                 std::span<const ShadowLoad> shadow = {});
  void add_lm_head(int64_t rows);
  // What an engine's sparse attention chose in the chunk added next (`rows` real rows whose
  // attention ends at key kv_len): the scale bucket of each head ([n_layers * n_heads]; seed 000
  // §3.3, heads sharing one may share a launch; any entry < 0, i.e. no buckets, keeps the
  // options' head_buckets) and the keys certified shadow-attn rescored in fp32 over all layers
  // and heads (sets rescore_share).
  void observe_attention(std::span<const int64_t> buckets, int64_t rescored_keys, int64_t rows,
                         int64_t kv_len);
  sched::TaskGraph take() { return std::move(graph_); }

 private:
  // The head-wise tasks of one layer's attention; returns the tasks the next one waits for.
  std::vector<int64_t> add_attention_tasks(const std::string& prefix, int64_t chunk, int64_t layer,
                                           int64_t rows, int64_t kv_len,
                                           const std::vector<int64_t>& deps);
  ModelConfig c_;
  Plan plan_;
  AttentionTimingOptions attn_;
  std::vector<int64_t> option_buckets_;  // the options' head_buckets (observe_attention's default)
  std::string core_;                     // attn_.resolved_core(plan_)
  sched::TaskGraph graph_;
  // per layer: the attention task(s) of the previous chunk (Eq. 2)
  std::vector<std::vector<int64_t>> prev_attention_;
  std::vector<int64_t> builds_;  // per layer: graph-build task, if any
  std::vector<int64_t> last_;    // the tasks the latest chunk ends with
};

struct PrefillGraphOptions {
  // Run-time graph build and optimize times of the whole model (0: graphs are pre-built).
  double build_ms = 0, optimize_ms = 0;
  // Shadow loads per chunk (what an engine measured); empty: `expected` for every chunk.
  std::vector<std::vector<ShadowLoad>> shadow_per_chunk;
  std::vector<ShadowLoad> expected;  // empty: expected_shadow_loads(config, plan options)
  AttentionTimingOptions attention;  // head-wise attention (seed 000)
};

// The prefill graph of a prompt from a config alone: chunks of prefill_graph_rows(prompt_len,
// chunk_len), the last one padded, then the LM head of the last position. meta records the
// request (config, plan, prompt_len, chunk_len, graph_rows) and resident_bytes.
sched::TaskGraph prefill_task_graph(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                    int64_t chunk_len, const PrefillGraphOptions& opts = {});

// The request a prefill graph describes, as its meta.
nlohmann::json prefill_graph_meta(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                  int64_t chunk_len);

// Bytes resident during a prefill: linear weights at their stored width, the fp16 embedding and
// the fp16 KV cache of the prompt.
int64_t prefill_resident_bytes(const ModelConfig& c, const Plan& plan, int64_t prompt_len);

// Stored bytes per linear weight of a scheme (int4 packed two per byte).
double weight_bytes_per_param(const quant::LinearScheme& s);

}  // namespace socllm
