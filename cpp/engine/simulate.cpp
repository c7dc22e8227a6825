#include "socllm/simulate.h"

#include <cmath>
#include <limits>

namespace socllm {

std::pair<double, double> runtime_graph_build_ms(const ModelConfig& c,
                                                 const soc::DeviceProfile& p) {
  const std::string why = "run-time graph building";
  const double build = p.number("/cost_model/graph/build_ms", why);
  const double optimize = p.number("/cost_model/graph/optimize_ms", why);
  const double ref = p.number("/cost_model/graph/reference_linear_params", why);
  const double scale = static_cast<double>(linear_params_per_block(c) * c.n_layers) / ref;
  return {build * scale, optimize * scale};
}

soc::CostModel timing_cost_model(const soc::DeviceProfile& device,
                                 const std::string& characterization, bool fast_sync, bool decode,
                                 const std::string& co_runner) {
  return soc::CostModel(device.with_characterization(characterization),
                        {.fast = fast_sync, .gpu_queue_kept = decode && fast_sync})
      .with_co_runner(co_runner);
}

PrefillTimeline simulate_graph(sched::TaskGraph graph, const soc::DeviceProfile& device,
                               const std::string& policy, int64_t optimal_max_tasks,
                               const std::string& head_policy) {
  if (!graph.meta.contains("prompt_len"))
    throw InvalidArgument("[simulate] the task graph's meta has no prompt_len");
  sched::SimOptions o;
  o.policy = sched::policy_from_name(policy);
  o.optimal_max_tasks = optimal_max_tasks;
  const sched::HeadPolicy hp = sched::head_policy_from_name(head_policy);
  const auto& m = graph.meta;
  const soc::CostModel cost = timing_cost_model(
      device, m.value("characterization", std::string()), m.value("fast_sync", false),
      m.value("phase", std::string()) == "decode", m.value("co_runner", std::string()));
  PrefillTimeline t;
  if (!graph.meta.contains("head_policy")) {
    t.head_plans = sched::apply_head_pipeline(graph, cost, hp);
    if (!t.head_plans.empty()) graph.meta["head_policy"] = head_policy;
  }
  t.timeline = sched::simulate(graph, cost, o);
  t.graph = std::move(graph);
  return t;
}

PrefillTimeline simulate_prefill(const ModelConfig& c, const Plan& plan,
                                 const soc::DeviceProfile& device, int64_t prompt_len,
                                 int64_t chunk_len, const PrefillSimOptions& opts) {
  PrefillGraphOptions g;
  g.attention = opts.attention;
  if (opts.runtime_graph_build)
    std::tie(g.build_ms, g.optimize_ms) = runtime_graph_build_ms(c, device);
  if (plan.linear.shadow) {
    if (!(opts.shadow_channels >= 0) || !std::isfinite(opts.shadow_channels))
      throw InvalidArgument("[simulate] shadow_channels must be >= 0, got " +
                            std::to_string(opts.shadow_channels));
    g.expected = expected_shadow_loads(c, *plan.linear.shadow, opts.shadow_channels);
  }
  sched::TaskGraph graph = prefill_task_graph(c, plan, prompt_len, chunk_len, g);
  if (!opts.co_runner.empty()) graph.meta["co_runner"] = opts.co_runner;
  if (!opts.characterization.empty()) graph.meta["characterization"] = opts.characterization;
  return simulate_graph(std::move(graph), device, opts.policy, opts.optimal_max_tasks,
                        opts.head_policy);
}

nlohmann::json PrefillTimeline::summary() const {
  const nlohmann::json s = timeline.summary();
  const int64_t prompt_len = graph.meta.at("prompt_len").get<int64_t>();
  double build_us = 0;
  for (const auto& t : graph.tasks())
    if (t.kind == sched::TaskKind::GraphBuild) {
      const auto& sp = timeline.spans[static_cast<size_t>(t.id)];
      build_us += sp.end_us - sp.start_us;
    }
  const double prefill_ms = timeline.makespan_us / 1e3;
  nlohmann::json busy = nlohmann::json::object(), bubble = nlohmann::json::object();
  for (const auto& [p, v] : s["processors"].items()) {
    busy[p] = v["busy_ms"];
    bubble[p] = v["bubble_rate"];
  }
  nlohmann::json out = graph.meta;
  out["plan"] = graph.meta.contains("plan") && graph.meta["plan"].is_object()
                    ? graph.meta["plan"]["name"]
                    : graph.meta.value("plan", nlohmann::json("?"));
  out.update(nlohmann::json{
      {"policy", s["policy"]},
      {"device", s["device"]},
      {"prefill_ms", prefill_ms},
      {"prefill_tokens_per_s", prefill_ms > 0 ? static_cast<double>(prompt_len) / (prefill_ms / 1e3)
                                              : std::numeric_limits<double>::infinity()},
      {"ttft_ms", prefill_ms},
      {"energy_mj", s["energy_mj"]},
      {"graph_build_ms", build_us / 1e3},
      {"peak_memory_bytes",
       graph.meta.value("resident_bytes", int64_t{0}) + timeline.peak_working_bytes},
      {"tasks", graph.size()},
      {"bubble_rate", bubble},
      {"busy_ms", busy},
      {"processors", s["processors"]},
      {"scheduler_decisions", s["decisions"]},
      {"scheduler_us_per_decision", s["decision_us_mean"]}});
  if (graph.meta.value("phase", std::string()) == "decode") {
    out["tpot_ms"] = prefill_ms;  // one decoding step
    out["decode_tokens_per_s"] = prefill_ms > 0 ? 1e3 / prefill_ms : 0.0;
    out["kv_len"] = prompt_len + 1;
  }
  if (!head_plans.empty()) {
    double ns = 0;
    for (const auto& hp : head_plans) ns += hp["plan"]["planner_ns"].get<double>();
    out["head_pipelines"] = head_plans.size();
    out["head_planner_ns_mean"] = ns / static_cast<double>(head_plans.size());
  }
  return out;
}

}  // namespace socllm
