#include "npu/static_graph.h"

#include "core/core.h"

namespace socllm::npu {

bool is_shareable(SubgraphKind k) { return k != SubgraphKind::Attention; }

std::string GraphKey::describe() const {
  return std::string(subgraph_kind_name(kind)) + "[layer " + std::to_string(layer) + ", rows " +
         std::to_string(rows) +
         (chunk_index < 0 ? ", shared]" : ", chunk " + std::to_string(chunk_index) + "]");
}

void StaticGraph::check_input(int64_t rows, int64_t cols) const {
  if (rows != key.rows || cols != in_cols)
    throw ShapeError("[StaticGraph] graph " + key.describe() + " was built for input [" +
                     std::to_string(key.rows) + ", " + std::to_string(in_cols) + "], got [" +
                     std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

const StaticGraph& GraphCache::acquire(StaticGraph g) {
  std::lock_guard lock(mu_);
  if (sharing_ && is_shareable(g.key.kind)) g.key.chunk_index = -1;
  ++stats_.requests;
  auto it = graphs_.find(g.key);
  if (it != graphs_.end()) {
    ++stats_.reused;
    return it->second;
  }
  ++stats_.built;
  ++(g.key.chunk_index < 0 ? stats_.built_shared : stats_.built_per_chunk);
  stats_.weight_bytes += g.weight_bytes;
  stats_.activation_bytes += g.activation_bytes;
  events_.push_back({g.key, g.weight_bytes, g.activation_bytes});
  return graphs_.emplace(g.key, std::move(g)).first->second;
}

GraphCacheStats GraphCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::vector<GraphBuildEvent> GraphCache::events() const {
  std::lock_guard lock(mu_);
  return events_;
}

void GraphCache::clear() {
  std::lock_guard lock(mu_);
  graphs_.clear();
  events_.clear();
  stats_ = {};
}

}  // namespace socllm::npu
