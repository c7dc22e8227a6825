#include "kernels/sparse_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/kernels.h"

namespace socllm::kernels {

namespace {

// Order-preserving map to uint32: a < b (as T) iff key(a) < key(b). Floats: flip all bits of
// negatives, set the sign bit of the rest (NaNs land beyond the infinities, deterministically).
inline uint32_t order_key(int32_t x) { return static_cast<uint32_t>(x) ^ 0x80000000u; }
inline uint32_t order_key(float x) {
  const auto b = std::bit_cast<uint32_t>(x == 0.0f ? 0.0f : x);  // -0 ties with +0, as == says
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Rows shorter than this take nth_element (the histogram's fixed cost would dominate).
constexpr int64_t kRadixMinN = 256;
constexpr int kRadixBits = 11;  // 2048 bins: the histogram stays in L1

// The k-th largest key by radix selection: a histogram of the keys' top bits within [lo, hi],
// the bin holding the k-th from the top, then the same within that bin's keys, until a bin is a
// single value. Returns it; `equal_left` = how many keys equal to it the top-k takes.
uint32_t radix_kth_largest(const uint32_t* keys, int64_t n, int64_t k, uint32_t lo, uint32_t hi,
                           int64_t& equal_left) {
  thread_local std::vector<uint32_t> cand;
  thread_local std::vector<int64_t> hist;
  const uint32_t* cur = keys;
  int64_t n_cur = n, need = k;
  uint32_t base = lo, range = hi - lo;
  while (range > 0) {
    const int bits = 32 - std::countl_zero(range);
    const int shift = std::max(0, bits - kRadixBits);
    const auto nb = static_cast<size_t>(range >> shift) + 1;
    hist.assign(nb, 0);
    for (int64_t j = 0; j < n_cur; ++j) ++hist[(cur[j] - base) >> shift];
    size_t b = nb;
    int64_t above = 0;
    while (above + hist[--b] < need) above += hist[b];
    need -= above;
    const uint32_t bin_lo = base + (static_cast<uint32_t>(b) << shift);
    const uint32_t bin_span = shift == 0 ? 0 : (uint32_t{1} << shift) - 1;
    const uint32_t bin_hi = std::min(hi, bin_lo + std::min(bin_span, ~bin_lo));
    if (shift == 0) {
      base = bin_lo;
      break;
    }
    // keep the bin's keys (compacted in place after the first round)
    std::vector<uint32_t>& dst = cand;
    if (cur != cand.data()) dst.resize(static_cast<size_t>(hist[b]));
    int64_t m = 0;
    for (int64_t j = 0; j < n_cur; ++j)
      if (cur[j] >= bin_lo && cur[j] <= bin_hi) dst[static_cast<size_t>(m++)] = cur[j];
    cur = dst.data(), n_cur = m;
    base = bin_lo, hi = bin_hi, range = bin_hi - bin_lo;
  }
  equal_left = need;
  return base;
}

// The top k of n values, ascending indices; ties go to earlier keys. O(n): nth_element on a
// copy for short rows, radix selection on order keys for long ones, then one pass in index
// order taking every value above the k-th and the first (k - above) equal to it.
template <class T>
int64_t topk_impl(const T* s, int64_t n, int64_t k, int32_t* idx, std::vector<T>& buf) {
  k = std::clamp<int64_t>(k, 0, n);
  if (k == 0) return 0;
  if (k == n) {
    for (int64_t j = 0; j < n; ++j) idx[j] = static_cast<int32_t>(j);
    return n;
  }
  if (n < kRadixMinN) {
    buf.assign(s, s + n);
    std::nth_element(buf.begin(), buf.begin() + (k - 1), buf.end(), std::greater<T>());
    const T thr = buf[static_cast<size_t>(k - 1)];
    int64_t above = 0;
    for (int64_t j = 0; j < n; ++j) above += s[j] > thr;
    int64_t equal_left = k - above, m = 0;
    for (int64_t j = 0; j < n && m < k; ++j) {
      if (s[j] > thr) {
        idx[m++] = static_cast<int32_t>(j);
      } else if (s[j] == thr && equal_left > 0) {
        idx[m++] = static_cast<int32_t>(j);
        --equal_left;
      }
    }
    return m;
  }
  thread_local std::vector<uint32_t> keys;
  keys.resize(static_cast<size_t>(n));
  uint32_t lo = ~0u, hi = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = order_key(s[j]);
    keys[static_cast<size_t>(j)] = key;
    lo = std::min(lo, key), hi = std::max(hi, key);
  }
  int64_t equal_left = 0;
  const uint32_t thr = radix_kth_largest(keys.data(), n, k, lo, hi, equal_left);
  // branch-free on the common path (a kept key is a coin flip at keep ratios like 0.2)
  int64_t m = 0;
  for (int64_t j = 0; j < n && m < k; ++j) {
    const uint32_t key = keys[static_cast<size_t>(j)];
    idx[m] = static_cast<int32_t>(j);
    bool take = key > thr;
    if (key == thr) {
      take = equal_left > 0;
      equal_left -= take;
    }
    m += take;
  }
  return m;
}

// out = sum_j p_j v[idx_j] / sum_j p_j with p_j = exp(scale * s_j - max) (s_j in p on entry).
void softmax_gather_v(float* p, const float* v, int64_t ldkv, int64_t head_dim, const int32_t* idx,
                      int64_t n, float scale, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j] * scale);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = exp_nonpositive(p[j] * scale - mx);
    sum += p[j];
  }
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float* vr = v + static_cast<int64_t>(idx[j]) * ldkv;
    const float w = p[j];
#pragma omp simd
    for (int64_t c = 0; c < head_dim; ++c) out[c] += w * vr[c];
  }
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < head_dim; ++c) out[c] *= inv;
}

}  // namespace

int64_t topk_indices(const float* s, int64_t n, int64_t k, int32_t* idx, std::vector<float>& buf) {
  return topk_impl(s, n, k, idx, buf);
}

int64_t topk_indices(const int32_t* s, int64_t n, int64_t k, int32_t* idx,
                     std::vector<int32_t>& buf) {
  return topk_impl(s, n, k, idx, buf);
}

void score_selected(const float* q, const float* k, int64_t ldkv, int64_t head_dim,
                    const int32_t* idx, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = k + static_cast<int64_t>(idx[j]) * ldkv;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < head_dim; ++c) dot += q[c] * kr[c];
    out[j] = dot;
  }
}

void attend_selected(const float* q, const float* k, const float* v, int64_t ldkv, int64_t head_dim,
                     const int32_t* idx, int64_t n, float scale, float* out, float* p) {
  score_selected(q, k, ldkv, head_dim, idx, n, p);
  softmax_gather_v(p, v, ldkv, head_dim, idx, n, scale, out);
}

void attend_selected_scored(const float* s, const float* v, int64_t ldkv, int64_t head_dim,
                            const int32_t* idx, int64_t n, float scale, float* out, float* p) {
  for (int64_t j = 0; j < n; ++j) p[j] = s[idx[j]];
  softmax_gather_v(p, v, ldkv, head_dim, idx, n, scale, out);
}

void quantize_rows_s8(const float* x, int64_t rows, int64_t cols, int64_t ldx, float scale,
                      int8_t* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      // x / scale as np.round(x / scale) computes it; nearbyint rounds half to even
      const float q = std::nearbyint(x[r * ldx + c] / scale);
      y[r * ldy + c] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
}

float absmax_rows(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  float m = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, std::abs(x[r * ld + c]));
  return m;
}

}  // namespace socllm::kernels
