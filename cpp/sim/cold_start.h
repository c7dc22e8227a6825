// Sim layer: a cold start as one task graph (seed 004 §3.1, §4, §5.1): the weights read from
// flash layer by layer (on soc::Processor::Io), unpacked where the stored format needs it (on
// CpuAux, one thread), graphs prepared where the system builds them at run time, and the prompt
// prefilled to the first token (the block description's prefill graph, block.h), overlapped as
// each system does. The simulator (simulator.h) times it on a device profile; TTFT is its
// makespan.
//
// Systems (seed 004 §5.1):
//   edgeflow   B-bit weightlet files (bits/weight + a 3-bit width and an fp32 scale per row),
//              unpacked per layer on one thread; plan edgeflow (INT8 matmuls on the NPU, every
//              other op on the CPU, App. B); a layer's prefill starts once it is unpacked;
//              policy position-steal (§4.3).
//   llm.npu+   llm.npu with materialized graphs and layer-wise overlap (§3.1, Fig. 1): INT8
//              per-tensor weights read with their graph, a layer's prefill starts once read;
//              llm.npu's placement, policy npu-stall-first (Eq. 6).
//   llm.npu    the same without materialization: every layer's graph is built and optimized at
//              run time before its prefill (seed 001 §2.2, the profile's graph times).
//   llama.cpp  CPU only, weights mmap'ed (Q8_0: 8.5 bits/weight): demand paging reads a layer
//              when the compute first touches it, so a layer's read waits for the previous
//              layer's compute (no overlap; readahead ignored).
//   mnn        CPU only, INT8 per-channel weights loaded whole before the computation starts.
// Every system reads the LM head's INT8 weights after the last layer (the embedding lookup
// reads only the prompt's rows, which is neglected).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "sched/simulator.h"
#include "soc/soc.h"

namespace socllm {

enum class ColdStartSystem { EdgeFlow, LlmNpuPlus, LlmNpu, LlamaCpp, Mnn };
const char* cold_start_system_name(ColdStartSystem s);  // edgeflow, llm.npu+, ...
ColdStartSystem cold_start_system_from_name(const std::string& s);

struct ColdStartOptions {
  ColdStartSystem system = ColdStartSystem::EdgeFlow;
  double bits = 5.0;  // edgeflow: average bits per linear weight (1..8)
  int64_t prompt_len = 128;
  int64_t chunk_len = 256;  // prefill chunks on static graphs (NPU systems)
  std::string policy;       // "" = the system's own (above)
  // edgeflow: the unpack format's rate key ("weightlet"; "kquant" for the K-quant ablation).
  std::string unpack_format = "weightlet";
  std::optional<int64_t> steal_threshold;  // unset: seed 004's rule (sched::SimOptions)
};

// What an EdgeFlow weightlet row stores besides its weights: an fp32 scale and a 3-bit width
// code (seed 004 §4.2).
inline constexpr double kWeightletRowMetadataBytes = 4.0 + 3.0 / 8.0;

// Bytes a system reads for one decoder layer's linear weights.
int64_t cold_start_layer_bytes(const ModelConfig& c, const ColdStartOptions& o);

struct ColdStartTimeline {
  sched::TaskGraph graph;
  sched::Timeline timeline;
  // system, config, prompt_len, ttft_ms, read_ms (Io busy), unpack_ms, prefill_ms (from the
  // first prefill task's start), energy_mj, bytes_read, per-processor busy / bubble.
  nlohmann::json summary() const;
};

// The cold-start task graph of a config (no numerics). InvalidArgument for bits outside 1..8,
// a non-positive prompt, an unknown policy.
sched::TaskGraph cold_start_graph(const ModelConfig& c, const soc::DeviceProfile& device,
                                  const ColdStartOptions& o);
// The modelled cold-start cost of single output channels at 1..8 bits (issue 14 item 6: one
// bit-allocation heap over every channel of a model under a time budget): a channel of n weights
// at B bits reads n·B/8 bytes plus its row metadata from flash (Io) and is unpacked on one
// thread at the weightlet rate, times the measured time of a B-bit mix relative to 5 bits
// (/processors/cpu_all/unpack_weightlet_relative_time_by_bits; the rate's number is for the
// paper's mix, taken as the 5-bit one). `seconds` is [channels, 8] (column B - 1); `inputs` the
// profile numbers used, with their sources. MissingData naming what is absent.
struct ChannelCostTable {
  std::vector<double> seconds;
  nlohmann::json inputs;
};
ChannelCostTable channel_cold_start_cost(const soc::DeviceProfile& device,
                                         std::span<const int64_t> in_features);

ColdStartTimeline simulate_cold_start(const ModelConfig& c, const soc::DeviceProfile& device,
                                      const ColdStartOptions& o);

}  // namespace socllm
