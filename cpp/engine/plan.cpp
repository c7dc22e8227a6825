#include "socllm/plan.h"

#include "socllm/block.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <functional>

#include "socllm/core.h"

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
};

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
       R"({"bits": 5.0, "alpha": "calibrated", "beta": 1.0, "output_quant": "int8",
           "allocation": "greedy", "metric": "closed-form", "bitwidths": "per-tensor",
           "fold": 1})",
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
       R"({"group_size": 32})",
       [](const json& o) {
         return scheme(WeightFormat::Int4, Granularity::PerGroup, ActFormat::F16,
                       o["group_size"].get<int64_t>());
       }},
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

constexpr std::array<const char*, kNumOpClasses> kOpClassNames = {
    "norm", "linear", "rope", "attention", "activation", "residual", "shadow", "lm_head"};

std::string known_op_classes() {
  std::string s;
  for (const char* n : kOpClassNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

bool is_float_class(OpClass c) { return c != OpClass::Linear; }

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
    bool is_processor = false;
    for (int i = 0; i < soc::kNumProcessors; ++i)
      is_processor |= t == soc::processor_name(static_cast<soc::Processor>(i));
    if (slash != std::string::npos) {
      proc = soc::processor_from_name(t.substr(0, slash));
      fmt = soc::dtype_from_name(t.substr(slash + 1));
    } else if (is_processor) {
      proc = soc::processor_from_name(t);
    } else {
      fmt = soc::dtype_from_name(t);
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
  for (const auto d : {soc::DType::Int8, soc::DType::Fp16, soc::DType::Fp32})
    if (t == soc::dtype_name(d)) return false;
  return quant::is_attention_kind(t.substr(0, t.find(':')));
}

// The plan's attention scheme from its "attention" value and the top-level attention options
// ("fp32:attention=sparse,keep=0.3").
quant::AttentionScheme attention_scheme(const json& spec, const json& options) {
  if (spec.is_null() && options.empty()) return {};
  if (spec.is_null())
    throw InvalidArgument("[Plan] option '" + options.begin().key() +
                          "' belongs to an attention scheme: name one, e.g. "
                          "attention=shadow-attn," +
                          options.begin().key() + "=...");
  json obj =
      spec.is_string() ? quant::AttentionScheme::text_to_json(spec.get<std::string>()) : spec;
  for (const auto& [k, v] : options.items()) obj[k] = v;
  return quant::AttentionScheme::from_json(obj);
}

}  // namespace

const char* op_class_name(OpClass c) { return kOpClassNames.at(static_cast<size_t>(c)); }

OpClass op_class_from_name(const std::string& s) {
  for (int i = 0; i < kNumOpClasses; ++i)
    if (s == kOpClassNames[static_cast<size_t>(i)]) return static_cast<OpClass>(i);
  throw InvalidArgument("[Plan] unknown op class '" + s + "' (known: " + known_op_classes() + ")");
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
    const bool npu_attention = attention.kind == quant::AttentionKind::NpuInt8;
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

std::string Plan::describe(const std::string& name) {
  if (name == "custom") return "a plan composed from 'ops' (see Plan JSON form)";
  return preset_or_throw(name).description;
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
// The linear op of a site as the block description names it ("qkv" ... "down").
std::string linear_op_name(int site) {
  for (const BlockOpInfo& info : decoder_block())
    if (info.site && static_cast<int>(*info.site) == site) return info.name;
  return "?";
}

int linear_site_of(const std::string& op) {
  std::string known;
  for (const BlockOpInfo& info : decoder_block()) {
    if (!info.site) continue;
    if (op == info.name) return static_cast<int>(*info.site);
    known += (known.empty() ? "" : ", ") + std::string(info.name);
  }
  throw InvalidArgument("[Plan] partitions: '" + op + "' is not a linear (known: " + known + ")");
}
}  // namespace

Plan Plan::from_json(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string())
    throw InvalidArgument("[Plan.from_json] a plan is an object with a string 'name', got " +
                          json_text(j) + " " + known_list());
  Plan plan;
  plan.name = j["name"].get<std::string>();
  const bool custom = plan.name == "custom";
  const Preset* preset = custom ? nullptr : &preset_or_throw(plan.name);
  if (preset) plan.options = json::parse(preset->options);
  json placement_keys = json::object();  // op class -> placement, applied after the scheme
  json attention_spec;                   // the attention scheme, if given
  json attention_options = json::object();
  for (const auto& [key, v] : j.items()) {
    if (key == "name" || key == "ops") continue;
    // "attention" is a scheme ("shadow-attn:keep=0.2", {"kind": ...}) or a placement ("gpu").
    if (key == "attention" && is_attention_value(v)) {
      attention_spec = v;
      continue;
    }
    const auto& names = quant::AttentionScheme::option_names();
    if (std::find(names.begin(), names.end(), key) != names.end() &&
        !(preset && plan.options.contains(key))) {
      attention_options[key] = v;
      continue;
    }
    if (key == "partitions") {
      if (!v.is_object())
        throw InvalidArgument("[Plan] 'partitions' must map linears to partitions, got " +
                              json_text(v));
      for (const auto& [op, pj] : v.items()) {
        const auto part = sched::MatmulPartition::from_json(pj);
        sched::validate(part, sched::PartitionRules::structural());
        plan.partitions[static_cast<size_t>(linear_site_of(op))] = part;
      }
      continue;
    }
    if (key == "placement") {
      if (!v.is_object())
        throw InvalidArgument("[Plan] 'placement' must map op classes to processors, got " +
                              json_text(v));
      for (const auto& [c, pv] : v.items()) placement_keys[c] = pv;
      continue;
    }
    if (std::find(kOpClassNames.begin(), kOpClassNames.end(), key) != kOpClassNames.end()) {
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
      std::string allowed = "chunk_len, ops, placement, " + known_op_classes();
      for (const auto& [k, _] : plan.options.items()) allowed += ", " + k;
      throw InvalidArgument("[Plan] plan '" + plan.name + "' has no option '" + key +
                            "' (its options: " + allowed + ")");
    }
  }
  if (custom) {
    if (!j.contains("ops"))
      throw InvalidArgument("[Plan] plan 'custom' needs 'ops' naming how each operator class runs");
    plan.linear = ops_linear_scheme(j["ops"]).value_or(LinearScheme{});
  } else {
    plan.linear = preset->linear(plan.options);
    plan.linear.validate();
    if (j.contains("ops")) {
      const auto given = ops_linear_scheme(j["ops"]);
      if (given && given->to_json() != plan.linear.to_json())
        throw InvalidArgument("[Plan] 'ops' differ from what plan '" + plan.name +
                              "' runs; name a composed plan 'custom'");
    }
  }
  plan.attention = attention_scheme(attention_spec, attention_options);
  plan.placement = default_placement(plan.linear);
  if (plan.attention.kind == quant::AttentionKind::NpuInt8)
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
  plan.validate_placement();
  return plan;
}

Plan Plan::with_partition(const std::string& op, const sched::MatmulPartition& p,
                          const sched::PartitionRules& rules) const {
  sched::validate(p, rules);
  Plan out = *this;
  out.partitions[static_cast<size_t>(linear_site_of(op))] = p;
  return out;
}

json Plan::to_json() const {
  json j = {{"name", name}};
  json parts = json::object();
  for (size_t s = 0; s < partitions.size(); ++s)
    if (partitions[s]) parts[linear_op_name(static_cast<int>(s))] = partitions[s]->to_json();
  if (!parts.empty()) j["partitions"] = parts;
  for (const auto& [k, v] : options.items()) j[k] = v;
  j["chunk_len"] = chunk_len;
  if (!attention.is_fp32()) j["attention"] = attention.to_json();
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
    ops[kOpClassNames[static_cast<size_t>(i)]] = e;
  }
  j["ops"] = ops;
  return j;
}

}  // namespace socllm
