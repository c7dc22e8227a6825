// Mirrors cpp/sched/ (task_graph.h, simulator.h, partition.h, head_pipeline.h) as part of
// socllm._core.sim: task graphs, the discrete-event simulator and its policies, HeteroLLM's
// partitions and solver, shadowAttn's head pipeline.
#include <pybind11/stl.h>

#include "common.h"
#include "sched/head_pipeline.h"
#include "sched/partition.h"
#include "sched/simulator.h"
#include "sched/task_graph.h"

namespace socllm::py_bind {

sched::PartitionCosts predicted_costs(const soc::CostModel& cost, const py::object& predictor,
                                      soc::Processor partner) {
  sched::PartitionCosts c = sched::PartitionCosts::of(cost, partner);
  c.time_us = [predictor](const soc::OpDesc& o, soc::Processor p) {
    const double us = predictor(json_to_py(o.to_json()), soc::processor_name(p)).cast<double>();
    if (!std::isfinite(us) || us < 0)
      throw InvalidArgument("[partition] the predictor gave " + std::to_string(us) + " µs for " +
                            json_text(o.to_json()) + " on " + soc::processor_name(p));
    return us;
  };
  return c;
}

namespace {
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
      .def_readonly("static_energy_mj", &sched::Timeline::static_energy_mj)
      .def_readonly("dram_energy_mj", &sched::Timeline::dram_energy_mj)
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
         int64_t optimal_max_tasks, std::optional<int64_t> steal_threshold) {
        sched::SimOptions o;
        o.policy = sched::policy_from_name(policy);
        o.optimal_max_tasks = optimal_max_tasks;
        o.steal_threshold = steal_threshold;
        py::gil_scoped_release release;
        return sched::simulate(g, cost, o);
      },
      py::arg("graph"), py::arg("cost"), py::arg("policy") = "ooe",
      py::arg("optimal_max_tasks") = 24, py::arg("steal_threshold") = py::none());

  s.def(
      "simulate_durations",
      [](const sched::TaskGraph& g, const std::vector<double>& durations_us, double sync_us,
         const std::string& policy, int64_t optimal_max_tasks,
         std::optional<int64_t> steal_threshold, std::optional<double> steal_cpu_time_ratio) {
        sched::SimOptions o;
        o.policy = sched::policy_from_name(policy);
        o.optimal_max_tasks = optimal_max_tasks;
        o.steal_threshold = steal_threshold;
        o.steal_cpu_time_ratio = steal_cpu_time_ratio;
        return sched::simulate(g, durations_us, sync_us, o);
      },
      py::arg("graph"), py::arg("durations_us"), py::arg("sync_us") = 0.0,
      py::arg("policy") = "ooe", py::arg("optimal_max_tasks") = 24,
      py::arg("steal_threshold") = py::none(), py::arg("steal_cpu_time_ratio") = py::none(),
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

  s.def("task_durations_us", &sched::task_durations_us, py::arg("graph"), py::arg("cost"));

  // partition.h, hetero.h
  s.def(
      "partition_rules",
      [](const py::object& profile, int64_t decode_rows) {
        const auto r = rules_of(profile_from_py(profile), decode_rows);
        py::dict d;
        d["npu_row_align"] = r.npu_row_align;
        d["npu_col_align"] = r.npu_col_align;
        d["npu_graph_rows"] = r.npu_graph_rows;
        return d;
      },
      py::arg("profile"), py::arg("decode_rows") = 0,
      "What the profile's NPU accepts (partition.h PartitionRules): its tile (row and column "
      "alignment) and pre-built static graph lengths (decode_rows > 0: one graph of those rows).");
  s.def(
      "make_partition",
      [](int64_t rows, int64_t cols, const std::vector<int64_t>& npu_graphs, int64_t npu_cols,
         const py::object& profile, int64_t decode_rows, const std::string& partner) {
        auto rules = rules_of(profile_from_py(profile), decode_rows);
        rules.partner = soc::processor_from_name(partner);
        return json_to_py(sched::make_partition(rows, cols, npu_graphs, npu_cols, rules).to_json());
      },
      py::arg("rows"), py::arg("cols"), py::arg("npu_graphs"), py::arg("npu_cols"),
      py::arg("profile"), py::arg("decode_rows") = 0, py::arg("partner") = "gpu",
      "A partition (partition.h make_partition): the NPU runs graphs of npu_graphs rows over the "
      "first npu_cols columns, the partner (gpu or cpu) the rest; validated against the "
      "profile's NPU rules.");
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
        const auto cost =
            soc::timing_cost_model(dev, characterization, fast_sync, decode, co_runner);
        const soc::OpDesc o = soc::OpDesc::from_json(py_to_json(op));
        const auto rules = rules_of(dev.with_characterization(characterization), decode ? o.m : 0);
        const auto costs = predictor.is_none()
                               ? sched::PartitionCosts::of(cost)
                               : predicted_costs(cost, predictor, soc::Processor::Gpu);
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
        const auto cost = soc::timing_cost_model(profile_from_py(profile), characterization,
                                                 fast_sync, decode, co_runner);
        return time_to_py(
            sched::partition_time(soc::OpDesc::from_json(py_to_json(op)),
                                  sched::MatmulPartition::from_json(py_to_json(partition)),
                                  sched::PartitionCosts::of(cost)));
      },
      py::arg("op"), py::arg("partition"), py::arg("profile"),
      py::arg("characterization") = "heterollm", py::arg("fast_sync") = true,
      py::arg("decode") = false, py::arg("co_runner") = "",
      "T_total of a partition under the cost model (real times).");
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
