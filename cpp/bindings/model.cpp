// Mirrors cpp/include/socllm/model.h: a model's config, fp32 or prequantized weights.
#include <pybind11/stl.h>

#include "common.h"
#include "socllm/model.h"

namespace socllm::py_bind {

void init_model(py::module_& m) {
  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "fp32 weights of a llama-family model.")
      .def_static(
          "load",
          [](const std::string& path) {
            py::gil_scoped_release nogil;
            return std::const_pointer_cast<Model>(Model::load(path));
          },
          py::arg("path"), "Load a socllm HDF5 model file (docs/MODEL_FORMAT.md).")
      .def_property_readonly("config",
                             [](const Model& mdl) { return json_to_py(mdl.config().to_json()); })
      .def_static(
          "check_config",
          [](const py::handle& config) {
            const ModelConfig c = ModelConfig::from_json(py_to_json(config, "ModelConfig"));
            c.check_runnable();
            return json_to_py(c.to_json());
          },
          py::arg("config"),
          "The config Model.load would accept, normalized (defaults filled); InvalidArgumentError "
          "naming the value, UnsupportedError for what the engine cannot run.")
      .def_property_readonly_static("format_version",
                                    [](const py::object&) { return Model::kFormatVersion; })
      .def_property_readonly_static("oldest_format_version",
                                    [](const py::object&) { return Model::kOldestFormatVersion; })
      .def_property_readonly_static("checksum_format_version",
                                    [](const py::object&) { return Model::kChecksumFormatVersion; })
      .def_property_readonly("path", &Model::path)
      .def_property_readonly("weight_bytes", &Model::weight_bytes)
      .def_property_readonly(
          "packed_linears",
          [](const Model& mdl) -> py::object {
            const PackedModelLinears* pk = mdl.packed_linears();
            if (!pk) return py::none();
            py::dict d;
            d["plan"] = json_to_py(pk->plan);
            d["scheme"] = json_to_py(pk->scheme);
            d["group"] = pk->group;
            d["bytes_read"] = pk->bytes_read;
            d["read_seconds"] = pk->read_seconds;
            d["unpack_seconds"] = pk->unpack_seconds;
            return d;
          },
          "For a file of prequantized linears: the plan it was converted under, its scheme, the "
          "weightlet group, and what loading them cost (bytes_read, read_seconds, "
          "unpack_seconds); None otherwise.");
}

}  // namespace socllm::py_bind
