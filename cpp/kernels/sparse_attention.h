// Sparse-attention kernels (kernels layer): per-row top-k, attention over selected keys, and the
// INT8 operand quantization of an estimation graph (seed 000 §3.2). Pure numerics.
#pragma once

#include <cstdint>
#include <functional>
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
  // fused_topk_rows: the row's query norm (0: not known) and the running mean of how far the
  // prediction made before the scores missed (negative: not known yet)
  double q_norm = 0, moved_fused = -1;
};

// topk_indices with the same result (tested against it), for consecutive rows: a band around the
// k-th value predicted from the hint and this row's mean and deviation is checked in one
// vectorized counting pass, its few candidates are selected, and one pass writes the indices; a
// band that misses is replaced by one from a sample, then widened, and after three misses the
// whole row's selection runs. Updates the hint.
int64_t topk_indices(const float* s, int64_t n, int64_t k, int32_t* idx, TopkHint& hint);
int64_t topk_indices(const int32_t* s, int64_t n, int64_t k, int32_t* idx, TopkHint& hint);

// ---- top-k fused into the estimate (issue 38 item 3) ----
//
// A chunk of rows' scores arrive tile by tile of kFusedTileKeys keys, and each tile is compressed
// against every row's band while it is in L1: no row's scores are stored whole, and no pass reads
// them again. The band must exist before the scores, so it is predicted: the row's mean is exact
// from the keys' prefix sums (q·Σk / n), its deviation is the hint row's scaled by the ratio of the
// query norms, and the k-th score keeps the hint row's standardised position (on WikiText-2 Q/K of
// SmolLM2-135M, keep 0.2, chunks of 24 rows: 27% of the keys are candidates, 1% of rows miss). A
// row whose band misses (fewer than k keys above it), or that has no hint yet, gets its scores from
// row_scores and the row-after-row selection: the result is always topk_indices'.

// Keys per score tile: a chunk's tile (24 rows x 256 int32, 24 KB) is compressed while in L1.
constexpr int64_t kFusedTileKeys = 512;

// One row of a chunk: visible keys [lo, lo + n), the k to keep, and what predicts its band: the
// mean of its scores and its query's norm.
struct FusedTopkRow {
  int64_t lo = 0, n = 0, k = 0;
  double mean = 0, q_norm = 0;
};
// How the rows went: selected from their band while fused, missed (rescored), or without a band
// (no hint yet, or fewer than 64 keys).
struct FusedTopkStats {
  int64_t fused_rows = 0, missed_rows = 0, rescored_rows = 0;
};
// tile(r0, r1, c0, cols, S, lds): rows [r0, r1)'s scores of keys [c0, c0 + cols) (c0 a multiple
// of kFusedTileKeys, cols <= kFusedTileKeys), row r's at S + (r - r0) * lds. row_scores(r, s):
// row r's scores of its n visible keys, from its lo.
template <class T>
using ScoreTileFn =
    std::function<void(int64_t r0, int64_t r1, int64_t c0, int64_t cols, T* S, int64_t lds)>;
template <class T>
using RowScoresFn = std::function<void(int64_t r, T* s)>;
// Every row's topk_indices (ascending, relative to its lo; row r's at idx + offs[r], offs holds
// n_rows + 1), in row order, the hint carried from row to row and out to the next chunk.
void fused_topk_rows(const FusedTopkRow* rows, int64_t n_rows, const ScoreTileFn<int32_t>& tile,
                     const RowScoresFn<int32_t>& row_scores, TopkHint& hint, int32_t* idx,
                     int64_t* offs, FusedTopkStats* stats = nullptr);
void fused_topk_rows(const FusedTopkRow* rows, int64_t n_rows, const ScoreTileFn<float>& tile,
                     const RowScoresFn<float>& row_scores, TopkHint& hint, int32_t* idx,
                     int64_t* offs, FusedTopkStats* stats = nullptr);

// Prefix sums of int8 keys [L, head_dim] (exact in int32 up to kMaxPrefixKeys keys): the mean
// INT8 score of a query over any key range in head_dim multiply-adds.
class KeyPrefixSums {
 public:
  static constexpr int64_t kMaxPrefixKeys = (int64_t{1} << 31) / 128 - 1;
  KeyPrefixSums(const int8_t* k8, int64_t ldk, int64_t L, int64_t head_dim);
  int64_t keys() const { return L_; }
  // mean over j in [lo, hi) of q8·k8_j (0 <= lo < hi <= keys())
  double mean_score(const int8_t* q8, int64_t lo, int64_t hi) const;

 private:
  int64_t L_, hd_;
  std::vector<int32_t> sums_;  // [(L + 1), head_dim]
};

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
// key are scores + r * lds, or with scores_by_pair one per kept key, aligned with idx (C/G-Sparse
// reuses its estimate). Same result as attend_selected per row up to float rounding.
void attend_selected_rows(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv,
                          int64_t head_dim, const int32_t* idx, const int64_t* offs, int64_t rows,
                          float scale, const float* scores, int64_t lds, float* out, int64_t ldo,
                          bool scores_by_pair = false);

// y[r, c] = saturate(round_half_even(x[r, c] / scale)) to [-127, 127] for rows of `cols` values
// (x row stride ldx, y row stride ldy): a static-scale INT8 quantizer as an NPU graph applies
// it (symmetric, no -128). scale > 0.
void quantize_rows_s8(const float* x, int64_t rows, int64_t cols, int64_t ldx, float scale,
                      int8_t* y, int64_t ldy);

// max |x| over rows of `cols` values (row stride ld).
float absmax_rows(const float* x, int64_t rows, int64_t cols, int64_t ld);

}  // namespace socllm::kernels
