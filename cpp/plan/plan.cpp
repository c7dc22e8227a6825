#include "plan/plan.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>

#include "core/core.h"

namespace socllm {

namespace {

using quant::ActFormat;
using quant::Granularity;
using quant::LinearScheme;
using quant::WeightFormat;
using json = nlohmann::json;

struct Preset {
  const char* name;
  const char* description;
  const char* options;  // JSON object of option defaults (besides chunk_len)
  std::function<LinearScheme(const json& opts)> linear;
  // Op classes placed otherwise than default_placement puts them, as in "placement" (JSON).
  const char* placement = nullptr;
  // Plan-level parts the preset sets (sync, characterization, decode, lm_head_weights), as in
  // the plan JSON, and its partition mode; what a user gives replaces them.
  const char* settings = nullptr;
  const char* partition = nullptr;
};

// HeteroLLM's engines (seed 002 §5.1-5.2): W4A16 linears, every other op class on the GPU in
// FP16, the LM head quantized as well, fast synchronization (§4.2), the device's 'heterollm'
// characterization (its ~10 TFLOPS FP16 NPU with shape sensitivity).
constexpr const char* kHeteroPlacement =
    R"({"norm": "gpu/fp16", "rope": "gpu/fp16", "attention": "gpu/fp16",
        "activation": "gpu/fp16", "residual": "gpu/fp16", "lm_head": "gpu/fp16",
        "linear": "npu"})";
constexpr const char* kHeteroGpuPlacement =
    R"({"norm": "gpu/fp16", "rope": "gpu/fp16", "attention": "gpu/fp16",
        "activation": "gpu/fp16", "residual": "gpu/fp16", "lm_head": "gpu/fp16",
        "linear": "gpu"})";
constexpr const char* kHeteroSettings =
    R"({"sync": "fast", "characterization": "heterollm", "lm_head_weights": "linear",
        "decode": "same"})";
// Weight-only per-group weights with fp16 activations: int4 (W4A16, HeteroLLM's and GPTQ/AWQ's
// setting, seed 002 §5.1) or int8 (weight_bits=8: the same engine with twice the weight bytes,
// a point between W4A16 and fp16 the frontier can choose; not a paper's configuration).
LinearScheme w4a16(const json& o) {
  const int64_t bits = o["weight_bits"].get<int64_t>();
  if (bits != 4 && bits != 8)
    throw InvalidArgument(
        "[Plan] weight_bits of a weight-only per-group plan must be 4 or 8, got " +
        std::to_string(bits));
  LinearScheme s;
  s.weights = bits == 8 ? WeightFormat::Int8 : WeightFormat::Int4;
  s.weight_granularity = Granularity::PerGroup;
  s.activations = ActFormat::F16;
  s.group_size = o["group_size"].get<int64_t>();
  return s;
}

// EdgeFlow's options shared by its preset and the NPU-adapted baselines (seed 004 §4.1, §5.4.1).
quant::NpuSmoothing npu_smoothing_option(const json& o) {
  quant::NpuSmoothing n;
  const json& a = o["alpha"];
  if (a.is_string() && a.get<std::string>() == "calibrated") n.alpha_calibrated = true;
  else if (a.is_number()) n.alpha = a.get<double>();
  else
    throw InvalidArgument("[Plan] alpha must be a number in [0, 1] or 'calibrated', got " +
                          json_text(a));
  n.beta = o["beta"].get<double>();
  n.fold = o["fold"].get<int64_t>() != 0;
  return n;
}

quant::OutputQuant output_quant_option(const json& o) {
  const auto v = o["output_quant"].get<std::string>();
  for (auto q : {quant::OutputQuant::None, quant::OutputQuant::Int8, quant::OutputQuant::Int16})
    if (quant::output_quant_name(q) == v) return q;
  throw InvalidArgument("[Plan] output_quant must be none, int8 or int16, got '" + v + "'");
}

// "calibrated" options also take a number (edgeflow's alpha).
bool number_for_calibrated(const json& def, const json& v) {
  return def.is_string() && def.get<std::string>() == "calibrated" && v.is_number();
}

LinearScheme scheme(WeightFormat w, Granularity g, ActFormat a, int64_t group = 32) {
  LinearScheme s;
  s.weights = w;
  s.weight_granularity = g;
  s.activations = a;
  s.group_size = group;
  return s;
}

constexpr const char* kEdgeflowOptions =
    R"({"bits": 5.0, "alpha": "calibrated", "beta": 1.0, "output_quant": "int8",
        "allocation": "greedy", "metric": "closed-form", "bitwidths": "per-tensor", "fold": 1})";

const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = {
      {"fp32",
       "every operator in fp32 on the CPU: the reference the quantized plans are measured against",
       "{}", [](const json&) { return LinearScheme{}; }},
      {"w8a8",
       "llm.npu's NPU baseline (seed 001 §2.3, §3.3): int8 per-tensor weights, int8 activations "
       "with "
       "static per-tensor scales from calibration (symmetric max-min), exact int8 GEMM",
       "{}",
       [](const json&) {
         return scheme(WeightFormat::Int8, Granularity::PerTensor, ActFormat::Int8StaticPerTensor);
       }},
      {"w8a8-perchannel",
       "w8a8 with per-output-channel weight scales (still static per-tensor activations; a "
       "per-column rescale after the int32 GEMM, which NPUs support)",
       "{}",
       [](const json&) {
         return scheme(WeightFormat::Int8, Granularity::PerChannel, ActFormat::Int8StaticPerTensor);
       }},
      {"smoothquant",
       "SmoothQuant (Xiao et al. 2023), the per-tensor baseline of seed 001 Table 4/6 ('SQ'): "
       "activation outliers migrated into weights with strength alpha, then w8a8 per-tensor static",
       R"({"alpha": 0.5})",
       [](const json& o) {
         auto s =
             scheme(WeightFormat::Int8, Granularity::PerTensor, ActFormat::Int8StaticPerTensor);
         s.smooth_alpha = o["alpha"].get<double>();
         return s;
       }},
      {"llm-int8",
       "LLM.int8() (Dettmers et al. 2022), seed 001 Table 6 'INT8()': input columns with |x| > "
       "threshold in float, the rest int8 with dynamic per-row scales; int8 per-channel weights",
       R"({"threshold": 6.0})",
       [](const json& o) {
         auto s = scheme(WeightFormat::Int8, Granularity::PerChannel, ActFormat::Int8DynamicPerRow);
         s.outlier_threshold = o["threshold"].get<double>();
         return s;
       }},
      {"shadow-outlier",
       "llm.npu's shadow outlier execution (seed 001 §3.3, Eq. 1): w8a8 per-tensor on the NPU with "
       "activations clipped to a calibrated threshold, the values beyond it in float on the CPU "
       "(hot channels' weights resident, cold ones fetched), the CPU part pruned on the "
       "pruning_rate least important linears; weights per-tensor (the paper) or per-channel",
       R"({"pruning_rate": 0.85, "hot_share": 0.8, "weights": "per-tensor", "weight_bits": 8})",
       [](const json& o) {
         const auto w = o["weights"].get<std::string>();
         if (w != "per-tensor" && w != "per-channel")
           throw InvalidArgument(
               "[Plan] shadow-outlier: weights must be per-tensor or per-channel, got '" + w + "'");
         auto s = scheme(WeightFormat::Int8,
                         w == "per-tensor" ? Granularity::PerTensor : Granularity::PerChannel,
                         ActFormat::Int8StaticPerTensor);
         // B-bit weights: EdgeFlow's shadow-outlier baseline at an average of B bits (§5.4.1).
         const int64_t bits = o["weight_bits"].get<int64_t>();
         if (bits < 2 || bits > 8)
           throw InvalidArgument("[Plan] shadow-outlier: weight_bits must be in 2..8, got " +
                                 std::to_string(bits));
         s.weight_bits = static_cast<int>(bits);
         s.shadow =
             quant::ShadowOptions{o["pruning_rate"].get<double>(), o["hot_share"].get<double>()};
         return s;
       }},
      {"edgeflow",
       "EdgeFlow (seed 004 §4.1, App. B): per-output-channel symmetric weights at 1-8 bits "
       "allocated per tensor by Algorithm 1 at an average of `bits`, NPU-aware smoothing (input "
       "S_I^alpha folded into the norms / previous rows, output S_O^beta into the "
       "dequantization), static per-tensor int8 activations and outputs (output_quant), exact "
       "int8 GEMM on the NPU, every other op on the CPU in fp16. allocation: greedy, uniform, "
       "int4-int8, cmpq (the §5.4.1 baselines); bitwidths=stored takes the calibration's; "
       "fold=0 divides each linear's input at run time instead of folding it",
       kEdgeflowOptions,
       [](const json& o) {
         auto s =
             scheme(WeightFormat::Int8, Granularity::PerChannel, ActFormat::Int8StaticPerTensor);
         quant::ChannelBits cb;
         cb.bits = o["bits"].get<double>();
         cb.allocation = quant::bit_allocation_from_name(o["allocation"].get<std::string>());
         cb.metric = quant::error_metric_from_name(o["metric"].get<std::string>());
         const auto where = o["bitwidths"].get<std::string>();
         if (where != "per-tensor" && where != "stored")
           throw InvalidArgument("[Plan] edgeflow: bitwidths must be per-tensor or stored, got '" +
                                 where + "'");
         cb.stored = where == "stored";
         if (cb.stored) {  // the calibration's bit-widths decide (numerics and timing, whose
                           // budget becomes their mean: Engine::timing_plan), so an allocation
                           // option would change nothing: one off its default is refused
           const json defaults = json::parse(kEdgeflowOptions);
           for (const char* k : {"bits", "allocation", "metric"})
             if (o[k] != defaults[k])
               throw InvalidArgument("[Plan] edgeflow: " + std::string(k) + "=" + json_text(o[k]) +
                                     " does not apply with bitwidths=stored (the calibration's "
                                     "bit-widths set every channel; step bitwidths chose them)");
         }
         s.channel_bits = cb;
         s.npu_smoothing = npu_smoothing_option(o);
         s.output_quant = output_quant_option(o);
         return s;
       },
       R"({"norm": "cpu", "activation": "cpu", "residual": "cpu"})"},
      {"smoothquant-npu",
       "SmoothQuant adapted to the NPU as EdgeFlow's baseline (seed 004 §5.4.1): SmoothQuant's "
       "input smoothing (alpha) plus NPU output smoothing (beta), uniform per-channel weights at "
       "`bits`, static per-tensor int8 activations and outputs",
       R"({"bits": 8, "alpha": 0.5, "beta": 1.0, "output_quant": "int8"})",
       [](const json& o) {
         auto s =
             scheme(WeightFormat::Int8, Granularity::PerChannel, ActFormat::Int8StaticPerTensor);
         s.smooth_alpha = o["alpha"].get<double>();
         quant::ChannelBits cb;
         cb.bits = static_cast<double>(o["bits"].get<int64_t>());
         cb.allocation = quant::BitAllocation::Uniform;
         s.channel_bits = cb;
         s.npu_smoothing = quant::NpuSmoothing{std::nullopt, false, o["beta"].get<double>()};
         s.output_quant = output_quant_option(o);
         return s;
       },
       R"({"norm": "cpu", "activation": "cpu", "residual": "cpu"})"},
      {"w8-group",
       "K-quant-like per-group int8 (llama.cpp Q8_0 x Q8_0; seed 001 Fig. 3b, Table 6 'K-Quant'): "
       "weights and activations quantized in groups along K, float sum over groups",
       R"({"group_size": 32})",
       [](const json& o) {
         return scheme(WeightFormat::Int8, Granularity::PerGroup, ActFormat::Int8DynamicPerGroup,
                       o["group_size"].get<int64_t>());
       }},
      {"w4-group",
       "K-quant-like per-group int4 weights with per-group int8 activations (llama.cpp Q4_0 x "
       "Q8_0; seed 001 Fig. 3b)",
       R"({"group_size": 32})",
       [](const json& o) {
         return scheme(WeightFormat::Int4, Granularity::PerGroup, ActFormat::Int8DynamicPerGroup,
                       o["group_size"].get<int64_t>());
       }},
      {"w4a16",
       "weight-only per-group int4 with fp16 activations (GPTQ/AWQ-style, seed 001 Table 4)",
       R"({"group_size": 32, "weight_bits": 4})", w4a16},
      {"gpu-only",
       "HeteroLLM's GPU baseline (PPL-OpenCL, seed 002 §5.1): W4A16, every op on the GPU",
       R"({"group_size": 32, "weight_bits": 4})", w4a16, kHeteroGpuPlacement, kHeteroSettings},
      {"npu-padding",
       "HeteroLLM's engine with linears on the NPU, the prompt padded to the next pre-built "
       "static graph (seed 002 §5.2.2 Padding), other ops on the GPU",
       R"({"group_size": 32, "weight_bits": 4})", w4a16, kHeteroPlacement, kHeteroSettings,
       "padding"},
      {"npu-pipe",
       "HeteroLLM's engine with linears on the NPU over pre-built graphs of decreasing sizes "
       "(§5.2.2 Pipe: multi-sequence-length cutting without the GPU)",
       R"({"group_size": 32, "weight_bits": 4})", w4a16, kHeteroPlacement, kHeteroSettings, "pipe"},
      {"npu-online-prepare",
       "HeteroLLM's engine with linears on the NPU on graphs prepared at run time for the exact "
       "length, preparation included (§5.2.2 Online-prepare)",
       R"({"group_size": 32, "weight_bits": 4})", w4a16, kHeteroPlacement, kHeteroSettings,
       "online"},
      {"hetero-layer",
       "HeteroLLM's Hetero-layer (seed 002 §5): each linear wholly on the faster of the GPU and "
       "the NPU, other ops on the GPU",
       R"({"group_size": 32, "weight_bits": 4})", w4a16, kHeteroPlacement, kHeteroSettings,
       "layer"},
      {"hetero-tensor",
       "HeteroLLM's Hetero-tensor (seed 002 §4.1, §4.3): each linear cut between the GPU and "
       "the NPU by the partition solver, other ops on the GPU",
       R"({"group_size": 32, "weight_bits": 4})", w4a16, kHeteroPlacement, kHeteroSettings,
       "solver"},
  };
  return kPresets;
}

const Preset* find_preset(const std::string& name) {
  for (const auto& p : presets())
    if (name == p.name) return &p;
  return nullptr;
}

const Preset& preset_or_throw(const std::string& name) {
  if (const Preset* p = find_preset(name)) return *p;
  throw InvalidArgument("[Plan] unknown plan '" + name + "' " + Plan::known_list());
}

bool is_float_class(OpClass c) { return c != OpClass::Linear; }

bool is_op_class(const std::string& s) {
  for (int i = 0; i < kNumOpClasses; ++i)
    if (s == op_class_name(static_cast<OpClass>(i))) return true;
  return false;
}

// llm.npu's placement for plans whose linears a static NPU graph runs (seed 001 §3.4, §4
// "Implementation": linears, RMSNorm and SiLU are QNN ops; attention, RoPE's graph and the
// shadow outlier part run on the CPU), float ops in FP16 except the float outlier part and the
// LM head (fp32 on the CPU). Other plans run on the CPU, float ops in fp32 when the linears
// are fp32 and fp16 otherwise (the CPU baselines of seed 001 Table 4 are fp16 inference
// engines).
std::array<OpPlacement, kNumOpClasses> default_placement(const LinearScheme& s) {
  using soc::DType;
  using soc::Processor;
  std::array<OpPlacement, kNumOpClasses> p{};
  const bool npu = s.activations == ActFormat::Int8StaticPerTensor ||
                   (s.activations == ActFormat::Int8DynamicPerGroup && !s.outlier_threshold);
  const DType flt = npu || s.activations != ActFormat::F32 ? DType::Fp16 : DType::Fp32;
  for (auto& o : p) o = {Processor::Cpu, flt};
  auto at = [&](OpClass c) -> OpPlacement& { return p[static_cast<size_t>(c)]; };
  at(OpClass::Linear) = {npu ? Processor::Npu : Processor::Cpu, Plan::linear_format(s)};
  if (npu)
    for (OpClass c : {OpClass::Norm, OpClass::Activation, OpClass::Residual})
      at(c).processor = Processor::Npu;
  at(OpClass::Shadow) = {Processor::Cpu, DType::Fp32};
  at(OpClass::LmHead) = {Processor::Cpu, DType::Fp32};
  return p;
}

// {"processor": "npu", "format": "fp16"}, "cpu/fp32" (both, the plan string's form), "gpu"
// (processor only) or the legacy "fp32" (format).
void apply_placement_entry(Plan& plan, OpClass c, const json& v) {
  auto proc = plan.at(c).processor;
  std::optional<soc::DType> fmt;
  if (v.is_string()) {
    const auto t = v.get<std::string>();
    const auto slash = t.find('/');
    // A name that is none of them is reported against everything the class accepts, not as
    // the format it was last tried as.
    const std::string where = "[Plan] " + std::string(op_class_name(c)) + "=" + t + ": ";
    try {
      if (slash != std::string::npos) {
        proc = soc::processor_from_name(t.substr(0, slash));
        fmt = soc::dtype_from_name(t.substr(slash + 1));
      } else if (const auto p = soc::find_processor(t)) {
        proc = *p;
      } else if (const auto d = soc::find_dtype(t)) {
        fmt = *d;
      } else {
        throw InvalidArgument("'" + t + "' is not a processor (" + soc::processor_names() +
                              ") or a format (" + soc::dtype_names() + ")" +
                              (c == OpClass::Attention
                                   ? ", nor an attention scheme (" + attention::scheme_list() + ")"
                                   : std::string()));
      }
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(where + e.what());
    }
  } else if (v.is_object()) {
    for (const auto& [k, x] : v.items()) {
      if ((k == "processor" || k == "format") && !x.is_string())
        throw InvalidArgument("[Plan] the " + k + " of op class '" + op_class_name(c) +
                              "' must be a name, got " + json_text(x));
      if (k == "processor") proc = soc::processor_from_name(x.get<std::string>());
      else if (k == "format") fmt = soc::dtype_from_name(x.get<std::string>());
      else if (c != OpClass::Linear)
        throw InvalidArgument("[Plan] op class '" + std::string(op_class_name(c)) +
                              "' has no field '" + k + "' (processor, format)");
    }
  } else {
    throw InvalidArgument(
        "[Plan] placement of '" + std::string(op_class_name(c)) +
        "' must be a processor, a format, \"processor/format\" or {\"processor\", "
        "\"format\"}, got " +
        json_text(v));
  }
  if (c == OpClass::Linear && fmt && *fmt != Plan::linear_format(plan.linear))
    throw InvalidArgument(std::string("[Plan] the linear format follows its scheme (") +
                          soc::dtype_name(Plan::linear_format(plan.linear)) + "), got '" +
                          soc::dtype_name(*fmt) + "'");
  plan = plan.placed(c, proc, fmt);
}

// The scheme of an "ops" object (its "linear" entry without the placement fields).
std::optional<LinearScheme> ops_linear_scheme(const json& ops) {
  if (!ops.is_object())
    throw InvalidArgument("[Plan] 'ops' must be an object of operator classes, got " +
                          json_text(ops));
  for (const auto& [op, mode] : ops.items())
    if (op != "embedding") op_class_from_name(op);  // names the unknown class
  if (!ops.contains("linear")) return std::nullopt;
  json lin = ops["linear"];
  if (!lin.is_object())
    throw InvalidArgument("[Plan] ops.linear must be a linear scheme object, got " +
                          json_text(lin));
  lin.erase("processor");
  lin.erase("format");
  return LinearScheme::from_json(lin);
}

void apply_ops_placement(Plan& plan, const json& ops) {
  for (const auto& [op, v] : ops.items()) {
    if (op == "embedding") {  // legacy: the embedding is always an fp32 table read
      if (v != "fp32")
        throw InvalidArgument("[Plan] the embedding is an fp32 lookup on the CPU, got " +
                              json_text(v));
      continue;
    }
    const OpClass c = op_class_from_name(op);
    // Plans written before placement existed said "fp32" for every float class: keep the
    // preset's placement for them.
    if (c != OpClass::Linear && v == "fp32") continue;
    if (c == OpClass::Linear) {
      json pl = json::object();
      if (v.contains("processor")) pl["processor"] = v["processor"];
      if (v.contains("format")) pl["format"] = v["format"];
      if (!pl.empty()) apply_placement_entry(plan, c, pl);
    } else {
      apply_placement_entry(plan, c, v);
    }
  }
}

// A number if the text is one (an integer if it parses fully as one: "64"; else a decimal:
// ".5", "1e-3"), else the text itself (string options such as weights=...); from_json checks the
// type against the option's default. A number that does not fit (1e400, 2^64) or is not finite
// is an error naming it, not a string.
json parse_scalar(const std::string& key, const std::string& v) {
  const char *b = v.data(), *e = v.data() + v.size();
  if (e - b > 1 && *b == '+' && b[1] != '-') ++b;  // "+0.5" as stod read it
  int64_t i = 0;
  const auto ri = std::from_chars(b, e, i);
  if (ri.ptr == e && ri.ec == std::errc()) return i;
  double d = 0;
  const auto rd = std::from_chars(b, e, d);
  if (rd.ptr != e || v.empty()) return v;
  if (ri.ptr == e || rd.ec != std::errc() || !std::isfinite(d))
    throw InvalidArgument("[Plan] option " + key + "=" + v + " is out of range (" +
                          (ri.ptr == e ? "integers fit in 64 bits" : "numbers must be finite") +
                          ")");
  return d;
}

// A value of the "attention" key that names a scheme rather than a placement. A bare format
// name is a placement, as for every other op class: "attention=fp32" next to "norm=fp32" means
// the fp32 format, not the dense scheme "fp32" (the default; {"kind": "fp32"} names it).
bool is_attention_value(const json& v) {
  if (v.is_object()) return v.contains("kind");
  if (!v.is_string()) return false;
  const auto t = v.get<std::string>();
  if (soc::find_dtype(t)) return false;
  return attention::is_scheme_name(t.substr(0, t.find(':')));
}

// The plan's attention scheme from its "attention" value and the top-level attention options
// ("fp32:attention=sparse,keep=0.3").
attention::AttentionScheme attention_scheme(const json& spec, const json& options) {
  if (spec.is_null() && options.empty()) return {};
  if (spec.is_null())
    throw InvalidArgument("[Plan] option '" + options.begin().key() +
                          "' belongs to an attention scheme: name one, e.g. "
                          "attention=shadow-attn," +
                          options.begin().key() + "=...");
  json obj =
      spec.is_string() ? attention::AttentionScheme::text_to_json(spec.get<std::string>()) : spec;
  for (const auto& [k, v] : options.items()) obj[k] = v;
  return attention::AttentionScheme::from_json(obj);
}

constexpr std::array<std::pair<const char*, sched::PartitionSpace>, 8> kPartitionModes = {{
    {"solver", sched::PartitionSpace::Tensor},
    {"row", sched::PartitionSpace::Row},
    {"seq", sched::PartitionSpace::Seq},
    {"hybrid", sched::PartitionSpace::Hybrid},
    {"layer", sched::PartitionSpace::Layer},
    {"padding", sched::PartitionSpace::NpuPadding},
    {"pipe", sched::PartitionSpace::NpuPipe},
    {"online", sched::PartitionSpace::NpuOnline},
}};

std::string partition_modes() {
  std::string s = "none";
  for (const auto& [n, _] : kPartitionModes) s += std::string(", ") + n;
  return s;
}

std::string text_of(const json& v, const std::string& key) {
  if (!v.is_string())
    throw InvalidArgument("[Plan] '" + key + "' must be a name, got " + json_text(v));
  return v.get<std::string>();
}

// "solver" or {"mode": "row", "partner": "cpu", "npu_share": 0.5} into `spec`.
void apply_partition(PartitionSpec& spec, const json& v) {
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) {
      if (k == "mode") apply_partition(spec, x);
      else if (k == "partner") spec.partner = soc::processor_from_name(text_of(x, "partner"));
      else if (k == "npu_share") {
        if (!x.is_number() || !(x.get<double>() >= 0.0 && x.get<double>() <= 1.0))
          throw InvalidArgument("[Plan] npu_share must be a number in [0, 1], got " + json_text(x));
        spec.npu_share = x.get<double>();
      } else {
        throw InvalidArgument("[Plan] 'partition' has no field '" + k +
                              "' (mode, partner, npu_share)");
      }
    }
    return;
  }
  const std::string mode = text_of(v, "partition");
  if (mode == "none") {
    spec.space.reset();
    return;
  }
  for (const auto& [n, space] : kPartitionModes)
    if (mode == n) {
      spec.space = space;
      return;
    }
  throw InvalidArgument("[Plan] unknown partition '" + mode + "' (known: " + partition_modes() +
                        ")");
}

// A linear processes its format on a processor: the NPU's partner must run the linears' format.
soc::Processor default_partner(const LinearScheme& s) {
  return Plan::can_run(soc::Processor::Gpu, Plan::linear_format(s)) ? soc::Processor::Gpu
                                                                    : soc::Processor::Cpu;
}

// llm.npu decodes on the CPU (seed 001 §4: "utilizes the MLLM CPU backend for decoding"), and
// EdgeFlow is compared with it so (seed 004 §5.5.1): plans whose linears a static NPU graph
// runs decode on the CPU unless they say otherwise.
std::optional<soc::Processor> default_decode(const std::array<OpPlacement, kNumOpClasses>& p) {
  if (p[static_cast<size_t>(OpClass::Linear)].processor == soc::Processor::Npu)
    return soc::Processor::Cpu;
  return std::nullopt;
}

// The linear op of a site as the block names it ("qkv" ... "down"), and back.
int linear_site_of(const std::string& op) {
  std::string known;
  for (const BlockOpInfo& info : all_block_ops()) {
    if (!info.site) continue;
    if (op == info.name) return static_cast<int>(*info.site);
    known += (known.empty() ? "" : ", ") + std::string(info.name);
  }
  throw InvalidArgument("[Plan] partitions: '" + op + "' is not a linear (known: " + known + ")");
}

// Solved partitions, shared by every plan and engine: (device, characterization, sync, space,
// partner, share, decode, linear shape) -> partition.
struct PartitionCache {
  std::mutex mu;
  std::map<std::string, sched::MatmulPartition> solved;
};
PartitionCache& partition_cache() {
  static PartitionCache c;
  return c;
}

}  // namespace

std::string PartitionSpec::mode() const {
  if (!space) return "none";
  for (const auto& [n, s] : kPartitionModes)
    if (s == *space) return n;
  return "?";
}

json PartitionSpec::to_json() const {
  json j = {{"mode", mode()}};
  if (partner) j["partner"] = soc::processor_name(*partner);
  if (npu_share) j["npu_share"] = *npu_share;
  return j;
}

std::vector<std::string> Plan::hetero_engines() {
  return {"gpu-only",           "npu-padding",  "npu-pipe",
          "npu-online-prepare", "hetero-layer", "hetero-tensor"};
}

std::shared_ptr<const soc::DeviceProfile> Plan::device_profile() const {
  if (device_ptr) return device_ptr;
  return soc::load_device(device.empty() ? soc::kDefaultDevice : device);
}

Plan Plan::on_device(std::shared_ptr<const soc::DeviceProfile> d) const {
  if (!d) throw InvalidArgument("[Plan.on_device] no device profile given");
  if (!device.empty() && device != d->name() && device_profile()->name() != d->name())
    throw InvalidArgument("[Plan] '" + name + "' is planned for device '" + device + "', not '" +
                          d->name() + "' (drop device=, or use that device)");
  Plan p = *this;
  p.device = d->name();
  p.device_ptr = std::move(d);
  return p;
}

soc::Processor Plan::partition_partner() const {
  return partition.partner.value_or(default_partner(linear));
}

sched::PartitionRules Plan::partition_rules(bool decode, int64_t rows) const {
  sched::PartitionRules r = sched::PartitionRules::from_profile(*device_profile());
  r.partner = partition_partner();
  return decode ? r.for_rows(rows) : r;
}

soc::OpDesc Plan::linear_desc(const ModelConfig& c, LinearSite site, int64_t rows) const {
  soc::OpDesc o;
  o.name = socllm::linear_op(site).name;
  o.op_class = op_class_name(OpClass::Linear);
  o.kind = soc::OpKind::MatMul;
  o.dtype = linear_format(linear);
  o.m = rows;
  o.k = linear_site_width(c, site);
  o.n = linear_out_width(c, site);
  // Per-group quantized activations run on an NPU as one sub-matmul per group plus a float
  // reduction (seed 001 §2.3, Fig. 3b/4).
  const int64_t g =
      linear.activations == quant::ActFormat::Int8DynamicPerGroup ? linear.group_size : 0;
  o.groups = g > 0 ? std::max<int64_t>(1, (o.k + g - 1) / g) : 1;
  std::vector<int64_t> tensor_rows;
  for (const auto& t : fused_tensors(c, site)) tensor_rows.push_back(t.rows);
  o.weight_bytes = quant::stored_weight_bytes(linear, o.n, o.k, tensor_rows,
                                              site == LinearSite::AttnIn && c.qkv_bias);
  o.activation_bytes = rows * (o.k + o.n) * soc::dtype_bytes(o.dtype);
  return o;
}

std::optional<sched::MatmulPartition> Plan::partition_for(const ModelConfig& c, LinearSite site,
                                                          int64_t rows, bool decode) const {
  if (auto it = partitions.find({static_cast<int>(site), decode, rows}); it != partitions.end())
    return it->second;
  if (partition.none()) return std::nullopt;
  const soc::OpDesc lin = linear_desc(c, site, rows);
  const soc::Processor partner = partition_partner();
  const std::string key = std::to_string(device_profile()->fingerprint()) + "|" + characterization +
                          "|" + partition.to_json().dump() + "|" + soc::processor_name(partner) +
                          "|" + std::to_string(fast_sync) + "|" + std::to_string(decode) + "|" +
                          lin.to_json().dump();
  {
    std::lock_guard lock(partition_cache().mu);
    if (auto it = partition_cache().solved.find(key); it != partition_cache().solved.end())
      return it->second;
  }
  const sched::PartitionRules rules = partition_rules(decode, rows);
  sched::MatmulPartition p;
  if (partition.npu_share && partition.space == sched::PartitionSpace::Row) {
    p = sched::row_cut_share(rows, lin.n, *partition.npu_share, rules);
  } else {
    const soc::CostModel cost =
        soc::timing_cost_model(*device_profile(), characterization, fast_sync, decode);
    p = sched::solve_partition(lin, rules, sched::PartitionCosts::of(cost, partner),
                               *partition.space)
            .partition;
  }
  std::lock_guard lock(partition_cache().mu);
  return partition_cache().solved.emplace(key, std::move(p)).first->second;
}

Plan Plan::solved(const ModelConfig& c, const std::vector<int64_t>& prefill_rows,
                  bool decode) const {
  Plan out = *this;
  auto write = [&](const Plan& phase_plan, int64_t rows, bool dec) {
    for (int s = 0; s < kNumLinearSites; ++s)
      if (auto p = phase_plan.partition_for(c, static_cast<LinearSite>(s), rows, dec))
        out.partitions[{s, dec, rows}] = *p;
  };
  for (int64_t r : prefill_rows) {
    if (r <= 0) throw InvalidArgument("[Plan.solved] rows must be > 0, got " + std::to_string(r));
    write(*this, r, false);
  }
  if (decode) write(for_decode(), 1, true);
  return out;
}

Plan Plan::for_decode() const {
  Plan p = *this;
  p.chunk_len = 0;
  p.attention = {};  // decoding steps run full attention (seed 000 §4)
  OpPlacement& at = p.placement[static_cast<size_t>(OpClass::Attention)];
  if (at.format == soc::DType::Int8) at = {soc::Processor::Cpu, soc::DType::Fp32};  // npu-int8's
  if (decode_processor) {
    p.partition = {};  // a decoding step on one processor runs its linears whole
    p.partitions.clear();
    for (int i = 0; i < kNumOpClasses; ++i) {
      OpPlacement& o = p.placement[static_cast<size_t>(i)];
      o.processor = *decode_processor;
      const auto c = static_cast<OpClass>(i);
      if (c != OpClass::Linear && c != OpClass::Shadow && *decode_processor != soc::Processor::Cpu)
        o.format = soc::DType::Fp16;
    }
    if (!can_run(*decode_processor, linear_format(linear)))
      throw InvalidArgument(
          "[Plan] '" + name + "': decode=" + soc::processor_name(*decode_processor) +
          " cannot run its " + soc::dtype_name(linear_format(linear)) + " linears");
  }
  p.validate_placement();
  return p;
}

std::vector<std::string> Plan::calibration_steps() const {
  // The same predicates the engine checks before it builds a plan's linears and attention.
  std::vector<std::string> steps;
  if (linear.needs_calibration()) steps.push_back("act-scales");
  if (linear.needs_outlier_calibration()) steps.push_back("outliers");
  if (linear.needs_smoothing_calibration()) steps.push_back("smoothing");
  if (linear.channel_bits && linear.channel_bits->stored) steps.push_back("bitwidths");
  if (linear.needs_hessians()) steps.push_back("gptq");
  if (attention.needs_qk_scales()) steps.push_back("qk-scales");
  if (attention.needs_head_importance()) steps.push_back("head-importance");
  return steps;
}

bool Plan::can_run(soc::Processor p, soc::DType f) {
  switch (p) {
    // The NPU (Hexagon HTP) computes INT8/INT16 and FP16, not FP32 (seed 001 §2.3, seed 002 §3);
    // the mobile GPU runs FP16/FP32 kernels (seed 002 §3.1; no GPU INT8 path is modelled).
    case soc::Processor::Npu: return f != soc::DType::Fp32;
    case soc::Processor::Gpu: return f != soc::DType::Int8;
    case soc::Processor::Cpu: return true;
    case soc::Processor::Io:
    case soc::Processor::CpuAux: return false;  // cold-start resources (soc.h)
  }
  return false;
}

soc::DType Plan::linear_format(const LinearScheme& s) {
  switch (s.activations) {
    case ActFormat::F32: return soc::DType::Fp32;
    case ActFormat::F16: return soc::DType::Fp16;
    default: return soc::DType::Int8;
  }
}

void Plan::validate_placement() const {
  for (int i = 0; i < kNumOpClasses; ++i) {
    const auto c = static_cast<OpClass>(i);
    const OpPlacement& p = placement[static_cast<size_t>(i)];
    const bool npu_attention = attention.computes_int8();
    if (c == OpClass::Attention && npu_attention != (p.format == soc::DType::Int8))
      throw InvalidArgument("[Plan] '" + name + "': attention " +
                            (npu_attention
                                 ? "npu-int8 computes in int8 on the npu, got " +
                                       std::string(soc::dtype_name(p.format))
                                 : std::string("in unknown mode int8 (its formats: fp16, fp32; "
                                               "int8 attention is the scheme npu-int8)")));
    if (c == OpClass::Attention && attention.is_sparse() && p.processor == soc::Processor::Npu)
      throw InvalidArgument("[Plan] '" + name + "': attention " + attention.label() +
                            " selects keys per row at run time, which a static NPU graph cannot "
                            "(seed 000 §2.2): place it on the cpu or gpu");
    if (is_float_class(c) && p.format == soc::DType::Int8 && !(c == OpClass::Attention))
      throw InvalidArgument("[Plan] '" + name + "': unknown mode int8 for op class '" +
                            op_class_name(c) + "' (its formats: fp16, fp32)");
    if (c == OpClass::Shadow && p.format != soc::DType::Fp32)
      throw InvalidArgument("[Plan] '" + name +
                            "': the shadow outlier part computes in fp32 (its "
                            "values are the outliers fp16 would not hold), got " +
                            soc::dtype_name(p.format));
    if (!can_run(p.processor, p.format))
      throw InvalidArgument("[Plan] '" + name + "': op class '" + op_class_name(c) + "' in " +
                            soc::dtype_name(p.format) + " cannot run on the " +
                            soc::processor_name(p.processor) +
                            " (the NPU runs int8 and fp16 ops; give the class format fp16, or "
                            "another processor)");
    if (p.processor != soc::Processor::Npu) continue;
    if (c == OpClass::Shadow && linear.shadow)
      throw InvalidArgument("[Plan] '" + name +
                            "': op class 'shadow' (the float outlier part, "
                            "gathered per input at run time) cannot run on a static NPU graph");
    if (c == OpClass::Linear &&
        (linear.activations == ActFormat::Int8DynamicPerRow || linear.outlier_threshold))
      throw InvalidArgument("[Plan] '" + name + "': linears with activations '" +
                            quant::act_format_name(linear.activations) +
                            (linear.outlier_threshold ? "' and float outlier columns" : "'") +
                            " cannot run on the npu: a static graph fixes its scales and shapes "
                            "when built (seed 001 §2.3)");
  }
  if (decode_processor && !can_run(*decode_processor, linear_format(linear)))
    throw InvalidArgument("[Plan] '" + name +
                          "': decode=" + soc::processor_name(*decode_processor) +
                          " cannot run its " + soc::dtype_name(linear_format(linear)) + " linears");
  // How the linears are cut (seed 002 §4.1): between the NPU and its partner, for schemes whose
  // output blocks depend on their rows alone.
  if (partition.none() && partitions.empty()) return;
  const std::string cut =
      partition.none() ? std::string("a written partition") : "partition=" + partition.mode();
  const OpPlacement& lin = at(OpClass::Linear);
  if (lin.processor != soc::Processor::Npu)
    throw InvalidArgument("[Plan] '" + name + "': " + cut +
                          " cuts linears between the npu and a partner, and the plan places "
                          "them on the " +
                          soc::processor_name(lin.processor) + " (linear=npu)");
  const soc::Processor partner = partition_partner();
  if (partner != soc::Processor::Gpu && partner != soc::Processor::Cpu)
    throw InvalidArgument("[Plan] '" + name +
                          "': the npu shares linears with the gpu or the cpu, "
                          "got partner=" +
                          soc::processor_name(partner));
  if (!can_run(partner, lin.format))
    throw InvalidArgument("[Plan] '" + name + "': " + cut + " puts parts of the " +
                          soc::dtype_name(lin.format) + " linears on the " +
                          soc::processor_name(partner) + ", which cannot run " +
                          soc::dtype_name(lin.format) + " (partner=cpu)");
  if (linear.shadow || linear.outlier_threshold)
    throw InvalidArgument("[Plan] '" + name + "': " + cut + " computes each block of a linear " +
                          "from its rows alone, and " +
                          (linear.shadow ? "shadow outliers" : "LLM.int8's outlier columns") +
                          " are gathered over a whole sequence (partition=none)");
  if (partition.npu_share && partition.space != sched::PartitionSpace::Row)
    throw InvalidArgument("[Plan] '" + name +
                          "': npu_share fixes a row cut (partition=row), "
                          "not " +
                          cut);
  for (const auto& [key, part] : partitions)
    for (const auto& q : part.parts)
      if (q.processor != soc::Processor::Npu && q.processor != partner)
        throw InvalidArgument("[Plan] '" + name + "': a written partition of " +
                              socllm::linear_op(static_cast<LinearSite>(std::get<0>(key))).name +
                              " has a part on the " + soc::processor_name(q.processor) +
                              ", the plan's partner is the " + soc::processor_name(partner));
}

Plan Plan::placed(OpClass c, soc::Processor processor, std::optional<soc::DType> format) const {
  Plan p = *this;
  OpPlacement& o = p.placement[static_cast<size_t>(c)];
  o.processor = processor;
  if (c == OpClass::Linear) o.format = linear_format(linear);
  else if (format) o.format = *format;
  p.validate_placement();
  return p;
}

Plan Plan::all_on(soc::Processor processor) const {
  Plan p = *this;
  p.partition = {};  // one processor: the linears run whole
  p.partitions.clear();
  for (int i = 0; i < kNumOpClasses; ++i) {
    // The float outlier part is what a static NPU graph cannot run: it stays where it was.
    if (static_cast<OpClass>(i) == OpClass::Shadow && processor == soc::Processor::Npu) continue;
    OpPlacement& o = p.placement[static_cast<size_t>(i)];
    o.processor = processor;
    const auto c = static_cast<OpClass>(i);
    if (is_float_class(c) && c != OpClass::Shadow && processor != soc::Processor::Cpu)
      o.format = soc::DType::Fp16;
  }
  p.validate_placement();
  return p;
}

std::vector<std::string> Plan::known() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.emplace_back(p.name);
  return out;
}

namespace {
// The plan parts that compose with every preset and come from a paper (issue 39).
constexpr std::pair<const char*, const char*> kPartDescriptions[] = {
    {"rotate",
     "rotate=fold|hadamard|random: the residual stream rotated by an orthogonal Q folded into the "
     "embeddings, linears and LM head, RMSNorm gains folded into the reading linears; the same "
     "function in fp32, outlier channels spread (QuaRot, Ashkboos et al. 2024 §4.1; random: "
     "SpinQuant's Haar start, Liu et al. 2024); rotate_seed=N"},
    {"rotate_down",
     "rotate_down=hadamard: an online Hadamard transform of the down projection's input, timed "
     "as op down_rotate with the activation (QuaRot §4.2)"},
    {"rotate_heads",
     "rotate_heads=hadamard: each head's values rotated by a head_dim Hadamard folded into v_proj "
     "and o_proj (QuaRot §4.2, without its online cross-head part)"},
    {"act_percentile",
     "act_percentile=<p>: a static per-tensor activation scale mapping the calibrated p-th "
     "percentile of |x| to 127 instead of the maximum (the percentile rule of llm.npu's outlier "
     "thresholds, seed 001 §3.3, applied to the whole input)"},
    {"residual_scale",
     "residual_scale=<c>|auto: the residual stream scaled by c, folded into the embeddings and the "
     "outputs the residual adds, the stream's norms taking eps c^2: the same function, fp16 float "
     "ops without overflow (issue 39; auto: a power of two from the calibrated stream maximum)"},
    {"rounding",
     "rounding=gptq: weight integers chosen by GPTQ's error compensation against the calibrated "
     "input Hessians (Frantar et al. 2023, Algorithm 1; calibration step gptq); gptq_damp, "
     "gptq_block, gptq_order=natural|act"},
};
}  // namespace

std::string Plan::describe(const std::string& name) {
  if (name == "custom") return "a plan composed from 'ops' (see Plan JSON form)";
  for (const auto& [part, text] : kPartDescriptions)
    if (name == part) return text;
  return preset_or_throw(name).description;
}

std::vector<std::string> Plan::parts() {
  std::vector<std::string> out;
  for (const auto& [part, text] : kPartDescriptions) out.push_back(part);
  return out;
}

std::string Plan::known_list() {
  std::string list;
  for (const auto& p : presets()) list += (list.empty() ? "" : ", ") + std::string(p.name);
  return "(known plans: " + list + ", custom)";
}

Plan Plan::from_name(const std::string& name) { return from_json({{"name", name}}); }

Plan Plan::parse(const std::string& text) {
  if (!text.empty() && text.front() == '{') {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw InvalidArgument("[Plan] invalid plan JSON: " + std::string(e.what()));
    }
    return from_json(j);
  }
  const auto kv = split_key_values(text, "[Plan]");
  json j = {{"name", kv.head}};
  for (const auto& [key, value] : kv.items) j[key] = parse_scalar(key, value);
  return from_json(j);
}

namespace {

// "partitions": [{"op", "phase", "partition"}] (or the earlier {"qkv": partition}, prefill).
void apply_partitions(Plan& plan, const json& v) {
  auto add = [&](const std::string& op, const json& pj, bool decode) {
    auto part = sched::MatmulPartition::from_json(pj);
    sched::validate(part, sched::PartitionRules::structural());
    plan.partitions[{linear_site_of(op), decode, part.rows}] = std::move(part);
  };
  if (v.is_object()) {
    for (const auto& [op, pj] : v.items()) add(op, pj, false);
    return;
  }
  if (!v.is_array())
    throw InvalidArgument(
        "[Plan] 'partitions' must be a list of {\"op\", \"phase\", \"partition\"}, got " +
        json_text(v));
  for (const auto& e : v) {
    if (!e.is_object() || !e.contains("op") || !e.contains("partition"))
      throw InvalidArgument("[Plan] a 'partitions' entry needs 'op' and 'partition', got " +
                            json_text(e));
    const std::string phase = e.contains("phase") ? text_of(e["phase"], "phase") : "prefill";
    if (phase != "prefill" && phase != "decode")
      throw InvalidArgument("[Plan] a partition's phase is prefill or decode, got '" + phase + "'");
    add(text_of(e["op"], "op"), e["partition"], phase == "decode");
  }
}

// Plan-level parts (not op classes, not preset options), applied to `plan`; false if `key` is
// none of them.
bool apply_plan_part(Plan& plan, const std::string& key, const json& v,
                     std::optional<std::optional<soc::Processor>>& decode) {
  if (key == "partition") apply_partition(plan.partition, v);
  else if (key == "partner" || key == "npu_share") apply_partition(plan.partition, {{key, v}});
  else if (key == "partitions") apply_partitions(plan, v);
  else if (key == "device") plan.device = text_of(v, key);
  else if (key == "characterization") plan.characterization = text_of(v, key);
  else if (key == "sync") {
    const std::string s = text_of(v, key);
    if (s != "fast" && s != "conventional")
      throw InvalidArgument("[Plan] sync must be fast or conventional, got '" + s + "'");
    plan.fast_sync = s == "fast";
  } else if (key == "decode") {
    const std::string s = text_of(v, key);
    decode = s == "same" ? std::optional<soc::Processor>() : soc::processor_from_name(s);
  } else if (key == "residual_scale") {
    if (v.is_string() && v.get<std::string>() == "auto") {
      plan.residual_scale_auto = true;
      plan.residual_scale.reset();
    } else if (v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>())) {
      plan.residual_scale = v.get<double>();
      plan.residual_scale_auto = false;
    } else {
      throw InvalidArgument("[Plan] residual_scale must be auto or a number > 0, got " +
                            json_text(v));
    }
  } else if (key == "rotate") {
    const std::string s = text_of(v, key);
    if (s == "none") plan.rotation.residual.reset();
    else plan.rotation.residual = quant::rotation_from_name(s);
  } else if (key == "rotate_seed") {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw InvalidArgument("[Plan] rotate_seed must be an integer >= 0, got " + json_text(v));
    plan.rotation.seed = v.get<uint64_t>();
  } else if (key == "rotate_down" || key == "rotate_heads") {
    const std::string s = text_of(v, key);
    if (s != "none" && s != "hadamard")
      throw InvalidArgument("[Plan] " + key + " must be hadamard or none, got '" + s + "'");
    (key == "rotate_down" ? plan.rotation.online_down : plan.rotation.heads) = s == "hadamard";
  } else if (key == "lm_head_weights") {
    const std::string s = text_of(v, key);
    if (s != "fp32" && s != "linear")
      throw InvalidArgument("[Plan] lm_head_weights must be fp32 or linear, got '" + s + "'");
    plan.lm_head_linear = s == "linear";
  } else {
    return false;
  }
  return true;
}

// The linear scheme's parts: rounding=nearest|gptq, gptq_damp, gptq_block,
// gptq_order=natural|act; act_percentile=<p>.
constexpr std::array<const char*, 5> kLinearParts = {"rounding", "gptq_damp", "gptq_block",
                                                     "gptq_order", "act_percentile"};
bool is_linear_part(const std::string& key) {
  return std::find(kLinearParts.begin(), kLinearParts.end(), key) != kLinearParts.end();
}

void apply_linear_parts(LinearScheme& s, const json& parts) {
  for (const auto& [key, v] : parts.items()) {
    if (key == "act_percentile") {
      if (!v.is_number())
        throw InvalidArgument("[Plan] act_percentile must be a number, got " + json_text(v));
      s.act_percentile = v.get<double>();
    } else if (key == "rounding") {
      s.rounding = quant::rounding_from_name(text_of(v, key));
    } else if (key == "gptq_damp") {
      if (!v.is_number())
        throw InvalidArgument("[Plan] gptq_damp must be a number, got " + json_text(v));
      s.gptq.damp = v.get<double>();
    } else if (key == "gptq_block") {
      if (!v.is_number_integer())
        throw InvalidArgument("[Plan] gptq_block must be an integer, got " + json_text(v));
      s.gptq.block = v.get<int64_t>();
    } else {
      s.gptq.act_order = quant::GptqOptions::act_order_from_name(text_of(v, key));
    }
  }
  const size_t others = parts.contains("rounding") + parts.contains("act_percentile");
  if (s.rounding != quant::Rounding::Gptq && parts.size() > others)
    throw InvalidArgument("[Plan] gptq_damp, gptq_block and gptq_order need rounding=gptq");
}

constexpr const char* kPlanParts =
    "partition, partner, npu_share, partitions, device, characterization, sync, decode, "
    "lm_head_weights, rotate, rotate_seed, rotate_down, rotate_heads, rounding, gptq_damp, "
    "gptq_block, gptq_order, act_percentile, residual_scale";

}  // namespace

Plan Plan::from_json(const json& j_in) {
  if (!j_in.is_object() || !j_in.contains("name") || !j_in["name"].is_string())
    throw InvalidArgument("[Plan.from_json] a plan is an object with a string 'name', got " +
                          json_text(j_in) + " " + known_list());
  Plan plan;
  plan.name = j_in["name"].get<std::string>();
  const bool custom = plan.name == "custom";
  const Preset* preset = custom ? nullptr : &preset_or_throw(plan.name);
  if (preset) plan.options = json::parse(preset->options);
  // The preset's plan-level parts first, what the plan gives over them.
  json j = preset && preset->settings ? json::parse(preset->settings) : json::object();
  if (preset && preset->partition) j["partition"] = preset->partition;
  for (const auto& [k, v] : j_in.items()) j[k] = v;
  json placement_keys = json::object();  // op class -> placement, applied after the scheme
  json attention_spec;                   // the attention scheme, if given
  json attention_options = json::object();
  std::optional<std::optional<soc::Processor>> decode;  // unset: the placement's default
  const auto attention_option_names = attention::AttentionScheme::option_names();
  json linear_parts = json::object();  // the linear scheme's parts, applied to it below
  for (const auto& [key, v] : j.items()) {
    if (key == "name" || key == "ops") continue;
    if (is_linear_part(key)) {
      linear_parts[key] = v;
      continue;
    }
    // "attention" is a scheme ("shadow-attn:keep=0.2", {"kind": ...}) or a placement ("gpu").
    if (key == "attention" && is_attention_value(v)) {
      attention_spec = v;
      continue;
    }
    if (std::find(attention_option_names.begin(), attention_option_names.end(), key) !=
            attention_option_names.end() &&
        !(preset && plan.options.contains(key))) {
      attention_options[key] = v;
      continue;
    }
    if (apply_plan_part(plan, key, v, decode)) continue;
    if (key == "placement") {
      if (!v.is_object())
        throw InvalidArgument("[Plan] 'placement' must map op classes to processors, got " +
                              json_text(v));
      for (const auto& [c, pv] : v.items()) placement_keys[c] = pv;
      continue;
    }
    if (is_op_class(key)) {
      placement_keys[key] = v;
      continue;
    }
    if (key == "chunk_len") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        throw InvalidArgument("[Plan] chunk_len must be an integer >= 0, got " + json_text(v));
      plan.chunk_len = v.get<int64_t>();
    } else if (preset && plan.options.contains(key) && plan.options[key].is_string() &&
               !number_for_calibrated(plan.options[key], v)) {
      if (!v.is_string())
        throw InvalidArgument("[Plan] option '" + key + "' of plan '" + plan.name +
                              "' must be a string, got " + json_text(v));
      plan.options[key] = v;
    } else if (preset && plan.options.contains(key)) {
      if (number_for_calibrated(plan.options[key], v)) {
        plan.options[key] = v;
        continue;
      }
      if (!v.is_number())
        throw InvalidArgument("[Plan] option '" + key + "' of plan '" + plan.name +
                              "' must be a number, got " + json_text(v));
      if (plan.options[key].is_number_integer() && !v.is_number_integer())
        throw InvalidArgument("[Plan] option '" + key + "' of plan '" + plan.name +
                              "' must be an integer, got " + json_text(v));
      plan.options[key] = v;
    } else {
      std::string allowed = "chunk_len, ops, placement, " + op_class_list() + ", " + kPlanParts;
      for (const auto& [k, _] : plan.options.items()) allowed += ", " + k;
      throw InvalidArgument("[Plan] plan '" + plan.name + "' has no option '" + key +
                            "' (its options: " + allowed + ")");
    }
  }
  if (custom) {
    if (!j.contains("ops"))
      throw InvalidArgument("[Plan] plan 'custom' needs 'ops' naming how each operator class runs");
    plan.linear = ops_linear_scheme(j["ops"]).value_or(LinearScheme{});
    apply_linear_parts(plan.linear, linear_parts);
  } else {
    plan.linear = preset->linear(plan.options);
    apply_linear_parts(plan.linear, linear_parts);
    plan.linear.validate();
    if (j.contains("ops")) {
      const auto given = ops_linear_scheme(j["ops"]);
      if (given && given->to_json() != plan.linear.to_json())
        throw InvalidArgument("[Plan] 'ops' differ from what plan '" + plan.name +
                              "' runs; name a composed plan 'custom'");
    }
  }
  plan.attention = attention_scheme(attention_spec, attention_options);
  const auto kind = plan.rotation.residual;
  if (plan.rotation.seed != 0 && (!kind || *kind == quant::RotationKind::Fold))
    throw InvalidArgument("[Plan] rotate_seed=" + std::to_string(plan.rotation.seed) +
                          " seeds no rotation: give rotate=hadamard or rotate=random");
  // Placed first, then cut: a partition is validated against the final placement.
  const PartitionSpec partition = plan.partition;
  const auto partitions = plan.partitions;
  plan.partition = {};
  plan.partitions.clear();
  plan.placement = default_placement(plan.linear);
  if (plan.attention.computes_int8())
    plan.placement[static_cast<size_t>(OpClass::Attention)] = {soc::Processor::Npu,
                                                               soc::DType::Int8};
  if (preset && preset->placement) {
    const json preset_placement = json::parse(preset->placement);
    for (const auto& [c, v] : preset_placement.items())
      apply_placement_entry(plan, op_class_from_name(c), v);
  }
  if (j.contains("ops")) apply_ops_placement(plan, j["ops"]);
  for (const auto& [c, v] : placement_keys.items())
    apply_placement_entry(plan, op_class_from_name(c), v);
  plan.decode_processor = decode ? *decode : default_decode(plan.placement);
  plan.partition = partition;
  plan.partitions = partitions;
  plan.validate_placement();
  return plan;
}

Plan Plan::with_partition(const std::string& op, const sched::MatmulPartition& p, bool decode,
                          const sched::PartitionRules& rules) const {
  sched::validate(p, rules);
  Plan out = *this;
  out.partitions[{linear_site_of(op), decode, p.rows}] = p;
  out.validate_placement();
  return out;
}

json Plan::to_json() const {
  json j = {{"name", name}};
  for (const auto& [k, v] : options.items()) j[k] = v;
  j["chunk_len"] = chunk_len;
  if (!attention.is_fp32()) j["attention"] = attention.to_json();
  j["partition"] = partition.to_json();
  if (!partitions.empty()) {
    json parts = json::array();
    for (const auto& [key, part] : partitions)
      parts.push_back({{"op", socllm::linear_op(static_cast<LinearSite>(std::get<0>(key))).name},
                       {"phase", std::get<1>(key) ? "decode" : "prefill"},
                       {"partition", part.to_json()}});
    j["partitions"] = parts;
  }
  j["device"] = device;
  j["characterization"] = characterization;
  j["sync"] = fast_sync ? "fast" : "conventional";
  j["decode"] = decode_processor ? soc::processor_name(*decode_processor) : "same";
  j["lm_head_weights"] = lm_head_linear ? "linear" : "fp32";
  if (linear.act_percentile) j["act_percentile"] = *linear.act_percentile;
  if (residual_scale_auto) j["residual_scale"] = "auto";
  else if (residual_scale) j["residual_scale"] = *residual_scale;
  if (linear.rounding == quant::Rounding::Gptq) {
    j["rounding"] = quant::rounding_name(linear.rounding);
    j["gptq_damp"] = linear.gptq.damp;
    j["gptq_block"] = linear.gptq.block;
    j["gptq_order"] = linear.gptq.order_name();
  }
  if (!rotation.none()) {
    j["rotate"] = rotation.residual ? quant::rotation_name(*rotation.residual) : "none";
    j["rotate_seed"] = rotation.seed;
    j["rotate_down"] = rotation.online_down ? "hadamard" : "none";
    j["rotate_heads"] = rotation.heads ? "hadamard" : "none";
  }
  json ops = json::object();
  for (int i = 0; i < kNumOpClasses; ++i) {
    const OpPlacement& p = placement[static_cast<size_t>(i)];
    json e = {{"processor", soc::processor_name(p.processor)},
              {"format", soc::dtype_name(p.format)}};
    if (static_cast<OpClass>(i) == OpClass::Linear) {
      json lin = linear.to_json();
      lin.update(e);
      e = lin;
    }
    ops[op_class_name(static_cast<OpClass>(i))] = e;
  }
  j["ops"] = ops;
  return j;
}

}  // namespace socllm
