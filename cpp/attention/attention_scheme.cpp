#include "attention/attention_scheme.h"

#include <algorithm>
#include <charconv>

#include "attention/common.h"
#include "core/core.h"

namespace socllm::attention {

std::string scheme_list() {
  std::string s;
  for (const SchemeKind* k : schemes()) s += (s.empty() ? "" : ", ") + std::string(k->name());
  return s;
}

namespace {

using json = nlohmann::json;

const OptionSpec* find_option(const SchemeKind& k, const std::string& name,
                              std::vector<OptionSpec>& storage) {
  storage = k.options();
  for (const auto& o : storage)
    if (name == o.name) return &o;
  return nullptr;
}

std::string option_list(const SchemeKind& k) {
  std::string s;
  for (const auto& o : k.options()) s += (s.empty() ? "" : ", ") + std::string(o.name);
  return s.empty() ? "none" : s;
}

// A text option value: integer, decimal, or the text itself.
json text_value(const std::string& v) {
  const char *b = v.data(), *e = v.data() + v.size();
  int64_t i = 0;
  if (auto r = std::from_chars(b, e, i); r.ptr == e && r.ec == std::errc() && !v.empty()) return i;
  double d = 0;
  if (auto r = std::from_chars(b, e, d); r.ptr == e && r.ec == std::errc() && !v.empty()) return d;
  return v;
}

const json& option_value(const AttentionScheme& s, const char* option) {
  const auto it = s.options.find(option);
  if (it == s.options.end())
    throw InvalidArgument("[AttentionScheme] " + s.name() + " has no option '" + option +
                          "' (its options: " + option_list(*s.kind) + ")");
  return *it;
}

}  // namespace

AttentionScheme::AttentionScheme() : kind(&scheme_kind("fp32")) {}

std::string AttentionScheme::name() const { return kind->name(); }

double AttentionScheme::number(const char* option) const {
  return option_value(*this, option).get<double>();
}
int64_t AttentionScheme::integer(const char* option) const {
  return option_value(*this, option).get<int64_t>();
}
std::string AttentionScheme::text(const char* option) const {
  return option_value(*this, option).get<std::string>();
}

bool AttentionScheme::is_fp32() const { return name() == "fp32"; }
bool AttentionScheme::is_sparse() const { return kind->selects_keys(); }
bool AttentionScheme::needs_head_importance() const { return kind->needs_head_importance(*this); }
bool AttentionScheme::needs_qk_scales() const { return kind->needs_qk_scales(*this); }
bool AttentionScheme::computes_int8() const { return kind->computes_int8(); }
bool AttentionScheme::operator==(const AttentionScheme& o) const {
  return kind == o.kind && options == o.options;
}

void AttentionScheme::validate() const {
  const std::string who = "[AttentionScheme] " + name() + ": ";
  for (const auto& spec : kind->options()) {
    const json& v = option_value(*this, spec.name);
    if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(),
                                           v.get<std::string>()) == spec.choices.end()) {
      std::string c;
      for (const auto& x : spec.choices) c += (c.empty() ? "'" : " or '") + x + "'";
      throw InvalidArgument(who + spec.name + " must be " + c + ", got '" + v.get<std::string>() +
                            "'");
    }
  }
  kind->validate(*this);
}

json AttentionScheme::to_json() const {
  json j = {{"kind", name()}};
  for (const auto& [k, v] : options.items()) j[k] = v;
  return j;
}

AttentionScheme AttentionScheme::from_json(const json& j) {
  if (j.is_string()) return parse(j.get<std::string>());
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string())
    throw InvalidArgument("[AttentionScheme] expected a kind name (" + scheme_list() +
                          ") or an object with a string 'kind', got " + json_text(j));
  AttentionScheme s;
  s.kind = &scheme_kind(j["kind"].get<std::string>());
  s.options = json::object();
  for (const auto& o : s.kind->options()) s.options[o.name] = o.default_value;
  const std::string who = "[AttentionScheme] " + s.name();
  std::vector<OptionSpec> storage;
  for (const auto& [key, v] : j.items()) {
    if (key == "kind") continue;
    const OptionSpec* spec = find_option(*s.kind, key, storage);
    if (!spec)
      throw InvalidArgument(who + " has no option '" + key +
                            "' (its options: " + option_list(*s.kind) + ")");
    const json& d = spec->default_value;
    const bool text = d.is_string(), integer = d.is_number_integer();
    if (text ? !v.is_string() : !v.is_number() || (integer && !v.is_number_integer()))
      throw InvalidArgument(who + ": option '" + key + "' must be " +
                            (text      ? "a name"
                             : integer ? "an integer"
                                       : "a number") +
                            ", got " + json_text(v));
    s.options[key] = d.is_number_float() ? json(v.get<double>()) : v;
  }
  s.validate();
  return s;
}

AttentionScheme AttentionScheme::parse(const std::string& text) {
  return from_json(text_to_json(text));
}

json AttentionScheme::text_to_json(const std::string& text) {
  const auto kv = split_key_values(text, "[AttentionScheme]");
  json j = {{"kind", kv.head}};
  for (const auto& [key, value] : kv.items) j[key] = text_value(value);
  return j;
}

std::vector<std::string> AttentionScheme::option_names() {
  std::vector<std::string> names;
  for (const SchemeKind* k : schemes())
    for (const auto& o : k->options())
      if (std::find(names.begin(), names.end(), o.name) == names.end()) names.emplace_back(o.name);
  return names;
}

std::string AttentionScheme::label() const {
  std::string s = name();
  if (is_sparse()) s += ":keep=" + json_text(options.at("keep"));
  return s;
}

const SchemeKind& scheme_kind(const std::string& name) {
  for (const SchemeKind* k : schemes())
    if (name == k->name()) return *k;
  throw InvalidArgument("[AttentionScheme] unknown attention '" + name +
                        "' (known: " + scheme_list() + ")");
}

bool is_scheme_name(const std::string& name) {
  return std::any_of(schemes().begin(), schemes().end(),
                     [&](const SchemeKind* k) { return name == k->name(); });
}

std::vector<LayerConsts> SchemeKind::prepare(const AttentionScheme& s, const Calibration*,
                                             const ModelConfig& c, const std::string&) const {
  return std::vector<LayerConsts>(static_cast<size_t>(c.n_layers),
                                  uniform_layer_consts(s, c.n_heads));
}

std::vector<int64_t> SchemeKind::tasks(const AttentionScheme& s, const TaskShape&, TaskSink&,
                                       const std::vector<int64_t>&) const {
  throw InvalidArgument("[AttentionScheme] " + s.name() +
                        " is not head-wise: it is one op of the attention subgraph");
}

void prefill_attention(const AttentionScheme& s, const LayerConsts& consts, const float* q,
                       int64_t ldq, const float* k, const float* v, int64_t ldkv, const Shape& sh,
                       float* out, int64_t ldo, Trace* trace) {
  detail::check_shape(sh, "prefill_attention");
  s.kind->run(s, consts, q, ldq, k, v, ldkv, sh, out, ldo, trace);
}

}  // namespace socllm::attention
