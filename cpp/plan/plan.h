// Plan layer: a Plan names every technique a request runs with, and is the one input both
// interpretations of the block read (DESIGN.md, "What a plan is"): for every op class
// (model/decoder_block.h) the processor it is placed on and its number format; the linear scheme
// (weights, activations, smoothing, outliers, bit-widths); the attention scheme (attention/);
// how a linear is cut between the NPU and a partner processor (HeteroLLM's partitions, solved on
// the plan's device); how a prompt is fed (whole, or in fixed-length chunks on static graphs,
// seed 001 §3.2); where decoding steps run; GPU-NPU synchronization; the LM head's weights.
//
// JSON form (what to_json writes and from_json reads back):
//   {"name": "smoothquant", "alpha": 0.5, "chunk_len": 0,
//    "partition": {"mode": "none"}, "device": "", "characterization": "", "sync": "conventional",
//    "decode": "same", "lm_head_weights": "fp32",
//    "partitions": [{"op": "qkv", "phase": "prefill", "partition": MatmulPartition}, ...],
//    "ops": {"linear": {LinearScheme..., "processor": "npu", "format": "int8"},
//            "norm": {"processor": "npu", "format": "fp16"}, "rope": {...}, "attention": {...},
//            "activation": {...}, "residual": {...}, "shadow": {...}, "lm_head": {...}}}
// A preset name with its options is enough. Placement of op classes can be changed on any plan:
// "ops" entries with a processor/format, a top-level "placement": {"attention": "gpu",
// "norm": {"processor": "cpu", "format": "fp32"}}, or in text "w8a8:attention=gpu". In text,
// every part composes with every preset: "edgeflow:bits=5,partition=solver,attention=shadow-attn".
// A linear's format follows from its scheme (int8 activations: int8; fp16: fp16; else fp32).
// Float formats are emulated in the numerics: an op whose format is fp16 rounds its output to
// IEEE binary16 (it computes in fp32 inside); fp32 ops are exact fp32. For lm_head the final
// norm's output is rounded; the shadow part is always fp32.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention_scheme.h"
#include "model/decoder_block.h"
#include "quant/linear_scheme.h"
#include "quant/rotation.h"
#include "sched/partition.h"
#include "soc/soc.h"

namespace socllm {

struct OpPlacement {
  soc::Processor processor = soc::Processor::Cpu;
  soc::DType format = soc::DType::Fp32;
  bool operator==(const OpPlacement&) const = default;
};

// How the linears are cut between the NPU and a partner processor (HeteroLLM, seed 002 §4.1,
// §4.3). Text "partition=<mode>" with options partner=gpu|cpu, npu_share=<x>; JSON
// {"mode": ..., "partner": ..., "npu_share": ...}. Modes:
//   none     each linear whole on its processor (the default)
//   solver   the solver's best partition of each linear shape over every cut (Hetero-tensor)
//   row | seq | hybrid   the best cut of that kind (row with npu_share: that share of the output
//            columns, aligned, instead of the solver)
//   layer    each linear wholly on the faster of the two (Hetero-layer)
//   padding | pipe | online   the NPU alone, on the next pre-built static graph, the
//            multi-sequence-length cover, or graphs prepared at run time for the exact length
//            (seed 002 §5.2.2; online adds the preparation before the NPU's first part)
// The partner defaults to the GPU when it runs the linears' format (fp16/fp32) and to the CPU
// otherwise (INT8: no GPU INT8 path is modelled). Shapes are solved on the plan's device.
struct PartitionSpec {
  std::optional<sched::PartitionSpace> space;  // nullopt: none
  std::optional<soc::Processor> partner;       // nullopt: by the linears' format (above)
  std::optional<double> npu_share;             // row cuts at a fixed share (no solver)
  bool none() const { return !space.has_value(); }
  std::string mode() const;  // "none", "solver", ...
  nlohmann::json to_json() const;
  bool operator==(const PartitionSpec&) const = default;
};

struct Plan {
  std::string name = "fp32";
  nlohmann::json options = nlohmann::json::object();  // the preset's options, as given/defaulted
  // All linears of every decoder block (q/k/v, o, gate/up, down). The embedding lookup is fp32
  // on the CPU in every plan (a table read, not placed).
  quant::LinearScheme linear;
  // How prefill attention is computed (fp32, sparse, block-sparse, npu-int8, shadow-attn; seed
  // 000). Decode steps always run full fp32 attention.
  attention::AttentionScheme attention;
  // Processor and format of every op class (indexed by OpClass); presets carry llm.npu's
  // placement when their linears can run on a static NPU graph (seed 001 §3.4, §4).
  std::array<OpPlacement, kNumOpClasses> placement{};
  // > 0: prefill runs in chunks of this many rows on static graphs, the last chunk padded.
  int64_t chunk_len = 0;
  // How each linear is cut between the NPU and its partner (seed 002 §4.1).
  PartitionSpec partition;
  // Partitions written into the plan for one linear and phase at one row count: the solver's
  // (solved()) or a user's (with_partition). They replace what `partition` would choose for
  // that shape. Key: (site, decode, rows); JSON "partitions": [{"op", "phase", "partition"}].
  std::map<std::tuple<int, bool, int64_t>, sched::MatmulPartition> partitions;
  // The device the plan is planned for (a profile name or .json path; "": soc::kDefaultDevice)
  // and its characterization ("": the profile's default cost model): the NPU's tile and static
  // graph shapes, and the solver's costs, come from it in the numerics and in the timing.
  std::string device, characterization;
  // The profile itself when the plan was bound to one (on_device: e.g. a profile given as a
  // dict); else `device` is loaded by name. Not part of the JSON, which names the device.
  std::shared_ptr<const soc::DeviceProfile> device_ptr;
  // HeteroLLM's fast GPU-NPU synchronization (seed 002 §4.2), else the conventional one.
  bool fast_sync = false;
  // Where a decoding step (one new token on a filled cache) runs: nullopt as the prompt;
  // a processor: every op class on it (llm.npu decodes on the CPU, seed 001 §3.1).
  std::optional<soc::Processor> decode_processor;
  // The LM head's weights: fp32 (false), or quantized with the linear scheme (W4A16 quantizes
  // it too, seed 002 §5.1; weight-only schemes).
  bool lm_head_linear = false;
  // Rotations folded into the weights (QuaRot, issue 39; quant/rotation.h): the residual
  // stream's (rotate=fold|hadamard|random, rotate_seed=N), the down projection's input online
  // (rotate_down=hadamard: an op of the graph), every head's values (rotate_heads=hadamard).
  // The engine runs such a plan on the model rotated so (the same function in fp32), and its
  // calibration must come from that model (socllm calibrate --rotate ...).
  quant::RotationSpec rotation;
  // The residual stream scaled by a constant c (issue 39; residual_scale=<c>|auto): the
  // embeddings and every output the residual adds take (Gemma 3's post-norm outputs, else the
  // o_proj and down outputs) times c, and the norms reading the stream with eps·c², since
  // RMSNorm(c·x; eps·c²) = RMSNorm(x; eps) exactly: the same function with a stream c times
  // smaller, so float ops stored in fp16 do not overflow. nullopt: 1. auto: the power of two that
  // brings the calibrated stream maximum under kAutoResidualMax (Engine::residual_scale).
  std::optional<double> residual_scale;
  bool residual_scale_auto = false;
  static constexpr double kAutoResidualMax = 4096;  // binary16's max 65504 / 16 of headroom

  // The plan a decoding step runs (Plan::decode_processor's placement, fp32 attention: seed 000
  // §4; no chunking).
  Plan for_decode() const;
  // The partition of the linear at `site` for `rows` input rows, in prefill or decode: the one
  // written into the plan, else the spec's (solved on the plan's device, cached), else none.
  std::optional<sched::MatmulPartition> partition_for(const ModelConfig& c, LinearSite site,
                                                      int64_t rows, bool decode) const;
  // The linear at `site` for `rows` input rows as the cost model sees it: its shapes, format,
  // stored weight bytes (quant::stored_weight_bytes) and activation bytes. The solver cuts it
  // and the block's graph times it (or its parts).
  soc::OpDesc linear_desc(const ModelConfig& c, LinearSite site, int64_t rows) const;
  // The NPU's alignment and static graph shapes on the plan's device, with the plan's partner
  // (a decoding step: one pre-built graph of its rows).
  sched::PartitionRules partition_rules(bool decode, int64_t rows) const;
  // A copy planned for `device` (device = its name); InvalidArgument if the plan names another.
  Plan on_device(std::shared_ptr<const soc::DeviceProfile> device) const;
  // The plan's device profile (device_ptr, else soc::load_device) and the processor the NPU
  // shares linears with.
  std::shared_ptr<const soc::DeviceProfile> device_profile() const;
  soc::Processor partition_partner() const;
  // A copy with the spec's partitions written in for prompts of `prefill_rows` rows and, if
  // decode, for decoding steps: what the solver chose, readable and editable (to_json).
  Plan solved(const ModelConfig& c, const std::vector<int64_t>& prefill_rows, bool decode) const;
  // A copy with `p` on the linear named `op` ("qkv", "o_proj", "gate_up", "down") for inputs of
  // p.rows rows; validated against `rules` (InvalidArgument naming the op or the part).
  Plan with_partition(
      const std::string& op, const sched::MatmulPartition& p, bool decode = false,
      const sched::PartitionRules& rules = sched::PartitionRules::structural()) const;

  static std::vector<std::string> known();
  static std::string known_list();  // "(known plans: a, b)", for error messages
  // One line naming the source, of a preset or of a part that composes with every preset
  // (parts(): rotate, rotate_down, rotate_heads, act_percentile, residual_scale, rounding).
  static std::string describe(const std::string& name);
  static std::vector<std::string> parts();
  // A preset with default options. InvalidArgument naming the plan and listing the known ones.
  static Plan from_name(const std::string& name);
  // "name", "name:key=value,key=value" or a JSON object.
  static Plan parse(const std::string& text);
  static Plan from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  bool needs_calibration() const {
    return linear.needs_calibration() || attention.needs_head_importance() ||
           attention.needs_qk_scales();
  }
  // The calibration steps (socllm calibrate --steps) whose statistics this plan reads, in the
  // order they run; empty when it reads none.
  std::vector<std::string> calibration_steps() const;
  // The preset names that alias HeteroLLM's engines (seed 002 §5: gpu-only, npu-padding,
  // npu-pipe, npu-online-prepare, hetero-layer, hetero-tensor).
  static std::vector<std::string> hetero_engines();

  const OpPlacement& at(OpClass c) const { return placement[static_cast<size_t>(c)]; }
  // A copy with op class `c` on `processor` (and `format`, if given; a linear's format follows
  // its scheme). InvalidArgument if the processor cannot run the op's format.
  Plan placed(OpClass c, soc::Processor processor, std::optional<soc::DType> format = {}) const;
  // A copy with every op class on `processor`, float classes in the processor's float format
  // (fp16 on NPU and GPU): the single-processor baselines. On the NPU the shadow-outlier float
  // part stays where it was (it is what a static graph cannot run). Errors as placed().
  Plan all_on(soc::Processor processor) const;
  // InvalidArgument naming the op class, processor and format if one cannot run where it is
  // placed (an NPU runs static-graph INT8 and FP16 ops only, seed 001 §2.3; a GPU FP16/FP32;
  // the shadow part is fp32; float op classes have no int8 format), and naming the part for a
  // partition the linears cannot take (not on the NPU, a partner that cannot run their format,
  // schemes that look across a sequence's rows).
  void validate_placement() const;
  // The formats a processor runs.
  static bool can_run(soc::Processor p, soc::DType format);
  // The format a linear scheme computes in (int8, fp16 or fp32 activations).
  static soc::DType linear_format(const quant::LinearScheme& s);
};

}  // namespace socllm
