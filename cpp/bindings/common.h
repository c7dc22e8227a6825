// Helpers shared by the binding files (numpy conversion, JSON <-> Python, arguments used by
// several areas) and the init function of each binding file. Each binding file mirrors one
// area of cpp/ and says which headers in its first line.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

#include "core/core.h"

namespace socllm::py_bind {

namespace py = pybind11;

// Moves the tensor into a numpy array that owns it (no copy). C-contiguous float32.
inline py::array_t<float> to_numpy(TensorF32&& t) {
  auto* owned = new TensorF32(std::move(t));
  py::capsule base(owned, [](void* p) { delete static_cast<TensorF32*>(p); });
  std::vector<py::ssize_t> shape(owned->shape.begin(), owned->shape.end());
  return py::array_t<float>(shape, owned->ptr(), base);
}

// A string read from a file as a Python str: meant to be UTF-8, undecodable bytes kept visible as
// surrogate escapes (as os.fsdecode does) rather than failing.
py::str str_from_file(const std::string& s);
// The inverse, for names handed back (GgufFile.tensor_info(name)): InvalidArgument for a non-str.
std::string str_to_file(const py::handle& s);
py::object json_to_py(const nlohmann::json& j);
// Python (dict, list, str, int, float, bool, None, numpy scalars) -> JSON; InvalidArgument
// prefixed by `fn` for NaN/inf, integers beyond 64 bits, non-string keys or other types.
nlohmann::json py_to_json(const py::handle& o, const char* fn = "socllm");

// Token ids from Python ints (list, tuple or integer numpy array), range-checked
// before narrowing so 2**40 is reported, not wrapped.
std::vector<int32_t> to_token_ids(const py::handle& seq, const char* fn);

// A Python integer (or numpy integer) as int64; InvalidArgument naming `name` and the value if
// it is not an integer or does not fit (pybind11 would raise a TypeError about the signature).
int64_t to_int64(const py::handle& v, const char* fn, const char* name);

// `obj` (an array or anything numpy.asarray takes) as a C-contiguous array of T. Only bool,
// integer and float data convert: numpy would turn an object array's None into NaN, and
// pybind11's ensure() gives a null array for strings. InvalidArgument names `what` and the dtype.
template <typename T>
py::array_t<T, py::array::c_style | py::array::forcecast> numeric_array(const py::handle& obj,
                                                                        const std::string& what) {
  py::array a = py::array::ensure(obj);
  if (!a) {
    PyErr_Clear();
    throw InvalidArgument(what + " must be a numeric array, got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  const char kind = a.dtype().kind();
  if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f')
    throw InvalidArgument(what + " must be a numeric array, got dtype " +
                          std::string(py::str(a.dtype())));
  auto out = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!out) {
    PyErr_Clear();
    throw InvalidArgument(what + " cannot be converted from dtype " +
                          std::string(py::str(a.dtype())));
  }
  return out;
}

}  // namespace socllm::py_bind

namespace socllm {
struct Plan;
enum class LinearSite : int;
namespace npu {
struct GraphCacheStats;
}
namespace soc {
class DeviceProfile;
class CostModel;
enum class Processor : int;
}  // namespace soc
namespace sched {
struct PartitionCosts;
}
}  // namespace socllm

namespace socllm::py_bind {

// "[2, 3]": the shape of an array, for error messages (as core.h's shape_str, kept visible).
using socllm::shape_str;
inline std::string shape_str(const py::array& a) {
  return shape_str(std::vector<int64_t>(a.shape(), a.shape() + a.ndim()));
}

// Token sequences (an iterable of what to_token_ids takes); InvalidArgument if there are none.
// Defined in engine.cpp.
std::vector<std::vector<int32_t>> to_batch(const py::handle& seqs, const char* fn);

// A Plan from a Plan, a name ("w8a8", "smoothquant:alpha=0.8") or a dict (plan.h JSON form).
// Defined in plan.cpp.
Plan plan_from_py(const py::handle& p);

// A linear site from its name (attn_in, attn_out, mlp_in, mlp_act); `fn` prefixes the error.
// Defined in calibration.cpp.
LinearSite site_from_name(const std::string& site, const char* fn);

// The statistics of a static graph cache as a dict. Defined in engine.cpp.
py::dict graph_stats_to_py(const npu::GraphCacheStats& s);
// Declared options (attention::OptionSpec, calibrate::StepOption) as a list of dicts: name,
// default, help, choices.
template <typename Option>
py::list options_to_py(const std::vector<Option>& options) {
  py::list l;
  for (const auto& o : options) {
    py::dict d;
    d["name"] = o.name;
    d["default"] = json_to_py(o.default_value);
    d["help"] = o.help;
    d["choices"] = o.choices;
    l.append(d);
  }
  return l;
}

// A device profile from a DeviceProfile, a name or .json path (soc::load_device) or a dict (the
// profile's JSON). Defined in soc.cpp.
std::shared_ptr<const soc::DeviceProfile> device_from_py(const py::handle& profile);
soc::DeviceProfile profile_from_py(const py::handle& profile);
// The partition profiler's prediction mode: predictor(op: dict, processor: str) -> µs for the
// solver, the cost model's synchronization and contention (partner and NPU). Calls back into
// Python: the GIL stays held. Defined in sched.cpp.
sched::PartitionCosts predicted_costs(const soc::CostModel& cost, const py::object& predictor,
                                      soc::Processor partner);

// One init function per binding file, each mirroring one folder of cpp/, called in this order
// by module.cpp (a type is registered before the functions whose signatures name it).
// init_soc, init_sched and init_sim fill the `sim` submodule; init_kernels creates `ops` (which
// init_attention adds to) and init_quant `quant`.
void init_core(py::module_& m);         // core.cpp: core/
void init_io(py::module_& m);           // io.cpp: io/
void init_model(py::module_& m);        // model.cpp: model/
void init_kernels(py::module_& m);      // kernels.cpp: kernels/
void init_quant(py::module_& m);        // quant.cpp: quant/
void init_soc(py::module_& sim);        // soc.cpp: soc/
void init_sched(py::module_& sim);      // sched.cpp: sched/
void init_attention(py::module_& m);    // attention.cpp: attention/
void init_plan(py::module_& m);         // plan.cpp: plan/
void init_calibration(py::module_& m);  // calibration.cpp: calibration/
void init_block(py::module_& m);        // block.cpp: block/, npu/
void init_engine(py::module_& m);       // engine.cpp: engine/
void init_sim(py::module_& sim);        // sim.cpp: sim/
void init_calibrate(py::module_& m);    // calibrate.cpp: calibrate/

}  // namespace socllm::py_bind
