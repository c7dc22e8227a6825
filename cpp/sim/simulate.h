// Sim layer: a request timed on a modelled SoC in one call (DESIGN.md, "one task graph, two
// interpretations"): config + plan -> the block's task graph (block.h) for a prefill, one
// decoding step or a session (the prompt, then decoding steps on one timeline) -> the
// discrete-event simulator (simulator.h) on a device profile -> summary numbers. The Python
// `socllm.sim.simulate` and `Timeline` are views over this.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "block/block.h"
#include "sched/head_pipeline.h"
#include "sched/simulator.h"
#include "soc/soc.h"

namespace socllm {

struct SimOptions {
  std::string policy = "npu-stall-first";  // a name or alias of sched::policies()
  // "prefill" of prompt_len tokens, "decode": one decoding step on a cache of prompt_len
  // positions, "session": the prefill then decode_tokens decoding steps on one timeline.
  std::string phase = "prefill";
  int64_t decode_tokens = 0;  // session only (> 0)
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
  std::string co_runner;  // a co-running app of the profile's /scenarios ("": none)
  // Timing assumptions that replace the plan's (""/unset: the plan's): the device's
  // characterization, and GPU-NPU synchronization (seed 002 §5.4's ablation times partitions
  // solved for fast sync with conventional sync).
  std::string characterization;
  std::optional<bool> fast_sync;
};

// A simulated request: the graph, its schedule, and summary() numbers.
struct PrefillTimeline {
  sched::TaskGraph graph;
  sched::Timeline timeline;
  // One entry per NPU-CPU head pipeline planned (apply_head_pipeline): chunk, layer, plan,
  // problem. Empty when the graph has none or was planned before (meta "head_policy").
  nlohmann::json head_plans = nlohmann::json::array();
  // graph meta (config, plan, phase, prompt_len, chunk_len, resident_bytes, partitions) +
  // policy, device, energy_mj, graph_build_ms, peak_memory_bytes (resident + the peak of running
  // tasks' working bytes), tasks, busy_ms / bubble_rate per processor, scheduler decisions and
  // host µs per decision; by phase: prefill_ms, prefill_tokens_per_s, ttft_ms (the first token
  // comes with the prefill's last task, the LM head); decode: tpot_ms, decode_tokens_per_s,
  // kv_len; session: ttft_ms, then decode_ms, tpot_ms (mean per decoded token),
  // decode_tokens_per_s and total_ms.
  nlohmann::json summary() const;
};

// Run-time (build, optimize) ms of a whole model's NPU graph on a device (see the option above).
std::pair<double, double> runtime_graph_build_ms(const ModelConfig& c, const soc::DeviceProfile& p);

// Times `graph` (whose meta gives prompt_len and phase) under a policy on a device, with the
// cost model its meta names (characterization, fast_sync, phase, co_runner; soc.h
// timing_cost_model). Head-wise attention groups are first planned under `head_policy` and the
// plan written into the graph (meta "head_policy" records it; a graph planned before keeps it).
PrefillTimeline simulate_graph(sched::TaskGraph graph, const soc::DeviceProfile& device,
                               const std::string& policy, int64_t optimal_max_tasks = 24,
                               const std::string& head_policy = "greedy");

// A request of a config under a plan: the prefill of prompt_len tokens (chunks of chunk_len,
// 0: whole prompt), one decoding step after it, or a session (opts.phase).
PrefillTimeline simulate_request(const ModelConfig& c, const Plan& plan,
                                 const soc::DeviceProfile& device, int64_t prompt_len,
                                 int64_t chunk_len, const SimOptions& opts = {});

}  // namespace socllm
