// Engine layer: HeteroLLM's engines (seed 002) on the one task graph. A W4A16 model whose
// non-linear ops (norms, RoPE, attention, SiLU, residuals, LM head) run on the GPU in FP16 and
// whose linears go where the engine puts them, as partitions (partition.h) chosen per linear
// shape by the solver; the block description's graph (block.h) is built for the prompt (prefill)
// or one decoding step, and each linear task is replaced by one task per part (the graph
// transform), whose GPU-NPU edges pay the conventional or the fast synchronization
// (soc::SyncOptions) when the simulator times it.
//
// Engines (seed 002 §5): gpu-only (PPL-OpenCL), npu-padding / npu-pipe / npu-online-prepare
// (linears on the NPU only: padded to the next static graph, the multi-sequence-length cover,
// or a graph prepared for the exact length at run time, §5.2.2), hetero-layer (each linear
// wholly on the faster of GPU and NPU) and hetero-tensor (the solver's partition).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "socllm/model.h"
#include "socllm/partition.h"
#include "socllm/simulate.h"

namespace socllm {

struct HeteroEngineInfo {
  const char* name;
  sched::PartitionSpace space;  // what the solver may choose for each linear
  const char* description;
};
std::span<const HeteroEngineInfo> hetero_engines();
// InvalidArgument naming the value and listing the engines.
const HeteroEngineInfo& hetero_engine(const std::string& name);

struct HeteroOptions {
  std::string engine = "hetero-tensor";
  bool fast_sync = true;                       // seed 002 §4.2, or conventional synchronization
  std::string characterization = "heterollm";  // the device profile's (soc.h)
  std::string policy = "first-ready";
  // "prefill" of prompt_len tokens, or "decode": one token on a KV cache of prompt_len.
  std::string phase = "prefill";
  std::string plan = "w4a16";  // the linear scheme (seed 002 §5.1: W4A16); placement is ours
  // false: partitions chosen for fast synchronization, the engine's design, whatever the graph
  // is timed with (seed 002 §5.4's ablation swaps only the mechanism); true: re-solved for the
  // synchronization it is timed with (an engine that knows its sync is slow).
  bool solve_for_timing_sync = false;
  // A co-running app (the profile's /scenarios): the graph is timed sharing the SoC with it; the
  // solver decides as the profile alone says unless solve_for_co_runner (re-partitioning for
  // what the processors have left, beyond the paper).
  std::string co_runner;
  bool solve_for_co_runner = false;
};

// The plan a HeteroLLM engine runs: the linear scheme of `plan`, the linears on the NPU (the GPU
// for gpu-only), every other op class on the GPU in FP16.
Plan hetero_plan(const HeteroOptions& o);

// The graph of a prefill or decode step with each linear cut as `costs` (the profiler: real
// times of the cost model, or a prediction) makes the engine's solver choose. meta records the
// engine, phase, characterization, fast_sync and per linear shape the chosen partition
// ("partitions": [{site, m, k, n, partition, predicted_us}]).
sched::TaskGraph hetero_task_graph(const ModelConfig& c, const soc::DeviceProfile& device,
                                   int64_t prompt_len, const HeteroOptions& o,
                                   const sched::PartitionCosts* costs = nullptr);

// The cost model an engine's graph is timed with: the device with the graph's characterization
// and its synchronization (fast or conventional; in decode the GPU queue stays filled, §4.2).
soc::CostModel hetero_cost_model(const soc::DeviceProfile& device, const HeteroOptions& o);

// Builds and times it (simulate_graph honours the graph's meta).
PrefillTimeline simulate_hetero(const ModelConfig& c, const soc::DeviceProfile& device,
                                int64_t prompt_len, const HeteroOptions& o,
                                const sched::PartitionCosts* costs = nullptr);

// Graph preparation at run time for one prompt length (Online-prepare, seed 002 §5.2.2):
// linear in the length through the two Llama-8B points the seed gives, scaled by the model's
// linear weights.
double online_prepare_ms(const ModelConfig& c, const soc::DeviceProfile& device,
                         int64_t prompt_len);

}  // namespace socllm
