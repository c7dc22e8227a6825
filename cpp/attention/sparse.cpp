// C/G-Sparse (seed 000 §5 baseline): fp32 estimation of Q·Kᵀ, per-row top-k over the causal
// keys, fp32 attention over the selected keys only (the estimate's scores are reused for them).
// The estimate is the dense kernel's Q·Kᵀ micro-kernel on keys packed once per KV head.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "attention/common.h"
#include "kernels/kernels.h"
#include "kernels/sparse_attention.h"

namespace socllm::attention {

namespace {

namespace k = socllm::kernels;
using detail::kEstimateRowChunk;
using detail::kSelectRowBlock;

class Sparse final : public SchemeKind {
 public:
  const char* name() const override { return "sparse"; }
  const char* description() const override {
    return "C/G-Sparse: fp32 Q·Kᵀ estimate, per-row top-k of the causal keys, fp32 attention "
           "over the kept keys";
  }
  std::vector<OptionSpec> options() const override { return detail::keep_ratio_options("uniform"); }
  void validate(const AttentionScheme& s) const override { detail::validate_keep_ratio_options(s); }
  bool selects_keys() const override { return true; }
  bool needs_head_importance(const AttentionScheme& s) const override {
    return detail::calibrated_ratios(s);
  }
  std::vector<LayerConsts> prepare(const AttentionScheme& s, const Calibration* calib,
                                   const ModelConfig& c, const std::string& who) const override {
    return detail::keep_ratio_consts(s, calib, c, who);
  }

  void run(const AttentionScheme& s, const LayerConsts& consts, const float* q, int64_t ldq,
           const float* kk, const float* v, int64_t ldkv, const Shape& sh, float* out, int64_t ldo,
           Trace* trace) const override {
    detail::check_head_ratios(consts, sh.n_heads, "prefill_attention");
    const int64_t T = sh.T, hd = sh.head_dim, H = sh.n_heads, group = H / sh.n_kv_heads;
    const int64_t min_keys = s.integer("min_keys");
    const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
    detail::trace_begin(trace, H, T);
    const detail::KvHeadRows kv(kk, v, ldkv, sh.past + T, sh);
    // each KV head's keys packed once as Kᵀ panels for the estimate (an sgemm per row block
    // repacked them, and its beta = 0 pass cleared the score block: 7% of the kind's time)
    std::vector<std::optional<k::KeyPanelsF32>> panels(static_cast<size_t>(sh.n_kv_heads));
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < sh.n_kv_heads; ++g)
      panels[static_cast<size_t>(g)].emplace(kv.k(g), kv.ld(), sh.past + T, hd);
    const int64_t n_blocks = (T + kSelectRowBlock - 1) / kSelectRowBlock;
#pragma omp parallel for schedule(dynamic) collapse(2)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t bi = 0; bi < n_blocks; ++bi) {
        const int64_t r0 = bi * kSelectRowBlock, rows = std::min(kSelectRowBlock, T - r0);
        const int64_t g = h / group, keys = sh.past + r0 + rows;
        const int64_t lds = (keys + k::KeyPanelsF32::panel_keys() - 1) /
                            k::KeyPanelsF32::panel_keys() * k::KeyPanelsF32::panel_keys();
        const double ratio = consts.head_ratio[static_cast<size_t>(h)];
        thread_local std::vector<float> qh_buf, S_buf, kept_buf;
        thread_local std::vector<int32_t> idx_buf;
        thread_local std::vector<int64_t> offs_buf;
        float* qh = detail::thread_scratch(qh_buf, rows * hd);
        float* S = detail::thread_scratch(S_buf, std::min(rows, kEstimateRowChunk) * lds);
        // every row's kept keys and their estimated scores, row i's from offs[i]
        int32_t* idx_all = detail::thread_scratch(idx_buf, rows * keys);
        float* kept_scores = detail::thread_scratch(kept_buf, rows * keys);
        int64_t* offs = detail::thread_scratch(offs_buf, rows + 1);
        detail::gather_head(q + r0 * ldq, ldq, rows, h * hd, hd, qh);
        k::TopkHint hint;  // the previous row's k-th value and score moments: this row's band
        offs[0] = 0;
        // the fp32 estimate a chunk of rows at a time, ranked while its scores are in L2; each
        // row's kept scores copied out for the attention
        for (int64_t c0 = 0; c0 < rows; c0 += kEstimateRowChunk) {
          const int64_t c1 = std::min(rows, c0 + kEstimateRowChunk);
          k::causal_scores_f32(qh + c0 * hd, c1 - c0, *panels[static_cast<size_t>(g)],
                               sh.past + r0 + c0, S, lds);
          for (int64_t i = c0; i < c1; ++i) {
            const int64_t visible = sh.past + r0 + i + 1,
                          lo = k::first_visible_key(visible - 1, sh.window);
            const float* srow = S + (i - c0) * lds;
            int32_t* idx = idx_all + offs[i];
            const int64_t n = k::topk_indices(srow + lo, visible - lo,
                                              keys_kept(visible - lo, ratio, min_keys), idx, hint);
            for (int64_t t = 0; t < n; ++t) {
              idx[t] += static_cast<int32_t>(lo);
              kept_scores[offs[i] + t] = srow[idx[t]];
            }
            detail::trace_keys(trace, h, T, r0 + i, idx, n);
            offs[i + 1] = offs[i] + n;
          }
        }
        // attention over the kept keys with the estimate's scores, the block's rows together
        k::attend_selected_rows(qh, hd, nullptr, kv.v(g), kv.ld(), hd, idx_all, offs, rows,
                                inv_sqrt, kept_scores, 0, out + r0 * ldo + h * hd, ldo, true);
      }
  }

  // Per head on the attention's processor: fp32 Q·Kᵀ over the causal pairs, top-k, sparse
  // attention, chained in head order.
  std::vector<int64_t> tasks(const AttentionScheme& s, const TaskShape& sh, TaskSink& sink,
                             const std::vector<int64_t>& deps) const override {
    const int64_t causal = causal_pairs(sh.rows, sh.kv_len, sh.window);
    std::vector<detail::HeadChainStep> heads;
    for (int64_t h = 0; h < sh.n_heads; ++h)
      heads.push_back({{detail::attention_op(soc::OpKind::AttnMatMul, "qk_estimate",
                                             soc::DType::Fp32, 1, sh.head_dim, causal, sh.core)},
                       causal,
                       kept_pairs(sh.rows, sh.kv_len, sh.window, detail::head_ratio(sh, s, h),
                                  s.integer("min_keys"))});
    return detail::head_chain_tasks(sh, sink, deps, heads);
  }
};

}  // namespace

const SchemeKind& sparse_scheme() {
  static const Sparse kScheme;
  return kScheme;
}

}  // namespace socllm::attention
