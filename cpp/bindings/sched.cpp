// Mirrors cpp/include/socllm/task_graph.h, simulator.h and simulate.h as part of
// socllm._core.sim: task graphs, the discrete-event simulator, simulated prefills.
#include <pybind11/stl.h>

#include "common.h"
#include "socllm/block.h"
#include "socllm/cold_start.h"
#include "socllm/head_pipeline.h"
#include "socllm/plan.h"
#include "socllm/simulate.h"
#include "socllm/simulator.h"
#include "socllm/task_graph.h"

namespace socllm::py_bind {

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
         double rescore_share) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        const Plan p = plan_from_py(plan);
        const auto prof = py_to_json(profile);
        const auto dev =
            soc::DeviceProfile::from_json(prof, prof.value("name", std::string("profile")));
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
      "A prefill of a config timed on a device (simulate.h); head_* and attention_cpu_core: the "
      "head-wise attention of non-fp32 plans (block.h AttentionTimingOptions, head_pipeline.h).");

  s.def(
      "simulate_graph",
      [](const sched::TaskGraph& g, const py::object& profile, const std::string& policy,
         int64_t optimal_max_tasks, const std::string& head_policy) {
        const auto prof = py_to_json(profile);
        const auto dev =
            soc::DeviceProfile::from_json(prof, prof.value("name", std::string("profile")));
        py::gil_scoped_release nogil;
        return simulate_graph(g, dev, policy, optimal_max_tasks, head_policy);
      },
      py::arg("graph"), py::arg("profile"), py::arg("policy") = "npu-stall-first",
      py::arg("optimal_max_tasks") = 24, py::arg("head_policy") = "greedy",
      "Times a task graph (meta must give prompt_len); head-wise attention planned under "
      "head_policy unless the graph was planned before.");

  s.def("task_durations_us", &sched::task_durations_us, py::arg("graph"), py::arg("cost"));

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
        const auto prof = py_to_json(profile);
        const auto dev =
            soc::DeviceProfile::from_json(prof, prof.value("name", std::string("profile")));
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
