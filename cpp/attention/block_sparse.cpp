// C/G-Block-Sparse (seed 000 §5 baseline): Q and K mean-pooled over blocks of `block` absolute
// positions, pooled scores, per query block the top-k key blocks (its diagonal block always
// kept), attention over the selected blocks' causal keys.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/common.h"
#include "core/core.h"
#include "kernels/kernels.h"
#include "kernels/sparse_attention.h"

namespace socllm::attention {

namespace {

namespace k = socllm::kernels;

// Visible keys of the r-th of `rows` causal rows ending at kv_len (a window caps them).
int64_t visible(int64_t r, int64_t rows, int64_t kv_len, int64_t window) {
  const int64_t pos = kv_len - rows + r;
  return pos + 1 - k::first_visible_key(pos, window);
}

class BlockSparse final : public SchemeKind {
 public:
  const char* name() const override { return "block-sparse"; }
  const char* description() const override {
    return "C/G-Block-Sparse: Q and K mean-pooled over blocks, per query block the top-k key "
           "blocks (the diagonal kept), attention over their causal keys";
  }
  std::vector<OptionSpec> options() const override {
    auto o = detail::keep_ratio_options("uniform");
    o.push_back({"block", int64_t{64}, "pooling block size in positions (seed 000 §5: 64x64)"});
    return o;
  }
  void validate(const AttentionScheme& s) const override {
    detail::validate_keep_ratio_options(s);
    if (s.integer("block") < 1)
      throw InvalidArgument("[AttentionScheme] block-sparse: block must be >= 1, got " +
                            std::to_string(s.integer("block")));
  }
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
    const int64_t T = sh.T, L = sh.past + T, hd = sh.head_dim, H = sh.n_heads;
    const int64_t group = H / sh.n_kv_heads, B = s.integer("block"), n_kb = (L + B - 1) / B;
    const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
    detail::trace_begin(trace, H, T);
    // keys mean-pooled over blocks of B absolute positions, per KV head
    std::vector<float> kpool(static_cast<size_t>(sh.n_kv_heads * n_kb * hd), 0.0f);
    for (int64_t g = 0; g < sh.n_kv_heads; ++g)
      for (int64_t b = 0; b < n_kb; ++b) {
        float* dst = kpool.data() + (g * n_kb + b) * hd;
        const int64_t j1 = std::min(L, (b + 1) * B);
        for (int64_t j = b * B; j < j1; ++j)
          for (int64_t d = 0; d < hd; ++d) dst[d] += kk[j * ldkv + g * hd + d];
        for (int64_t d = 0; d < hd; ++d) dst[d] /= static_cast<float>(j1 - b * B);
      }
    const auto blocks = block_sparse_query_blocks(T, sh.past, B, sh.window);
    const int64_t n_blocks = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(dynamic) collapse(2)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t bi = 0; bi < n_blocks; ++bi) {
        const auto& blk = blocks[static_cast<size_t>(bi)];
        const int64_t r0 = blk.r0, rows = blk.rows, g = h / group, keys = sh.past + r0 + rows;
        const double ratio = consts.head_ratio[static_cast<size_t>(h)];
        const float* kg = kk + g * hd;
        const float* vg = v + g * hd;
        std::vector<float> qh(static_cast<size_t>(rows * hd)), p(static_cast<size_t>(keys)), fbuf;
        std::vector<int32_t> idx(static_cast<size_t>(keys));
        detail::gather_head(q + r0 * ldq, ldq, rows, h * hd, hd, qh.data());
        // the query block's mean against the key blocks' means
        const int64_t qb = blk.diagonal, kb0 = blk.first_key_block;
        std::vector<float> qpool(static_cast<size_t>(hd), 0.0f), bs(static_cast<size_t>(qb - kb0));
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t d = 0; d < hd; ++d) qpool[d] += qh[i * hd + d] / static_cast<float>(rows);
        for (int64_t b = kb0; b < qb; ++b) {
          const float* kp = kpool.data() + (g * n_kb + b) * hd;
          float dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qpool[d] * kp[d];
          bs[b - kb0] = dot;
        }
        // the diagonal block always, then the best (kept - 1) earlier blocks
        const int64_t kept = keys_kept(qb - kb0 + 1, ratio, 1);
        std::vector<int32_t> sel(static_cast<size_t>(qb - kb0 + 1));
        const int64_t n_sel = k::topk_indices(bs.data(), qb - kb0, kept - 1, sel.data(), fbuf);
        for (int64_t t = 0; t < n_sel; ++t) sel[t] += static_cast<int32_t>(kb0);
        sel[static_cast<size_t>(n_sel)] = static_cast<int32_t>(qb);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t pos = sh.past + r0 + i, lo = k::first_visible_key(pos, sh.window);
          int64_t n = 0;
          for (int64_t t = 0; t <= n_sel; ++t)
            for (int64_t j = std::max<int64_t>(sel[t] * B, lo);
                 j < std::min<int64_t>((sel[t] + 1) * B, pos + 1); ++j)
              idx[static_cast<size_t>(n++)] = static_cast<int32_t>(j);
          k::attend_selected(qh.data() + i * hd, kg, vg, ldkv, hd, idx.data(), n, inv_sqrt,
                             out + (r0 + i) * ldo + h * hd, p.data());
          detail::trace_keys(trace, h, T, r0 + i, idx.data(), n);
        }
      }
  }

  // Per head: a pooling pass over the head's Q and K, the pooled scores of every (query block,
  // key block) candidate, block top-k, and attention over the kept blocks' keys: exact at
  // keep=1; otherwise the kept blocks are assumed full within each row's range (which blocks
  // are kept depends on the data).
  std::vector<int64_t> tasks(const AttentionScheme& s, const TaskShape& sh, TaskSink& sink,
                             const std::vector<int64_t>& deps) const override {
    const int64_t B = s.integer("block"), d = sh.head_dim;
    const auto blocks = block_sparse_query_blocks(sh.rows, sh.kv_len - sh.rows, B, sh.window);
    int64_t candidates = 0;
    for (const auto& b : blocks) candidates += b.candidates();
    std::vector<detail::HeadChainStep> heads;
    for (int64_t h = 0; h < sh.n_heads; ++h) {
      const double ratio = detail::head_ratio(sh, s, h);
      int64_t kept = 0;
      for (const auto& b : blocks) {
        const int64_t keys = keys_kept(b.candidates(), ratio, 1) * B;
        for (int64_t r = b.r0; r < b.r0 + b.rows; ++r)
          kept += std::min(visible(r, sh.rows, sh.kv_len, sh.window), keys);
      }
      heads.push_back({{detail::attention_op(soc::OpKind::Elementwise, "pool", soc::DType::Fp32, 0,
                                             0, (sh.rows + sh.kv_len) * d, sh.core),
                        detail::attention_op(soc::OpKind::AttnMatMul, "qk_estimate",
                                             soc::DType::Fp32, 1, d, candidates, sh.core)},
                       candidates,
                       kept});
    }
    return detail::head_chain_tasks(sh, sink, deps, heads);
  }
};

}  // namespace

const SchemeKind& block_sparse_scheme() {
  static const BlockSparse kScheme;
  return kScheme;
}

}  // namespace socllm::attention
