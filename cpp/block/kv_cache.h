// Block layer: the per-sequence key/value cache the attention op of every layer appends to.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace socllm {

// Per-sequence key/value cache: for each layer K and V of shape [capacity, kv_dim].
// A cache holds one sequence and serves one call at a time: a call that finds it in use by
// another thread throws InvalidArgument rather than wait (two threads appending to one sequence
// have no meaningful token order; sharing it corrupted the heap, issue 12). Different caches
// run in parallel threads on one Engine.
class KVCache {
 public:
  KVCache(const ModelConfig& config, int64_t capacity);
  KVCache(KVCache&& o) noexcept;
  KVCache& operator=(KVCache&& o) noexcept;
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  void clear();  // InvalidArgument while a call uses the cache
  float* k(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }
  float* v(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }
  int64_t bytes() const;

 private:
  friend class Engine;
  friend class KVCacheUse;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  int64_t n_layers_ = 0;
  int64_t kv_dim_ = 0;
  std::vector<std::vector<float>> k_, v_;
  std::atomic<bool> in_use_{false};
};

}  // namespace socllm
