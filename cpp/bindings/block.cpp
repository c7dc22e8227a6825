// Mirrors cpp/block/ (block.h) and cpp/npu/: the decoder block's ops and the task graphs they
// record from a config alone (prefill, decoding step, session), the static graphs they need.
#include <pybind11/stl.h>

#include <optional>

#include "block/block.h"
#include "common.h"
#include "model/decoder_block.h"
#include "npu/static_graph.h"
#include "plan/plan.h"

namespace socllm::py_bind {

void init_block(py::module_& m) {
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
         double shadow_channels, const std::string& phase, int64_t decode_tokens) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
        const Plan p = plan_from_py(plan);
        GraphOptions o;
        if (p.linear.shadow)
          o.expected = expected_shadow_loads(c, *p.linear.shadow, shadow_channels);
        if (phase == "decode") {
          if (decode_tokens != 0 || chunk_len != 0)
            throw InvalidArgument(
                "[task_graph] a decoding step has no chunks or decode_tokens (phase session)");
          return decode_task_graph(c, p, prompt_len + 1, o);
        }
        if (phase != "prefill" && phase != "session")
          throw InvalidArgument("[task_graph] phase must be prefill, decode or session, got '" +
                                phase + "'");
        if ((phase == "session") != (decode_tokens > 0))
          throw InvalidArgument("[task_graph] decode_tokens > 0 makes a session (phase " + phase +
                                ", decode_tokens " + std::to_string(decode_tokens) + ")");
        return prefill_task_graph(c, p, prompt_len, chunk_len, o, decode_tokens);
      },
      py::arg("config"), py::arg("plan"), py::arg("prompt_len"), py::arg("chunk_len"),
      py::arg("shadow_channels") = kDefaultShadowChannels, py::arg("phase") = "prefill",
      py::arg("decode_tokens") = 0,
      "The task graph of a config (block.h): a prefill, one decoding step on a cache of "
      "prompt_len (phase decode) or a session of decode_tokens steps after the prompt; shadow "
      "loads expected (shadow_channels).");

  m.attr("DEFAULT_SHADOW_CHANNELS") = kDefaultShadowChannels;
  m.def("prefill_graph_rows", &prefill_graph_rows, py::arg("prompt_len"), py::arg("chunk_len"));
}

}  // namespace socllm::py_bind
