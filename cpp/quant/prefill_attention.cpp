#include "socllm/prefill_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "socllm/core.h"
#include "socllm/gemm_s8.h"
#include "socllm/kernels.h"
#include "socllm/sparse_attention.h"

namespace socllm::quant {

namespace k = socllm::kernels;

namespace {

// Query rows per task: one estimation GEMM of [rows, keys] per task, the score block in cache.
constexpr int64_t kRowBlock = 64;

// Copies rows of one head out of the interleaved [rows, heads*head_dim] layout.
void gather_head(const float* x, int64_t ld, int64_t rows, int64_t col0, int64_t head_dim,
                 float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * head_dim, x + r * ld + col0, static_cast<size_t>(head_dim) * 4);
}

struct HeadInputs {
  std::vector<int8_t> k8;  // [L, head_dim] the KV head's keys in the head's bucket (shadow-attn)
  float bq = 0;            // the Q scale used
  // certified: max over keys of ||k8_j|| and of the rounding residual ||k_j / bk - k8_j||
  double k8_norm_max = 0, k_residual_max = 0;
};

// Certified top-k (issue 13 item 7). With x = s·(x8 + e), the exact score divided by bq·bk is
// q8·k8 + q8·e_k + e_q·k8 + e_q·e_k, so by Cauchy-Schwarz its distance from the INT8 score is at
// most B = |q8|·E_k + |e_q|·K8 + |e_q|·E_k (E_k, K8: the maxima over keys; residuals include
// clamping). A key of the fp32 top-k then has an INT8 score >= the k-th INT8 score - 2B: only
// those keys are rescored in fp32. Returns the keys rescored (0: the INT8 top-k is already
// certain, every candidate is in it).
int64_t certify_topk(const float* q, const int8_t* q8, const HeadInputs& hi, const float* kg,
                     int64_t ldkv, int64_t hd, const int32_t* s, int64_t visible, int64_t kept,
                     int32_t* idx, std::vector<int32_t>& cand, std::vector<float>& cand_score,
                     std::vector<int32_t>& pick, std::vector<float>& fbuf) {
  double q8n = 0, eqn = 0;
  for (int64_t d = 0; d < hd; ++d) {
    const double e = static_cast<double>(q[d]) / hi.bq - q8[d];
    q8n += static_cast<double>(q8[d]) * q8[d];
    eqn += e * e;
  }
  q8n = std::sqrt(q8n), eqn = std::sqrt(eqn);
  const double bound = q8n * hi.k_residual_max + eqn * hi.k8_norm_max + eqn * hi.k_residual_max;
  int32_t kth = s[idx[0]];
  for (int64_t t = 1; t < kept; ++t) kth = std::min(kth, s[idx[t]]);
  // 1e-6 relative + 1 covers the float rounding of the residual norms
  const double floor_score = static_cast<double>(kth) - 2.0 * bound * (1.0 + 1e-6) - 1.0;
  cand.clear();
  for (int64_t j = 0; j < visible; ++j)
    if (static_cast<double>(s[j]) >= floor_score) cand.push_back(static_cast<int32_t>(j));
  const auto n_cand = static_cast<int64_t>(cand.size());
  if (n_cand == kept) return 0;
  cand_score.resize(cand.size());
  k::score_selected(q, kg, ldkv, hd, cand.data(), n_cand, cand_score.data());
  pick.resize(cand.size());
  k::topk_indices(cand_score.data(), n_cand, kept, pick.data(), fbuf);
  for (int64_t t = 0; t < kept; ++t) idx[t] = cand[pick[t]];  // cand ascending: so is idx
  return n_cand;
}

// Per-row keep: the row's causal keys and how many it keeps.
int64_t row_keep(const AttentionScheme& s, double ratio, int64_t visible) {
  return keys_kept(visible, ratio, s.min_keys);
}

void npu_int8_attention(const AttentionLayerConsts& c, const float* q, int64_t ldq, const float* kk,
                        const float* v, int64_t ldkv, const AttentionShape& sh, float* out,
                        int64_t ldo) {
  const int64_t T = sh.T, L = sh.past + T, hd = sh.head_dim, group = sh.n_heads / sh.n_kv_heads;
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
  const float qk_scale = c.static_q * c.static_k * inv_sqrt;
  const float pv_scale = c.static_v / 255.0f;
  // Per KV head: K as [L, hd] int8 and V transposed [hd, L] int8 (the GEMM's weight layout).
  std::vector<int8_t> k8(static_cast<size_t>(sh.n_kv_heads * L * hd)),
      vt8(static_cast<size_t>(sh.n_kv_heads * hd * L));
  for (int64_t g = 0; g < sh.n_kv_heads; ++g) {
    k::quantize_rows_s8(kk + g * hd, L, hd, ldkv, c.static_k, k8.data() + g * L * hd, hd);
    std::vector<int8_t> v8(static_cast<size_t>(L * hd));
    k::quantize_rows_s8(v + g * hd, L, hd, ldkv, c.static_v, v8.data(), hd);
    for (int64_t j = 0; j < L; ++j)
      for (int64_t d = 0; d < hd; ++d) vt8[(g * hd + d) * L + j] = v8[j * hd + d];
  }
  const int64_t n_blocks = (T + kRowBlock - 1) / kRowBlock;
  const auto isa = k::best_isa();
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t h = 0; h < sh.n_heads; ++h)
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t g = h / group, r0 = b * kRowBlock, rows = std::min(kRowBlock, T - r0);
      const int64_t keys = sh.past + r0 + rows;
      std::vector<float> qh(static_cast<size_t>(rows * hd));
      std::vector<int8_t> q8(static_cast<size_t>(rows * hd));
      std::vector<int32_t> S(static_cast<size_t>(rows * keys)), O(static_cast<size_t>(rows * hd));
      std::vector<uint8_t> P(static_cast<size_t>(rows * keys));
      std::vector<float> p(static_cast<size_t>(keys));
      gather_head(q + r0 * ldq, ldq, rows, h * hd, hd, qh.data());
      k::quantize_rows_s8(qh.data(), rows, hd, hd, c.static_q, q8.data(), hd);
      k::gemm_s8s8s32(q8.data(), hd, k8.data() + g * L * hd, hd, S.data(), keys, rows, keys, hd,
                      isa);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t visible = sh.past + r0 + i + 1,
                      lo = k::first_visible_key(visible - 1, sh.window);
        const int32_t* s = S.data() + i * keys;
        float mx = -INFINITY;
        for (int64_t j = lo; j < visible; ++j)
          mx = std::max(mx, static_cast<float>(s[j]) * qk_scale);
        float sum = 0;
        for (int64_t j = lo; j < visible; ++j)
          sum += p[j] = k::exp_nonpositive(static_cast<float>(s[j]) * qk_scale - mx);
        uint8_t* pr = P.data() + i * keys;
        for (int64_t j = 0; j < keys; ++j) {
          // the probability in fp16 (the NPU's float format), then uint8 with scale 1/255
          const float pj =
              j >= lo && j < visible ? static_cast<float>(static_cast<_Float16>(p[j] / sum)) : 0;
          pr[j] = static_cast<uint8_t>(std::clamp(std::nearbyint(pj * 255.0f), 0.0f, 255.0f));
        }
      }
      k::gemm_u8s8s32(P.data(), keys, vt8.data() + g * hd * L, L, O.data(), hd, rows, hd, keys,
                      isa);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t d = 0; d < hd; ++d)
          out[(r0 + i) * ldo + h * hd + d] = static_cast<float>(O[i * hd + d]) * pv_scale;
    }
}

}  // namespace

AttentionLayerConsts uniform_layer_consts(const AttentionScheme& s, int64_t n_heads) {
  AttentionLayerConsts c;
  c.head_ratio.assign(static_cast<size_t>(n_heads), s.keep);
  return c;
}

void prefill_attention(const AttentionScheme& s, const AttentionLayerConsts& c, const float* q,
                       int64_t ldq, const float* kk, const float* v, int64_t ldkv,
                       const AttentionShape& sh, float* out, int64_t ldo, AttentionTrace* trace) {
  const int64_t T = sh.T, L = sh.past + T, hd = sh.head_dim, H = sh.n_heads;
  if (T < 1 || sh.past < 0 || H < 1 || sh.n_kv_heads < 1 || H % sh.n_kv_heads != 0 || hd < 1 ||
      sh.window < 0)
    throw ShapeError("[prefill_attention] bad shape: T " + std::to_string(T) + ", past " +
                     std::to_string(sh.past) + ", heads " + std::to_string(H) + "/" +
                     std::to_string(sh.n_kv_heads) + ", head_dim " + std::to_string(hd) +
                     ", window " + std::to_string(sh.window));
  const int64_t group = H / sh.n_kv_heads;
  if (s.kind == AttentionKind::Fp32) {
    std::vector<float> scratch(
        static_cast<size_t>(k::attention_scratch_floats(T, L, H, sh.n_kv_heads, hd)));
    k::attention_causal(q, ldq, kk, v, ldkv, T, sh.past, H, sh.n_kv_heads, hd, out, ldo,
                        scratch.data(), sh.window);
    return;
  }
  if (s.kind == AttentionKind::NpuInt8) {
    if (!(c.static_q > 0 && c.static_k > 0 && c.static_v > 0))
      throw InvalidArgument(
          "[prefill_attention] npu-int8 needs static Q/K/V scales (step "
          "qk-scales)");
    if (L > k::kMaxExactKU8S8)
      throw ShapeError("[prefill_attention] npu-int8: P·V over " + std::to_string(L) +
                       " keys exceeds the exact int32 range (" + std::to_string(k::kMaxExactKU8S8) +
                       " keys)");
    npu_int8_attention(c, q, ldq, kk, v, ldkv, sh, out, ldo);
    return;
  }
  if (static_cast<int64_t>(c.head_ratio.size()) != H)
    throw ShapeError("[prefill_attention] " + std::to_string(c.head_ratio.size()) +
                     " head ratios for " + std::to_string(H) + " heads");
  const bool shadow = s.kind == AttentionKind::ShadowAttn;
  const bool bucketed = shadow && s.scales == "buckets";
  if (bucketed && (c.buckets < 1 || static_cast<int64_t>(c.bucket_q.size()) != H * c.buckets ||
                   c.bucket_k.size() != c.bucket_q.size()))
    throw ShapeError("[prefill_attention] shadow-attn needs " + std::to_string(H) +
                     " heads' bucket scales (step qk-scales)");
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
  if (trace) {
    trace->bucket.assign(static_cast<size_t>(H), -1);
    trace->input_q.assign(static_cast<size_t>(H), 0.0f);
    trace->input_k.assign(static_cast<size_t>(H), 0.0f);
    trace->keys.assign(static_cast<size_t>(trace->record_keys ? H * T : 0), {});
    trace->rescored.assign(static_cast<size_t>(H), 0);
  }

  // shadow-attn: per head the bucket nearest to the input's <λQ, λK> (§3.3), K in that bucket.
  std::vector<HeadInputs> heads(static_cast<size_t>(shadow ? H : 0));
  if (shadow) {
    std::vector<float> lk(static_cast<size_t>(sh.n_kv_heads));
    for (int64_t g = 0; g < sh.n_kv_heads; ++g)
      lk[g] = k::absmax_rows(kk + g * hd, L, hd, ldkv) / 127.0f;
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      const float lq = k::absmax_rows(q + h * hd, T, hd, ldq) / 127.0f;
      float bq = lq, bk = lk[g];
      int64_t bucket = -1;
      if (bucketed) {
        const std::span<const float> cq(c.bucket_q.data() + h * c.buckets, c.buckets),
            ck(c.bucket_k.data() + h * c.buckets, c.buckets);
        bucket = nearest_bucket(lq, lk[g], cq, ck);
        bq = cq[bucket], bk = ck[bucket];
      }
      // an all-zero input has no scale: any positive one quantizes it to zeros
      bq = bq > 0 ? bq : 1.0f, bk = bk > 0 ? bk : 1.0f;
      HeadInputs& hi = heads[static_cast<size_t>(h)];
      hi.bq = bq;
      hi.k8.resize(static_cast<size_t>(L * hd));
      k::quantize_rows_s8(kk + g * hd, L, hd, ldkv, bk, hi.k8.data(), hd);
      if (s.certified)
        for (int64_t j = 0; j < L; ++j) {
          double n8 = 0, ne = 0;
          for (int64_t d = 0; d < hd; ++d) {
            const double q8 = hi.k8[static_cast<size_t>(j * hd + d)];
            const double e = static_cast<double>(kk[j * ldkv + g * hd + d]) / bk - q8;
            n8 += q8 * q8, ne += e * e;
          }
          hi.k8_norm_max = std::max(hi.k8_norm_max, std::sqrt(n8));
          hi.k_residual_max = std::max(hi.k_residual_max, std::sqrt(ne));
        }
      if (trace) {
        trace->bucket[h] = static_cast<int32_t>(bucket);
        trace->input_q[h] = lq;
        trace->input_k[h] = lk[g];
      }
    }
  }

  // block-sparse: keys mean-pooled over blocks of s.block absolute positions, per KV head
  const int64_t B = s.block, n_kb = (L + B - 1) / B;
  std::vector<float> kpool;
  if (s.kind == AttentionKind::BlockSparse) {
    kpool.assign(static_cast<size_t>(sh.n_kv_heads * n_kb * hd), 0.0f);
    for (int64_t g = 0; g < sh.n_kv_heads; ++g)
      for (int64_t b = 0; b < n_kb; ++b) {
        float* dst = kpool.data() + (g * n_kb + b) * hd;
        const int64_t j1 = std::min(L, (b + 1) * B);
        for (int64_t j = b * B; j < j1; ++j)
          for (int64_t d = 0; d < hd; ++d) dst[d] += kk[j * ldkv + g * hd + d];
        for (int64_t d = 0; d < hd; ++d) dst[d] /= static_cast<float>(j1 - b * B);
      }
  }

  // Row blocks: for block-sparse, the query blocks of absolute positions (pooling unit);
  // otherwise kRowBlock rows.
  std::vector<std::pair<int64_t, int64_t>> blocks;  // [r0, rows)
  std::vector<BlockSparseQueryBlock> query_blocks;
  if (s.kind == AttentionKind::BlockSparse) {
    query_blocks = block_sparse_query_blocks(T, sh.past, B, sh.window);
    for (const auto& qb : query_blocks) blocks.emplace_back(qb.r0, qb.rows);
  } else {
    for (int64_t r0 = 0; r0 < T; r0 += kRowBlock)
      blocks.emplace_back(r0, std::min(kRowBlock, T - r0));
  }
  const int64_t n_blocks = static_cast<int64_t>(blocks.size());
  const auto isa = k::best_isa();

#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t h = 0; h < H; ++h)
    for (int64_t bi = 0; bi < n_blocks; ++bi) {
      const auto [r0, rows] = blocks[static_cast<size_t>(bi)];
      const int64_t g = h / group, keys = sh.past + r0 + rows;
      const double ratio = c.head_ratio[static_cast<size_t>(h)];
      const float* kg = kk + g * hd;
      const float* vg = v + g * hd;
      std::vector<float> qh(static_cast<size_t>(rows * hd)), p(static_cast<size_t>(keys)), fbuf;
      std::vector<int32_t> idx(static_cast<size_t>(keys)), ibuf;
      gather_head(q + r0 * ldq, ldq, rows, h * hd, hd, qh.data());
      auto emit = [&](int64_t i, int64_t n) {
        if (trace && trace->record_keys)
          trace->keys[static_cast<size_t>(h * T + r0 + i)].assign(idx.begin(), idx.begin() + n);
      };
      if (s.kind == AttentionKind::Sparse) {
        // C/G-Sparse: the fp32 scores are the estimate, and reused for the selected keys
        std::vector<float> S(static_cast<size_t>(rows * keys));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd, 1.0f, qh.data(), hd,
                    kg, ldkv, 0.0f, S.data(), keys);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t visible = sh.past + r0 + i + 1,
                        lo = k::first_visible_key(visible - 1, sh.window);
          const float* srow = S.data() + i * keys;
          const int64_t n = k::topk_indices(srow + lo, visible - lo,
                                            row_keep(s, ratio, visible - lo), idx.data(), fbuf);
          for (int64_t t = 0; t < n; ++t) idx[t] += static_cast<int32_t>(lo);
          k::attend_selected_scored(srow, vg, ldkv, hd, idx.data(), n, inv_sqrt,
                                    out + (r0 + i) * ldo + h * hd, p.data());
          emit(i, n);
        }
      } else if (shadow) {
        // shadowAttn: INT8 estimate with the bucket's scales, top-k on int32 scores (§3.2)
        const HeadInputs& hi = heads[static_cast<size_t>(h)];
        std::vector<int8_t> q8(static_cast<size_t>(rows * hd));
        std::vector<int32_t> S(static_cast<size_t>(rows * keys));
        k::quantize_rows_s8(qh.data(), rows, hd, hd, hi.bq, q8.data(), hd);
        k::gemm_s8s8s32(q8.data(), hd, hi.k8.data(), hd, S.data(), keys, rows, keys, hd, isa);
        std::vector<int32_t> cand, pick;
        std::vector<float> cand_score;
        int64_t rescored = 0;
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t visible = sh.past + r0 + i + 1,
                        lo = k::first_visible_key(visible - 1, sh.window);
          const int32_t* srow = S.data() + i * keys + lo;  // the window's keys, from lo
          const int64_t n = k::topk_indices(srow, visible - lo, row_keep(s, ratio, visible - lo),
                                            idx.data(), ibuf);
          if (s.certified)
            rescored +=
                certify_topk(qh.data() + i * hd, q8.data() + i * hd, hi, kg + lo * ldkv, ldkv, hd,
                             srow, visible - lo, n, idx.data(), cand, cand_score, pick, fbuf);
          for (int64_t t = 0; t < n; ++t) idx[t] += static_cast<int32_t>(lo);
          k::attend_selected(qh.data() + i * hd, kg, vg, ldkv, hd, idx.data(), n, inv_sqrt,
                             out + (r0 + i) * ldo + h * hd, p.data());
          emit(i, n);
        }
        if (trace && s.certified) {
#pragma omp atomic
          trace->rescored[static_cast<size_t>(h)] += rescored;
        }
      } else {
        // C/G-Block-Sparse: the query block's mean against the key blocks' means
        const auto& blk = query_blocks[static_cast<size_t>(bi)];
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
            for (int64_t j = std::max(sel[t] * B, lo); j < std::min((sel[t] + 1) * B, pos + 1); ++j)
              idx[static_cast<size_t>(n++)] = static_cast<int32_t>(j);
          k::attend_selected(qh.data() + i * hd, kg, vg, ldkv, hd, idx.data(), n, inv_sqrt,
                             out + (r0 + i) * ldo + h * hd, p.data());
          emit(i, n);
        }
      }
    }
}

}  // namespace socllm::quant
