// NPU layer: static graphs and llm.npu's chunk-sharing graph cache (seed 001 §2.2, §3.2).
//
// A mobile NPU runs graphs whose shapes and quantization constants are fixed when the graph
// is built, and building costs time (seed 001 §2.2; the simulator times the build events
// recorded here). A decoder layer of one prefill chunk is cut into six subgraphs:
//   attn_in   RMSNorm + QKV linear              static: depends on the chunk length only
//   attention RoPE + causal attention over KV   dynamic: depends on the chunk's position
//   o_proj    O linear + residual               static
//   mlp_in    RMSNorm + gate/up linear          static
//   mlp_act   SiLU(gate) * up                   static
//   down      down linear + residual            static
// The ops each subgraph groups, and its shapes and bytes, come from the block description
// (block.h: describe_subgraph). With sharing, static subgraphs are built once per (layer,
// chunk length) and reused by every chunk; the attention subgraph is built per chunk index (it
// holds no weights, only buffers).
// For a 24-layer model one chunk needs 24 x 6 = 144 subgraphs, of which 120 are shareable:
// seed 001 §3.2's "120 out of 144" for Qwen1.5-1.8B.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "model/decoder_block.h"

namespace socllm::npu {

// The subgraphs of a layer are facts of the block (model/decoder_block.h).
using socllm::kSubgraphsPerLayer;
using socllm::subgraph_kind_name;
using socllm::SubgraphKind;
bool is_shareable(SubgraphKind k);  // everything but attention

struct GraphKey {
  SubgraphKind kind = SubgraphKind::AttnIn;
  int64_t layer = 0;
  int64_t rows = 0;          // chunk length the graph is built for
  int64_t chunk_index = -1;  // -1 for a shared graph; the chunk's index for per-chunk graphs
  auto operator<=>(const GraphKey&) const = default;
  std::string describe() const;
};

// What a built graph fixes: its input shape and its constants (weights bytes, static scales).
struct StaticGraph {
  GraphKey key;
  int64_t in_cols = 0;
  int64_t out_cols = 0;
  int64_t weight_bytes = 0;      // weights the graph holds (shared graphs hold them once)
  int64_t activation_bytes = 0;  // input/output/intermediate buffers of one execution
  std::vector<float> scales;     // static activation scales baked into the graph

  // ShapeError unless the input is exactly [key.rows, in_cols]: a static graph never runs on
  // another shape.
  void check_input(int64_t rows, int64_t cols) const;
};

struct GraphBuildEvent {
  GraphKey key;
  int64_t weight_bytes = 0;
  int64_t activation_bytes = 0;
};

struct GraphCacheStats {
  int64_t requests = 0;          // graph executions asked for
  int64_t built = 0;             // graphs built (each a build event)
  int64_t reused = 0;            // requests served by an already built graph
  int64_t built_shared = 0;      // of `built`, static (chunk-length-only) graphs
  int64_t built_per_chunk = 0;   // of `built`, attention graphs
  int64_t weight_bytes = 0;      // held by all built graphs
  int64_t activation_bytes = 0;  // buffers of all built graphs
};

class GraphCache {
 public:
  // sharing = false models the naive per-chunk graphs: every chunk builds its own copy of
  // every subgraph (static ones included).
  explicit GraphCache(bool sharing = true) : sharing_(sharing) {}
  bool sharing() const { return sharing_; }
  // The graph for `g.key` (shared graphs under key.chunk_index = -1), building it (and
  // recording a build event) on first use.
  const StaticGraph& acquire(StaticGraph g);
  GraphCacheStats stats() const;
  std::vector<GraphBuildEvent> events() const;
  void clear();

 private:
  bool sharing_;
  mutable std::mutex mu_;
  std::map<GraphKey, StaticGraph> graphs_;
  std::vector<GraphBuildEvent> events_;
  GraphCacheStats stats_;
};

}  // namespace socllm::npu
