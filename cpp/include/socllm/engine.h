// Engine layer: runs a Model on token sequences under a Plan (plan.h): fp32, or the NPU and
// baseline quantization schemes on prepared linears, whole or in chunks on static graphs.
#pragma once

#include <cstdint>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "socllm/calibration.h"
#include "socllm/core.h"
#include "socllm/linear_scheme.h"
#include "socllm/model.h"
#include "socllm/plan.h"
#include "socllm/static_graph.h"

namespace socllm {

// Per-sequence key/value cache: for each layer K and V of shape [capacity, kv_dim].
class KVCache {
 public:
  KVCache(const ModelConfig& config, int64_t capacity);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  void clear() { length_ = 0; }
  float* k(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }
  float* v(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }
  int64_t bytes() const;

 private:
  friend class Engine;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  int64_t n_layers_ = 0;
  int64_t kv_dim_ = 0;
  std::vector<std::vector<float>> k_, v_;
};

// The four linears of every block prepared for one linear scheme (quantized, packed,
// smoothed, static scales fixed): what the graphs of a plan hold.
struct PreparedLinears {
  std::vector<std::array<std::unique_ptr<quant::PreparedLinear>, kNumLinearSites>> layers;
  const quant::PreparedLinear& at(int64_t layer, LinearSite s) const {
    return *layers[static_cast<size_t>(layer)][static_cast<size_t>(s)];
  }
  int64_t weight_bytes() const;
};

// One linear subgraph built for a fixed row count, runnable on its own (tests, notebooks):
// shape and scales are those of the engine's graphs for the same plan.
struct LinearGraph {
  npu::StaticGraph graph;
  std::shared_ptr<const PreparedLinears> owner;
  const quant::PreparedLinear* linear = nullptr;
  const float* fp32_weights = nullptr;  // fp32 plans run the model's weights directly
  const float* fp32_bias = nullptr;
  // y [rows, out] for x [rows, in]; ShapeError on any other shape.
  TensorF32 run(const float* x, int64_t rows, int64_t cols) const;
};

class Engine {
 public:
  explicit Engine(std::shared_ptr<const Model> model);
  const Model& model() const { return *model_; }
  std::shared_ptr<const Model> model_ptr() const { return model_; }

  // A cache for up to `capacity` tokens (<= context_length; 0 means context_length).
  KVCache new_cache(int64_t capacity = 0) const;

  // Runs several independent sequences in one pass (linears batched over all rows),
  // appending each to its cache. Returns final-normed hidden states [sum T_i, d_model].
  TensorF32 forward_hidden(const std::vector<KVCache*>& caches,
                           const std::vector<std::span<const int32_t>>& seqs,
                           const Plan& plan) const;
  // logits [rows, vocab] for hidden states h [rows, d_model].
  TensorF32 logits_from_hidden(const float* h, int64_t rows) const;

  // Incremental step on one cache: logits for every new position [T, V], or the last [1, V].
  TensorF32 step(KVCache& cache, std::span<const int32_t> tokens, bool all_positions,
                 const Plan& plan) const;
  // Fresh context per sequence; logits for all positions, one [T_i, V] per sequence.
  std::vector<TensorF32> logits(const std::vector<std::vector<int32_t>>& seqs,
                                const Plan& plan) const;
  // For each sequence x: log p(x_t | x_<t) for t = 1 .. T-1 (T-1 values), computed block
  // by block so the [T, V] logits never exist at once.
  std::vector<std::vector<float>> token_logprobs(const std::vector<std::vector<int32_t>>& seqs,
                                                 const Plan& plan) const;
  // Greedy decoding: returns only the new tokens; stops after a token in stop_ids.
  std::vector<int32_t> generate_greedy(std::span<const int32_t> prompt, int64_t max_new_tokens,
                                       const std::vector<int32_t>& stop_ids,
                                       const Plan& plan) const;

  // Calibration statistics for plans with static scales / smoothing (ShapeError if they are
  // from a model with other shapes). Replacing them drops prepared linears and graphs.
  void set_calibration(std::shared_ptr<const Calibration> calib);
  std::shared_ptr<const Calibration> calibration() const;
  // Runs each sequence in fp32 from a fresh context and folds every linear input into `into`.
  void observe_activations(const std::vector<std::vector<int32_t>>& seqs, Calibration& into) const;

  // The linears prepared for `plan` (cached per linear scheme and calibration); null for fp32.
  // InvalidArgument if the plan needs calibration and none is set.
  std::shared_ptr<const PreparedLinears> prepare(const Plan& plan) const;
  LinearGraph linear_graph(const Plan& plan, int64_t layer, LinearSite site, int64_t rows) const;

  // Static graphs built by chunked prefill so far (chunk-sharing cache, seed 001 §3.2).
  npu::GraphCacheStats graph_stats() const { return graphs_.stats(); }
  std::vector<npu::GraphBuildEvent> graph_events() const { return graphs_.events(); }
  void clear_graphs() const { graphs_.clear(); }

 private:
  struct Batch;
  void check_tokens(std::span<const int32_t> tokens, const char* fn) const;
  // x[t, :] = embedding of tokens[t] (rows of d_model floats).
  void embed_rows(std::span<const int32_t> tokens, float* x) const;
  // All decoder blocks on x [batch.N, d_model] in place; chunk_rows > 0 runs them as the
  // static graphs of a chunk of that many rows at `chunk_index`.
  void run_blocks(Batch& batch, float* x, const Plan& plan, const PreparedLinears* prep,
                  int64_t chunk_index, Calibration* observe) const;
  TensorF32 forward_chunked(const std::vector<KVCache*>& caches,
                            const std::vector<std::span<const int32_t>>& seqs, const Plan& plan,
                            const PreparedLinears* prep) const;
  npu::StaticGraph describe_graph(const Plan& plan, const PreparedLinears* prep,
                                  npu::SubgraphKind kind, int64_t layer, int64_t rows,
                                  int64_t chunk_index) const;
  std::shared_ptr<const Model> model_;
  std::vector<float> inv_freq_;
  mutable std::mutex mu_;
  std::shared_ptr<const Calibration> calib_;
  mutable std::map<std::string, std::shared_ptr<const PreparedLinears>> prepared_;
  mutable npu::GraphCache graphs_{true};
};

}  // namespace socllm
