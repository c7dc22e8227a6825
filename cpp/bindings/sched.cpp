// Mirrors cpp/include/socllm/task_graph.h, simulator.h and simulate.h as part of
// socllm._core.sim: task graphs, the discrete-event simulator, simulated prefills.
#include <pybind11/stl.h>

#include "common.h"
#include "socllm/block.h"
#include "socllm/cold_start.h"
#include "socllm/head_pipeline.h"
#include "socllm/hetero.h"
#include "socllm/partition.h"
#include "socllm/plan.h"
#include "socllm/simulate.h"
#include "socllm/simulator.h"
#include "socllm/task_graph.h"

namespace socllm::py_bind {

namespace {
soc::DeviceProfile profile_from_py(const py::object& profile) {
  const auto prof = py_to_json(profile);
  return soc::DeviceProfile::from_json(prof, prof.value("name", std::string("profile")));
}

// The profiler's prediction mode from Python: predictor(op: dict, processor: str) -> µs; the
// cost model's sync and contention. Calls back into Python: the GIL stays held.
sched::PartitionCosts predicted_costs(const soc::CostModel& cost, const py::object& predictor) {
  sched::PartitionCosts c = sched::PartitionCosts::of(cost);
  c.time_us = [predictor](const soc::OpDesc& o, soc::Processor p) {
    const double us = predictor(json_to_py(o.to_json()), soc::processor_name(p)).cast<double>();
    if (!std::isfinite(us) || us < 0)
      throw InvalidArgument("[partition] the predictor gave " + std::to_string(us) + " µs for " +
                            json_text(o.to_json()) + " on " + soc::processor_name(p));
    return us;
  };
  return c;
}

sched::PartitionRules rules_of(const soc::DeviceProfile& dev, int64_t decode_rows) {
  auto r = sched::PartitionRules::from_profile(dev);
  return decode_rows > 0 ? r.for_rows(decode_rows) : r;
}

py::dict time_to_py(const sched::PartitionTime& t) {
  py::dict d;
  d["total_us"] = t.total_us;
  d["gpu_us"] = t.gpu_us;
  d["npu_us"] = t.npu_us;
  d["overlap_us"] = t.overlap_us;
  d["sync_us"] = t.sync_us;
  return d;
}
}  // namespace

void init_sched(py::module_& s) {
  py::class_<sched::TaskGraph>(s, "TaskGraph")
      .def(py::init<>())
      .def_static("from_json",
                  [](const py::object& j) { return sched::TaskGraph::from_json(py_to_json(j)); })
      .def("to_json", [](const sched::TaskGraph& g) { return json_to_py(g.to_json()); })
      .def_property(
          "meta", [](const sched::TaskGraph& g) { return json_to_py(g.meta); },
          [](sched::TaskGraph& g, const py::object& m) { g.meta = py_to_json(m); })
      .def("validate", &sched::TaskGraph::validate)
      .def("__len__", &sched::TaskGraph::size)
      .def("topological_order", &sched::TaskGraph::topological_order);

  py::class_<sched::Timeline>(s, "Timeline")
      .def_readonly("policy", &sched::Timeline::policy)
      .def_readonly("device", &sched::Timeline::device)
      .def_readonly("makespan_us", &sched::Timeline::makespan_us)
      .def_readonly("energy_mj", &sched::Timeline::energy_mj)
      .def_readonly("peak_working_bytes", &sched::Timeline::peak_working_bytes)
      .def_readonly("decisions", &sched::Timeline::decisions)
      .def_readonly("decision_ns_total", &sched::Timeline::decision_ns_total)
      .def_readonly("search_nodes", &sched::Timeline::search_nodes)
      .def_property_readonly(
          "spans",
          [](const sched::Timeline& t) {
            py::array_t<double> a({static_cast<py::ssize_t>(t.spans.size()), py::ssize_t{2}});
            auto r = a.mutable_unchecked<2>();
            for (size_t i = 0; i < t.spans.size(); ++i) {
              r(static_cast<py::ssize_t>(i), 0) = t.spans[i].start_us;
              r(static_cast<py::ssize_t>(i), 1) = t.spans[i].end_us;
            }
            return a;
          },
          "[n_tasks, 2] start and end (µs) of every task, by task id")
      .def_property_readonly(
          "span_processors",
          [](const sched::Timeline& t) {
            std::vector<std::string> out;
            for (const auto& sp : t.spans) out.push_back(soc::processor_name(sp.processor));
            return out;
          },
          "where every task ran, by task id (position-steal moves NPU tasks to the CPU)")
      .def("summary", [](const sched::Timeline& t) { return json_to_py(t.summary()); });

  s.def(
      "simulate",
      [](const sched::TaskGraph& g, const soc::CostModel& cost, const std::string& policy,
         int64_t optimal_max_tasks, int64_t steal_threshold) {
        sched::SimOptions o;
        o.policy = sched::policy_from_name(policy);
        o.optimal_max_tasks = optimal_max_tasks;
        o.steal_threshold = steal_threshold;
        py::gil_scoped_release release;
        return sched::simulate(g, cost, o);
      },
      py::arg("graph"), py::arg("cost"), py::arg("policy") = "ooe",
      py::arg("optimal_max_tasks") = 24, py::arg("steal_threshold") = 5);

  s.def(
      "simulate_durations",
      [](const sched::TaskGraph& g, const std::vector<double>& durations_us, double sync_us,
         const std::string& policy, int64_t optimal_max_tasks, int64_t steal_threshold,
         double steal_cpu_time_ratio) {
        sched::SimOptions o;
        o.policy = sched::policy_from_name(policy);
        o.optimal_max_tasks = optimal_max_tasks;
        o.steal_threshold = steal_threshold;
        o.steal_cpu_time_ratio = steal_cpu_time_ratio;
        return sched::simulate(g, durations_us, sync_us, o);
      },
      py::arg("graph"), py::arg("durations_us"), py::arg("sync_us") = 0.0,
      py::arg("policy") = "ooe", py::arg("optimal_max_tasks") = 24, py::arg("steal_threshold") = 5,
      py::arg("steal_cpu_time_ratio") = 5.0,
      "Simulation with given task durations and one cross-processor sync cost (hand examples).");

  s.def(
      "policies",
      [] {
        py::list l;
        for (const auto& p : sched::policies()) {
          py::dict d;
          d["name"] = p.name;
          d["alias"] = p.alias;
          d["description"] = p.description;
          l.append(d);
        }
        return l;
      },
      "The scheduling policies (simulator.h): name, alias (earlier short name), description.");
  s.def(
      "policy_name",
      [](const std::string& s) { return sched::policy_name(sched::policy_from_name(s)); },
      py::arg("policy"), "Canonical name of a policy name or alias (InvalidArgument if unknown).");

  py::class_<PrefillTimeline>(s, "PrefillTimeline", "A simulated prefill (simulate.h).")
      .def_readonly("graph", &PrefillTimeline::graph)
      .def_readonly("timeline", &PrefillTimeline::timeline)
      .def_property_readonly(
          "head_plans", [](const PrefillTimeline& t) { return json_to_py(t.head_plans); },
          "One dict per head pipeline planned: chunk, layer, plan, problem (head_pipeline.h).")
      .def("summary", [](const PrefillTimeline& t) { return json_to_py(t.summary()); });

  s.def(
      "simulate_prefill",
      [](const py::object& config, const py::handle& plan, const py::object& profile,
         int64_t prompt_len, int64_t chunk_len, const std::string& policy, bool runtime_graph_build,
         double shadow_channels, int64_t optimal_max_tasks, const std::string& head_policy,
         const std::string& attention_cpu_core, int64_t max_fused_heads,
         const std::vector<double>& head_ratios, const std::vector<int64_t>& head_buckets,
         double rescore_share, const std::string& co_runner, const std::string& characterization) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        const Plan p = plan_from_py(plan);
        const auto dev = profile_from_py(profile);
        PrefillSimOptions o;
        o.policy = policy;
        o.runtime_graph_build = runtime_graph_build;
        o.shadow_channels = shadow_channels;
        o.optimal_max_tasks = optimal_max_tasks;
        o.head_policy = head_policy;
        o.attention.cpu_core = attention_cpu_core;
        o.attention.max_fused_heads = max_fused_heads;
        o.attention.head_ratios = head_ratios;
        o.attention.head_buckets = head_buckets;
        o.attention.rescore_share = rescore_share;
        o.co_runner = co_runner;
        o.characterization = characterization;
        py::gil_scoped_release nogil;
        return simulate_prefill(c, p, dev, prompt_len, chunk_len, o);
      },
      py::arg("config"), py::arg("plan"), py::arg("profile"), py::arg("prompt_len"),
      py::arg("chunk_len"), py::arg("policy") = "npu-stall-first",
      py::arg("runtime_graph_build") = false, py::arg("shadow_channels") = kDefaultShadowChannels,
      py::arg("optimal_max_tasks") = 24, py::arg("head_policy") = "greedy",
      py::arg("attention_cpu_core") = "auto", py::arg("max_fused_heads") = 4,
      py::arg("head_ratios") = std::vector<double>{},
      py::arg("head_buckets") = std::vector<int64_t>{}, py::arg("rescore_share") = 1.0,
      py::arg("co_runner") = "", py::arg("characterization") = "",
      "A prefill of a config timed on a device (simulate.h); head_* and attention_cpu_core: the "
      "head-wise attention of non-fp32 plans (block.h AttentionTimingOptions, head_pipeline.h).");

  s.def(
      "simulate_graph",
      [](const sched::TaskGraph& g, const py::object& profile, const std::string& policy,
         int64_t optimal_max_tasks, const std::string& head_policy) {
        const auto dev = profile_from_py(profile);
        py::gil_scoped_release nogil;
        return simulate_graph(g, dev, policy, optimal_max_tasks, head_policy);
      },
      py::arg("graph"), py::arg("profile"), py::arg("policy") = "npu-stall-first",
      py::arg("optimal_max_tasks") = 24, py::arg("head_policy") = "greedy",
      "Times a task graph (meta must give prompt_len); head-wise attention planned under "
      "head_policy unless the graph was planned before.");

  s.def("task_durations_us", &sched::task_durations_us, py::arg("graph"), py::arg("cost"));

  // partition.h, hetero.h
  s.def(
      "hetero_engines",
      [] {
        py::list l;
        for (const auto& e : hetero_engines()) {
          py::dict d;
          d["name"] = e.name;
          d["space"] = sched::partition_space_name(e.space);
          d["description"] = e.description;
          l.append(d);
        }
        return l;
      },
      "HeteroLLM's engines (hetero.h): name, partition space, description.");
  s.def(
      "make_partition",
      [](int64_t rows, int64_t cols, const std::vector<int64_t>& npu_graphs, int64_t npu_cols,
         const py::object& profile, int64_t decode_rows) {
        return json_to_py(sched::make_partition(rows, cols, npu_graphs, npu_cols,
                                                rules_of(profile_from_py(profile), decode_rows))
                              .to_json());
      },
      py::arg("rows"), py::arg("cols"), py::arg("npu_graphs"), py::arg("npu_cols"),
      py::arg("profile"), py::arg("decode_rows") = 0,
      "A partition (partition.h make_partition): the NPU runs graphs of npu_graphs rows over the "
      "first npu_cols columns, the GPU the rest; validated against the profile's NPU rules.");
  s.def(
      "row_partition",
      [](int64_t rows, int64_t cols, double npu_share, const py::object& profile,
         int64_t decode_rows) {
        return json_to_py(sched::row_cut_share(rows, cols, npu_share,
                                               rules_of(profile_from_py(profile), decode_rows))
                              .to_json());
      },
      py::arg("rows"), py::arg("cols"), py::arg("npu_share"), py::arg("profile"),
      py::arg("decode_rows") = 0,
      "A row cut giving the NPU npu_share of the output columns (aligned; seed 002 §4.1).");
  s.def(
      "validate_partition",
      [](const py::object& partition, const py::object& profile, int64_t decode_rows) {
        sched::validate(sched::MatmulPartition::from_json(py_to_json(partition)),
                        rules_of(profile_from_py(profile), decode_rows));
      },
      py::arg("partition"), py::arg("profile"), py::arg("decode_rows") = 0);
  s.def(
      "npu_graph_cover",
      [](int64_t rows, const std::string& how, const py::object& profile) {
        const auto r = rules_of(profile_from_py(profile), 0);
        if (how == "pipe") return sched::pipe_graphs(rows, r);
        if (how == "padding") return sched::padded_graphs(rows, r);
        throw InvalidArgument("[partition] cover must be pipe or padding, got '" + how + "'");
      },
      py::arg("rows"), py::arg("how"), py::arg("profile"));
  s.def(
      "solve_partition",
      [](const py::object& op, const py::object& profile, const std::string& space,
         const std::string& characterization, bool fast_sync, bool decode, int64_t col_step,
         const py::object& predictor, const std::string& co_runner) {
        const auto dev = profile_from_py(profile);
        const auto cost = timing_cost_model(dev, characterization, fast_sync, decode, co_runner);
        const soc::OpDesc o = soc::OpDesc::from_json(py_to_json(op));
        const auto rules = rules_of(dev.with_characterization(characterization), decode ? o.m : 0);
        const auto costs = predictor.is_none() ? sched::PartitionCosts::of(cost)
                                               : predicted_costs(cost, predictor);
        const auto c = sched::solve_partition(o, rules, costs,
                                              sched::partition_space_from_name(space), col_step);
        py::dict d;
        d["partition"] = json_to_py(c.partition.to_json());
        d["time"] = time_to_py(c.time);
        d["candidates"] = c.candidates;
        return d;
      },
      py::arg("op"), py::arg("profile"), py::arg("space") = "tensor",
      py::arg("characterization") = "heterollm", py::arg("fast_sync") = true,
      py::arg("decode") = false, py::arg("col_step") = 0, py::arg("predictor") = py::none(),
      py::arg("co_runner") = "",
      "The partition solver (partition.h, seed 002 §4.3) for one linear op dict; predictor(op, "
      "processor) -> µs replaces the cost model's times (the profiler's prediction mode).");
  s.def(
      "partition_time",
      [](const py::object& op, const py::object& partition, const py::object& profile,
         const std::string& characterization, bool fast_sync, bool decode,
         const std::string& co_runner) {
        const auto cost = timing_cost_model(profile_from_py(profile), characterization, fast_sync,
                                            decode, co_runner);
        return time_to_py(
            sched::partition_time(soc::OpDesc::from_json(py_to_json(op)),
                                  sched::MatmulPartition::from_json(py_to_json(partition)),
                                  sched::PartitionCosts::of(cost)));
      },
      py::arg("op"), py::arg("partition"), py::arg("profile"),
      py::arg("characterization") = "heterollm", py::arg("fast_sync") = true,
      py::arg("decode") = false, py::arg("co_runner") = "",
      "T_total of a partition under the cost model (real times).");
  s.def(
      "simulate_hetero",
      [](const py::object& config, const py::object& profile, int64_t prompt_len,
         const std::string& engine, bool fast_sync, const std::string& characterization,
         const std::string& policy, const std::string& phase, const std::string& plan,
         const py::object& predictor, bool solve_for_timing_sync, const std::string& co_runner,
         bool solve_for_co_runner) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        const auto dev = profile_from_py(profile);
        HeteroOptions o;
        o.engine = engine;
        o.fast_sync = fast_sync;
        o.characterization = characterization;
        o.policy = policy;
        o.phase = phase;
        o.plan = plan;
        o.solve_for_timing_sync = solve_for_timing_sync;
        o.co_runner = co_runner;
        o.solve_for_co_runner = solve_for_co_runner;
        if (predictor.is_none()) {
          py::gil_scoped_release nogil;
          return simulate_hetero(c, dev, prompt_len, o);
        }
        const auto cost = hetero_cost_model(dev, o);
        const auto costs = predicted_costs(cost, predictor);
        return simulate_hetero(c, dev, prompt_len, o, &costs);
      },
      py::arg("config"), py::arg("profile"), py::arg("prompt_len"),
      py::arg("engine") = "hetero-tensor", py::arg("fast_sync") = true,
      py::arg("characterization") = "heterollm", py::arg("policy") = "first-ready",
      py::arg("phase") = "prefill", py::arg("plan") = "w4a16", py::arg("predictor") = py::none(),
      py::arg("solve_for_timing_sync") = false, py::arg("co_runner") = "",
      py::arg("solve_for_co_runner") = false,
      "A HeteroLLM engine's prefill or decoding step timed on a device (hetero.h); predictor: the "
      "solver decides on predicted times, the timeline is the cost model's.");

  // cold_start.h
  py::class_<ColdStartTimeline>(s, "ColdStartTimeline", "A simulated cold start (cold_start.h).")
      .def_readonly("graph", &ColdStartTimeline::graph)
      .def_readonly("timeline", &ColdStartTimeline::timeline)
      .def("summary", [](const ColdStartTimeline& t) { return json_to_py(t.summary()); });
  s.def(
      "simulate_cold_start",
      [](const py::object& config, const py::object& profile, const std::string& system,
         double bits, int64_t prompt_len, int64_t chunk_len, const std::string& policy,
         const std::string& unpack_format, int64_t steal_threshold) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        const auto dev = profile_from_py(profile);
        ColdStartOptions o;
        o.system = cold_start_system_from_name(system);
        o.bits = bits;
        o.prompt_len = prompt_len;
        o.chunk_len = chunk_len;
        o.policy = policy;
        o.unpack_format = unpack_format;
        o.steal_threshold = steal_threshold;
        py::gil_scoped_release nogil;
        return simulate_cold_start(c, dev, o);
      },
      py::arg("config"), py::arg("profile"), py::arg("system") = "edgeflow", py::arg("bits") = 5.0,
      py::arg("prompt_len") = 128, py::arg("chunk_len") = 256, py::arg("policy") = "",
      py::arg("unpack_format") = "weightlet", py::arg("steal_threshold") = 5,
      "A cold start (flash reads, unpacking, graph preparation, prefill to the first token) of "
      "a config under a system (edgeflow, llm.npu+, llm.npu, llama.cpp, mnn) on a device "
      "(cold_start.h); policy '' = the system's own.");

  // head_pipeline.h
  s.def(
      "head_policies",
      [] {
        py::list l;
        for (const auto& p : sched::head_policies()) {
          py::dict d;
          d["name"] = p.name;
          d["description"] = p.description;
          l.append(d);
        }
        return l;
      },
      "The head-pipeline policies (head_pipeline.h): name, description.");
  s.def(
      "plan_head_pipeline",
      [](const py::object& problem, const std::string& policy, int64_t optimal_max_nodes) {
        const auto p = sched::HeadPipelineProblem::from_json(py_to_json(problem));
        const auto hp = sched::head_policy_from_name(policy);
        sched::HeadPipelineOptions o;
        o.optimal_max_nodes = optimal_max_nodes;
        sched::HeadPipelinePlan r;
        {
          py::gil_scoped_release nogil;
          r = sched::HeadPipelinePlanner(o).plan(p, hp);
        }
        return json_to_py(r.to_json());
      },
      py::arg("problem"), py::arg("policy") = "greedy", py::arg("optimal_max_nodes") = 50'000'000,
      "Plans one head pipeline: problem {topk_us, qkv_us, launches, launch_us, sync_us, "
      "shared_cpu} -> {policy, launch_order, head_order, latency_us, orders_evaluated, "
      "planner_ns}.");
  s.def(
      "pipeline_latency_us",
      [](const py::object& problem, const std::vector<int64_t>& launch_order,
         const std::vector<int64_t>& head_order, bool sequential) {
        return sched::pipeline_latency_us(
            sched::HeadPipelineProblem::from_json(py_to_json(problem)), launch_order, head_order,
            sequential);
      },
      py::arg("problem"), py::arg("launch_order"), py::arg("head_order"),
      py::arg("sequential") = false, "Latency (µs) of one order under Algorithm 1's model.");
  s.def(
      "fuse_launches",
      [](const std::vector<int64_t>& buckets, int64_t max_fused_heads) {
        return sched::fuse_launches(buckets, max_fused_heads);
      },
      py::arg("bucket_of_head"), py::arg("max_fused_heads"),
      "Heads sharing a bucket id fused into launches of at most max_fused_heads (0: no limit).");
  s.def(
      "to_trace_json",
      [](const sched::TaskGraph& g, const sched::Timeline& t) {
        return json_to_py(sched::to_trace_json(g, t));
      },
      py::arg("graph"), py::arg("timeline"));
}

}  // namespace socllm::py_bind
