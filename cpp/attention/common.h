// Attention layer, internal: what the scheme files share (row blocks, head gathers, the sparse
// kinds' keep-ratio options and their timing chain). Not a public header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_scheme.h"
#include "kernels/aligned_vector.h"

namespace socllm::attention::detail {

// Query rows per parallel work item: one estimation GEMM of [rows, keys] per item, the score
// block in cache.
constexpr int64_t kRowBlock = 64;
// The key-selecting kinds' row blocks: a block's rows share the gathered attention's key tiles
// (attend_selected_rows), so more rows reuse each tile; 128 measured fastest on Zen 4 at 4096
// tokens (64: 6% slower, 256: 13% slower, its score block no longer in L2; measured before the
// estimate ran in kEstimateRowChunk chunks).
constexpr int64_t kSelectRowBlock = 128;
// Rows of a block whose estimate is computed, then ranked, together: their scores (24 x 4,096,
// 384 KB) are still in L2 when each row's top-k reads them, and each chunk multiplies only the
// keys its rows see. Measured on Zen 4 at 4,096 tokens: shadow-attn's estimate + top-k 87 ms with
// the whole 128-row block at once, 81 ms in chunks of 24 (a multiple of the micro-kernels' 6-row
// tiles). C/G-Sparse's fp32 estimate runs in the same chunks on the dense kernel's micro-kernel
// (OpenBLAS's sgemm on such chunks had made it 0.84x dense, not 0.98x).
constexpr int64_t kEstimateRowChunk = 24;

// A thread's scratch of at least n elements, kept across the work items it runs: a fresh
// vector per item was a new mmap of the score block, zeroed and page-faulted each time. The
// contents are whatever the last item left.
template <class T>
T* thread_scratch(std::vector<T>& buf, int64_t n) {
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// Copies rows of one head out of the interleaved [rows, heads*head_dim] layout.
void gather_head(const float* x, int64_t ld, int64_t rows, int64_t col0, int64_t head_dim,
                 float* dst);

// The key-selecting kinds' K and V rows of every KV head. The gathered attention loads whole
// rows by index; the caller's interleaved rows (stride n_kv_heads * head_dim, starting wherever
// its array began) split vector loads across cache lines, which made it 1.45x slower on Zen 4.
// With at least kPackKvMinRows query rows each KV head's rows are copied once into contiguous,
// cache-line aligned [L, head_dim] storage (the copy reads L rows, the attention gathers them
// about rows x keep x heads-per-group times); with fewer (decode) the caller's rows are used.
constexpr int64_t kPackKvMinRows = 16;
class KvHeadRows {
 public:
  KvHeadRows(const float* k, const float* v, int64_t ldkv, int64_t L, const Shape& sh);
  const float* k(int64_t g) const { return packed_ ? k_.data() + g * L_ * hd_ : k_src_ + g * hd_; }
  const float* v(int64_t g) const { return packed_ ? v_.data() + g * L_ * hd_ : v_src_ + g * hd_; }
  int64_t ld() const { return ld_; }

 private:
  const float *k_src_, *v_src_;
  int64_t L_, hd_, ld_;
  bool packed_;
  kernels::AlignedVector<float> k_, v_;
};

// ShapeError naming the shape unless it is one attention can run.
void check_shape(const Shape& sh, const char* who);

// The options of every key-selecting kind: keep, min_keys, ratios, clamp_quantile.
std::vector<OptionSpec> keep_ratio_options(const char* default_ratios);
void validate_keep_ratio_options(const AttentionScheme& s);
bool calibrated_ratios(const AttentionScheme& s);
// Per layer the head ratios: Eq. 3 from the calibration's head and layer importance
// (ratios=calibrated), else keep for every head.
std::vector<LayerConsts> keep_ratio_consts(const AttentionScheme& s, const Calibration* calib,
                                           const ModelConfig& c, const std::string& who);
// ShapeError unless `consts` holds one ratio per head.
void check_head_ratios(const LayerConsts& consts, int64_t n_heads, const char* who);

// One op of a head-wise attention task.
soc::OpDesc attention_op(soc::OpKind kind, const char* name, soc::DType dtype, int64_t heads,
                         int64_t head_dim, int64_t elements, const std::string& core);

// The keep ratio of head h in a task shape (the plan's keep when none is given).
double head_ratio(const TaskShape& shape, const AttentionScheme& s, int64_t h);

// The per-head chain of the CPU/GPU-run kinds (sparse, block-sparse): per head an estimation
// task (its ops), a top-k over `scored` scores and the attention over the head's kept pairs,
// each on the attention's processor and waiting for the previous one (one core, no overlap).
struct HeadChainStep {
  std::vector<soc::OpDesc> estimate;  // the estimation ops
  int64_t scored = 0;                 // scores the top-k ranks
  int64_t kept = 0;                   // (row, key) pairs attended
};
std::vector<int64_t> head_chain_tasks(const TaskShape& shape, TaskSink& sink,
                                      const std::vector<int64_t>& deps,
                                      const std::vector<HeadChainStep>& heads);

// Records what a key-selecting kind chose for row block rows [r0, r0 + n) of head h: its
// keys (if asked for) and the pairs it kept.
void trace_keys(Trace* trace, int64_t h, int64_t T, int64_t row, const int32_t* idx, int64_t n);
void trace_begin(Trace* trace, int64_t n_heads, int64_t T);

}  // namespace socllm::attention::detail
