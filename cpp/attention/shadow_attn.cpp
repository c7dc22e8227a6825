// shadowAttn (seed 000 §3.2-3.4): per query head, Q and K quantized to INT8 with the static
// scales of the bucket nearest (MSE) to the input's own <λQ, λK> (λ = max|x|/127), exact INT8
// Q·Kᵀ on the NPU, per-row top-k on the int32 scores over the causal keys (no softmax, §3.2),
// then fp32 attention over the kept keys on the CPU. Timed head-wise: fused NPU estimation
// launches, per head a top-k and a sparse attention, Eq. 4's dependencies.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "attention/common.h"
#include "core/core.h"
#include "kernels/gemm_s8.h"
#include "kernels/kernels.h"
#include "kernels/sparse_attention.h"
#include "sched/head_pipeline.h"

namespace socllm::attention {

namespace {

namespace k = socllm::kernels;
using detail::kEstimateRowChunk;
using detail::kSelectRowBlock;

// One KV head's keys at one K scale, shared by the query heads of its group that use that scale
// (all of them with scales=dynamic).
struct KeyInputs {
  int64_t g = 0;                // the KV head
  float bk = 0;                 // the K scale
  k::AlignedVector<int8_t> k8;  // [L, head_dim] the keys quantized at bk
  // k8 packed once for the estimate's GEMMs: every row block reads a prefix of its columns, or
  // (topk=fused) per tile of kFusedTileKeys keys
  std::optional<k::PackedWeightsS8> k8_packed;
  std::vector<k::PackedWeightsS8> k8_tiles;
  std::optional<k::KeyPrefixSums> k8_sums;  // each row's mean score, the fused top-k's band
  // certified: max over keys of ||k8_j|| and of the rounding residual ||k_j / bk - k8_j||
  double k8_norm_max = 0, k_residual_max = 0;
};

struct HeadInputs {
  float bq = 0;                     // the Q scale used
  const KeyInputs* keys = nullptr;  // its KV head's keys at its K scale
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
  const KeyInputs& ki = *hi.keys;
  const double bound = q8n * ki.k_residual_max + eqn * ki.k8_norm_max + eqn * ki.k_residual_max;
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

// topk=fused: the top-k of rows `spec` (n of them, INT8 queries q8 [n, hd]) fused into the
// estimate against the keys' tiles (kernels::fused_topk_rows); a row whose band missed is scored
// again from the same tiles. Row r's keys at idx + offs[r], relative to its lo.
void select_fused(const KeyInputs& ki, const int8_t* q8, int64_t hd, const k::FusedTopkRow* spec,
                  int64_t n, k::Isa isa, k::TopkHint& hint, int32_t* idx, int64_t* offs,
                  k::FusedTopkStats* stats) {
  const auto tile = [&](int64_t ra, int64_t rb, int64_t key0, int64_t cols, int32_t* S,
                        int64_t lds) {
    k::gemm_s8s8s32_packed_cols(q8 + ra * hd, hd, ki.k8_tiles[key0 / k::kFusedTileKeys], S, lds,
                                rb - ra, cols, isa);
  };
  const auto row_scores = [&](int64_t r, int32_t* s) {
    thread_local std::vector<int32_t> row_buf;
    const k::FusedTopkRow& row = spec[r];
    const int64_t t0 = row.lo / k::kFusedTileKeys,
                  t1 = (row.lo + row.n - 1) / k::kFusedTileKeys + 1;
    int32_t* tiles = detail::thread_scratch(row_buf, (t1 - t0) * k::kFusedTileKeys);
    for (int64_t t = t0; t < t1; ++t)
      k::gemm_s8s8s32_packed(q8 + r * hd, hd, ki.k8_tiles[t], tiles + (t - t0) * k::kFusedTileKeys,
                             k::kFusedTileKeys, 1, isa);
    std::copy_n(tiles + (row.lo - t0 * k::kFusedTileKeys), row.n, s);
  };
  k::fused_topk_rows(spec, n, tile, row_scores, hint, idx, offs, stats);
}

class ShadowAttn final : public SchemeKind {
 public:
  const char* name() const override { return "shadow-attn"; }
  const char* description() const override {
    return "shadowAttn: INT8 Q·Kᵀ estimate on the NPU with bucketed static scales, per-row top-k, "
           "fp32 attention over the kept keys on the CPU";
  }
  std::vector<OptionSpec> options() const override {
    auto o = detail::keep_ratio_options("calibrated");
    o.push_back({"buckets", int64_t{9}, "static Q/K scale buckets per head (§5.2: 9)"});
    o.push_back({"step", 0.5, "bucket step σ: scales <λ̄Q·σ^a, λ̄K·σ^b> (§5.2: 5e-1)"});
    o.push_back({"scales",
                 "buckets",
                 "estimator scales: the nearest calibrated bucket, or each input's own (dynamic, "
                 "the upper bound)",
                 {"buckets", "dynamic"}});
    o.push_back({"certified", int64_t{0},
                 "1: rescore in fp32 the keys within the INT8 error bound of the k-th score, so "
                 "the selection equals the fp32 top-k (beyond the paper)"});
    o.push_back({"topk",
                 "rows",
                 "host execution of the top-k, same selection: ranked row after row on a chunk's "
                 "scores (rows), or fused into the estimate's key tiles (fused; not with "
                 "certified); the simulated graph is the paper's either way",
                 {"rows", "fused"}});
    return o;
  }
  void validate(const AttentionScheme& s) const override {
    detail::validate_keep_ratio_options(s);
    const std::string k = "[AttentionScheme] shadow-attn: ";
    const int64_t buckets = s.integer("buckets"), certified = s.integer("certified");
    const double step = s.number("step");
    if (buckets < 1)
      throw InvalidArgument(k + "buckets must be >= 1, got " + std::to_string(buckets));
    if (buckets > 1024)
      throw InvalidArgument(k + "buckets must be <= 1024, got " + std::to_string(buckets));
    if (!(step > 0.0) || !std::isfinite(step))
      throw InvalidArgument(k + "step must be a positive number, got " + json_text(step));
    if (certified != 0 && certified != 1)
      throw InvalidArgument(k + "certified must be 0 or 1, got " + std::to_string(certified));
    if (certified && s.text("topk") == "fused")
      throw InvalidArgument(k + "topk=fused keeps no row's scores, which certified=1 rescans");
  }
  bool selects_keys() const override { return true; }
  bool needs_head_importance(const AttentionScheme& s) const override {
    return detail::calibrated_ratios(s);
  }
  bool needs_qk_scales(const AttentionScheme& s) const override {
    return s.text("scales") == "buckets";
  }

  std::vector<LayerConsts> prepare(const AttentionScheme& s, const Calibration* calib,
                                   const ModelConfig& c, const std::string& who) const override {
    auto out = detail::keep_ratio_consts(s, calib, c, who);
    if (!needs_qk_scales(s)) return out;
    if (!calib || !calib->has_qk_scales())
      throw InvalidArgument(
          who +
          " fixes its Q/K scales from calibration, and the loaded calibration "
          "has none (socllm calibrate --steps qk-scales [--calib FILE] --out FILE, "
          "then --calib FILE)");
    // <λ̄Q·σ^a, λ̄K·σ^b> per head (§3.3); a query head's λ̄K is its KV head's
    const auto mq = calib->mean_scale('q'), mk = calib->mean_scale('k');
    const int64_t n = s.integer("buckets");
    const double step = s.number("step");
    const auto offsets = bucket_offsets(n);
    const int64_t group = c.n_heads / c.n_kv_heads;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      auto& lc = out[static_cast<size_t>(l)];
      lc.buckets = n;
      for (int64_t h = 0; h < c.n_heads; ++h)
        for (const auto& [oq, ok] : offsets) {
          lc.bucket_q.push_back(mq[l * c.n_heads + h] * static_cast<float>(std::pow(step, oq)));
          lc.bucket_k.push_back(mk[l * c.n_kv_heads + h / group] *
                                static_cast<float>(std::pow(step, ok)));
        }
    }
    return out;
  }

  void run(const AttentionScheme& s, const LayerConsts& c, const float* q, int64_t ldq,
           const float* kk, const float* v, int64_t ldkv, const Shape& sh, float* out, int64_t ldo,
           Trace* trace) const override {
    detail::check_head_ratios(c, sh.n_heads, "prefill_attention");
    const int64_t T = sh.T, L = sh.past + T, hd = sh.head_dim, H = sh.n_heads;
    const int64_t group = H / sh.n_kv_heads, min_keys = s.integer("min_keys");
    const bool bucketed = needs_qk_scales(s), certified = s.integer("certified") != 0,
               fused_topk = s.text("topk") == "fused";
    if (bucketed && (c.buckets < 1 || static_cast<int64_t>(c.bucket_q.size()) != H * c.buckets ||
                     c.bucket_k.size() != c.bucket_q.size()))
      throw ShapeError("[prefill_attention] shadow-attn needs " + std::to_string(H) +
                       " heads' bucket scales (step qk-scales)");
    const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
    detail::trace_begin(trace, H, T);

    const auto isa = k::best_isa();
    // per head the bucket nearest to the input's <λQ, λK> (§3.3), K in that bucket
    std::vector<HeadInputs> heads(static_cast<size_t>(H));
    std::vector<float> lk(static_cast<size_t>(sh.n_kv_heads)), head_bk(static_cast<size_t>(H));
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
      heads[static_cast<size_t>(h)].bq = bq > 0 ? bq : 1.0f;
      head_bk[static_cast<size_t>(h)] = bk > 0 ? bk : 1.0f;
      if (trace) {
        trace->bucket[h] = static_cast<int32_t>(bucket);
        trace->input_q[h] = lq;
        trace->input_k[h] = lk[g];
      }
    }
    // each distinct (KV head, K scale) quantized and packed once
    std::vector<KeyInputs> key_inputs;
    std::vector<size_t> key_of(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      const float bk = head_bk[static_cast<size_t>(h)];
      auto it = std::find_if(key_inputs.begin(), key_inputs.end(),
                             [&](const KeyInputs& ki) { return ki.g == g && ki.bk == bk; });
      if (it == key_inputs.end()) {
        it = key_inputs.emplace(key_inputs.end());
        it->g = g, it->bk = bk;
      }
      key_of[static_cast<size_t>(h)] = static_cast<size_t>(it - key_inputs.begin());
    }
#pragma omp parallel for schedule(dynamic)
    for (size_t i = 0; i < key_inputs.size(); ++i) {
      KeyInputs& ki = key_inputs[i];
      const int64_t g = ki.g;
      ki.k8.resize(static_cast<size_t>(L * hd));
      k::quantize_rows_s8(kk + g * hd, L, hd, ldkv, ki.bk, ki.k8.data(), hd);
      if (!fused_topk) {
        ki.k8_packed.emplace(ki.k8.data(), hd, L, hd, isa);
      } else {
        for (int64_t c0 = 0; c0 < L; c0 += k::kFusedTileKeys)
          ki.k8_tiles.emplace_back(ki.k8.data() + c0 * hd, hd, std::min(k::kFusedTileKeys, L - c0),
                                   hd, isa);
        ki.k8_sums.emplace(ki.k8.data(), hd, L, hd);
      }
      if (certified)
        for (int64_t j = 0; j < L; ++j) {
          double n8 = 0, ne = 0;
          for (int64_t d = 0; d < hd; ++d) {
            const double q8 = ki.k8[static_cast<size_t>(j * hd + d)];
            const double e = static_cast<double>(kk[j * ldkv + g * hd + d]) / ki.bk - q8;
            n8 += q8 * q8, ne += e * e;
          }
          ki.k8_norm_max = std::max(ki.k8_norm_max, std::sqrt(n8));
          ki.k_residual_max = std::max(ki.k_residual_max, std::sqrt(ne));
        }
    }
    for (int64_t h = 0; h < H; ++h)
      heads[static_cast<size_t>(h)].keys = &key_inputs[key_of[static_cast<size_t>(h)]];

    const detail::KvHeadRows kv(kk, v, ldkv, sh.past + T, sh);
    const int64_t n_blocks = (T + kSelectRowBlock - 1) / kSelectRowBlock;
#pragma omp parallel for schedule(dynamic) collapse(2)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t bi = 0; bi < n_blocks; ++bi) {
        const int64_t r0 = bi * kSelectRowBlock, rows = std::min(kSelectRowBlock, T - r0);
        const int64_t g = h / group, keys = sh.past + r0 + rows;
        const double ratio = c.head_ratio[static_cast<size_t>(h)];
        const float *kg = kv.k(g), *vg = kv.v(g);
        const HeadInputs& hi = heads[static_cast<size_t>(h)];
        thread_local std::vector<float> qh_buf, fbuf, cand_score;
        thread_local std::vector<int32_t> idx_buf, S_buf, cand, pick;
        thread_local std::vector<int64_t> offs_buf, offs_chunk_buf;
        thread_local std::vector<k::FusedTopkRow> spec_buf;
        thread_local std::vector<int8_t> q8_buf;
        float* qh = detail::thread_scratch(qh_buf, rows * hd);
        // every row's kept keys, row i's from offs[i]
        int32_t* idx_all = detail::thread_scratch(idx_buf, rows * keys);
        int64_t* offs = detail::thread_scratch(offs_buf, rows + 1);
        int32_t* S = fused_topk
                         ? nullptr
                         : detail::thread_scratch(S_buf, std::min(rows, kEstimateRowChunk) * keys);
        int64_t* offs_chunk = detail::thread_scratch(offs_chunk_buf, kEstimateRowChunk + 1);
        int8_t* q8 = detail::thread_scratch(q8_buf, rows * hd);
        detail::gather_head(q + r0 * ldq, ldq, rows, h * hd, hd, qh);
        // INT8 estimate with the bucket's scales, top-k on the int32 scores (§3.2), a chunk of
        // rows at a time against the keys the chunk sees
        k::quantize_rows_s8(qh, rows, hd, hd, hi.bq, q8, hd);
        const KeyInputs& ki = *hi.keys;
        int64_t rescored = 0;
        k::FusedTopkStats fused;
        k::TopkHint hint;  // the previous row's k-th value and score moments: this row's band
        offs[0] = 0;
        for (int64_t c0 = 0; c0 < rows; c0 += kEstimateRowChunk) {
          const int64_t c1 = std::min(rows, c0 + kEstimateRowChunk), chunk_keys = sh.past + r0 + c1;
          const int8_t* q8c = q8 + c0 * hd;
          if (!fused_topk) {  // the chunk's scores, in L2 while each row's top-k reads them
            k::gemm_s8s8s32_packed_cols(q8c, hd, *ki.k8_packed, S, chunk_keys, c1 - c0, chunk_keys,
                                        isa);
            for (int64_t i = c0; i < c1; ++i) {
              const int64_t visible = sh.past + r0 + i + 1,
                            lo = k::first_visible_key(visible - 1, sh.window);
              const int32_t* srow = S + (i - c0) * chunk_keys + lo;
              int32_t* idx = idx_all + offs[i];
              const int64_t n = k::topk_indices(
                  srow, visible - lo, keys_kept(visible - lo, ratio, min_keys), idx, hint);
              if (certified)
                rescored +=
                    certify_topk(qh + i * hd, q8 + i * hd, hi, kg + lo * kv.ld(), kv.ld(), hd, srow,
                                 visible - lo, n, idx, cand, cand_score, pick, fbuf);
              offs[i + 1] = offs[i] + n;
            }
          } else {  // the top-k fused into the estimate, tile by tile of keys
            k::FusedTopkRow* spec = detail::thread_scratch(spec_buf, c1 - c0);
            for (int64_t i = c0; i < c1; ++i) {
              const int64_t visible = sh.past + r0 + i + 1,
                            lo = k::first_visible_key(visible - 1, sh.window);
              double qn = 0;
              for (int64_t d = 0; d < hd; ++d)
                qn += static_cast<double>(q8[i * hd + d]) * q8[i * hd + d];
              spec[i - c0] = {lo, visible - lo, keys_kept(visible - lo, ratio, min_keys),
                              ki.k8_sums->mean_score(q8 + i * hd, lo, visible), std::sqrt(qn)};
            }
            select_fused(ki, q8c, hd, spec, c1 - c0, isa, hint, idx_all + offs[c0], offs_chunk,
                         trace ? &fused : nullptr);
            for (int64_t i = c0; i < c1; ++i) offs[i + 1] = offs[c0] + offs_chunk[i - c0 + 1];
          }
          for (int64_t i = c0; i < c1; ++i) {
            const int64_t lo = k::first_visible_key(sh.past + r0 + i, sh.window);
            int32_t* idx = idx_all + offs[i];
            const int64_t n = offs[i + 1] - offs[i];
            for (int64_t t = 0; t < n; ++t) idx[t] += static_cast<int32_t>(lo);
            detail::trace_keys(trace, h, T, r0 + i, idx, n);
          }
        }
        // fp32 attention over the kept keys, the block's rows together (§3.2)
        k::attend_selected_rows(qh, hd, kg, vg, kv.ld(), hd, idx_all, offs, rows, inv_sqrt, nullptr,
                                0, out + r0 * ldo + h * hd, ldo);
        if (trace) {
#pragma omp atomic
          trace->rescored[static_cast<size_t>(h)] += rescored;
#pragma omp atomic
          trace->fused_rows[static_cast<size_t>(h)] += fused.fused_rows + fused.missed_rows;
#pragma omp atomic
          trace->missed_rows[static_cast<size_t>(h)] += fused.missed_rows;
        }
      }
  }

  // Per fused launch an NPU Estimate task (launch + INT8 Q·Kᵀ of the dense rows x kv scores of
  // its heads: a static graph computes masked pairs too); per head a TopK task over its causal
  // scores and a SparseAttention task over the keys it keeps (shadowAttn's own fused kernel,
  // §4, timed at its own rate), with Eq. 4's dependencies
  // (ζnpu <- ζtopk; ζnpu, ζtopk <- ζqkv); the order of launches and heads is the scheduler's
  // (head_pipeline.h).
  std::vector<int64_t> tasks(const AttentionScheme& s, const TaskShape& sh, TaskSink& sink,
                             const std::vector<int64_t>& deps) const override {
    using soc::DType;
    using soc::OpKind;
    const int64_t H = sh.n_heads, d = sh.head_dim;
    const int64_t dense = sh.rows * sh.kv_len, causal = causal_pairs(sh.rows, sh.kv_len, sh.window);
    std::vector<int64_t> buckets(static_cast<size_t>(H), 0);
    if (!sh.buckets.empty()) buckets.assign(sh.buckets.begin(), sh.buckets.end());
    const auto launches = sched::fuse_launches(buckets, sh.max_fused_heads);
    std::vector<int64_t> est_of(static_cast<size_t>(H), -1);
    for (size_t l = 0; l < launches.size(); ++l) {
      const auto& hs = launches[l];
      const auto nh = static_cast<int64_t>(hs.size());
      std::vector<soc::OpDesc> ops = {
          detail::attention_op(OpKind::NpuLaunch, "launch", DType::Int8, 0, 0, 0, ""),
          detail::attention_op(OpKind::AttnMatMul, "qk_estimate", DType::Int8, nh, d, dense, "")};
      const int64_t id = sink.add("estimate.g" + std::to_string(l), sched::TaskKind::Estimate,
                                  soc::Processor::Npu, std::move(ops), hs, 4 * nh * dense, deps);
      for (int64_t h : hs) est_of[static_cast<size_t>(h)] = id;
    }
    const bool certified = s.integer("certified") != 0;
    std::vector<int64_t> finals;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t est = est_of[static_cast<size_t>(h)];
      const std::string hn = ".h" + std::to_string(h);
      std::vector<soc::OpDesc> topk = {
          detail::attention_op(OpKind::TopK, "topk", DType::Fp32, 1, d, causal, sh.core)};
      if (certified)  // the uncertain band's keys, rescored in fp32
        topk.push_back(detail::attention_op(
            OpKind::AttnMatMul, "rescore", DType::Fp32, 1, d,
            std::llround(sh.rescore_share * static_cast<double>(causal)), sh.core));
      const int64_t tk = sink.add("topk" + hn, sched::TaskKind::TopK, sh.processor, std::move(topk),
                                  {h}, 4 * dense, {est});
      const int64_t kept = kept_pairs(sh.rows, sh.kv_len, sh.window, detail::head_ratio(sh, s, h),
                                      s.integer("min_keys"));
      finals.push_back(
          sink.add("sparse_attention" + hn, sched::TaskKind::SparseAttention, sh.processor,
                   {detail::attention_op(OpKind::SparseAttention, "fused_sparse_attention",
                                         DType::Fp32, 1, d, kept, sh.core)},
                   {h}, 4 * (kept + 2 * sh.rows * d), {est, tk}));  // Eq. 4
    }
    return finals;
  }
};

}  // namespace

const SchemeKind& shadow_attn_scheme() {
  static const ShadowAttn kScheme;
  return kScheme;
}

}  // namespace socllm::attention
