// Engine layer: a Plan names how each operator class of a decoder runs (its number format and
// the processor it is placed on) and how a prompt is fed (whole, or in fixed-length chunks on
// static graphs, seed 001 §3.2). The block description (block.h) turns a config and a plan into
// the operator graph that the engine executes and the simulator times.
//
// JSON form (what to_json writes and from_json reads back):
//   {"name": "smoothquant", "alpha": 0.5, "chunk_len": 0,
//    "ops": {"linear": {LinearScheme..., "processor": "npu", "format": "int8"},
//            "norm": {"processor": "npu", "format": "fp16"}, "rope": {...}, "attention": {...},
//            "activation": {...}, "residual": {...}, "shadow": {...}, "lm_head": {...}}}
// A preset name with its options is enough. Placement of op classes can be changed on any plan:
// "ops" entries with a processor/format, a top-level "placement": {"attention": "gpu",
// "norm": {"processor": "cpu", "format": "fp32"}}, or in text "w8a8:attention=gpu".
// A linear's format follows from its scheme (int8 activations: int8; fp16: fp16; else fp32).
// Float formats are emulated in the numerics: an op whose format is fp16 rounds its output to
// IEEE binary16 (it computes in fp32 inside); fp32 ops are exact fp32. For lm_head the final
// norm's output is rounded (the LM head's fp16 weights are not emulated); the shadow part is
// always fp32.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "socllm/attention_scheme.h"
#include "socllm/linear_scheme.h"
#include "socllm/partition.h"
#include "socllm/soc.h"

namespace socllm {

// Operator classes of a decoder that a plan places (block.h lists the ops of each class).
enum class OpClass : int {
  Norm = 0,    // RMSNorm before attention / MLP
  Linear,      // the four linear sites (q/k/v, o, gate/up, down)
  Rope,        // rotary embedding of q and k
  Attention,   // Q·Kᵀ, softmax, P·V over the KV cache
  Activation,  // SiLU(gate) * up
  Residual,    // residual adds after o_proj and down
  Shadow,      // the float outlier part of a shadow-outlier linear (seed 001 §3.3)
  LmHead       // final norm + LM head
};
constexpr int kNumOpClasses = 8;
const char* op_class_name(OpClass c);
// InvalidArgument naming the class and listing the known ones.
OpClass op_class_from_name(const std::string& s);

struct OpPlacement {
  soc::Processor processor = soc::Processor::Cpu;
  soc::DType format = soc::DType::Fp32;
  bool operator==(const OpPlacement&) const = default;
};

struct Plan {
  std::string name = "fp32";
  nlohmann::json options = nlohmann::json::object();  // the preset's options, as given/defaulted
  // All linears of every decoder block (q/k/v, o, gate/up, down). The embedding lookup is fp32
  // on the CPU in every plan (a table read, not placed).
  quant::LinearScheme linear;
  // How prefill attention is computed (fp32, sparse, block-sparse, npu-int8, shadow-attn; seed
  // 000). Decode steps always run full fp32 attention.
  quant::AttentionScheme attention;
  // Processor and format of every op class (indexed by OpClass); presets carry llm.npu's
  // placement when their linears can run on a static NPU graph (seed 001 §3.4, §4).
  std::array<OpPlacement, kNumOpClasses> placement{};
  // > 0: prefill runs in chunks of this many rows on static graphs, the last chunk padded.
  int64_t chunk_len = 0;
  // HeteroLLM's tensor partitions (partition.h, seed 002 §4.1) per linear site: a linear whose
  // input has the partition's rows runs as its parts (GPU and NPU sub-blocks of the output);
  // other row counts run whole. JSON "partitions": {"qkv" | "o_proj" | "gate_up" | "down":
  // MatmulPartition.to_json()}.
  std::array<std::optional<sched::MatmulPartition>, 4> partitions{};
  // A copy with `p` on the linear named `op` ("qkv", "o_proj", "gate_up", "down"); validated
  // against `rules` (InvalidArgument naming the op or the part).
  Plan with_partition(
      const std::string& op, const sched::MatmulPartition& p,
      const sched::PartitionRules& rules = sched::PartitionRules::structural()) const;

  static std::vector<std::string> known();
  static std::string known_list();  // "(known plans: a, b)", for error messages
  static std::string describe(const std::string& name);  // one line, names the source
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
  // the shadow part is fp32; float op classes have no int8 format).
  void validate_placement() const;
  // The formats a processor runs.
  static bool can_run(soc::Processor p, soc::DType format);
  // The format a linear scheme computes in (int8, fp16 or fp32 activations).
  static soc::DType linear_format(const quant::LinearScheme& s);
};

}  // namespace socllm
