#include "socllm/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "socllm/kernels.h"

namespace socllm::kernels {

namespace {

// The k-th largest value by nth_element on a copy, then one pass in index order taking every
// value above it and the first (k - above) equal to it: O(n), and ties go to earlier keys.
template <class T>
int64_t topk_impl(const T* s, int64_t n, int64_t k, int32_t* idx, std::vector<T>& buf) {
  k = std::clamp<int64_t>(k, 0, n);
  if (k == 0) return 0;
  if (k == n) {
    for (int64_t j = 0; j < n; ++j) idx[j] = static_cast<int32_t>(j);
    return n;
  }
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

void attend_selected(const float* q, const float* k, const float* v, int64_t ldkv, int64_t head_dim,
                     const int32_t* idx, int64_t n, float scale, float* out, float* p) {
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = k + static_cast<int64_t>(idx[j]) * ldkv;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < head_dim; ++c) dot += q[c] * kr[c];
    p[j] = dot;
  }
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
