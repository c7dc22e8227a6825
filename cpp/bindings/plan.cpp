// Mirrors cpp/include/socllm/plan.h and block.h: plans (placement, formats, chunking) and the
// decoder block with the graphs it makes (census, prefill task graph).
#include <pybind11/stl.h>

#include <optional>

#include "common.h"
#include "socllm/block.h"
#include "socllm/calibration.h"
#include "socllm/plan.h"
#include "socllm/static_graph.h"

namespace socllm::py_bind {

Plan plan_from_py(const py::handle& p) {
  if (py::isinstance<Plan>(p)) return p.cast<Plan>();
  // through py_to_json: a str that is not valid Unicode (lone surrogates) is InvalidArgument
  if (py::isinstance<py::str>(p)) return Plan::parse(py_to_json(p, "Plan").get<std::string>());
  if (py::isinstance<py::dict>(p)) return Plan::from_json(py_to_json(p, "Plan"));
  throw InvalidArgument("[Plan] a plan is a name, a dict or a Plan, got " +
                        std::string(py::str(py::type::of(p).attr("__name__"))) + " " +
                        Plan::known_list());
}

void init_plan(py::module_& m) {
  py::class_<Plan>(m, "Plan", "How each operator class runs. Build from a name or a dict.")
      .def(py::init([](const py::handle& p) { return plan_from_py(p); }), py::arg("plan"))
      .def_readonly("name", &Plan::name)
      .def_readonly("chunk_len", &Plan::chunk_len)
      .def_property_readonly("needs_calibration", &Plan::needs_calibration)
      .def("to_json", [](const Plan& p) { return json_to_py(p.to_json()); })
      .def_property_readonly(
          "attention", [](const Plan& p) { return json_to_py(p.attention.to_json()); },
          "The prefill attention scheme: {'kind': ..., options} (attention_scheme.h)")
      .def_property_readonly(
          "placement",
          [](const Plan& p) {
            py::dict d;
            for (int i = 0; i < kNumOpClasses; ++i) {
              const OpPlacement& o = p.placement[static_cast<size_t>(i)];
              py::dict e;
              e["processor"] = soc::processor_name(o.processor);
              e["format"] = soc::dtype_name(o.format);
              d[op_class_name(static_cast<OpClass>(i))] = e;
            }
            return d;
          },
          "{op class: {'processor': ..., 'format': ...}} (plan.h)")
      .def(
          "placed",
          [](const Plan& p, const std::string& op_class, const std::string& processor,
             const std::optional<std::string>& format) {
            std::optional<soc::DType> f;
            if (format) f = soc::dtype_from_name(*format);
            return p.placed(op_class_from_name(op_class), soc::processor_from_name(processor), f);
          },
          py::arg("op_class"), py::arg("processor"), py::arg("format") = py::none(),
          "A copy with one op class moved to another processor (and format).")
      .def(
          "all_on",
          [](const Plan& p, const std::string& processor) {
            return p.all_on(soc::processor_from_name(processor));
          },
          py::arg("processor"),
          "A copy with every op class on one processor (float ops in fp16 off the CPU).")
      .def(
          "with_chunk_len",
          [](const Plan& p, int64_t chunk_len) {
            if (chunk_len < 0)
              throw InvalidArgument("[Plan] chunk_len must be >= 0, got " +
                                    std::to_string(chunk_len));
            Plan q = p;
            q.chunk_len = chunk_len;
            return q;
          },
          py::arg("chunk_len"))
      .def(
          "with_partition",
          [](const Plan& p, const std::string& op, const py::object& partition) {
            return p.with_partition(op, sched::MatmulPartition::from_json(py_to_json(partition)));
          },
          py::arg("op"), py::arg("partition"),
          "A copy whose linear `op` (qkv, o_proj, gate_up, down) runs as the partition's parts "
          "(a dict as socllm._core.sim.make_partition / solve_partition give) when its input has "
          "the partition's rows (seed 002 §4.1).")
      .def_property_readonly(
          "partitions",
          [](const Plan& p) {
            return json_to_py(p.to_json().value("partitions", nlohmann::json::object()));
          })
      .def_static("op_classes",
                  [] {
                    std::vector<std::string> out;
                    for (int i = 0; i < kNumOpClasses; ++i)
                      out.emplace_back(op_class_name(static_cast<OpClass>(i)));
                    return out;
                  })
      .def_static("known", &Plan::known)
      .def_static("describe", &Plan::describe, py::arg("name"))
      .def("__repr__",
           [](const Plan& p) { return "Plan(" + json_text(p.to_json(), std::string::npos) + ")"; });

  m.def(
      "graph_census",
      [](const py::object& config, const py::handle& plan, int64_t prompt_len, int64_t chunk_len,
         bool sharing) {
        return graph_stats_to_py(
            graph_census(ModelConfig::from_json(py_to_json(config, "ModelConfig")),
                         plan_from_py(plan), prompt_len, chunk_len, sharing));
      },
      py::arg("config"), py::arg("plan"), py::arg("prompt_len"), py::arg("chunk_len"),
      py::arg("sharing") = true,
      "Static graphs one chunked prefill builds, from a model config alone (seed 001 §3.2).");

  m.def(
      "task_graph",
      [](const py::object& config, const py::handle& plan, int64_t prompt_len, int64_t chunk_len,
         double shadow_channels) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        const Plan p = plan_from_py(plan);
        PrefillGraphOptions o;
        if (p.linear.shadow)
          o.expected = expected_shadow_loads(c, *p.linear.shadow, shadow_channels);
        return prefill_task_graph(c, p, prompt_len, chunk_len, o);
      },
      py::arg("config"), py::arg("plan"), py::arg("prompt_len"), py::arg("chunk_len"),
      py::arg("shadow_channels") = kDefaultShadowChannels,
      "The prefill task graph of a config (block.h), shadow loads expected (shadow_channels).");

  m.attr("DEFAULT_SHADOW_CHANNELS") = kDefaultShadowChannels;
  m.def("prefill_graph_rows", &prefill_graph_rows, py::arg("prompt_len"), py::arg("chunk_len"));

  m.def(
      "decoder_block",
      [] {
        py::list l;
        for (const BlockOpInfo& op : decoder_block()) {
          py::dict d;
          d["name"] = op.name;
          d["op_class"] = op_class_name(op.op_class);
          d["subgraph"] = npu::subgraph_kind_name(op.subgraph);
          d["site"] =
              op.site ? py::object(py::str(linear_site_name(*op.site))) : py::object(py::none());
          l.append(d);
        }
        return l;
      },
      "The ops of a decoder block in execution order (block.h).");
}

}  // namespace socllm::py_bind
