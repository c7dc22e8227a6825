#include "socllm/static_graph.h"

#include "socllm/core.h"

namespace socllm::npu {

const char* subgraph_kind_name(SubgraphKind k) {
  constexpr const char* kNames[] = {"attn_in", "attention", "o_proj", "mlp_in", "mlp_act", "down"};
  return kNames[static_cast<int>(k)];
}

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

StaticGraph describe_subgraph(const ModelConfig& c, SubgraphKind kind, int64_t layer, int64_t rows,
                              int64_t chunk_index, double weight_bytes_per_param,
                              int64_t activation_bytes_per_value) {
  if (rows <= 0) throw InvalidArgument("[StaticGraph] rows must be > 0, got " + std::to_string(rows));
  if (layer < 0 || layer >= c.n_layers)
    throw InvalidArgument("[StaticGraph] layer " + std::to_string(layer) + " outside [0, " +
                          std::to_string(c.n_layers) + ")");
  const int64_t d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), dff = c.d_ff;
  const int64_t qkv_w = qd + 2 * kvd;
  StaticGraph g;
  g.key = {kind, layer, rows, chunk_index};
  int64_t params = 0, norm = 0, values = 0;
  switch (kind) {
    case SubgraphKind::AttnIn:
      g.in_cols = d, g.out_cols = qkv_w, params = d * qkv_w, norm = d;
      values = rows * (d + qkv_w);
      break;
    case SubgraphKind::Attention: {
      const int64_t L = (std::max<int64_t>(chunk_index, 0) + 1) * rows;  // keys seen by the chunk
      g.in_cols = qkv_w, g.out_cols = qd;
      values = rows * (qkv_w + qd) + 2 * L * kvd + c.n_heads * rows * L;
      break;
    }
    case SubgraphKind::OProj:
      g.in_cols = qd, g.out_cols = d, params = qd * d, values = rows * (qd + d);
      break;
    case SubgraphKind::MlpIn:
      g.in_cols = d, g.out_cols = 2 * dff, params = d * 2 * dff, norm = d;
      values = rows * (d + 2 * dff);
      break;
    case SubgraphKind::MlpAct:
      g.in_cols = 2 * dff, g.out_cols = dff, values = rows * 3 * dff;
      break;
    case SubgraphKind::Down:
      g.in_cols = dff, g.out_cols = d, params = dff * d, values = rows * (dff + d);
      break;
  }
  g.weight_bytes = static_cast<int64_t>(static_cast<double>(params) * weight_bytes_per_param) +
                   norm * static_cast<int64_t>(sizeof(float));
  g.activation_bytes = values * activation_bytes_per_value;
  return g;
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

GraphCacheStats chunk_graph_census(const ModelConfig& c, int64_t prompt_len, int64_t chunk_len,
                                   bool sharing, double weight_bytes_per_param,
                                   int64_t activation_bytes_per_value) {
  if (prompt_len <= 0 || chunk_len <= 0)
    throw InvalidArgument("[chunk_graph_census] prompt_len and chunk_len must be > 0, got " +
                          std::to_string(prompt_len) + ", " + std::to_string(chunk_len));
  GraphCache cache(sharing);
  const int64_t chunks = (prompt_len + chunk_len - 1) / chunk_len;
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int k = 0; k < kSubgraphsPerLayer; ++k)
        cache.acquire(describe_subgraph(c, static_cast<SubgraphKind>(k), l, chunk_len, ch,
                                        weight_bytes_per_param, activation_bytes_per_value));
  return cache.stats();
}

}  // namespace socllm::npu
