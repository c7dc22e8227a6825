#include "block/kv_cache.h"

#include <unistd.h>

#include <string>

#include "core/core.h"

namespace socllm {

KVCache::KVCache(const ModelConfig& config, int64_t capacity)
    : capacity_(capacity), n_layers_(config.n_layers), kv_dim_(config.kv_dim()) {
  if (capacity <= 0)
    throw InvalidArgument("[KVCache] capacity must be > 0, got " + std::to_string(capacity));
  // Sized by a config read from a file: refused before allocating if it cannot fit in memory.
  const int64_t n_per_layer = checked_mul(capacity, kv_dim_, "[KVCache] capacity x kv_dim");
  const int64_t total_bytes = checked_mul(
      checked_mul(2 * config.n_layers, n_per_layer, "[KVCache] size"), sizeof(float), "[KVCache]");
  const int64_t ram = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  if (ram > 0 && total_bytes > ram)
    throw InvalidArgument("[KVCache] a cache of " + std::to_string(capacity) + " tokens needs " +
                          std::to_string(total_bytes) + " bytes, more than this machine's " +
                          std::to_string(ram) + " (ask for a smaller capacity)");
  const size_t n = static_cast<size_t>(n_per_layer);
  k_.assign(static_cast<size_t>(config.n_layers), std::vector<float>(n));
  v_.assign(static_cast<size_t>(config.n_layers), std::vector<float>(n));
}

KVCache::KVCache(KVCache&& o) noexcept
    : capacity_(o.capacity_),
      length_(o.length_),
      n_layers_(o.n_layers_),
      kv_dim_(o.kv_dim_),
      k_(std::move(o.k_)),
      v_(std::move(o.v_)) {}

KVCache& KVCache::operator=(KVCache&& o) noexcept {
  capacity_ = o.capacity_;
  length_ = o.length_;
  n_layers_ = o.n_layers_;
  kv_dim_ = o.kv_dim_;
  k_ = std::move(o.k_);
  v_ = std::move(o.v_);
  return *this;
}

void KVCache::clear() {
  bool expected = false;  // taken like a call takes it: no call can start in between
  if (!in_use_.compare_exchange_strong(expected, true))
    throw InvalidArgument("[KVCache.clear] the cache is in use by a running call");
  length_ = 0;
  in_use_ = false;
}

int64_t KVCache::bytes() const {
  return static_cast<int64_t>(2 * k_.size()) * capacity_ * kv_dim_ *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace socllm
