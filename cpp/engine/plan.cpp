#include <algorithm>

#include "socllm/engine.h"

namespace socllm {

namespace {
struct PlanEntry {
  const char* name;
  const char* description;
};
// Later issues add the NPU plans (w8a8, smoothquant, shadow-outlier...) here.
constexpr PlanEntry kPlans[] = {
    {"fp32", "every operator in fp32 on the CPU: the reference the quantized plans are measured against"},
};
}  // namespace

std::vector<std::string> Plan::known() {
  std::vector<std::string> out;
  for (const auto& p : kPlans) out.emplace_back(p.name);
  return out;
}

std::string Plan::describe(const std::string& name) {
  for (const auto& p : kPlans)
    if (name == p.name) return p.description;
  return from_name(name).name;  // throws with the list of known plans
}

std::string Plan::known_list() {
  std::string list;
  for (const auto& p : kPlans) list += (list.empty() ? "" : ", ") + std::string(p.name);
  return "(known plans: " + list + ")";
}

Plan Plan::from_name(const std::string& name) {
  for (const auto& p : kPlans)
    if (name == p.name) return Plan{name};
  throw InvalidArgument("[Plan] unknown plan '" + name + "' " + known_list());
}

Plan Plan::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string())
    throw InvalidArgument("[Plan.from_json] a plan is an object with a string 'name', got " +
                          j.dump() + " " + known_list());
  for (const auto& [k, v] : j.items())
    if (k != "name")
      throw InvalidArgument("[Plan.from_json] unknown plan field '" + k + "' " + known_list());
  return from_name(j["name"].get<std::string>());
}

nlohmann::json Plan::to_json() const { return {{"name", name}}; }

}  // namespace socllm
