#include "sim/hetero.h"

#include <algorithm>

namespace socllm {

Plan hetero_plan(const ModelConfig& c, std::shared_ptr<const soc::DeviceProfile> device,
                 int64_t prompt_len, const HeteroOptions& o, const sched::PartitionCosts* costs) {
  const auto engines = Plan::hetero_engines();
  if (std::find(engines.begin(), engines.end(), o.engine) == engines.end()) {
    std::string known;
    for (const auto& e : engines) known += (known.empty() ? "" : ", ") + e;
    throw InvalidArgument("[hetero] unknown engine '" + o.engine + "' (known: " + known + ")");
  }
  if (o.phase != "prefill" && o.phase != "decode")
    throw InvalidArgument("[hetero] phase must be prefill or decode, got '" + o.phase + "'");
  if (prompt_len <= 0)
    throw InvalidArgument("[hetero] prompt length must be positive, got " +
                          std::to_string(prompt_len));
  if (c.context_length > 0 && prompt_len + (o.phase == "decode") > c.context_length)
    throw ContextOverflow("[hetero] " + std::to_string(prompt_len) + " tokens exceed " + c.name +
                          "'s context of " + std::to_string(c.context_length));
  const Plan scheme = Plan::parse(o.plan);
  if (scheme.name != "w4a16")
    throw InvalidArgument(
        "[hetero] HeteroLLM's engines compute linears in FP16 (W4A16, seed 002 §5.1); plan '" +
        o.plan + "' has activations " + quant::act_format_name(scheme.linear.activations));
  nlohmann::json j = {{"name", o.engine}, {"characterization", o.characterization}};
  for (const auto& [k, v] : scheme.options.items()) j[k] = v;
  // The partitions are those of the engine's design (fast sync) unless re-solved for the sync
  // it is timed with.
  j["sync"] = o.fast_sync || !o.solve_for_timing_sync ? "fast" : "conventional";
  Plan plan = Plan::from_json(j).on_device(std::move(device));
  const bool decode = o.phase == "decode";
  // The engine needs the GPU: its numbers must be in the profile (MissingData names them).
  (void)soc::timing_cost_model(*plan.device_profile(), plan.characterization, plan.fast_sync,
                               decode)
      .sync_us(soc::Processor::Gpu, soc::Processor::Npu);
  if (plan.partition.none() || (!costs && !(o.solve_for_co_runner && !o.co_runner.empty())))
    return plan;
  // Solved with other costs than the plan's own: written into the plan.
  const soc::CostModel cost =
      soc::timing_cost_model(*plan.device_profile(), plan.characterization, plan.fast_sync, decode,
                             o.solve_for_co_runner ? o.co_runner : "");
  const sched::PartitionCosts own = sched::PartitionCosts::of(cost, plan.partition_partner());
  const sched::PartitionCosts& solver = costs ? *costs : own;
  const Plan phase_plan = decode ? plan.for_decode() : plan;
  const int64_t rows = decode ? 1 : prompt_len;
  const sched::PartitionRules rules = plan.partition_rules(decode, rows);
  for (int s = 0; s < kNumLinearSites; ++s) {
    const auto site = static_cast<LinearSite>(s);
    const soc::OpDesc lin = phase_plan.linear_desc(c, site, rows);
    const auto choice = sched::solve_partition(lin, rules, solver, *phase_plan.partition.space);
    plan = plan.with_partition(linear_op(site).name, choice.partition, decode, rules);
  }
  return plan;
}

PrefillTimeline simulate_hetero(const ModelConfig& c, const soc::DeviceProfile& device,
                                int64_t prompt_len, const HeteroOptions& o,
                                const sched::PartitionCosts* costs) {
  const Plan plan =
      hetero_plan(c, std::make_shared<const soc::DeviceProfile>(device), prompt_len, o, costs);
  SimOptions so;
  so.policy = o.policy;
  so.phase = o.phase;
  so.co_runner = o.co_runner;
  so.fast_sync = o.fast_sync;
  PrefillTimeline t = simulate_request(c, plan, device, prompt_len, 0, so);
  t.graph.meta["engine"] = o.engine;
  t.graph.meta["predicted_partitions"] = costs != nullptr;
  t.graph.meta["solve_for_timing_sync"] = o.solve_for_timing_sync;
  t.graph.meta["solve_for_co_runner"] = o.solve_for_co_runner;
  t.graph.meta["co_runner"] = o.co_runner.empty() ? "none" : o.co_runner;
  return t;
}

}  // namespace socllm
