#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "socllm/kernels.h"

namespace socllm::kernels {

namespace {
// Below this many elements a loop runs on the calling thread: waking the OpenMP team costs
// more than the loop (decode is mostly such loops), and every barrier is a chance to wait
// on a descheduled thread when the cores are shared.
constexpr int64_t kMinParallelElems = int64_t{1} << 15;
}  // namespace

void linear(const float* x, int64_t T, int64_t in, int64_t ldx, const float* W, int64_t out,
            const float* bias, float* y, int64_t ldy, bool accumulate) {
  if (T == 0) return;
  const float beta = accumulate ? 1.0f : 0.0f;
  if (T == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, W, in, x, 1, beta, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, ldx, W, in, beta, y,
                ldy);
  }
  if (bias) {
#pragma omp parallel for schedule(static) if (T * out >= kMinParallelElems)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < out; ++j) y[t * ldy + j] += bias[j];
  }
}

void rms_norm(const float* x, const float* w, int64_t T, int64_t d, double eps, float* y) {
#pragma omp parallel for schedule(static) if (T * d >= kMinParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * d;
    float* yr = y + t * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    // transformers computes rsqrt in fp32, then scales x and multiplies by the weight.
    float r =
        1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + static_cast<float>(eps));
    for (int64_t i = 0; i < d; ++i) yr[i] = w[i] * (xr[i] * r);
  }
}

void rope_inv_freq(double theta, int64_t head_dim, float* inv_freq) {
  for (int64_t i = 0; i < head_dim / 2; ++i)
    inv_freq[i] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim)));
}

void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t ld,
               const int64_t* positions, const float* inv_freq) {
  const int64_t half = head_dim / 2;
#pragma omp parallel if (T * n_heads * head_dim >= kMinParallelElems)
  {
    std::vector<float> cs(static_cast<size_t>(head_dim));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        // The angle is an fp32 product, as in transformers' rotary embedding.
        const float a = pos * inv_freq[i];
        cs[static_cast<size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(a)));
        cs[static_cast<size_t>(half + i)] = static_cast<float>(std::sin(static_cast<double>(a)));
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* xh = x + t * ld + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float c = cs[static_cast<size_t>(i)], s = cs[static_cast<size_t>(half + i)];
          const float x1 = xh[i], x2 = xh[i + half];
          xh[i] = x1 * c - x2 * s;
          xh[i + half] = x2 * c + x1 * s;
        }
      }
    }
  }
}

void silu_mul(const float* gate_up, int64_t T, int64_t d_ff, float* out) {
#pragma omp parallel for schedule(static) if (T * d_ff >= kMinParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * d_ff;
    const float* u = g + d_ff;
    float* o = out + t * d_ff;
    for (int64_t j = 0; j < d_ff; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
}

void gelu_tanh_mul(const float* gate_up, int64_t T, int64_t d_ff, float* out) {
  // GeLU with the tanh approximation (Hendrycks & Gimpel 2016; transformers
  // "gelu_pytorch_tanh"): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
  const float c = std::sqrt(2.0f / static_cast<float>(M_PI));
#pragma omp parallel for schedule(static) if (T * d_ff >= kMinParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * d_ff;
    const float* u = g + d_ff;
    float* o = out + t * d_ff;
    for (int64_t j = 0; j < d_ff; ++j) {
      const float x = g[j];
      o[j] = 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x))) * u[j];
    }
  }
}

namespace {
// Flash-style blocking (Dao et al. 2022, "FlashAttention", Alg. 1, on the CPU): a task owns a
// block of query rows and walks the keys in blocks, keeping per row the running max m, the
// running sum l of exp(s - m) and the unnormalized output O; no [T, T] score matrix exists.
// The score tile [group * kQueryBlock, kKeyBlock] (384 KB for SmolLM2's groups of 3) stays in
// L2, and key blocks past a block's last row (causal) or before its first row's window
// (sliding window) are never touched. 128 x 256 measured 5% faster than 64 x 128 at 4096
// tokens on Zen 4 (docs/RESULTS.md, Issue 16).
constexpr int64_t kQueryBlock = 128;
constexpr int64_t kKeyBlock = 256;

// Folds one key block into a row's running softmax: s[0, n) are the block's scores, of which
// [lo, hi) are visible to the row. s becomes P = exp(s - m_new) (0 outside [lo, hi)); returns
// the factor exp(m_old - m_new) the row's O and l must be scaled by (1 if nothing is visible).
float online_softmax_block(float* s, int64_t lo, int64_t hi, int64_t n, float& m, float& l) {
  if (lo >= hi) {
    std::fill(s, s + n, 0.0f);
    return 1.0f;
  }
  float bm = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : bm)
  for (int64_t j = lo; j < hi; ++j) bm = std::max(bm, s[j]);
  const float m_new = std::max(m, bm);
  // m is -inf until the row's first visible key: there is nothing to rescale yet
  const float alpha = std::isinf(m) ? 0.0f : exp_nonpositive(m - m_new);
  std::fill(s, s + lo, 0.0f);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = lo; j < hi; ++j) {
    s[j] = exp_nonpositive(s[j] - m_new);
    sum += s[j];
  }
  std::fill(s + hi, s + n, 0.0f);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}
}  // namespace

int64_t attention_scratch_floats(int64_t T, int64_t L, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim) {
  const int64_t rows = (n_heads / n_kv_heads) * std::min(T, kQueryBlock);
  const int64_t keys = std::min(L, kKeyBlock);
  return static_cast<int64_t>(omp_get_max_threads()) * rows * (keys + 2 * head_dim + 2);
}

void attention_causal(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv,
                      int64_t T, int64_t past, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, float* out, int64_t ldo, float* scratch, int64_t window) {
  const int64_t group = n_heads / n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t n_blocks = (T + kQueryBlock - 1) / kQueryBlock;
  const int64_t max_rows = group * std::min(T, kQueryBlock);
  const int64_t tile_keys = std::min(past + T, kKeyBlock);
  const int64_t per_thread = max_rows * (tile_keys + 2 * head_dim + 2);
  // One task per (kv group, query block). The group's heads share K and V, so their query
  // rows are stacked into one [group*rows, head_dim] matrix: one larger GEMM per key block
  // instead of `group` small ones. OpenBLAS (OpenMP build) runs single-threaded inside the
  // parallel region, so threads split tasks, not tiny GEMMs.
#pragma omp parallel for schedule(dynamic) \
    collapse(2) if (n_heads * T * (past + T) * head_dim >= kMinParallelElems)
  for (int64_t g = 0; g < n_kv_heads; ++g) {
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      const int64_t r0 = blk * kQueryBlock;
      const int64_t rows = std::min(kQueryBlock, T - r0);
      const int64_t n = group * rows;
      float* S = scratch + omp_get_thread_num() * per_thread;  // [n, tile_keys]
      float* Qs = S + max_rows * tile_keys;                    // [n, head_dim]
      float* O = Qs + max_rows * head_dim;                     // [n, head_dim], unnormalized
      float* m = O + max_rows * head_dim;                      // [n] running max
      float* l = m + max_rows;                                 // [n] running sum
      for (int64_t hh = 0; hh < group; ++hh)
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(Qs + (hh * rows + i) * head_dim,
                      q + (r0 + i) * ldq + (g * group + hh) * head_dim, head_dim * sizeof(float));
      std::fill(O, O + n * head_dim, 0.0f);
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, kn, head_dim, scale, Qs, head_dim,
                    k + k0 * ldkv + g * head_dim, ldkv, 0.0f, S, kn);
        for (int64_t hh = 0; hh < group; ++hh)
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t r = hh * rows + i, p = first_pos + i;
            const int64_t lo = std::max(first_visible_key(p, window), k0) - k0;
            const int64_t hi = std::min(p + 1, k0 + kn) - k0;
            const float alpha = online_softmax_block(S + r * kn, lo, hi, kn, m[r], l[r]);
            if (alpha != 1.0f)
              for (int64_t c = 0; c < head_dim; ++c) O[r * head_dim + c] *= alpha;
          }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, head_dim, kn, 1.0f, S, kn,
                    v + k0 * ldkv + g * head_dim, ldkv, 1.0f, O, head_dim);
      }
      for (int64_t hh = 0; hh < group; ++hh)
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t r = hh * rows + i;
          const float* o = O + r * head_dim;
          float* dst = out + (r0 + i) * ldo + (g * group + hh) * head_dim;
          const float inv = 1.0f / l[r];
          for (int64_t c = 0; c < head_dim; ++c) dst[c] = o[c] * inv;
        }
    }
  }
}

void log_softmax_gather(const float* logits, int64_t T, int64_t V, int64_t ld,
                        const int32_t* target, float* logprob) {
#pragma omp parallel for schedule(static) if (T * V >= kMinParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    const float* x = logits + t * ld;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[j]);
    double sum = 0.0;  // fp64 accumulation over the ~50k-term vocabulary
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += static_cast<double>(exp_nonpositive(x[j] - mx));
    logprob[t] = static_cast<float>(static_cast<double>(x[target[t]] - mx) - std::log(sum));
  }
}

int64_t argmax(const float* x, int64_t n) {
  return static_cast<int64_t>(std::max_element(x, x + n) - x);
}

}  // namespace socllm::kernels

namespace socllm::kernels {

void round_to_fp16(float* x, int64_t n) {
  // _Float16 conversions round to nearest even and overflow to inf; with F16C (-march=native on
  // x86) the loop compiles to vcvtps2ph / vcvtph2ps.
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<_Float16>(x[i]));
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace socllm::kernels
