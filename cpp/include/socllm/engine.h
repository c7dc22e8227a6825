// Engine layer: runs a Model on token sequences under a Plan.
// This engine executes the fp32 plan; later plans (INT8 NPU emulation,
// shadow outliers...) plug in here and share the same forward pass.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "socllm/core.h"
#include "socllm/model.h"

namespace socllm {

// How each operator class is executed. JSON form: {"name": "fp32"}.
struct Plan {
  std::string name = "fp32";

  static std::vector<std::string> known();
  static std::string known_list();  // "(known plans: a, b)", for error messages
  static std::string describe(const std::string& name);  // one line, names the source
  // InvalidArgument naming the unknown plan and listing the known ones.
  static Plan from_name(const std::string& name);
  static Plan from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

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

 private:
  void check_tokens(std::span<const int32_t> tokens, const char* fn) const;
  std::shared_ptr<const Model> model_;
  std::vector<float> inv_freq_;
};

}  // namespace socllm
