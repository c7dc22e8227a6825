#include "socllm/hetero.h"

#include <array>
#include <map>
#include <tuple>

#include "socllm/block.h"

namespace socllm {

namespace {
using sched::PartitionSpace;
using soc::Processor;

constexpr std::array<HeteroEngineInfo, 6> kEngines = {{
    {"gpu-only", PartitionSpace::GpuOnly,
     "every op on the GPU (PPL-OpenCL, seed 002's GPU baseline)"},
    {"npu-padding", PartitionSpace::NpuPadding,
     "linears on the NPU, the prompt padded to the next pre-built static graph (§5.2.2 Padding)"},
    {"npu-pipe", PartitionSpace::NpuPipe,
     "linears on the NPU over pre-built graphs of decreasing sizes, the margin padded to the "
     "smallest (§5.2.2 Pipe: multi-sequence-length cutting without the GPU)"},
    {"npu-online-prepare", PartitionSpace::NpuOnline,
     "linears on the NPU on graphs prepared at run time for the exact length, preparation "
     "included (§5.2.2 Online-prepare)"},
    {"hetero-layer", PartitionSpace::Layer,
     "each linear wholly on the faster of the GPU and the NPU (pipe cover), other ops on the GPU "
     "(§5 Hetero-layer)"},
    {"hetero-tensor", PartitionSpace::Tensor,
     "each linear cut between the GPU and the NPU by the partition solver (§4.1, §4.3 "
     "Hetero-tensor)"},
}};

bool is_linear(const soc::OpDesc& o) { return o.op_class == "linear"; }
}  // namespace

std::span<const HeteroEngineInfo> hetero_engines() { return kEngines; }

const HeteroEngineInfo& hetero_engine(const std::string& name) {
  std::string known;
  for (const auto& e : kEngines) {
    if (name == e.name) return e;
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  throw InvalidArgument("[hetero] unknown engine '" + name + "' (known: " + known + ")");
}

Plan hetero_plan(const HeteroOptions& o) {
  const auto& e = hetero_engine(o.engine);
  Plan p = Plan::parse(o.plan);
  if (p.linear.activations != quant::ActFormat::F16)
    throw InvalidArgument(
        "[hetero] HeteroLLM's engines compute linears in FP16 (W4A16, seed 002 "
        "§5.1); plan '" +
        o.plan + "' has activations " + quant::act_format_name(p.linear.activations));
  for (int c = 0; c < kNumOpClasses; ++c) {
    const auto oc = static_cast<OpClass>(c);
    if (oc == OpClass::Shadow) continue;
    if (oc == OpClass::Linear)
      p = p.placed(oc, e.space == PartitionSpace::GpuOnly ? Processor::Gpu : Processor::Npu);
    else p = p.placed(oc, Processor::Gpu, soc::DType::Fp16);
  }
  return p;
}

double online_prepare_ms(const ModelConfig& c, const soc::DeviceProfile& device,
                         int64_t prompt_len) {
  const std::string g = "/cost_model/graph/", why = "online graph preparation (npu-online-prepare)";
  const double base = device.number(g + "online_prepare_base_ms", why);
  const double per_token = device.number(g + "online_prepare_ms_per_token", why);
  const double ref = device.number(g + "online_prepare_reference_linear_params", why);
  const double scale = static_cast<double>(linear_params_per_block(c) * c.n_layers) / ref;
  return (base + per_token * static_cast<double>(prompt_len)) * scale;
}

soc::CostModel hetero_cost_model(const soc::DeviceProfile& device, const HeteroOptions& o) {
  return timing_cost_model(device, o.characterization, o.fast_sync, o.phase == "decode",
                           o.co_runner);
}

sched::TaskGraph hetero_task_graph(const ModelConfig& c, const soc::DeviceProfile& device,
                                   int64_t prompt_len, const HeteroOptions& o,
                                   const sched::PartitionCosts* costs) {
  const auto& engine = hetero_engine(o.engine);
  if (o.phase != "prefill" && o.phase != "decode")
    throw InvalidArgument("[hetero] phase must be prefill or decode, got '" + o.phase + "'");
  if (prompt_len <= 0)
    throw InvalidArgument("[hetero] prompt length must be positive, got " +
                          std::to_string(prompt_len));
  if (c.context_length > 0 && prompt_len + (o.phase == "decode") > c.context_length)
    throw ContextOverflow("[hetero] " + std::to_string(prompt_len) + " tokens exceed " + c.name +
                          "'s context of " + std::to_string(c.context_length));
  const soc::DeviceProfile dev = device.with_characterization(o.characterization);
  const soc::CostModel cost = hetero_cost_model(device, o);
  const Plan plan = hetero_plan(o);
  // The engine needs the GPU: its numbers must be in the profile (MissingData names them).
  (void)cost.sync_us(Processor::Gpu, Processor::Npu);
  const bool decode = o.phase == "decode";
  const int64_t rows = decode ? 1 : prompt_len, kv_len = decode ? prompt_len + 1 : prompt_len;
  BlockGraphBuilder b(c, plan);
  b.add_chunk(0, rows, kv_len);
  b.add_lm_head(1);
  sched::TaskGraph g = b.take();

  sched::PartitionRules rules = sched::PartitionRules::from_profile(dev);
  if (decode) rules = rules.for_rows(rows);  // a pre-built graph of the decoding shape
  const soc::CostModel solver_cost =
      timing_cost_model(device, o.characterization, o.fast_sync || !o.solve_for_timing_sync, decode,
                        o.solve_for_co_runner ? o.co_runner : "");
  const sched::PartitionCosts real = sched::PartitionCosts::of(solver_cost);
  const sched::PartitionCosts& solver_costs = costs ? *costs : real;
  // One solve per linear shape (every layer has the same four).
  std::map<std::tuple<int64_t, int64_t, int64_t>, sched::PartitionChoice> solved;
  nlohmann::json partitions = nlohmann::json::array();
  std::vector<std::vector<int64_t>> replaced(g.tasks().size());  // old id -> new ids
  sched::TaskGraph out;
  out.meta = prefill_graph_meta(c, plan, prompt_len, 0);
  for (const auto& t : g.tasks()) {
    std::vector<int64_t> deps;
    for (int64_t d : t.deps)
      for (int64_t n : replaced[static_cast<size_t>(d)]) deps.push_back(n);
    const bool cut = t.ops.size() == 1 && is_linear(t.ops[0]) && t.processor == Processor::Npu;
    if (!cut) {
      sched::Task copy = t;
      copy.deps = deps;
      if (t.kind == sched::TaskKind::LmHead)  // W4A16 quantizes the LM head as well (§5.1)
        for (auto& op : copy.ops)
          if (op.kind == soc::OpKind::MemoryCopy)
            op.bytes = op.weight_bytes =
                static_cast<int64_t>(static_cast<double>(c.vocab_size * c.d_model) *
                                     weight_bytes_per_param(plan.linear));
      replaced[static_cast<size_t>(t.id)] = {out.add(std::move(copy))};
      continue;
    }
    const soc::OpDesc& lin = t.ops[0];
    const auto key = std::make_tuple(lin.m, lin.k, lin.n);
    auto it = solved.find(key);
    if (it == solved.end()) {
      it =
          solved.emplace(key, sched::solve_partition(lin, rules, solver_costs, engine.space)).first;
      partitions.push_back({{"site", lin.name},
                            {"m", lin.m},
                            {"k", lin.k},
                            {"n", lin.n},
                            {"partition", it->second.partition.to_json()},
                            {"predicted_us", it->second.time.total_us},
                            {"candidates", it->second.candidates}});
    }
    const auto& parts = it->second.partition.parts;
    for (size_t i = 0; i < parts.size(); ++i) {
      sched::Task p = t;
      p.processor = parts[i].processor;
      p.name = t.name + "." + soc::processor_name(p.processor) + std::to_string(i);
      p.ops = {sched::part_op(lin, parts[i])};
      p.deps = deps;
      p.working_bytes = p.ops[0].activation_bytes;
      replaced[static_cast<size_t>(t.id)].push_back(out.add(std::move(p)));
    }
  }
  if (engine.space == PartitionSpace::NpuOnline && !decode) {
    // Graphs prepared for this length before the NPU's first part (the seed times them with
    // the prefill: 408.4 ms of 1180 ms at 135 tokens).
    sched::Task prep;
    prep.name = "online_prepare";
    prep.kind = sched::TaskKind::GraphBuild;
    prep.processor = Processor::Npu;
    soc::OpDesc f;
    f.kind = soc::OpKind::Fixed;
    f.name = "online_prepare";
    f.fixed_us = online_prepare_ms(c, dev, prompt_len) * 1e3;
    prep.ops = {f};
    sched::TaskGraph with;
    with.meta = out.meta;
    const int64_t prep_id = with.add(std::move(prep));
    for (const auto& t : out.tasks()) {
      sched::Task copy = t;
      for (auto& d : copy.deps) d += 1;
      if (copy.processor == Processor::Npu) copy.deps.push_back(prep_id);
      with.add(std::move(copy));
    }
    out = std::move(with);
  }
  out.meta["engine"] = o.engine;
  out.meta["phase"] = o.phase;
  out.meta["characterization"] = dev.characterization();
  out.meta["fast_sync"] = o.fast_sync;
  out.meta["graph_rows"] = rows;
  out.meta["partitions"] = partitions;
  out.meta["predicted_partitions"] = costs != nullptr;
  out.meta["solve_for_timing_sync"] = o.solve_for_timing_sync;
  out.meta["co_runner"] = cost.co_runner();
  out.meta["solve_for_co_runner"] = o.solve_for_co_runner;
  return out;
}

PrefillTimeline simulate_hetero(const ModelConfig& c, const soc::DeviceProfile& device,
                                int64_t prompt_len, const HeteroOptions& o,
                                const sched::PartitionCosts* costs) {
  return simulate_graph(hetero_task_graph(c, device, prompt_len, o, costs), device, o.policy);
}

}  // namespace socllm
