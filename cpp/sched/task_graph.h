// Scheduling layer: the task DAG of a request (DESIGN.md, "one task graph, two
// interpretations"). The engine layer builds it from the block description (block.h), from a
// config alone or from what a prefill executed; the simulator (simulator.h) replays it on a
// device profile. A task is one llm.npu subgraph (seed 001 §3.2/§3.4), or the part of one placed
// on one processor, or one shadow-outlier CPU part, with the operators it computes described by
// shape only (soc::OpDesc): the DAG carries no numbers of the model.
//
// JSON (to_json / from_json, stable; docs/ARCHITECTURE.md):
//   {"format": "socllm-task-graph", "version": 1, "meta": {...request...},
//    "tasks": [{"id", "name", "kind", "processor", "chunk", "layer", "deps", "working_bytes",
//               "heads" (head-wise attention tasks only),
//               "ops": [{"op", "dtype", "name", "op_class", "m", "k", "n", "elements", "bytes",
//                        "groups", "weight_bytes", "activation_bytes", "fixed_us"}]}]}
// Zero-valued op fields are omitted.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "soc/soc.h"

namespace socllm::sched {

// What a task is, for display and for policies that care (llm.npu's Eq. 6 only looks at the
// processor). Subgraph kinds follow npu::SubgraphKind; the rest are extra tasks.
enum class TaskKind : int {
  AttnIn = 0,
  Attention,
  OProj,
  MlpIn,
  MlpAct,
  Down,        // the six subgraphs of a decoder layer
  Shadow,      // CPU part of a shadow-outlier linear (seed 001 §3.3, Eq. 1)
  GraphBuild,  // building / optimizing a static graph at run time (seed 001 §2.2)
  Embed,       // token embedding lookup
  LmHead,      // final norm + LM head of the last chunk
  // Head-wise sparse attention (seed 000 §3.4, Eq. 4): per head (or fused launch of heads)
  Estimate,         // ζnpu: the Q·Kᵀ estimation of the heads in `heads` (one launch)
  TopK,             // ζtopk: top-k of one head's estimated scores
  SparseAttention,  // ζqkv: attention of one head over its selected keys
  // Cold start (seed 004 §3): a layer's weights read from flash, and unpacked to INT8 rows
  Load,
  Unpack,
  Other
};
constexpr int kNumTaskKinds = 15;
const char* task_kind_name(TaskKind k);
TaskKind task_kind_from_name(const std::string& s);

struct Task {
  int64_t id = -1;   // index in the graph
  std::string name;  // e.g. "c1.L3.attn_in"
  TaskKind kind = TaskKind::Other;
  soc::Processor processor = soc::Processor::Cpu;
  std::vector<soc::OpDesc> ops;  // what it computes, in order
  int64_t chunk = -1;            // prompt chunk (-1: not chunk-bound)
  int64_t layer = -1;            // decoder layer (-1: none)
  std::vector<int64_t> deps;     // ids of tasks that must finish first
  // Bytes the task keeps alive while it runs (activations, fetched weights), for peak memory.
  int64_t working_bytes = 0;
  // Query heads of a head-wise attention task (Estimate: the heads fused in its launch); empty
  // for every other task.
  std::vector<int64_t> heads;
};

class TaskGraph {
 public:
  // Appends a task (its id is assigned here) and returns the id.
  int64_t add(Task t);
  const std::vector<Task>& tasks() const { return tasks_; }
  const Task& at(int64_t id) const;
  // Makes `task` wait for `dep` (nothing if it already does); InvalidArgument on bad ids or
  // dep == task. Cycles are found by validate().
  void add_dep(int64_t task, int64_t dep);
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
  static constexpr int kJsonVersion = 1;

  // What the graph is of (config, plan, prompt and chunk length, resident bytes ...).
  nlohmann::json meta = nlohmann::json::object();

 private:
  std::vector<Task> tasks_;
};

}  // namespace socllm::sched
