// Mirrors cpp/sim/ (simulate.h, hetero.h, cold_start.h) as part of socllm._core.sim: a request
// of a config under a plan timed on a device (prefill, decoding step or session), a recorded
// graph timed, HeteroLLM's engines, cold starts.
#include <pybind11/stl.h>

#include <optional>

#include "block/block.h"
#include "common.h"
#include "plan/plan.h"
#include "sim/cold_start.h"
#include "sim/hetero.h"
#include "sim/simulate.h"

namespace socllm::py_bind {

void init_sim(py::module_& s) {
  py::class_<PrefillTimeline>(s, "PrefillTimeline",
                              "A simulated request: graph, timeline, summary (simulate.h).")
      .def_readonly("graph", &PrefillTimeline::graph)
      .def_readonly("timeline", &PrefillTimeline::timeline)
      .def_property_readonly(
          "head_plans", [](const PrefillTimeline& t) { return json_to_py(t.head_plans); },
          "One dict per head pipeline planned: chunk, layer, plan, problem (head_pipeline.h).")
      .def("summary", [](const PrefillTimeline& t) { return json_to_py(t.summary()); });

  s.def(
      "simulate_request",
      [](const py::object& config, const py::handle& plan, const py::object& profile,
         int64_t prompt_len, int64_t chunk_len, const std::string& phase, int64_t decode_tokens,
         const std::string& policy, bool runtime_graph_build, double shadow_channels,
         int64_t optimal_max_tasks, const std::string& head_policy,
         const std::string& attention_cpu_core, int64_t max_fused_heads,
         const std::vector<double>& head_ratios, const std::vector<int64_t>& head_buckets,
         double rescore_share, const std::string& co_runner, const std::string& characterization,
         const std::optional<bool>& fast_sync) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        const auto dev = device_from_py(profile);
        const Plan p = plan_from_py(plan).on_device(dev);
        SimOptions o;
        o.phase = phase;
        o.decode_tokens = decode_tokens;
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
        o.fast_sync = fast_sync;
        py::gil_scoped_release nogil;
        return simulate_request(c, p, *dev, prompt_len, chunk_len, o);
      },
      py::arg("config"), py::arg("plan"), py::arg("profile"), py::arg("prompt_len"),
      py::arg("chunk_len"), py::arg("phase") = "prefill", py::arg("decode_tokens") = 0,
      py::arg("policy") = "npu-stall-first", py::arg("runtime_graph_build") = false,
      py::arg("shadow_channels") = kDefaultShadowChannels, py::arg("optimal_max_tasks") = 24,
      py::arg("head_policy") = "greedy", py::arg("attention_cpu_core") = "auto",
      py::arg("max_fused_heads") = 4, py::arg("head_ratios") = std::vector<double>{},
      py::arg("head_buckets") = std::vector<int64_t>{}, py::arg("rescore_share") = 1.0,
      py::arg("co_runner") = "", py::arg("characterization") = "",
      py::arg("fast_sync") = py::none(),
      "A request of a config timed on a device (simulate.h): phase prefill, decode (one step on "
      "a cache of prompt_len) or session (the prefill then decode_tokens steps); head_* and "
      "attention_cpu_core: the head-wise attention of non-fp32 plans (block.h "
      "AttentionTimingOptions, head_pipeline.h); characterization / fast_sync replace the "
      "plan's timing assumptions.");

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

  s.def(
      "hetero_engines",
      [] {
        py::list l;
        for (const auto& e : Plan::hetero_engines()) {
          const Plan p = Plan::from_name(e);
          py::dict d;
          d["name"] = e;
          d["partition"] = p.partition.mode();
          d["description"] = Plan::describe(e);
          l.append(d);
        }
        return l;
      },
      "HeteroLLM's engines, plan presets (plan.h): name, partition mode, description.");
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
        const auto cost =
            soc::timing_cost_model(dev, characterization, fast_sync, phase == "decode", co_runner);
        const auto costs = predicted_costs(cost, predictor, soc::Processor::Gpu);
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
         const std::string& unpack_format, std::optional<int64_t> steal_threshold) {
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
      py::arg("unpack_format") = "weightlet", py::arg("steal_threshold") = py::none(),
      "A cold start (flash reads, unpacking, graph preparation, prefill to the first token) of "
      "a config under a system (edgeflow, llm.npu+, llm.npu, llama.cpp, mnn) on a device "
      "(cold_start.h); policy '' = the system's own.");
  s.def(
      "channel_cold_start_cost",
      [](const py::object& profile, const py::handle& in_features) {
        const auto dev = profile_from_py(profile);
        const auto n = numeric_array<int64_t>(in_features, "[channel_cold_start_cost] in_features");
        if (n.ndim() != 1)
          throw ShapeError("[channel_cold_start_cost] in_features must be 1-D, got " +
                           shape_str(n));
        auto t = channel_cold_start_cost(dev, {n.data(), static_cast<size_t>(n.size())});
        py::array_t<double> table({static_cast<py::ssize_t>(n.size()), py::ssize_t{8}});
        std::copy(t.seconds.begin(), t.seconds.end(), table.mutable_data());
        return py::make_tuple(table, json_to_py(t.inputs));
      },
      py::arg("profile"), py::arg("in_features"),
      "(seconds [channels, 8], inputs): the modelled cold-start cost of single output channels of "
      "in_features weights at 1..8 bits (column B - 1) and the profile numbers it used with their "
      "sources (cold_start.h; bit_scope global-ttft's costs).");
}

}  // namespace socllm::py_bind
