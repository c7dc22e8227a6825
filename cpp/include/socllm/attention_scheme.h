// Quant layer: how the attention of a prefill is computed (a plan component, plan.h), and the
// per-layer constants a scheme fixes from calibration (shadowAttn, seed 000).
//
// Kinds (seed 000 §5 "Baselines" and §3.2-3.3):
//   fp32          C/G-Full: dense causal attention in fp32 (the engine's kernel).
//   sparse        C/G-Sparse: fp32 estimation of Q·Kᵀ, per-row top-k over the causal keys, fp32
//                 attention over the selected keys only.
//   block-sparse  C/G-Block-Sparse: Q and K mean-pooled over 64-row blocks (absolute positions),
//                 pooled scores, per query block the top-k key blocks (the diagonal block always
//                 kept), attention over the selected blocks' causal keys.
//   npu-int8      NPU-Full: Q·Kᵀ and P·V in INT8 with static per-tensor scales from calibration,
//                 exact int32 accumulation; softmax in fp32 on the dequantized scores, its output
//                 rounded to fp16 (the NPU's float format) and quantized to uint8 with scale
//                 1/255 (P in [0, 1]), P·V as u8 x s8 -> s32.
//   shadow-attn   shadowAttn: per query head, Q and K quantized to INT8 with the static scales of
//                 the bucket whose <λQ, λK> is nearest (MSE) to the input's own (λ = max|x|/127
//                 of the head's Q rows and its KV head's keys), exact INT8 Q·Kᵀ, per-row top-k
//                 on the int32 scores over the causal keys (masked keys skipped, no softmax,
//                 §3.2), then fp32 attention over the selected keys only.
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
//                 score error (prefill_attention.h); 0 (default) = the paper's estimate.
// Decode (one new token on a non-empty cache) always runs full fp32 attention (seed 000 §4).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace socllm::quant {

enum class AttentionKind : int { Fp32 = 0, Sparse, BlockSparse, NpuInt8, ShadowAttn };
const char* attention_kind_name(AttentionKind k);
// InvalidArgument naming the value and listing the kinds.
AttentionKind attention_kind_from_name(const std::string& s);
bool is_attention_kind(const std::string& s);

struct AttentionScheme {
  AttentionKind kind = AttentionKind::Fp32;
  double keep = 0.2;               // global share of keys kept (sparse kinds), (0, 1]; §5: 20%
  int64_t min_keys = 1;            // keys every row keeps at least (if it sees that many)
  int64_t block = 64;              // block-sparse pooling size (seed 000 §5: 64x64)
  int64_t buckets = 9;             // shadow-attn scale buckets (§5.2: 9)
  double step = 0.5;               // shadow-attn bucket step σ (§5.2: 5e-1)
  std::string scales = "buckets";  // shadow-attn estimator scales: buckets | dynamic
  std::string ratios = "uniform";  // per-head keep ratios: calibrated | uniform
  int64_t certified = 0;           // shadow-attn: 1 = fp32 rescoring of the uncertain band
  // Eq. 3's clamp of headImp·layerImp: products are bounded to the [1 - q, q] quantiles of
  // the positive ones. The paper's example is absolute (1e-3, in its loss units); on SmolLM2 the
  // products are 1e-3..1 nats², so an absolute 1e-3 would clamp almost every head (uniform).
  double clamp_quantile = 0.95;

  bool is_fp32() const { return kind == AttentionKind::Fp32; }
  bool is_sparse() const {
    return kind == AttentionKind::Sparse || kind == AttentionKind::BlockSparse ||
           kind == AttentionKind::ShadowAttn;
  }
  // What the scheme reads from calibration: head/layer importance (calibrated ratios), Q/K(/V)
  // scale statistics (shadow-attn buckets, npu-int8 static scales).
  bool needs_head_importance() const { return is_sparse() && ratios == "calibrated"; }
  bool needs_qk_scales() const {
    return kind == AttentionKind::NpuInt8 ||
           (kind == AttentionKind::ShadowAttn && scales == "buckets");
  }
  // InvalidArgument naming the field and value.
  void validate() const;
  // {"kind": ..., and the options that apply to the kind}.
  nlohmann::json to_json() const;
  // An object {"kind": ..., options} or text "kind" / "kind:key=value,key=value". The kind's
  // defaults: shadow-attn takes calibrated ratios, the others uniform. Strict: an option the
  // kind does not take is InvalidArgument listing the ones it does.
  static AttentionScheme from_json(const nlohmann::json& j);
  static AttentionScheme parse(const std::string& text);
  // The object form of a text spec, with only the options the text gives.
  static nlohmann::json text_to_json(const std::string& text);
  // The option names any kind takes (plan text "fp32:attention=sparse,keep=0.3" routes them).
  static const std::vector<std::string>& option_names();
  // Short display form: "fp32", "shadow-attn:keep=0.2".
  std::string label() const;
};

// Lattice offsets (a, b) of the first n buckets: Chebyshev ring max(|a|,|b|) first, then
// |a|+|b| (axis neighbours before corners), then a, then b. n = 1: (0,0); 5: the origin and its
// four axis neighbours; 9: the 3x3 square; 25: 5x5. Bucket i's scales are <λ̄Q·σ^a, λ̄K·σ^b>.
std::vector<std::pair<int, int>> bucket_offsets(int64_t n);

// Index of the bucket nearest (mean squared error over <λQ, λK>) to (lq, lk); ties: the lower
// index. bq/bk: the buckets' scales.
int64_t nearest_bucket(float lq, float lk, std::span<const float> bq, std::span<const float> bk);

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

// Block-sparse's query blocks over T rows after `past` keys: blocks of `block` absolute
// positions (the first and last may be partial). Each ranks the key blocks from
// first_key_block (the one holding its first row's first visible key, after a sliding window's
// start) up to its own diagonal block, which it always keeps. The kernel (prefill_attention.cpp)
// and the task graph's pair counts (block.cpp) both take them from here.
struct BlockSparseQueryBlock {
  int64_t r0, rows;  // its rows [r0, r0 + rows)
  int64_t first_key_block, diagonal;
  int64_t candidates() const { return diagonal - first_key_block + 1; }
};
std::vector<BlockSparseQueryBlock> block_sparse_query_blocks(int64_t T, int64_t past, int64_t block,
                                                             int64_t window);

}  // namespace socllm::quant
