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

// What one row's top-k leaves for the next row of the same head, whose scores cover nearly the
// same keys: its k-th largest value, the mean and standard deviation of its scores, and the
// running mean of how far the prediction of the k-th value from them missed.
struct TopkHint {
  bool valid = false;
  double value = 0, mean = 0, sd = 0;
  double moved = 0;
};

// topk_indices with the same result (tested against it), for consecutive rows: a band around the
// k-th value predicted from the hint and this row's mean and deviation is checked in one
// vectorized counting pass, its few candidates are selected, and one pass writes the indices; a
// band that misses is replaced by one from a sample, then widened, and after three misses the
// whole row's selection runs. Updates the hint.
int64_t topk_indices(const float* s, int64_t n, int64_t k, int32_t* idx, TopkHint& hint);
int64_t topk_indices(const int32_t* s, int64_t n, int64_t k, int32_t* idx, TopkHint& hint);

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

// attend_selected for a block of query rows, each over its own keys: row r's query is
// q + r * ldq, its keys idx[offs[r] .. offs[r + 1]) (ascending, at least one), its output
// out + r * ldo. The keys are walked in tiles, every row's keys of a tile before the next tile,
// with an online softmax per row (Dao et al. 2022, Alg. 1): a tile's K and V rows serve every row
// of the block from cache, where row-by-row gathers fetch them again for each row (the
// "blocked gather-attention" of issue 38). scores: null computes q·k; else row r's scores by
// key are scores + r * lds (C/G-Sparse reuses its estimate). Same result as attend_selected per
// row up to float rounding.
void attend_selected_rows(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv,
                          int64_t head_dim, const int32_t* idx, const int64_t* offs, int64_t rows,
                          float scale, const float* scores, int64_t lds, float* out, int64_t ldo);

// y[r, c] = saturate(round_half_even(x[r, c] / scale)) to [-127, 127] for rows of `cols` values
// (x row stride ldx, y row stride ldy): a static-scale INT8 quantizer as an NPU graph applies
// it (symmetric, no -128). scale > 0.
void quantize_rows_s8(const float* x, int64_t rows, int64_t cols, int64_t ldx, float scale,
                      int8_t* y, int64_t ldy);

// max |x| over rows of `cols` values (row stride ld).
float absmax_rows(const float* x, int64_t rows, int64_t cols, int64_t ld);

}  // namespace socllm::kernels
