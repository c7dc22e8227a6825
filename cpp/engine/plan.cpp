#include "socllm/plan.h"

#include <algorithm>
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
};

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
      {"fp32", "every operator in fp32 on the CPU: the reference the quantized plans are measured against",
       "{}", [](const json&) { return LinearScheme{}; }},
      {"w8a8",
       "llm.npu's NPU baseline (seed 001 §2.3, §3.3): int8 per-tensor weights, int8 activations with "
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
         auto s = scheme(WeightFormat::Int8, Granularity::PerTensor, ActFormat::Int8StaticPerTensor);
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
       R"({"pruning_rate": 0.85, "hot_share": 0.8, "weights": "per-tensor"})",
       [](const json& o) {
         const auto w = o["weights"].get<std::string>();
         if (w != "per-tensor" && w != "per-channel")
           throw InvalidArgument("[Plan] shadow-outlier: weights must be per-tensor or per-channel, got '" +
                                 w + "'");
         auto s = scheme(WeightFormat::Int8, w == "per-tensor" ? Granularity::PerTensor : Granularity::PerChannel,
                         ActFormat::Int8StaticPerTensor);
         s.shadow = quant::ShadowOptions{o["pruning_rate"].get<double>(), o["hot_share"].get<double>()};
         return s;
       }},
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

constexpr const char* kOpClasses[] = {"linear", "attention", "norm", "embedding", "lm_head"};

json fp32_ops(const LinearScheme& linear) {
  return {{"linear", linear.to_json()},
          {"attention", "fp32"},
          {"norm", "fp32"},
          {"embedding", "fp32"},
          {"lm_head", "fp32"}};
}

LinearScheme parse_ops(const json& ops) {
  if (!ops.is_object())
    throw InvalidArgument("[Plan] 'ops' must be an object of operator classes, got " + ops.dump());
  LinearScheme linear;
  for (const auto& [op, mode] : ops.items()) {
    if (std::find(std::begin(kOpClasses), std::end(kOpClasses), op) == std::end(kOpClasses))
      throw InvalidArgument("[Plan] unknown operator class '" + op +
                            "' (known: linear, attention, norm, embedding, lm_head)");
    if (op == "linear") {
      linear = LinearScheme::from_json(mode);
    } else if (mode != "fp32") {
      throw InvalidArgument("[Plan] unknown mode " + mode.dump() + " for operator class '" + op +
                            "' (known: \"fp32\")");
    }
  }
  return linear;
}

// Number from a "key=value" string: integer if it parses fully as one, else double.
// A number if the text is one, else the text itself (string options such as weights=...);
// from_json checks the type against the option's default.
json parse_scalar(const std::string& v) {
  try {
    size_t used = 0;
    const long long i = std::stoll(v, &used);
    if (used == v.size()) return i;
    const double d = std::stod(v, &used);
    if (used == v.size()) return d;
  } catch (const std::exception&) {
  }
  return v;
}

}  // namespace

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
  const size_t colon = text.find(':');
  json j = {{"name", text.substr(0, colon)}};
  if (colon != std::string::npos) {
    std::string rest = text.substr(colon + 1);
    size_t start = 0;
    while (start <= rest.size()) {
      const size_t comma = std::min(rest.find(',', start), rest.size());
      const std::string kv = rest.substr(start, comma - start);
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InvalidArgument("[Plan] expected key=value in '" + text + "', got '" + kv + "'");
      j[kv.substr(0, eq)] = parse_scalar(kv.substr(eq + 1));
      start = comma + 1;
    }
  }
  return from_json(j);
}

Plan Plan::from_json(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string())
    throw InvalidArgument("[Plan.from_json] a plan is an object with a string 'name', got " +
                          j.dump() + " " + known_list());
  Plan plan;
  plan.name = j["name"].get<std::string>();
  const bool custom = plan.name == "custom";
  const Preset* preset = custom ? nullptr : &preset_or_throw(plan.name);
  if (preset) plan.options = json::parse(preset->options);
  for (const auto& [key, v] : j.items()) {
    if (key == "name" || key == "ops") continue;
    if (key == "chunk_len") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        throw InvalidArgument("[Plan] chunk_len must be an integer >= 0, got " + v.dump());
      plan.chunk_len = v.get<int64_t>();
    } else if (preset && plan.options.contains(key) && plan.options[key].is_string()) {
      if (!v.is_string())
        throw InvalidArgument("[Plan] option '" + key + "' of plan '" + plan.name +
                              "' must be a string, got " + v.dump());
      plan.options[key] = v;
    } else if (preset && plan.options.contains(key)) {
      if (!v.is_number())
        throw InvalidArgument("[Plan] option '" + key + "' of plan '" + plan.name +
                              "' must be a number, got " + v.dump());
      if (plan.options[key].is_number_integer() && !v.is_number_integer())
        throw InvalidArgument("[Plan] option '" + key + "' of plan '" + plan.name +
                              "' must be an integer, got " + v.dump());
      plan.options[key] = v;
    } else {
      std::string allowed = "chunk_len, ops";
      for (const auto& [k, _] : plan.options.items()) allowed += ", " + k;
      throw InvalidArgument("[Plan] plan '" + plan.name + "' has no option '" + key +
                            "' (its options: " + allowed + ")");
    }
  }
  if (custom) {
    if (!j.contains("ops"))
      throw InvalidArgument("[Plan] plan 'custom' needs 'ops' naming how each operator class runs");
    plan.linear = parse_ops(j["ops"]);
  } else {
    plan.linear = preset->linear(plan.options);
    plan.linear.validate();
    if (j.contains("ops") && parse_ops(j["ops"]).to_json() != plan.linear.to_json())
      throw InvalidArgument("[Plan] 'ops' differ from what plan '" + plan.name +
                            "' runs; name a composed plan 'custom'");
  }
  return plan;
}

json Plan::to_json() const {
  json j = {{"name", name}};
  for (const auto& [k, v] : options.items()) j[k] = v;
  j["chunk_len"] = chunk_len;
  j["ops"] = fp32_ops(linear);
  return j;
}

}  // namespace socllm
