// Scheduling layer: the task DAG of a request (DESIGN.md, "one task graph, two
// interpretations"). The engine appends the subgraphs it executes; the simulator (simulator.h)
// replays the same DAG on a device profile. A task is one llm.npu subgraph (seed 001 §3.2/§3.4)
// or one shadow-outlier CPU part, placed on one processor, with the operators it computes
// described by shape only (soc::OpDesc): the DAG carries no numbers of the model.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "socllm/soc.h"

namespace socllm::sched {

// What a task is, for display and for policies that care (llm.npu's Eq. 6 only looks at the
// processor). Subgraph kinds follow npu::SubgraphKind; the rest are extra tasks.
enum class TaskKind : int {
  AttnIn = 0, Attention, OProj, MlpIn, MlpAct, Down,  // the six subgraphs of a decoder layer
  Shadow,      // CPU part of a shadow-outlier linear (seed 001 §3.3, Eq. 1)
  GraphBuild,  // building / optimizing a static graph at run time (seed 001 §2.2)
  Embed,       // token embedding lookup
  LmHead,      // final norm + LM head of the last chunk
  Other
};
constexpr int kNumTaskKinds = 10;
const char* task_kind_name(TaskKind k);
TaskKind task_kind_from_name(const std::string& s);

struct Task {
  int64_t id = -1;              // index in the graph
  std::string name;             // e.g. "c1.L3.attn_in"
  TaskKind kind = TaskKind::Other;
  soc::Processor processor = soc::Processor::Cpu;
  std::vector<soc::OpDesc> ops; // what it computes, in order
  int64_t chunk = -1;           // prompt chunk (-1: not chunk-bound)
  int64_t layer = -1;           // decoder layer (-1: none)
  std::vector<int64_t> deps;    // ids of tasks that must finish first
  // Bytes the task keeps alive while it runs (activations, fetched weights), for peak memory.
  int64_t working_bytes = 0;
};

class TaskGraph {
 public:
  // Appends a task (its id is assigned here) and returns the id.
  int64_t add(Task t);
  const std::vector<Task>& tasks() const { return tasks_; }
  const Task& at(int64_t id) const;
  int64_t size() const { return static_cast<int64_t>(tasks_.size()); }
  bool empty() const { return tasks_.empty(); }
  // InvalidArgument naming the task if a dependency is out of range, on itself, repeated, or
  // part of a cycle (the message lists one cycle).
  void validate() const;
  // A topological order (Kahn's algorithm, lowest id first among ready tasks); validates.
  std::vector<int64_t> topological_order() const;
  // successors()[i] = tasks that depend on i.
  std::vector<std::vector<int64_t>> successors() const;

  nlohmann::json to_json() const;
  // InvalidArgument / FormatError on malformed JSON, unknown kinds or processors; validates.
  static TaskGraph from_json(const nlohmann::json& j);

 private:
  std::vector<Task> tasks_;
};

// Shapes a prefill graph needs, from a model config (real or shape-only).
struct ShapeConfig {
  std::string name;
  int64_t d_model = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, d_ff = 0;
  int64_t vocab_size = 0;
  bool gated_mlp = true;  // SwiGLU/GeGLU (gate + up); false ("plain"): one up projection (Phi-2)
  int64_t qkv_out() const { return (n_heads + 2 * n_kv_heads) * head_dim; }
  int64_t mlp_in_out() const { return gated_mlp ? 2 * d_ff : d_ff; }
  // From a socllm model-config JSON (python/socllm/configs/*.json or a loaded model's config);
  // InvalidArgument naming the missing or non-positive key.
  static ShapeConfig from_json(const nlohmann::json& j);
};

// How a plan runs the six subgraphs of a decoder layer on the SoC.
struct Placement {
  std::array<soc::Processor, 6> processor{};  // per subgraph kind (AttnIn .. Down)
  soc::DType linear_dtype = soc::DType::Int8; // the linears' compute type on their processor
  soc::DType float_dtype = soc::DType::Fp16;  // norms, activation, attention
  // > 0: per-group quantized linears (groups of this many input channels), which an NPU runs
  // as one sub-matmul per group plus a float reduction (seed 001 §2.3, Fig. 3b/4).
  int64_t linear_group_size = 0;
  static Placement llm_npu();      // linears, norms, SiLU on the NPU; attention on the CPU
  static Placement all_on(soc::Processor p, soc::DType linear, soc::DType flt);
};

// CPU work of one shadow-outlier linear input in one chunk.
struct ShadowLoad {
  bool pruned = false;
  double outlier_channels = 0;  // channels gathered into the dense tensor
  double cold_fetch_bytes = 0;  // float weight columns read from flash
};

// Builds the prefill DAG chunk by chunk with llm.npu's dependencies (seed 001 §3.4):
// within a chunk each subgraph waits for the previous one (Eq. 3); a chunk's attention waits
// for the same layer's attention of the previous chunk, whose KV it reads (Eq. 2).
class PrefillGraphBuilder {
 public:
  PrefillGraphBuilder(ShapeConfig shapes, Placement placement);
  // Static graphs built at run time before the first chunk (naive NPU execution builds and
  // optimizes one graph per prompt shape, seed 001 §2.2): one NPU task per layer.
  void add_graph_builds(int64_t rows, double build_ms, double optimize_ms);
  // One chunk of `rows` rows (a static graph's padded length) at chunk index `chunk`, whose
  // attention covers `kv_len` positions. shadow: empty, or n_layers * 4 loads (per layer: the
  // inputs of attn_in, o_proj, mlp_in, down).
  void add_chunk(int64_t chunk, int64_t rows, int64_t kv_len,
                 const std::vector<ShadowLoad>& shadow = {});
  void add_lm_head(int64_t rows);
  const TaskGraph& graph() const { return graph_; }
  TaskGraph take() { return std::move(graph_); }

 private:
  ShapeConfig s_;
  Placement p_;
  TaskGraph graph_;
  std::vector<int64_t> prev_attention_;  // per layer: attention task of the previous chunk
  std::vector<int64_t> builds_;          // per layer: graph-build task, if any
};

// llm.npu prefill of a prompt on shape-only configs: chunks of chunk_len (the last one padded
// to chunk_len, as static graphs require), expected shadow loads per linear input.
TaskGraph build_prefill_graph(const ShapeConfig& shapes, const Placement& placement,
                              int64_t prompt_len, int64_t chunk_len,
                              const std::vector<ShadowLoad>& shadow = {});

}  // namespace socllm::sched
