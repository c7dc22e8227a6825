// Sim layer: HeteroLLM's engines (seed 002 §5) as plans. Each engine is a plan preset (plan.h:
// gpu-only, npu-padding, npu-pipe, npu-online-prepare, hetero-layer, hetero-tensor): W4A16
// linears on the NPU (the GPU for gpu-only), every other op class on the GPU in FP16, the
// linears cut by the preset's partition on the 'heterollm' characterization with fast
// synchronization. This file keeps the engine-named entry point (`--engine`, simulate_hetero)
// and what the engines' studies vary beyond a plan: the solver deciding on predicted times (the
// profiler's prediction mode), partitions solved for fast synchronization but timed with the
// conventional one (§5.4's ablation), and a co-running app the solver may or may not know of.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "model/model.h"
#include "sched/partition.h"
#include "sim/simulate.h"

namespace socllm {

struct HeteroOptions {
  std::string engine = "hetero-tensor";        // a HeteroLLM preset (Plan::hetero_engines())
  bool fast_sync = true;                       // timed with fast synchronization (§4.2), or not
  std::string characterization = "heterollm";  // the device profile's (soc.h)
  std::string policy = "first-ready";
  // "prefill" of prompt_len tokens, or "decode": one token on a KV cache of prompt_len.
  std::string phase = "prefill";
  std::string plan = "w4a16";  // the linear scheme (seed 002 §5.1: W4A16, any group size)
  // false: partitions chosen for fast synchronization, the engine's design, whatever the graph
  // is timed with (§5.4's ablation swaps only the mechanism); true: re-solved for the
  // synchronization it is timed with (an engine that knows its sync is slow).
  bool solve_for_timing_sync = false;
  // A co-running app (the profile's /scenarios): the graph is timed sharing the SoC with it; the
  // solver decides as the profile alone says unless solve_for_co_runner (re-partitioning for
  // what the processors have left, beyond the paper).
  std::string co_runner;
  bool solve_for_co_runner = false;
};

// The plan an engine runs, on `device`, with its partitions written in for the request's rows
// (solved with `costs` when given: the profiler's prediction mode; else as the options say).
Plan hetero_plan(const ModelConfig& c, std::shared_ptr<const soc::DeviceProfile> device,
                 int64_t prompt_len, const HeteroOptions& o,
                 const sched::PartitionCosts* costs = nullptr);

// Builds and times the engine's request (simulate_request with the plan above). summary() adds
// engine, partitions (per linear shape: the cut and its predicted µs), predicted_partitions,
// solve_for_timing_sync, co_runner, solve_for_co_runner.
PrefillTimeline simulate_hetero(const ModelConfig& c, const soc::DeviceProfile& device,
                                int64_t prompt_len, const HeteroOptions& o,
                                const sched::PartitionCosts* costs = nullptr);

}  // namespace socllm
