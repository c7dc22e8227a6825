// Sparse-attention kernels (kernels layer): per-row top-k, attention over selected keys, and the
// INT8 operand quantization of an estimation graph (seed 000 §3.2). Pure numerics.
#pragma once

#include <cstdint>
#include <vector>

namespace socllm::kernels {

// Indices of the k largest of s[0, n) in ascending index order; equal values: the earlier index
// wins (so the selection is a function of the values alone). k is clamped to [0, n]; `buf`
// is scratch (resized as needed). Returns the number written.
int64_t topk_indices(const float* s, int64_t n, int64_t k, int32_t* idx, std::vector<float>& buf);
int64_t topk_indices(const int32_t* s, int64_t n, int64_t k, int32_t* idx,
                     std::vector<int32_t>& buf);

// out[j] = q·k[idx_j] for j < n (k rows of stride ldkv): fp32 scores of selected keys.
void score_selected(const float* q, const float* k, int64_t ldkv, int64_t head_dim,
                    const int32_t* idx, int64_t n, float* out);
// out[head_dim] = sum_j softmax_j(score_j) v[idx_j], score_j = scale * q·k[idx_j] (k, v rows of
// stride ldkv); n >= 1 keys. `p` holds n floats of scratch.
void attend_selected(const float* q, const float* k, const float* v, int64_t ldkv, int64_t head_dim,
                     const int32_t* idx, int64_t n, float scale, float* out, float* p);
// Same with the scores given (score_j = scale * s[idx_j]): C/G-Sparse reuses its fp32 estimate.
void attend_selected_scored(const float* s, const float* v, int64_t ldkv, int64_t head_dim,
                            const int32_t* idx, int64_t n, float scale, float* out, float* p);

// y[r, c] = saturate(round_half_even(x[r, c] / scale)) to [-127, 127] for rows of `cols` values
// (x row stride ldx, y row stride ldy): a static-scale INT8 quantizer as an NPU graph applies
// it (symmetric, no -128). scale > 0.
void quantize_rows_s8(const float* x, int64_t rows, int64_t cols, int64_t ldx, float scale,
                      int8_t* y, int64_t ldy);

// max |x| over rows of `cols` values (row stride ld).
float absmax_rows(const float* x, int64_t rows, int64_t cols, int64_t ld);

}  // namespace socllm::kernels
