// Helpers shared by the binding files: numpy conversion and JSON <-> Python.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

#include "socllm/core.h"

namespace socllm::py_bind {

namespace py = pybind11;

// Moves the tensor into a numpy array that owns it (no copy). C-contiguous float32.
inline py::array_t<float> to_numpy(TensorF32&& t) {
  auto* owned = new TensorF32(std::move(t));
  py::capsule base(owned, [](void* p) { delete static_cast<TensorF32*>(p); });
  std::vector<py::ssize_t> shape(owned->shape.begin(), owned->shape.end());
  return py::array_t<float>(shape, owned->ptr(), base);
}

py::object json_to_py(const nlohmann::json& j);
nlohmann::json py_to_json(const py::handle& o);

// Token ids from Python ints (list, tuple or integer numpy array), range-checked
// before narrowing so 2**40 is reported, not wrapped.
std::vector<int32_t> to_token_ids(const py::handle& seq, const char* fn);

}  // namespace socllm::py_bind

namespace socllm {
struct Plan;
}

namespace socllm::py_bind {

// A Plan from a Plan, a name ("w8a8", "smoothquant:alpha=0.8") or a dict (plan.h JSON form).
Plan plan_from_py(const py::handle& p);

void init_core(py::module_& m);
void init_io(py::module_& m);
void init_engine(py::module_& m);
void init_ops(py::module_& m);
void init_quant(py::module_& m);
void init_sim(py::module_& m);

}  // namespace socllm::py_bind
