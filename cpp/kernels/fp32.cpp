#include <cblas.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/kernels.h"
#include "parallel_threshold.h"

namespace socllm::kernels {

void add_gram_upper(const float* x, int64_t rows, int64_t n, int64_t ldx, float* C, int64_t ldc) {
  if (rows <= 0 || n <= 0) return;
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(n), static_cast<int>(rows),
              1.0f, x, static_cast<int>(ldx), 1.0f, C, static_cast<int>(ldc));
}

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

// silu_mul keeps std::exp (a libm call per element): the vectorized sigmoid would change
// SmolLM2's bits, which the sweep's reproduction test pins to docs/results/plan_accuracy.json.
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
  // "gelu_pytorch_tanh"): 0.5 g (1 + tanh(v)), v = sqrt(2/pi) (g + 0.044715 g^3), computed as
  // the identical g * sigmoid(2 v). That vectorizes (tanhf per element was a quarter of Gemma
  // 3's int8 forward on one thread) and has no cancellation in 1 + tanh(v) for g << 0.
  const float c2 = 2.0f * std::sqrt(2.0f / static_cast<float>(M_PI));
#pragma omp parallel for schedule(static) if (T * d_ff >= kMinParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * d_ff;
    const float* u = g + d_ff;
    float* o = out + t * d_ff;
#pragma omp simd
    for (int64_t j = 0; j < d_ff; ++j) {
      const float x = g[j];
      o[j] = x * sigmoid(c2 * (x + 0.044715f * x * x * x)) * u[j];
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

namespace {

// Round-trip of one register of floats through binary16. The conversion instructions take the
// rounding mode from their immediate (nearest even), not MXCSR, and overflow to inf as IEEE
// does. GCC 12 does not vectorize scalar _Float16 casts (vcvtss2sh per element), hence the
// intrinsics.
#if defined(__AVX512F__)
constexpr int64_t kFp16Lanes = 16;
inline bool round_lanes_to_fp16(float* x) {
  const __m512 v = _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x), _MM_FROUND_TO_NEAREST_INT));
  _mm512_storeu_ps(x, v);
  const __m512i exp = _mm512_set1_epi32(0x7f800000);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exp), exp) == 0;
}
#elif defined(__F16C__) && defined(__AVX2__)
constexpr int64_t kFp16Lanes = 8;
inline bool round_lanes_to_fp16(float* x) {
  const __m256 v = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x), _MM_FROUND_TO_NEAREST_INT));
  _mm256_storeu_ps(x, v);
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  return _mm256_movemask_epi8(
             _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp), exp)) == 0;
}
#else
constexpr int64_t kFp16Lanes = 1;
inline bool round_lanes_to_fp16(float* x) {
  *x = static_cast<float>(static_cast<_Float16>(*x));
  return std::isfinite(*x);
}
#endif

// Elements per parallel task: a multiple of every lane count.
constexpr int64_t kFp16Block = 4096;

}  // namespace

bool round_to_fp16(float* x, int64_t n) {
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite) if (n > (int64_t{1} << 16))
  for (int64_t b = 0; b < n; b += kFp16Block) {
    const int64_t end = std::min(n, b + kFp16Block);
    int64_t i = b;
    bool ok = true;
    for (; i + kFp16Lanes <= end; i += kFp16Lanes) ok &= round_lanes_to_fp16(x + i);
    for (; i < end; ++i) {  // the tail
      x[i] = static_cast<float>(static_cast<_Float16>(x[i]));
      ok &= std::isfinite(x[i]);
    }
    finite = finite && ok;
  }
  return finite;
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace socllm::kernels
