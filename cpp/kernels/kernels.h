// fp32 kernels (kernels layer). Pure numerics: no notion of time or devices.
// Matrices are row-major; a "[rows, cols] (ld)" argument has row stride `ld` floats.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace socllm::kernels {

// y[T, out] (+)= x[T, in] (ldx) · W[out, in]^T (+ bias[out]); with `accumulate` the product
// is added to y (a fused residual add). OpenBLAS sgemm (sgemv when T == 1).
void linear(const float* x, int64_t T, int64_t in, int64_t ldx, const float* W, int64_t out,
            const float* bias, float* y, int64_t ldy, bool accumulate = false);
// C[n, n] (ldc) += xᵀ x of x[rows, n] (ldx), the upper triangle only (row-major; OpenBLAS
// ssyrk): a Gram matrix accumulated sequence by sequence (GPTQ's Hessian).
void add_gram_upper(const float* x, int64_t rows, int64_t n, int64_t ldx, float* C, int64_t ldc);

// y[T, d] = x / sqrt(mean(x^2) + eps) * w  (RMSNorm, Zhang & Sennrich 2019; llama).
void rms_norm(const float* x, const float* w, int64_t T, int64_t d, double eps, float* y);

// Rotary inverse frequencies inv_freq[head_dim/2] = theta^(-2i/head_dim), rounded to fp32.
void rope_inv_freq(double theta, int64_t head_dim, float* inv_freq);

// In-place rotary embedding in the rotate-half ("NeoX", Hugging Face) layout on
// x[T, n_heads*head_dim] (ld), row t at position positions[t].
void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t head_dim, int64_t ld,
               const int64_t* positions, const float* inv_freq);

// out[T, d_ff] = silu(gate_up[:, :d_ff]) * gate_up[:, d_ff:]  (SwiGLU, Shazeer 2020).
void silu_mul(const float* gate_up, int64_t T, int64_t d_ff, float* out);
// The same with GeLU's tanh approximation (GeGLU; Gemma's "gelu_pytorch_tanh").
void gelu_tanh_mul(const float* gate_up, int64_t T, int64_t d_ff, float* out);

// Causal grouped-query attention of T new queries (absolute positions past .. past+T-1)
// against L = past+T cached keys/values.
//   q   [T, n_heads*head_dim] (ldq)
//   k,v [L, n_kv_heads*head_dim] (ldkv)
//   out [T, n_heads*head_dim] (ldo)
// `scratch` holds at least attention_scratch_floats(T, L, n_heads, n_kv_heads, head_dim) floats,
// which stops growing with L past one key block: the kernel is blocked over queries and keys
// with an online softmax, so no [T, L] score matrix is formed.
// window > 0: sliding-window attention, query at position p sees keys p - window + 1 .. p.
void attention_causal(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv,
                      int64_t T, int64_t past, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, float* out, int64_t ldo, float* scratch,
                      int64_t window = 0);
int64_t attention_scratch_floats(int64_t T, int64_t L, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim);
// fp32 keys [L, head_dim] as Kᵀ panels of panel_keys() keys ([panels][head_dim][panel_keys()],
// zero-padded): the dense kernel's Q·Kᵀ micro-kernel operand, packed once for every query row of
// a prefill (C/G-Sparse's estimate; issue 38 item 3).
class KeyPanelsF32 {
 public:
  KeyPanelsF32(const float* k, int64_t ldk, int64_t L, int64_t head_dim);
  static int64_t panel_keys();
  int64_t keys() const { return L_; }
  int64_t head_dim() const { return hd_; }
  const float* panel(int64_t p) const { return data_.data() + p * hd_ * panel_keys(); }

 private:
  int64_t L_, hd_;
  std::vector<float> data_;
};
// S[r, j] = q_r · k_j for the rows r < rows of q ([rows, head_dim], contiguous) and the keys
// j < keys_before + r + 1 they see (causal), each computed as the dense kernel does. Row r's
// entries from there up to the next multiple of panel_keys() are unspecified: lds must hold the
// last row's keys rounded up to it.
void causal_scores_f32(const float* q, int64_t rows, const KeyPanelsF32& kp, int64_t keys_before,
                       float* S, int64_t lds);

// First key the query at absolute position `pos` sees: pos + 1 - window with a sliding window
// (window > 0, at least 0), else 0. Every attention scheme and the graph's pair counts use it.
inline int64_t first_visible_key(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos + 1 - window) : 0;
}

// logprob[t] = log_softmax(logits[t, :])[target[t]] for t < T; logits [T, V] (ld).
void log_softmax_gather(const float* logits, int64_t T, int64_t V, int64_t ld,
                        const int32_t* target, float* logprob);

// The int32 type of the same width as F: int32_t for float, the GCC int vector for a float vector.
template <typename F>
struct Int32Of {
  typedef int32_t type __attribute__((vector_size(sizeof(F))));
};
template <>
struct Int32Of<float> {
  using type = int32_t;
};

// float, or a GCC vector of floats (the kernels' SIMD type).
template <typename F>
concept FloatLanes = std::is_same_v<F, float> || requires(F v) {
  requires std::is_same_v<std::remove_cvref_t<decltype(v[0])>, float>;
};

// exp(x) for x <= 0 (softmax after subtracting the max): Cephes expf, x = k ln2 + r with a
// degree-6 polynomial for exp(r); relative error < 2e-7. Pure arithmetic (k by the
// 1.5 * 2^23 rounding trick, 2^k by building the float's exponent bits) so that loops calling
// it vectorize; std::exp is a libm call per element, and floor/int conversions kept GCC 12
// from vectorizing. F is float or a GCC float vector (the same operations, lane by lane).
template <FloatLanes F>
inline F exp_nonpositive(F x) {
  using I = typename Int32Of<F>::type;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  x = x < -87.0f ? F{} - 87.0f : x;      // exp(-87) ~ 1.6e-38: below it, 0 for softmax
  const F shifted = x * 1.44269504088896341f + kRound;
  const F k = shifted - kRound;
  const F r = x - k * 0.693359375f + k * 2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F y = p * r * r + r + 1.0f;
  const I k_int = std::bit_cast<I>(shifted) - std::bit_cast<int32_t>(kRound);
  return y * std::bit_cast<F>((k_int + 127) << 23);
}

// The logistic sigmoid 1 / (1 + exp(-z)) from exp_nonpositive(-|z|), so no exp overflows for
// any z; a loop calling it vectorizes (no libm call). Relative error < 1e-6 where the result is
// above exp_nonpositive's clamp (~1.6e-38).
inline float sigmoid(float z) {
  const float e = exp_nonpositive(-std::fabs(z));
  return (z >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// x[i] = binary16(x[i]) (round to nearest even, overflow to inf): how the engine emulates an
// op whose plan format is fp16 (its output is stored in fp16). Returns whether every result is
// finite (false: an overflow to inf, or a NaN or inf in x), checked in the same pass.
bool round_to_fp16(float* x, int64_t n);

// y[i] += x[i] (residual add).
void add_inplace(float* y, const float* x, int64_t n);

// Index of the largest value of x[n] (first one on ties).
int64_t argmax(const float* x, int64_t n);

}  // namespace socllm::kernels
