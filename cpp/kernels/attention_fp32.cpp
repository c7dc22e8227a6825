// The engine's dense fp32 causal attention (kernels.h): flash-style blocking with
// register-tiled micro-kernels for Q·Kᵀ and P·V instead of library GEMM calls, whose
// per-call packing and K = head_dim inner dimension left them at half the linears' FLOP rate
// (docs/RESULTS.md, Issue 16 item 6).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "core/core.h"
#include "kernels/float_simd.h"
#include "kernels/kernels.h"
#include "parallel_threshold.h"

namespace socllm::kernels {

namespace {

using simd::kLanes;
using simd::load;
using simd::splat;
using simd::store;
using simd::VecF;

// Register tiles: kTileRows query rows by kQkVecs (Q·Kᵀ: keys) or kPvVecs (P·V: head dims)
// vectors of accumulators, sized so that accumulators, the loaded K/V vectors and a broadcast
// fit the register file: 6x2 + 2 + 1 of 16 (AVX2); 6x4 + 4 + 1 of 32 (AVX-512).
constexpr int kTileRows = 6;
constexpr int kQkVecs = 2;
#if defined(__AVX512F__)
constexpr int kPvVecs = 4;
#else
constexpr int kPvVecs = 2;
#endif
constexpr int64_t kQkCols = kQkVecs * kLanes;  // keys per Q·Kᵀ tile
constexpr int64_t kPvCols = kPvVecs * kLanes;  // head dims per P·V tile

// Flash-style blocking (Dao et al. 2022, "FlashAttention", Alg. 1, on the CPU): a task owns a
// block of query rows and walks the keys in blocks, keeping per row the running max m, the
// running sum l of exp(s - m) and the unnormalized output O; no [T, T] score matrix exists.
// A task's packed K and V blocks (2 x 64 KB at head_dim 64) stay in L2 while every row tile
// of the task passes over them. 128 x 256 measured 5% faster than 64 x 128 at 4096 tokens on
// Zen 4 (docs/RESULTS.md, Issue 16).
constexpr int64_t kQueryBlock = 128;
constexpr int64_t kKeyBlock = 256;

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// S[r, 0 .. kQkCols) = Σ_c Q[r, c] Kt[c, 0 .. kQkCols) for the R rows of a tile.
template <int R>
void qk_tile(const float* Q, int64_t d, const float* Kt, int64_t ldk, float* S, int64_t lds) {
  VecF acc[R][kQkVecs] = {};
  for (int64_t c = 0; c < d; ++c) {
    VecF kv[kQkVecs];
    for (int v = 0; v < kQkVecs; ++v) kv[v] = load(Kt + c * ldk + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const VecF qb = splat(Q[r * d + c]);
      for (int v = 0; v < kQkVecs; ++v) acc[r][v] += qb * kv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kQkVecs; ++v) store(S + r * lds + v * kLanes, acc[r][v]);
}

// O[r, 0 .. kPvCols) = alpha[r] O[r, ..] + Σ_{j < n} P[r, j] V[j, 0 .. kPvCols).
template <int R>
void pv_tile(const float* P, int64_t ldp, const float* V, int64_t ldv, int64_t n,
             const float* alpha, float* O, int64_t ldo) {
  VecF acc[R][kPvVecs];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kPvVecs; ++v) acc[r][v] = load(O + r * ldo + v * kLanes) * alpha[r];
  for (int64_t j = 0; j < n; ++j) {
    VecF vv[kPvVecs];
    for (int v = 0; v < kPvVecs; ++v) vv[v] = load(V + j * ldv + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const VecF pb = splat(P[r * ldp + j]);
      for (int v = 0; v < kPvVecs; ++v) acc[r][v] += pb * vv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kPvVecs; ++v) store(O + r * ldo + v * kLanes, acc[r][v]);
}

// f(std::integral_constant<int, R>) for a tile of R = 1 .. kTileRows rows.
template <typename F>
void with_tile_rows(int64_t R, F&& f) {
  static_assert(kTileRows == 6, "one case per tile height");
  switch (R) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    default: return f(std::integral_constant<int, 6>{});
  }
}

// Folds one key block into a row's running softmax: s[0, n) are the block's scores (n a
// multiple of kLanes), of which [lo, hi) are visible to the row. s becomes P = exp(s - m_new)
// (0 outside [lo, hi)); returns the factor exp(m_old - m_new) the row's O and l must be
// scaled by (1 if nothing is visible). Vectors straddling lo or hi are masked lane by lane.
float online_softmax_block(float* s, int64_t lo, int64_t hi, int64_t n, float& m, float& l) {
  using VecI = Int32Of<VecF>::type;
  if (lo >= hi) {
    std::fill(s, s + n, 0.0f);
    return 1.0f;
  }
  VecI lane;
  for (int64_t i = 0; i < kLanes; ++i) lane[i] = static_cast<int32_t>(i);
  const auto visible = [&](int64_t j0) {
    const VecI j = lane + static_cast<int32_t>(j0);
    return (j >= static_cast<int32_t>(lo)) & (j < static_cast<int32_t>(hi));
  };
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t v_lo = lo / kLanes * kLanes;
  VecF vmax = splat(neg_inf);
  for (int64_t j0 = v_lo; j0 < hi; j0 += kLanes) {
    VecF x = load(s + j0);
    if (j0 < lo || j0 + kLanes > hi) x = visible(j0) ? x : splat(neg_inf);
    vmax = vmax > x ? vmax : x;
  }
  float bm = neg_inf;
  for (int64_t i = 0; i < kLanes; ++i) bm = std::max(bm, vmax[i]);
  const float m_new = std::max(m, bm);
  // m is -inf until the row's first visible key: there is nothing to rescale yet
  const float alpha = std::isinf(m) ? 0.0f : exp_nonpositive(m - m_new);
  std::fill(s, s + v_lo, 0.0f);
  VecF vsum = VecF{};
  int64_t j0 = v_lo;
  for (; j0 < hi; j0 += kLanes) {
    VecF p = exp_nonpositive(load(s + j0) - m_new);
    if (j0 < lo || j0 + kLanes > hi) p = visible(j0) ? p : VecF{};
    store(s + j0, p);
    vsum += p;
  }
  std::fill(s + j0, s + n, 0.0f);
  float sum = 0.0f;
  for (int64_t i = 0; i < kLanes; ++i) sum += vsum[i];
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

// Per-thread scratch of one task, in floats (attention_scratch_floats adds them up).
struct TaskScratch {
  int64_t rows, head_dim, padded_dim, padded_keys;
  int64_t q() const { return rows * head_dim; }                      // Q [rows, head_dim], scaled
  int64_t o() const { return rows * padded_dim; }                    // O [rows, padded_dim]
  int64_t kt() const { return head_dim * padded_keys; }              // Kᵀ [head_dim, padded_keys]
  int64_t v() const { return padded_keys * padded_dim; }             // V [padded_keys, padded_dim]
  int64_t s() const { return kTileRows * padded_keys + kTileRows; }  // S tile and its alphas
  int64_t total() const { return q() + o() + kt() + v() + s() + 2 * rows; }  // + m, l
};

TaskScratch task_scratch(int64_t T, int64_t L, int64_t n_heads, int64_t n_kv_heads,
                         int64_t head_dim) {
  return {(n_heads / n_kv_heads) * std::min(T, kQueryBlock), head_dim, round_up(head_dim, kPvCols),
          round_up(std::min(L, kKeyBlock), kQkCols)};
}

}  // namespace

int64_t attention_scratch_floats(int64_t T, int64_t L, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim) {
  return static_cast<int64_t>(omp_get_max_threads()) *
         task_scratch(T, L, n_heads, n_kv_heads, head_dim).total();
}

void attention_causal(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv,
                      int64_t T, int64_t past, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, float* out, int64_t ldo, float* scratch, int64_t window) {
  const int64_t group = n_heads / n_kv_heads, hd = head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t n_blocks = (T + kQueryBlock - 1) / kQueryBlock;
  const int64_t tile_keys = std::min(past + T, kKeyBlock);
  const TaskScratch ts = task_scratch(T, past + T, n_heads, n_kv_heads, hd);
  const int64_t dp = ts.padded_dim, kp = ts.padded_keys;
  // One task per (kv group, query block). The group's heads share K and V, so their query rows
  // are stacked position-major (row i * group + h is query i of the group's head h): a tile's
  // rows are few consecutive positions, so its causal / window bounds are nearly one row's.
#pragma omp parallel for schedule(dynamic) \
    collapse(2) if (n_heads * T * (past + T) * hd >= kMinParallelElems)
  for (int64_t g = 0; g < n_kv_heads; ++g) {
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      const int64_t r0 = blk * kQueryBlock;
      const int64_t rows = std::min(kQueryBlock, T - r0);
      const int64_t n = group * rows;
      float* Qs = scratch + omp_get_thread_num() * ts.total();
      float* O = Qs + ts.q();
      float* Kt = O + ts.o();
      float* Vp = Kt + ts.kt();
      float* S = Vp + ts.v();
      float* alpha = S + kTileRows * kp;
      float* m = alpha + kTileRows;
      float* l = m + ts.rows;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t hh = 0; hh < group; ++hh) {
          const float* src = q + (r0 + i) * ldq + (g * group + hh) * hd;
          float* dst = Qs + (i * group + hh) * hd;
          for (int64_t c = 0; c < hd; ++c) dst[c] = src[c] * scale;
        }
      std::fill(O, O + n * dp, 0.0f);
      std::fill(m, m + n, -std::numeric_limits<float>::infinity());
      std::fill(l, l + n, 0.0f);
      // Query at absolute position p sees keys [p + 1 - window, p] (window > 0, Gemma 3's
      // local layers) or [0, p]: the block needs keys from its first row's lower bound up to
      // its last row.
      const int64_t first_pos = past + r0;
      const int64_t k_begin = first_visible_key(first_pos, window);
      const int64_t k_end = first_pos + rows;
      for (int64_t k0 = k_begin; k0 < k_end; k0 += tile_keys) {
        const int64_t kn = std::min(tile_keys, k_end - k0);
        const int64_t kn_pad = round_up(kn, kQkCols);
        // Pack the block: Kᵀ [hd, kn_pad] and V [kn_pad, dp], zero-padded (padded keys get
        // P = 0, padded dims are never read back, but 0 x garbage could be NaN). Kᵀ is written
        // row by row: strided loads, contiguous stores (strided stores took 15% of the time).
        const float* kb = k + k0 * ldkv + g * hd;
        for (int64_t c = 0; c < hd; ++c) {
          float* dst = Kt + c * kn_pad;
          for (int64_t j = 0; j < kn; ++j) dst[j] = kb[j * ldkv + c];
          std::fill(dst + kn, dst + kn_pad, 0.0f);
        }
        for (int64_t j = 0; j < kn_pad; ++j) {
          float* dst = Vp + j * dp;
          if (j < kn) {
            const float* vs = v + (k0 + j) * ldkv + g * hd;
            std::copy(vs, vs + hd, dst);
            std::fill(dst + hd, dst + dp, 0.0f);
          } else {
            std::fill(dst, dst + dp, 0.0f);
          }
        }
        for (int64_t r = 0; r < n; r += kTileRows) {
          const int64_t R = std::min<int64_t>(kTileRows, n - r);
          // Keys [lo, hi) of the block are visible to some row of the tile.
          const int64_t p_first = first_pos + r / group, p_last = first_pos + (r + R - 1) / group;
          const int64_t lo = std::max(first_visible_key(p_first, window), k0) - k0;
          const int64_t hi = std::min(p_last + 1, k0 + kn) - k0;
          if (lo >= hi) continue;  // every row's alpha is 1, its O and l unchanged
          const int64_t c0 = lo / kQkCols * kQkCols, c1 = round_up(hi, kQkCols);
          with_tile_rows(R, [&](auto rows_c) {
            constexpr int Rc = decltype(rows_c)::value;
            for (int64_t c = c0; c < c1; c += kQkCols)
              qk_tile<Rc>(Qs + r * hd, hd, Kt + c, kn_pad, S + (c - c0), kp);
            for (int64_t rr = 0; rr < Rc; ++rr) {
              const int64_t p = first_pos + (r + rr) / group;
              const int64_t row_lo = std::max(first_visible_key(p, window), k0) - k0 - c0;
              const int64_t row_hi = std::min(p + 1, k0 + kn) - k0 - c0;
              alpha[rr] = online_softmax_block(S + rr * kp, row_lo, row_hi,
                                               round_up(hi - c0, kLanes), m[r + rr], l[r + rr]);
            }
            for (int64_t c = 0; c < dp; c += kPvCols)
              pv_tile<Rc>(S, kp, Vp + c0 * dp + c, dp, hi - c0, alpha, O + r * dp + c, dp);
          });
        }
      }
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t r = i * group + hh;
          const float* o = O + r * dp;
          float* dst = out + (r0 + i) * ldo + (g * group + hh) * hd;
          const float inv = 1.0f / l[r];
          for (int64_t c = 0; c < hd; ++c) dst[c] = o[c] * inv;
        }
    }
  }
}

int64_t KeyPanelsF32::panel_keys() { return kQkCols; }

KeyPanelsF32::KeyPanelsF32(const float* k, int64_t ldk, int64_t L, int64_t head_dim)
    : L_(L), hd_(head_dim) {
  if (L < 0 || head_dim <= 0 || ldk < head_dim)
    throw ShapeError("[KeyPanelsF32] keys [" + std::to_string(L) + ", " + std::to_string(head_dim) +
                     "] with row stride " + std::to_string(ldk));
  const int64_t panels = (L + kQkCols - 1) / kQkCols;
  data_.assign(static_cast<size_t>(panels * head_dim * kQkCols), 0.0f);
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t j = p * kQkCols; j < std::min(L, (p + 1) * kQkCols); ++j)
      for (int64_t c = 0; c < head_dim; ++c)
        data_[static_cast<size_t>((p * head_dim + c) * kQkCols + j - p * kQkCols)] = k[j * ldk + c];
}

void causal_scores_f32(const float* q, int64_t rows, const KeyPanelsF32& kp, int64_t keys_before,
                       float* S, int64_t lds) {
  const int64_t d = kp.head_dim(), last_keys = keys_before + rows;
  if (keys_before < 0 || last_keys > kp.keys() || lds < round_up(last_keys, kQkCols))
    throw ShapeError("[causal_scores_f32] rows seeing up to " + std::to_string(last_keys) + " of " +
                     std::to_string(kp.keys()) + " keys, lds " + std::to_string(lds));
  // panel by panel (in L1 while every row tile uses it); a tile skips the panels beyond its
  // last row's keys
  const int64_t panels = (last_keys + kQkCols - 1) / kQkCols;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t r = 0; r < rows; r += kTileRows) {
      const int64_t R = std::min<int64_t>(kTileRows, rows - r);
      if (p * kQkCols >= keys_before + r + R) continue;  // beyond this tile's keys
      with_tile_rows(R, [&](auto rows_c) {
        qk_tile<decltype(rows_c)::value>(q + r * d, d, kp.panel(p), kQkCols,
                                         S + r * lds + p * kQkCols, lds);
      });
    }
}

}  // namespace socllm::kernels
