// Mirrors cpp/include/socllm/model.h: a model's config and fp32 weights.
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
      .def_property_readonly("path", &Model::path)
      .def_property_readonly("weight_bytes", &Model::weight_bytes);
}

}  // namespace socllm::py_bind
