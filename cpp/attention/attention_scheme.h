// Attention layer: how the attention of a prefill is computed (a plan component, plan.h), one
// scheme per file, each owning both its numerics (run) and what it records for the timing graph
// (tasks), so the two cannot disagree (DESIGN.md, "one task graph, two interpretations").
//
// Schemes (registry.cpp; seed 000 §5 "Baselines" and §3.2-3.3):
//   fp32          C/G-Full: dense causal attention in fp32 (fp32.cpp).
//   sparse        C/G-Sparse: fp32 estimation of Q·Kᵀ, per-row top-k over the causal keys, fp32
//                 attention over the selected keys only (sparse.cpp).
//   block-sparse  C/G-Block-Sparse: Q and K mean-pooled over 64-row blocks (absolute positions),
//                 pooled scores, per query block the top-k key blocks (the diagonal block always
//                 kept), attention over the selected blocks' causal keys (block_sparse.cpp).
//   npu-int8      NPU-Full: Q·Kᵀ and P·V in INT8 with static per-tensor scales from calibration,
//                 exact int32 accumulation; softmax in fp32 on the dequantized scores, its output
//                 rounded to fp16 (the NPU's float format) and quantized to uint8 with scale
//                 1/255 (P in [0, 1]), P·V as u8 x s8 -> s32 (npu_int8.cpp).
//   shadow-attn   shadowAttn: per query head, Q and K quantized to INT8 with the static scales of
//                 the bucket whose <λQ, λK> is nearest (MSE) to the input's own (λ = max|x|/127
//                 of the head's Q rows and its KV head's keys), exact INT8 Q·Kᵀ, per-row top-k
//                 on the int32 scores over the causal keys (masked keys skipped, no softmax,
//                 §3.2), then fp32 attention over the selected keys only (shadow_attn.cpp).
// A new scheme is one file (a SchemeKind) plus one line in registry.cpp; its options, their
// defaults and help are declared in its file and reach plan text, JSON and the CLI from there.
//
// Choices the paper leaves open (docs/ARCHITECTURE.md "Sparse attention"):
//   k per row     k = min(visible, max(min_keys, ceil(ratio_h * visible))), visible = the row's
//                 causal keys (past + its index + 1); ratio_h the head's keep ratio.
//   ties          equal scores: the earlier key wins (the order is total, results repeatable).
//   GQA           every query head selects its own keys; heads sharing a KV head share its K/V
//                 (and, for shadow-attn, quantize it with their own bucket's λK).
//   head ratios   "calibrated": seed 000 Eq. 3 from head and layer importance (step
//                 head-importance) with the clamp_quantile below, ratios above 1 capped and their
//                 excess shared among the others so the mean stays `keep`; "uniform": keep for all.
//   buckets       λ grid <λ̄Q·σ^a, λ̄K·σ^b> per head (λ̄ the calibration mean, σ = step), the
//                 lattice points (a, b) taken in the order of bucket_offsets(); scales="dynamic"
//                 uses the input's own λ (the estimation-quality upper bound).
//   certified     shadow-attn option (beyond the paper, issue 13 item 7): 1 = the INT8 selection
//                 is made equal to the fp32 top-k (up to fp32 rounding) by rescoring in fp32 every
//                 key whose INT8 score lies within 2B of the k-th, B the row's bound on the INT8
//                 score error; 0 (default) = the paper's estimate.
// Decode (one new token on a non-empty cache) always runs full fp32 attention (seed 000 §4).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "calibration/calibration.h"
#include "model/model.h"
#include "sched/task_graph.h"
#include "soc/soc.h"

namespace socllm::attention {

class SchemeKind;

// One option of a scheme: its name, its default (whose JSON type is the option's type: a float,
// an integer or a name) and a one-line help; a name option lists its choices.
struct OptionSpec {
  const char* name;
  nlohmann::json default_value;
  const char* help;
  std::vector<std::string> choices = {};
};

// A scheme and its options (every option of the kind, defaults filled in): plan data.
struct AttentionScheme {
  const SchemeKind* kind;
  nlohmann::json options = nlohmann::json::object();
  AttentionScheme();  // fp32

  std::string name() const;
  // An option's value (InvalidArgument naming it if the kind has no such option).
  double number(const char* option) const;
  int64_t integer(const char* option) const;
  std::string text(const char* option) const;
  bool is_fp32() const;
  // Selects keys per row at run time (sparse, block-sparse, shadow-attn): no static NPU graph.
  bool is_sparse() const;
  // What the scheme reads from calibration: head/layer importance (calibrated ratios), Q/K(/V)
  // scale statistics (shadow-attn buckets, npu-int8 static scales).
  bool needs_head_importance() const;
  bool needs_qk_scales() const;
  // The format the scheme computes in: int8 (npu-int8, an NPU graph), else a float format.
  bool computes_int8() const;
  // InvalidArgument naming the option and value.
  void validate() const;
  // {"kind": ..., and the kind's options}.
  nlohmann::json to_json() const;
  // An object {"kind": ..., options} or text "kind" / "kind:key=value,key=value". Strict: an
  // option the kind does not take is InvalidArgument listing the ones it does.
  static AttentionScheme from_json(const nlohmann::json& j);
  static AttentionScheme parse(const std::string& text);
  // The object form of a text spec, with only the options the text gives.
  static nlohmann::json text_to_json(const std::string& text);
  // The option names any kind takes (plan text "fp32:attention=sparse,keep=0.3" routes them).
  static std::vector<std::string> option_names();
  // Short display form: "fp32", "shadow-attn:keep=0.2".
  std::string label() const;
  bool operator==(const AttentionScheme& o) const;
};

// What a scheme fixes for one layer from calibration.
struct LayerConsts {
  std::vector<double> head_ratio;         // [n_heads] keep ratio of each query head
  std::vector<float> bucket_q, bucket_k;  // [n_heads * buckets] λQ, λK of each head's buckets
  int64_t buckets = 0;
  float static_q = 0, static_k = 0, static_v = 0;  // npu-int8 per-tensor scales
};

// One layer's prefill attention on the engine's row layout: T new query rows (absolute positions
// past .. past+T-1) against the L = past + T keys and values so far.
struct Shape {
  int64_t T = 0, past = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  // > 0: sliding-window layer (Gemma 3's local layers), the query at absolute position p sees
  // keys max(0, p + 1 - window) .. p only, as kernels::attention_causal; every scheme selects,
  // keeps ratios of and normalizes over those keys. 0: all keys up to p.
  int64_t window = 0;
};

// What a sparse prefill selected (for studies, tests and the timing of what ran).
struct Trace {
  std::vector<int32_t> bucket;             // [n_heads] bucket chosen (shadow-attn), else -1
  std::vector<float> input_q, input_k;     // [n_heads] the input's own λQ, λK (shadow-attn)
  std::vector<std::vector<int32_t>> keys;  // [n_heads * T] selected keys of each row, ascending
  std::vector<int64_t> kept;               // [n_heads] (query row, key) pairs attended
  std::vector<int64_t> rescored;           // [n_heads] keys rescored in fp32, all rows (certified)
  // [n_heads] rows whose top-k was fused into the estimate (shadow-attn), and those of them whose
  // predicted band missed and whose scores were computed again
  std::vector<int64_t> fused_rows, missed_rows;
  bool record_keys = true;  // false: only buckets, pair counts and input scales
};

// The head-wise tasks of one layer's attention in one chunk (seed 000 §3.4, Eq. 4).
struct TaskShape {
  int64_t layer = 0, rows = 0, kv_len = 0, window = 0, n_heads = 0, head_dim = 0;
  soc::Processor processor = soc::Processor::Cpu;
  std::string core;                    // CPU core class the CPU ops are timed on ("": whole CPU)
  std::span<const double> head_ratio;  // [n_heads] keep ratio of each head
  std::span<const int64_t> buckets;    // [n_heads] scale bucket of each head (heads sharing one
                                       // may share a fused NPU launch)
  int64_t max_fused_heads = 4;         // heads per fused launch at most (0: no limit)
  double rescore_share = 1.0;          // certified: share of causal pairs rescored in fp32
};

// Where a scheme's tasks go (the block's graph recorder): adds a task of the layer's chunk that
// waits for `deps` and returns its id.
class TaskSink {
 public:
  virtual ~TaskSink() = default;
  virtual int64_t add(const std::string& name, sched::TaskKind kind, soc::Processor processor,
                      std::vector<soc::OpDesc> ops, std::vector<int64_t> heads,
                      int64_t working_bytes, std::vector<int64_t> deps) = 0;
};

class SchemeKind {
 public:
  virtual ~SchemeKind() = default;
  virtual const char* name() const = 0;
  virtual const char* description() const = 0;
  virtual std::vector<OptionSpec> options() const = 0;
  // Ranges and consistency of the options (their types are checked from options()).
  virtual void validate(const AttentionScheme& s) const {}
  virtual bool selects_keys() const { return false; }
  virtual bool computes_int8() const { return false; }
  virtual bool needs_head_importance(const AttentionScheme& s) const { return false; }
  virtual bool needs_qk_scales(const AttentionScheme& s) const { return false; }
  // Per-layer constants from calibration (InvalidArgument naming the missing step, prefixed by
  // `who`); calib may be null when neither needs_* holds.
  virtual std::vector<LayerConsts> prepare(const AttentionScheme& s, const Calibration* calib,
                                           const ModelConfig& c, const std::string& who) const;
  // Numerics: out [T, n_heads*head_dim] (ldo) = attention of q [T, n_heads*head_dim] (ldq) over
  // k, v [past+T, n_kv_heads*head_dim] (ldkv). ShapeError if `consts` do not fit the shape.
  virtual void run(const AttentionScheme& s, const LayerConsts& consts, const float* q, int64_t ldq,
                   const float* k, const float* v, int64_t ldkv, const Shape& sh, float* out,
                   int64_t ldo, Trace* trace) const = 0;
  // Timing: false: the attention is one op of the block's attention subgraph (dense, timed as
  // soc::OpKind::Attention); true: tasks() expands it into its own tasks.
  virtual bool head_wise() const { return true; }
  // Adds the layer's attention tasks (the first ones waiting for `deps`) and returns those the
  // next op waits for.
  virtual std::vector<int64_t> tasks(const AttentionScheme& s, const TaskShape& shape,
                                     TaskSink& sink, const std::vector<int64_t>& deps) const;
};

// The registered schemes (registry.cpp), and one by name (InvalidArgument listing them).
std::span<const SchemeKind* const> schemes();
const SchemeKind& scheme_kind(const std::string& name);
bool is_scheme_name(const std::string& name);
// Their names, comma-separated (for messages).
std::string scheme_list();

// Helpers the schemes share (common.cpp).

// Lattice offsets (a, b) of the first n buckets: Chebyshev ring max(|a|,|b|) first, then
// |a|+|b| (axis neighbours before corners), then a, then b. n = 1: (0,0); 5: the origin and its
// four axis neighbours; 9: the 3x3 square; 25: 5x5. Bucket i's scales are <λ̄Q·σ^a, λ̄K·σ^b>.
std::vector<std::pair<int, int>> bucket_offsets(int64_t n);
// Index of the bucket nearest (mean squared error over <λQ, λK>) to (lq, lk); ties: the lower
// index. bq/bk: the buckets' scales.
int64_t nearest_bucket(float lq, float lk, std::span<const float> bq, std::span<const float> bk);
// Eq. 3's default clamp_quantile: what step attention-clamp chose for SmolLM2-135M on
// calibration text (128-window ablated importance, KL from fp32 on 4 x 2048 validation tokens;
// 0.5-0.75 tie within noise, 0.95 costs +0.23 nats of KL; docs/RESULTS.md, issue 40). The
// paper's absolute clamp (1e-3 in its loss units) does not carry over to another loss scale.
inline constexpr double kDefaultClampQuantile = 0.75;
// Per-head keep ratios by seed 000 Eq. 3: c_i = max(headImp_i, 0) * max(layerImp_j, 0),
// clamped to the [1 - clamp_quantile, clamp_quantile] quantiles of the positive c (a head whose
// removal did not hurt gets the lower bound, not 0); ratio_i = keep * N * c_i / sum(c); ratios
// above 1 are set to 1 and the excess shared among the rest in proportion to c (water filling)
// so that the mean is keep. head_importance [n_layers * n_heads], layer_importance [n_layers].
// No positive c: uniform keep.
std::vector<double> head_keep_ratios(std::span<const float> head_importance,
                                     std::span<const float> layer_importance, int64_t n_heads,
                                     double keep, double clamp_quantile);
// Keys a row with `visible` causal keys keeps at `ratio`.
int64_t keys_kept(int64_t visible, double ratio, int64_t min_keys);
// (query row, key) pairs of `rows` causal rows ending at key kv_len (a window > 0 caps a row's
// keys), and the pairs kept by a head at `ratio` (keys_kept per row).
int64_t causal_pairs(int64_t rows, int64_t kv_len, int64_t window = 0);
int64_t kept_pairs(int64_t rows, int64_t kv_len, int64_t window, double ratio, int64_t min_keys);

// Block-sparse's query blocks over T rows after `past` keys: blocks of `block` absolute
// positions (the first and last may be partial). Each ranks the key blocks from
// first_key_block (the one holding its first row's first visible key, after a sliding window's
// start) up to its own diagonal block, which it always keeps. Its kernel and its task counts
// both take them from here.
struct BlockSparseQueryBlock {
  int64_t r0, rows;  // its rows [r0, r0 + rows)
  int64_t first_key_block, diagonal;
  int64_t candidates() const { return diagonal - first_key_block + 1; }
};
std::vector<BlockSparseQueryBlock> block_sparse_query_blocks(int64_t T, int64_t past, int64_t block,
                                                             int64_t window);

// Per-layer constants for uniform ratios and no calibration.
LayerConsts uniform_layer_consts(const AttentionScheme& s, int64_t n_heads);

// Convenience: s.kind->run(...) after the shape checks every scheme shares.
void prefill_attention(const AttentionScheme& s, const LayerConsts& consts, const float* q,
                       int64_t ldq, const float* k, const float* v, int64_t ldkv, const Shape& sh,
                       float* out, int64_t ldo, Trace* trace = nullptr);

}  // namespace socllm::attention
