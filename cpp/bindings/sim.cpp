// Bindings of the SoC and scheduling layers (soc.h, task_graph.h, simulator.h): device
// profiles, cost models, task graphs and the discrete-event simulator.
#include <pybind11/stl.h>

#include "common.h"
#include "socllm/simulator.h"

namespace socllm::py_bind {

namespace {
soc::OpDesc op_from_py(const py::handle& o) { return soc::OpDesc::from_json(py_to_json(o)); }

sched::Placement placement_from_py(const py::dict& d) {
  sched::Placement p;
  const auto j = py_to_json(d);
  if (!j.contains("processor") || !j["processor"].is_object())
    throw InvalidArgument("[Placement] needs 'processor': {subgraph kind: npu|cpu|gpu} for attn_in, "
                          "attention, o_proj, mlp_in, mlp_act, down; got " + j.dump());
  for (int k = 0; k < 6; ++k) {
    const char* name = sched::task_kind_name(static_cast<sched::TaskKind>(k));
    if (!j["processor"].contains(name))
      throw InvalidArgument(std::string("[Placement] no processor for subgraph '") + name + "'");
    p.processor[static_cast<size_t>(k)] = soc::processor_from_name(j["processor"][name].get<std::string>());
  }
  p.linear_dtype = soc::dtype_from_name(j.value("linear_dtype", std::string("int8")));
  p.float_dtype = soc::dtype_from_name(j.value("float_dtype", std::string("fp16")));
  p.linear_group_size = j.value("linear_group_size", int64_t{0});
  if (p.linear_group_size < 0)
    throw InvalidArgument("[Placement] linear_group_size must be >= 0, got " +
                          std::to_string(p.linear_group_size));
  return p;
}

std::vector<sched::ShadowLoad> shadow_from_py(const py::object& o) {
  std::vector<sched::ShadowLoad> out;
  if (o.is_none()) return out;
  for (const auto& item : o) {
    const auto j = py_to_json(item);
    sched::ShadowLoad s;
    s.pruned = j.value("pruned", false);
    s.outlier_channels = j.value("outlier_channels", 0.0);
    s.cold_fetch_bytes = j.value("cold_fetch_bytes", 0.0);
    if (s.outlier_channels < 0 || s.cold_fetch_bytes < 0)
      throw InvalidArgument("[ShadowLoad] negative load " + j.dump());
    out.push_back(s);
  }
  return out;
}
}  // namespace

void init_sim(py::module_& m) {
  auto s = m.def_submodule("sim", "SoC profiles, cost models, task graphs, discrete-event simulation");

  py::class_<soc::DeviceProfile>(s, "DeviceProfile")
      .def_static("from_json", [](const py::object& j, const std::string& origin) {
        return soc::DeviceProfile::from_json(py_to_json(j), origin);
      }, py::arg("profile"), py::arg("origin") = "profile")
      .def_property_readonly("name", &soc::DeviceProfile::name)
      .def("has", &soc::DeviceProfile::has, py::arg("pointer"))
      .def("number", &soc::DeviceProfile::number, py::arg("pointer"), py::arg("needed_for") = "a lookup")
      .def("source", &soc::DeviceProfile::source, py::arg("pointer"));

  py::class_<soc::CostModel>(s, "CostModel")
      .def(py::init<soc::DeviceProfile>(), py::arg("profile"))
      .def_property_readonly("profile", &soc::CostModel::profile)
      .def("latency_us", [](const soc::CostModel& c, const py::handle& op, const std::string& proc) {
        return c.latency_us(op_from_py(op), soc::processor_from_name(proc));
      }, py::arg("op"), py::arg("processor"),
      "Latency (µs) of one operator, given as a dict: {'op': 'matmul', 'dtype': 'int8', 'm':..., "
      "'k':..., 'n':...} (see soc.h OpDesc), on 'npu' | 'cpu' | 'gpu'.")
      .def("active_power_w", [](const soc::CostModel& c, const std::string& p) {
        return c.active_power_w(soc::processor_from_name(p));
      })
      .def("sync_us", [](const soc::CostModel& c, const std::string& a, const std::string& b) {
        return c.sync_us(soc::processor_from_name(a), soc::processor_from_name(b));
      });

  py::class_<sched::TaskGraph>(s, "TaskGraph")
      .def(py::init<>())
      .def_static("from_json", [](const py::object& j) { return sched::TaskGraph::from_json(py_to_json(j)); })
      .def("to_json", [](const sched::TaskGraph& g) { return json_to_py(g.to_json()); })
      .def("validate", &sched::TaskGraph::validate)
      .def("__len__", &sched::TaskGraph::size)
      .def("topological_order", &sched::TaskGraph::topological_order);

  s.def("build_prefill_graph", [](const py::object& config, const py::dict& placement, int64_t prompt_len,
                                   int64_t chunk_len, const py::object& shadow) {
    return sched::build_prefill_graph(sched::ShapeConfig::from_json(py_to_json(config)),
                                      placement_from_py(placement), prompt_len, chunk_len,
                                      shadow_from_py(shadow));
  }, py::arg("config"), py::arg("placement"), py::arg("prompt_len"), py::arg("chunk_len"),
  py::arg("shadow") = py::none(),
  "llm.npu prefill task graph of a shape-only config (task_graph.h): chunks of chunk_len, the "
  "six subgraphs per layer placed as `placement` says, and shadow-outlier CPU tasks from "
  "`shadow` (n_layers * 4 dicts: pruned, outlier_channels, cold_fetch_bytes).");

  s.def("graph_builder_chunks", [](const py::object& config, const py::dict& placement,
                                    const std::vector<int64_t>& chunks,
                                    const py::object& shadow_per_chunk, double build_ms, double optimize_ms,
                                    int64_t lm_head_rows) {
    sched::PrefillGraphBuilder b(sched::ShapeConfig::from_json(py_to_json(config)), placement_from_py(placement));
    if (build_ms > 0 || optimize_ms > 0) b.add_graph_builds(chunks.empty() ? 0 : chunks[0], build_ms, optimize_ms);
    std::vector<py::object> per_chunk;
    if (!shadow_per_chunk.is_none())
      for (const auto& x : shadow_per_chunk) per_chunk.push_back(py::reinterpret_borrow<py::object>(x));
    if (!per_chunk.empty() && per_chunk.size() != chunks.size())
      throw ShapeError("[graph_builder_chunks] " + std::to_string(per_chunk.size()) + " shadow lists for " +
                       std::to_string(chunks.size()) + " chunks");
    int64_t kv = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      kv += chunks[c];
      b.add_chunk(static_cast<int64_t>(c), chunks[c], kv,
                  per_chunk.empty() ? std::vector<sched::ShadowLoad>{} : shadow_from_py(per_chunk[c]));
    }
    if (lm_head_rows > 0) b.add_lm_head(lm_head_rows);
    return b.take();
  }, py::arg("config"), py::arg("placement"), py::arg("chunks"), py::arg("shadow_per_chunk") = py::none(),
  py::arg("build_ms") = 0.0, py::arg("optimize_ms") = 0.0, py::arg("lm_head_rows") = 1,
  "A prefill graph chunk by chunk: chunks = rows of each chunk (padded length), optional run-time graph builds "
  "(naive NPU execution) and per-chunk shadow loads (what an engine run measured).");

  py::class_<sched::Timeline>(s, "Timeline")
      .def_readonly("policy", &sched::Timeline::policy)
      .def_readonly("device", &sched::Timeline::device)
      .def_readonly("makespan_us", &sched::Timeline::makespan_us)
      .def_readonly("energy_mj", &sched::Timeline::energy_mj)
      .def_readonly("peak_working_bytes", &sched::Timeline::peak_working_bytes)
      .def_readonly("decisions", &sched::Timeline::decisions)
      .def_readonly("decision_ns_total", &sched::Timeline::decision_ns_total)
      .def_readonly("search_nodes", &sched::Timeline::search_nodes)
      .def_property_readonly("spans", [](const sched::Timeline& t) {
        py::array_t<double> a({static_cast<py::ssize_t>(t.spans.size()), py::ssize_t{2}});
        auto r = a.mutable_unchecked<2>();
        for (size_t i = 0; i < t.spans.size(); ++i) {
          r(static_cast<py::ssize_t>(i), 0) = t.spans[i].start_us;
          r(static_cast<py::ssize_t>(i), 1) = t.spans[i].end_us;
        }
        return a;
      }, "[n_tasks, 2] start and end (µs) of every task, by task id")
      .def("summary", [](const sched::Timeline& t) { return json_to_py(t.summary()); });

  s.def("simulate", [](const sched::TaskGraph& g, const soc::CostModel& cost, const std::string& policy,
                       int64_t optimal_max_tasks) {
    sched::SimOptions o;
    o.policy = sched::policy_from_name(policy);
    o.optimal_max_tasks = optimal_max_tasks;
    py::gil_scoped_release release;
    return sched::simulate(g, cost, o);
  }, py::arg("graph"), py::arg("cost"), py::arg("policy") = "ooe", py::arg("optimal_max_tasks") = 24);

  s.def("simulate_durations", [](const sched::TaskGraph& g, const std::vector<double>& durations_us,
                                 double sync_us, const std::string& policy, int64_t optimal_max_tasks) {
    sched::SimOptions o;
    o.policy = sched::policy_from_name(policy);
    o.optimal_max_tasks = optimal_max_tasks;
    return sched::simulate(g, durations_us, sync_us, o);
  }, py::arg("graph"), py::arg("durations_us"), py::arg("sync_us") = 0.0, py::arg("policy") = "ooe",
  py::arg("optimal_max_tasks") = 24,
  "Simulation with given task durations and one cross-processor sync cost (hand examples).");

  s.def("task_durations_us", &sched::task_durations_us, py::arg("graph"), py::arg("cost"));
  s.def("to_trace_json", [](const sched::TaskGraph& g, const sched::Timeline& t) {
    return json_to_py(sched::to_trace_json(g, t));
  }, py::arg("graph"), py::arg("timeline"));
}

}  // namespace socllm::py_bind
