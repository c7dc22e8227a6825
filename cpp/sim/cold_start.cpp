#include "sim/cold_start.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "block/block.h"
#include "plan/plan.h"
#include "sim/simulate.h"

namespace socllm {

namespace {

constexpr std::array<const char*, 5> kSystems = {"edgeflow", "llm.npu+", "llm.npu", "llama.cpp",
                                                 "mnn"};
// llama.cpp's Q8_0: 32 int8 weights and an fp16 scale per 34-byte block.
constexpr double kQ8_0BitsPerWeight = 34.0 * 8.0 / 32.0;

// Output rows of a block's linears (one scale, and for EdgeFlow one width code, per row).
int64_t linear_rows_per_block(const ModelConfig& c) {
  int64_t rows = 0;
  for (int s = 0; s < kNumLinearSites; ++s) rows += linear_out_width(c, static_cast<LinearSite>(s));
  return rows;
}

Plan system_plan(const ColdStartOptions& o) {
  Plan p;
  switch (o.system) {
    case ColdStartSystem::EdgeFlow:
      p = Plan::parse("edgeflow:bits=" + std::to_string(o.bits));
      break;
    case ColdStartSystem::LlmNpuPlus:
    case ColdStartSystem::LlmNpu: p = Plan::from_name("w8a8"); break;
    case ColdStartSystem::LlamaCpp:
      p = Plan::from_name("w8-group").all_on(soc::Processor::Cpu);
      break;
    case ColdStartSystem::Mnn:
      p = Plan::from_name("w8a8-perchannel").all_on(soc::Processor::Cpu);
      break;
  }
  return p;
}

bool cpu_only(ColdStartSystem s) {
  return s == ColdStartSystem::LlamaCpp || s == ColdStartSystem::Mnn;
}

std::string default_policy(ColdStartSystem s) {
  switch (s) {
    case ColdStartSystem::EdgeFlow: return "position-steal";
    case ColdStartSystem::LlmNpuPlus:
    case ColdStartSystem::LlmNpu: return "npu-stall-first";
    default: return "first-ready";
  }
}

}  // namespace

const char* cold_start_system_name(ColdStartSystem s) {
  return kSystems.at(static_cast<size_t>(s));
}

ColdStartSystem cold_start_system_from_name(const std::string& s) {
  std::string known;
  for (size_t i = 0; i < kSystems.size(); ++i) {
    if (s == kSystems[i]) return static_cast<ColdStartSystem>(i);
    known += (i ? ", " : "") + std::string(kSystems[i]);
  }
  throw InvalidArgument("[cold start] unknown system '" + s + "' (known: " + known + ")");
}

int64_t cold_start_layer_bytes(const ModelConfig& c, const ColdStartOptions& o) {
  const double params = static_cast<double>(linear_params_per_block(c));
  const double rows = static_cast<double>(linear_rows_per_block(c));
  double bytes = 0;
  switch (o.system) {
    case ColdStartSystem::EdgeFlow:
      bytes = params * o.bits / 8.0 + rows * kWeightletRowMetadataBytes;
      break;
    case ColdStartSystem::LlmNpuPlus:
    case ColdStartSystem::LlmNpu: bytes = params; break;  // per-tensor scales: negligible
    case ColdStartSystem::LlamaCpp: bytes = params * kQ8_0BitsPerWeight / 8.0; break;
    case ColdStartSystem::Mnn: bytes = params + rows * 4.0; break;
  }
  return static_cast<int64_t>(std::ceil(bytes));
}

ChannelCostTable channel_cold_start_cost(const soc::DeviceProfile& device,
                                         std::span<const int64_t> in_features) {
  const std::string what = "the cold-start cost of a channel (bit_scope global-ttft)";
  const char* rel_ptr = "/processors/cpu_all/unpack_weightlet_relative_time_by_bits";
  const soc::CostModel cost(device);
  // per byte read and per weight unpacked, through the cost model (both are linear in size)
  constexpr double kProbe = 1e6;
  soc::OpDesc read;
  read.kind = soc::OpKind::FlashRead;
  read.bytes = static_cast<int64_t>(kProbe);
  soc::OpDesc unpack;
  unpack.kind = soc::OpKind::Unpack;
  unpack.name = "weightlet";
  unpack.elements = static_cast<int64_t>(kProbe);
  const double flash_s_per_byte = cost.latency_us(read, soc::Processor::Io) / kProbe * 1e-6;
  const double unpack_s_per_weight =
      cost.latency_us(unpack, soc::Processor::CpuAux) / kProbe * 1e-6;
  const nlohmann::json::json_pointer rel_at(std::string(rel_ptr) + "/value");
  if (!device.json().contains(rel_at))
    throw soc::MissingData("[cold start] device '" + device.name() + "' has no " + rel_ptr + " (" +
                           what + ")");
  const nlohmann::json& rel = device.json().at(rel_at);
  if (!rel.is_array() || rel.size() != 8 ||
      !std::all_of(rel.begin(), rel.end(), [](const auto& v) { return v.is_number(); }))
    throw FormatError("[cold start] device '" + device.name() + "': " + rel_ptr +
                      " must list 8 numbers (1..8 bits), got " + rel.dump());
  ChannelCostTable t;
  t.seconds.resize(in_features.size() * 8);
  for (size_t i = 0; i < in_features.size(); ++i) {
    const double n = static_cast<double>(in_features[i]);
    for (int b = 1; b <= 8; ++b)
      t.seconds[i * 8 + static_cast<size_t>(b - 1)] =
          (n * b / 8.0 + kWeightletRowMetadataBytes) * flash_s_per_byte +
          n * unpack_s_per_weight * rel[static_cast<size_t>(b - 1)].get<double>();
  }
  t.inputs = {
      {"flash_s_per_byte",
       {{"value", flash_s_per_byte}, {"source", device.source("/cost_model/memory/flash_gbps")}}},
      {"unpack_s_per_weight",
       {{"value", unpack_s_per_weight},
        {"source", device.source("/cost_model/cpu/unpack_weightlet_gweights_s")}}},
      {"unpack_relative", {{"value", rel}, {"source", device.source(rel_ptr)}}}};
  return t;
}

sched::TaskGraph cold_start_graph(const ModelConfig& c, const soc::DeviceProfile& device,
                                  const ColdStartOptions& o) {
  if (!(o.bits >= 1.0 && o.bits <= 8.0))
    throw InvalidArgument("[cold start] bits must be in [1, 8], got " + std::to_string(o.bits));
  if (o.prompt_len <= 0)
    throw InvalidArgument("[cold start] prompt_len must be > 0, got " +
                          std::to_string(o.prompt_len));
  const Plan plan = system_plan(o);
  GraphOptions po;
  if (o.system == ColdStartSystem::LlmNpu)
    std::tie(po.build_ms, po.optimize_ms) = runtime_graph_build_ms(c, device);
  sched::TaskGraph g =
      prefill_task_graph(c, plan, o.prompt_len, cpu_only(o.system) ? 0 : o.chunk_len, po);
  const int64_t n_prefill = g.size();

  // Loads (and unpacking) of every layer, in layer order, then the LM head's weights.
  auto flash_load = [&](const std::string& what, int64_t bytes, int64_t layer,
                        std::vector<int64_t> deps) {
    sched::Task t;
    t.kind = sched::TaskKind::Load;
    t.name = "load." + what;
    t.processor = soc::Processor::Io;
    t.layer = layer;
    soc::OpDesc read;
    read.kind = soc::OpKind::FlashRead;
    read.name = what;
    read.bytes = bytes;
    t.ops = {read};
    t.working_bytes = bytes;
    t.deps = std::move(deps);
    return g.add(std::move(t));
  };
  const int64_t layer_bytes = cold_start_layer_bytes(c, o);
  std::vector<int64_t> load(static_cast<size_t>(c.n_layers)), ready(load.size());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::vector<int64_t> after;
    if (l > 0) after = {load[static_cast<size_t>(l - 1)]};
    load[static_cast<size_t>(l)] = flash_load("L" + std::to_string(l), layer_bytes, l, after);
    ready[static_cast<size_t>(l)] = load[static_cast<size_t>(l)];
    if (o.system == ColdStartSystem::EdgeFlow) {
      sched::Task u;
      u.kind = sched::TaskKind::Unpack;
      u.name = "unpack.L" + std::to_string(l);
      u.processor = soc::Processor::CpuAux;
      u.layer = l;
      soc::OpDesc op;
      op.kind = soc::OpKind::Unpack;
      op.name = o.unpack_format;
      op.dtype = soc::DType::Int8;
      op.elements = linear_params_per_block(c);
      op.bytes = layer_bytes;
      u.ops = {op};
      u.working_bytes = layer_bytes + op.elements;
      u.deps = {load[static_cast<size_t>(l)]};
      if (l > 0) u.deps.push_back(ready[static_cast<size_t>(l - 1)]);
      ready[static_cast<size_t>(l)] = g.add(std::move(u));
    }
  }
  // INT8 rows of the LM head and their scales.
  const int64_t head_load =
      flash_load("lm_head", c.vocab_size * (c.d_model + 4), -1, {load.back()});

  // What each prefill task waits for besides its own dependencies.
  std::vector<std::vector<int64_t>> layer_tasks(static_cast<size_t>(c.n_layers));
  for (int64_t id = 0; id < n_prefill; ++id) {
    const sched::Task& t = g.at(id);
    if (t.layer >= 0) layer_tasks[static_cast<size_t>(t.layer)].push_back(id);
  }
  for (int64_t id = 0; id < n_prefill; ++id) {
    const sched::Task t = g.at(id);
    if (o.system == ColdStartSystem::Mnn || o.system == ColdStartSystem::LlmNpu) {
      g.add_dep(id, head_load);  // everything loaded before anything is prepared or computed
    } else if (t.kind == sched::TaskKind::LmHead) {
      g.add_dep(id, head_load);
    } else if (t.layer >= 0) {
      g.add_dep(id, ready[static_cast<size_t>(t.layer)]);
    }
  }
  // Demand paging (llama.cpp): a layer is read when the compute first touches it, after the
  // previous layer's compute.
  if (o.system == ColdStartSystem::LlamaCpp)
    for (int64_t l = 1; l < c.n_layers; ++l)
      for (int64_t id : layer_tasks[static_cast<size_t>(l - 1)])
        g.add_dep(load[static_cast<size_t>(l)], id);
  g.meta["cold_start"] = {{"system", cold_start_system_name(o.system)},
                          {"bits", o.system == ColdStartSystem::EdgeFlow ? o.bits : 8.0},
                          {"layer_bytes", layer_bytes},
                          {"unpack_format", o.unpack_format}};
  return g;
}

ColdStartTimeline simulate_cold_start(const ModelConfig& c, const soc::DeviceProfile& device,
                                      const ColdStartOptions& o) {
  ColdStartTimeline r;
  r.graph = cold_start_graph(c, device, o);
  sched::SimOptions so;
  so.policy = sched::policy_from_name(o.policy.empty() ? default_policy(o.system) : o.policy);
  so.steal_threshold = o.steal_threshold;
  r.timeline = sched::simulate(r.graph, soc::CostModel(device), so);
  r.timeline.device = device.name();
  return r;
}

nlohmann::json ColdStartTimeline::summary() const {
  nlohmann::json s = timeline.summary();
  double prefill_start = timeline.makespan_us;
  int64_t bytes = 0;
  for (const auto& t : graph.tasks()) {
    if (t.kind == sched::TaskKind::Load) {
      for (const auto& op : t.ops) bytes += op.bytes;
      continue;
    }
    if (t.kind == sched::TaskKind::Unpack) continue;
    prefill_start = std::min(prefill_start, timeline.spans[static_cast<size_t>(t.id)].start_us);
  }
  const auto busy = [&](soc::Processor p) {
    return timeline.usage[static_cast<size_t>(p)].busy_us / 1e3;
  };
  s["system"] = graph.meta["cold_start"]["system"];
  s["bits"] = graph.meta["cold_start"]["bits"];
  s["config"] = graph.meta.value("config", "");
  s["prompt_len"] = graph.meta.value("prompt_len", int64_t{0});
  s["ttft_ms"] = timeline.makespan_us / 1e3;
  s["read_ms"] = busy(soc::Processor::Io);
  s["unpack_ms"] = busy(soc::Processor::CpuAux);
  s["compute_ms"] = (timeline.makespan_us - prefill_start) / 1e3;
  s["bytes_read"] = bytes;
  return s;
}

}  // namespace socllm
