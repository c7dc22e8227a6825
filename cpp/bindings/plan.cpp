// Mirrors cpp/plan/ (plan.h): plans (placement and formats per op class, linear and attention
// schemes, partitions, device, decode placement, chunking).
#include <pybind11/stl.h>

#include <optional>

#include "common.h"
#include "plan/plan.h"

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
      .def_property_readonly("calibration_steps", &Plan::calibration_steps,
                             "the calibration steps whose statistics the plan reads, in order")
      .def_property_readonly(
          "rotation", [](const Plan& p) { return p.rotation.name(); },
          "The rotations it folds into the weights, by name ('none', 'hadamard,seed=0,down', "
          "...; quant/rotation.h): the model it runs on, and the calibration it needs.")
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
          [](const Plan& p, const std::string& op, const py::object& partition,
             const std::string& phase) {
            if (phase != "prefill" && phase != "decode")
              throw InvalidArgument("[Plan.with_partition] phase must be prefill or decode, got '" +
                                    phase + "'");
            return p.with_partition(op, sched::MatmulPartition::from_json(py_to_json(partition)),
                                    phase == "decode");
          },
          py::arg("op"), py::arg("partition"), py::arg("phase") = "prefill",
          "A copy whose linear `op` (qkv, o_proj, gate_up, down) runs as the partition's parts "
          "(a dict as socllm._core.sim.make_partition / solve_partition give) when its input has "
          "the partition's rows in that phase (seed 002 §4.1).")
      .def_property_readonly(
          "partitions",
          [](const Plan& p) {
            return json_to_py(p.to_json().value("partitions", nlohmann::json::array()));
          },
          "The partitions written into the plan: [{op, phase, partition}].")
      .def_property_readonly(
          "partition", [](const Plan& p) { return json_to_py(p.partition.to_json()); },
          "How linears are cut between the NPU and its partner: {mode, partner?, npu_share?}.")
      .def_readonly("device", &Plan::device)
      .def_readonly("characterization", &Plan::characterization)
      .def_property_readonly("sync",
                             [](const Plan& p) { return p.fast_sync ? "fast" : "conventional"; })
      .def_property_readonly("decode",
                             [](const Plan& p) {
                               return p.decode_processor
                                          ? std::string(soc::processor_name(*p.decode_processor))
                                          : std::string("same");
                             })
      .def_property_readonly(
          "partner",
          [](const Plan& p) { return std::string(soc::processor_name(p.partition_partner())); })
      .def(
          "linear_op",
          [](const Plan& p, const py::object& config, const std::string& site, int64_t rows) {
            const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
            return json_to_py(
                p.linear_desc(c, site_from_name(site, "Plan.linear_op"), rows).to_json());
          },
          py::arg("config"), py::arg("site"), py::arg("rows"),
          "The linear at a site (attn_in, attn_out, mlp_in, mlp_act) for `rows` input rows as "
          "the cost model and the partition solver see it: an op dict (m, k, n, dtype, stored "
          "weight bytes, activation bytes).")
      .def("for_decode", &Plan::for_decode,
           "The plan a decoding step runs: the decode placement, full fp32 attention.")
      .def(
          "on_device",
          [](const Plan& p, const py::handle& device) {
            return p.on_device(device_from_py(device));
          },
          py::arg("device"), "A copy planned for a device (a name, .json path or profile dict).")
      .def(
          "solved",
          [](const Plan& p, const py::object& config, const std::vector<int64_t>& prefill_rows,
             bool decode) {
            const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
            py::gil_scoped_release nogil;
            return p.solved(c, prefill_rows, decode);
          },
          py::arg("config"), py::arg("prefill_rows"), py::arg("decode") = true,
          "A copy with the partition solver's choices written in for prompts of these rows (and "
          "decoding steps): what `partition` would run, readable and editable.")
      .def_static("op_classes",
                  [] {
                    std::vector<std::string> out;
                    for (int i = 0; i < kNumOpClasses; ++i)
                      out.emplace_back(op_class_name(static_cast<OpClass>(i)));
                    return out;
                  })
      .def_static("known", &Plan::known)
      .def_static("describe", &Plan::describe, py::arg("name"),
                  "One line naming the source of a preset, or of a part (Plan.parts()).")
      .def_static("parts", &Plan::parts,
                  "The parts that compose with every preset and come from a paper (rotate, "
                  "rotate_down, rotate_heads, act_percentile, residual_scale, rounding): "
                  "Plan.describe(part).")
      .def("__repr__",
           [](const Plan& p) { return "Plan(" + json_text(p.to_json(), std::string::npos) + ")"; });
}

}  // namespace socllm::py_bind
