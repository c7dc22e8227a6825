#include "sim/simulate.h"

#include <cmath>
#include <limits>
#include <optional>

namespace socllm {

std::pair<double, double> runtime_graph_build_ms(const ModelConfig& c,
                                                 const soc::DeviceProfile& p) {
  const std::string why = "run-time graph building";
  const double build = p.number("/cost_model/graph/build_ms", why);
  const double optimize = p.number("/cost_model/graph/optimize_ms", why);
  const double ref = p.rate("/cost_model/graph/reference_linear_params", why);
  const double scale = static_cast<double>(linear_params_per_block(c) * c.n_layers) / ref;
  return {build * scale, optimize * scale};
}

PrefillTimeline simulate_graph(sched::TaskGraph graph, const soc::DeviceProfile& device,
                               const std::string& policy, int64_t optimal_max_tasks,
                               const std::string& head_policy) {
  if (!graph.meta.contains("prompt_len"))
    throw InvalidArgument("[simulate] the task graph's meta has no prompt_len");
  sched::SimOptions o;
  o.policy = sched::policy_from_name(policy);
  o.optimal_max_tasks = optimal_max_tasks;
  if (graph.meta.value("phase", std::string()) == "session") {
    // the prompt's chunks, then the decoding steps (block.h: one chunk per step)
    if (!graph.meta.contains("prompt_chunks"))
      throw InvalidArgument(
          "[simulate] the session graph's meta has no prompt_chunks (a graph from before "
          "sessions were timed: build it again)");
    o.first_decode_chunk = graph.meta.at("prompt_chunks").get<int64_t>();
  }
  const sched::HeadPolicy hp = sched::head_policy_from_name(head_policy);
  const auto& m = graph.meta;
  auto cost_model = [&](bool decode) {
    return soc::timing_cost_model(device, m.value("characterization", std::string()),
                                  m.value("fast_sync", false), decode,
                                  m.value("co_runner", std::string()));
  };
  const soc::CostModel cost = cost_model(m.value("phase", std::string()) == "decode");
  std::optional<soc::CostModel> decode_cost;
  if (o.first_decode_chunk >= 0) o.decode_cost = &decode_cost.emplace(cost_model(true));
  PrefillTimeline t;
  if (!graph.meta.contains("head_policy")) {
    t.head_plans = sched::apply_head_pipeline(graph, cost, hp);
    if (!t.head_plans.empty()) graph.meta["head_policy"] = head_policy;
  }
  t.timeline = sched::simulate(graph, cost, o);
  t.graph = std::move(graph);
  return t;
}

PrefillTimeline simulate_request(const ModelConfig& c, const Plan& given,
                                 const soc::DeviceProfile& device, int64_t prompt_len,
                                 int64_t chunk_len, const SimOptions& opts) {
  // Partitions and static graph shapes come from the plan's device: bound to the one timed
  // (InvalidArgument when the plan names another), so the two cannot disagree.
  const Plan plan = given.on_device(std::make_shared<const soc::DeviceProfile>(device));
  const std::string& phase = opts.phase;
  if (phase != "prefill" && phase != "decode" && phase != "session")
    throw InvalidArgument("[simulate] phase must be prefill, decode or session, got '" + phase +
                          "'");
  if (phase == "session" && opts.decode_tokens <= 0)
    throw InvalidArgument(
        "[simulate] a session decodes tokens after the prompt: decode_tokens "
        "must be > 0, got " +
        std::to_string(opts.decode_tokens));
  if (phase != "session" && opts.decode_tokens != 0)
    throw InvalidArgument("[simulate] decode_tokens applies to phase session, not " + phase);
  if (phase == "decode" && chunk_len != 0)
    throw InvalidArgument("[simulate] a decoding step has no prompt chunks (chunk " +
                          std::to_string(chunk_len) + " applies to prefill and session)");
  if (phase == "decode" && opts.runtime_graph_build)
    throw InvalidArgument(
        "[simulate] run-time graph building applies to a prefill, not a "
        "decoding step");
  if (plan.linear.channel_bits && plan.linear.channel_bits->stored)
    throw InvalidArgument(
        "[simulate] plan '" + plan.name +
        "' takes its bit-widths from a calibration (bitwidths=stored), which a shape-only "
        "config has none of: simulate a loaded, calibrated model, or give bits=<average>");
  GraphOptions g;
  g.attention = opts.attention;
  if (opts.runtime_graph_build)
    std::tie(g.build_ms, g.optimize_ms) = runtime_graph_build_ms(c, device);
  if (plan.linear.shadow) {
    if (!(opts.shadow_channels >= 0) || !std::isfinite(opts.shadow_channels))
      throw InvalidArgument("[simulate] shadow_channels must be >= 0, got " +
                            std::to_string(opts.shadow_channels));
    g.expected = expected_shadow_loads(c, *plan.linear.shadow, opts.shadow_channels);
  }
  sched::TaskGraph graph =
      phase == "decode" ? decode_task_graph(c, plan, prompt_len + 1, g)
                        : prefill_task_graph(c, plan, prompt_len, chunk_len, g, opts.decode_tokens);
  if (!opts.co_runner.empty()) graph.meta["co_runner"] = opts.co_runner;
  if (!opts.characterization.empty()) graph.meta["characterization"] = opts.characterization;
  if (opts.fast_sync) graph.meta["fast_sync"] = *opts.fast_sync;
  return simulate_graph(std::move(graph), device, opts.policy, opts.optimal_max_tasks,
                        opts.head_policy);
}

nlohmann::json PrefillTimeline::summary() const {
  const nlohmann::json s = timeline.summary();
  const int64_t prompt_len = graph.meta.at("prompt_len").get<int64_t>();
  const std::string phase = graph.meta.value("phase", std::string("prefill"));
  double build_us = 0, ttft_us = 0;
  for (const auto& t : graph.tasks()) {
    const auto& sp = timeline.spans[static_cast<size_t>(t.id)];
    if (t.kind == sched::TaskKind::GraphBuild) build_us += sp.end_us - sp.start_us;
    // the first token comes with the prompt's LM head
    if (t.kind == sched::TaskKind::LmHead && t.name == "lm_head") ttft_us = sp.end_us;
  }
  const double total_ms = timeline.makespan_us / 1e3;
  nlohmann::json busy = nlohmann::json::object(), bubble = nlohmann::json::object();
  for (const auto& [p, v] : s["processors"].items()) {
    busy[p] = v["busy_ms"];
    bubble[p] = v["bubble_rate"];
  }
  nlohmann::json out = graph.meta;
  out["plan"] = graph.meta.contains("plan") && graph.meta["plan"].is_object()
                    ? graph.meta["plan"]["name"]
                    : graph.meta.value("plan", nlohmann::json("?"));
  const auto rate = [](double n, double ms) {
    return ms > 0 ? n / (ms / 1e3) : std::numeric_limits<double>::infinity();
  };
  out.update(nlohmann::json{{"policy", s["policy"]},
                            {"device", s["device"]},
                            {"energy_mj", s["energy_mj"]},
                            {"static_energy_mj", s["static_energy_mj"]},
                            {"dram_energy_mj", s["dram_energy_mj"]},
                            {"graph_build_ms", build_us / 1e3},
                            {"peak_memory_bytes", graph.meta.value("resident_bytes", int64_t{0}) +
                                                      timeline.peak_working_bytes},
                            {"tasks", graph.size()},
                            {"bubble_rate", bubble},
                            {"busy_ms", busy},
                            {"processors", s["processors"]},
                            {"scheduler_decisions", s["decisions"]},
                            {"scheduler_us_per_decision", s["decision_us_mean"]},
                            {"total_ms", total_ms}});
  for (const char* k : {"steal_threshold", "steal_cpu_over_npu_time_ratio"})
    if (s.contains(k)) out[k] = s[k];
  if (phase == "decode") {
    out["tpot_ms"] = total_ms;  // one decoding step
    out["decode_tokens_per_s"] = total_ms > 0 ? 1e3 / total_ms : 0.0;
    out["kv_len"] = prompt_len + 1;
  } else {
    const double prefill_ms = phase == "session" ? ttft_us / 1e3 : total_ms;
    out["prefill_ms"] = prefill_ms;
    out["prefill_tokens_per_s"] = rate(static_cast<double>(prompt_len), prefill_ms);
    out["ttft_ms"] = prefill_ms;
    if (phase == "session") {
      const int64_t n = graph.meta.at("decode_tokens").get<int64_t>();
      const double decode_ms = total_ms - prefill_ms;
      out["decode_ms"] = decode_ms;
      out["tpot_ms"] = decode_ms / static_cast<double>(n);
      out["decode_tokens_per_s"] = rate(static_cast<double>(n), decode_ms);
    }
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
