// Quant layer: one layer's prefill attention under an AttentionScheme (attention_scheme.h), on
// the engine's row layout: T new query rows (absolute positions past .. past+T-1) against the
// L = past + T keys and values so far (a chunk's queries against all keys so far).
#pragma once

#include <cstdint>
#include <vector>

#include "socllm/attention_scheme.h"

namespace socllm::quant {

// What a scheme fixes for one layer from calibration.
struct AttentionLayerConsts {
  std::vector<double> head_ratio;         // [n_heads] keep ratio of each query head
  std::vector<float> bucket_q, bucket_k;  // [n_heads * buckets] λQ, λK of each head's buckets
  int64_t buckets = 0;
  float static_q = 0, static_k = 0, static_v = 0;  // npu-int8 per-tensor scales
};

struct AttentionShape {
  int64_t T = 0, past = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  // > 0: sliding-window layer (Gemma 3's local layers), the query at absolute position p sees
  // keys max(0, p + 1 - window) .. p only, as kernels::attention_causal; every scheme selects,
  // keeps ratios of and normalizes over those keys. 0: all keys up to p.
  int64_t window = 0;
};

// What a sparse prefill selected (for studies and tests).
struct AttentionTrace {
  std::vector<int32_t> bucket;             // [n_heads] bucket chosen (shadow-attn), else -1
  std::vector<float> input_q, input_k;     // [n_heads] the input's own λQ, λK (shadow-attn)
  std::vector<std::vector<int32_t>> keys;  // [n_heads * T] selected keys of each row, ascending
  std::vector<int64_t> rescored;           // [n_heads] keys rescored in fp32, all rows (certified)
  bool record_keys = true;  // false: only bucket and input scales (what a timed graph needs)
};

// Per-layer constants of a scheme for uniform ratios and no calibration (fp32, sparse and
// block-sparse with ratios=uniform, shadow-attn with scales=dynamic and uniform ratios).
AttentionLayerConsts uniform_layer_consts(const AttentionScheme& s, int64_t n_heads);

// out [T, n_heads*head_dim] (ldo) = attention of q [T, n_heads*head_dim] (ldq) over
// k, v [past+T, n_kv_heads*head_dim] (ldkv). ShapeError if `c` does not fit the shape.
void prefill_attention(const AttentionScheme& s, const AttentionLayerConsts& c, const float* q,
                       int64_t ldq, const float* k, const float* v, int64_t ldkv,
                       const AttentionShape& sh, float* out, int64_t ldo,
                       AttentionTrace* trace = nullptr);

}  // namespace socllm::quant
