// Engine layer: a prefill timed on a modelled SoC in one call (DESIGN.md, "one task graph, two
// interpretations"): config + plan -> the block description's task graph (block.h) -> the
// discrete-event simulator (simulator.h) on a device profile -> summary numbers. The Python
// `socllm.simulate` and `Timeline` are views over this.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "socllm/block.h"
#include "socllm/head_pipeline.h"
#include "socllm/simulator.h"
#include "socllm/soc.h"

namespace socllm {

struct PrefillSimOptions {
  std::string policy = "npu-stall-first";  // a name or alias of sched::policies()
  // Build and optimize the NPU graphs at run time, as naive NPU execution must for every new
  // prompt length (seed 001 §2.2): the profile's whole-model times scaled by linear weights.
  bool runtime_graph_build = false;
  double shadow_channels = kDefaultShadowChannels;  // expected loads of shape-only configs
  int64_t optimal_max_tasks = 24;
  // Head-wise attention (plans whose attention is not fp32, seed 000): how the attention
  // expands (block.h) and the head pipeline's policy (head_pipeline.h: sequential, pipelined,
  // greedy = Algorithm 1, optimal).
  AttentionTimingOptions attention;
  std::string head_policy = "greedy";
  std::string co_runner;         // a co-running app of the profile's /scenarios ("": none)
  std::string characterization;  // of the device profile ("": its default cost model)
};

// A simulated prefill: the graph, its schedule, and summary() numbers.
struct PrefillTimeline {
  sched::TaskGraph graph;
  sched::Timeline timeline;
  // One entry per NPU-CPU head pipeline planned (apply_head_pipeline): chunk, layer, plan,
  // problem. Empty when the graph has none or was planned before (meta "head_policy").
  nlohmann::json head_plans = nlohmann::json::array();
  // graph meta (config, plan, prompt_len, chunk_len, resident_bytes) + policy, device,
  // prefill_ms, prefill_tokens_per_s, ttft_ms (the first token comes with the prefill's last
  // task, the LM head); for a decoding step (meta phase "decode") tpot_ms and
  // decode_tokens_per_s, energy_mj, graph_build_ms, peak_memory_bytes (resident + the peak of
  // running tasks' working bytes), tasks, busy_ms / bubble_rate per processor, scheduler
  // decisions and host µs per decision.
  nlohmann::json summary() const;
};

// Run-time (build, optimize) ms of a whole model's NPU graph on a device (see the option above).
std::pair<double, double> runtime_graph_build_ms(const ModelConfig& c, const soc::DeviceProfile& p);

// The cost model a graph is timed with: the device under a characterization (soc.h; "" the
// default) with conventional or fast GPU-NPU synchronization (in decode the GPU's queue stays
// filled, seed 002 §4.2), sharing the SoC with a co-running app (soc.h with_co_runner).
// simulate_graph reads them from the graph's meta ("characterization", "fast_sync", "phase",
// "co_runner"), so a graph times the same wherever it is replayed.
soc::CostModel timing_cost_model(const soc::DeviceProfile& device,
                                 const std::string& characterization, bool fast_sync, bool decode,
                                 const std::string& co_runner = "");

// Times `graph` (whose meta gives prompt_len) under a policy on a device. Head-wise attention
// groups are first planned under `head_policy` and the plan written into the graph (meta
// "head_policy" records it; a graph planned before keeps its plan).
PrefillTimeline simulate_graph(sched::TaskGraph graph, const soc::DeviceProfile& device,
                               const std::string& policy, int64_t optimal_max_tasks = 24,
                               const std::string& head_policy = "greedy");

// The prefill of prompt_len tokens (chunks of chunk_len, 0: whole prompt) of a config.
PrefillTimeline simulate_prefill(const ModelConfig& c, const Plan& plan,
                                 const soc::DeviceProfile& device, int64_t prompt_len,
                                 int64_t chunk_len, const PrefillSimOptions& opts = {});

}  // namespace socllm
