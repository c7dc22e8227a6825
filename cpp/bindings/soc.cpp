// Mirrors cpp/soc/ (soc.h) as part of socllm._core.sim: device profiles (and the folder named
// ones are read from) and cost models.
#include <pybind11/stl.h>

#include "common.h"
#include "soc/soc.h"

namespace socllm::py_bind {

namespace {
soc::OpDesc op_from_py(const py::handle& o) { return soc::OpDesc::from_json(py_to_json(o)); }

}  // namespace

std::shared_ptr<const soc::DeviceProfile> device_from_py(const py::handle& profile) {
  if (py::isinstance<soc::DeviceProfile>(profile))
    return std::make_shared<const soc::DeviceProfile>(profile.cast<soc::DeviceProfile>());
  if (py::isinstance<py::str>(profile) ||
      py::isinstance(profile, py::module_::import("os").attr("PathLike")))
    return soc::load_device(py::str(profile).cast<std::string>());
  const auto j = py_to_json(profile, "DeviceProfile");
  return std::make_shared<const soc::DeviceProfile>(soc::DeviceProfile::from_json(
      j, j.is_object() ? j.value("name", std::string("profile")) : std::string("profile")));
}

soc::DeviceProfile profile_from_py(const py::handle& profile) { return *device_from_py(profile); }

void init_soc(py::module_& s) {
  py::class_<soc::DeviceProfile>(s, "DeviceProfile")
      .def_static(
          "from_json",
          [](const py::object& j, const std::string& origin) {
            return soc::DeviceProfile::from_json(py_to_json(j), origin);
          },
          py::arg("profile"), py::arg("origin") = "profile")
      .def_property_readonly("name", &soc::DeviceProfile::name)
      .def("has", &soc::DeviceProfile::has, py::arg("pointer"))
      .def("number", &soc::DeviceProfile::number, py::arg("pointer"),
           py::arg("needed_for") = "a lookup")
      .def("source", &soc::DeviceProfile::source, py::arg("pointer"))
      .def("characterizations", &soc::DeviceProfile::characterizations)
      .def("with_characterization", &soc::DeviceProfile::with_characterization, py::arg("name"))
      .def_property_readonly("characterization", &soc::DeviceProfile::characterization)
      .def("to_json", [](const soc::DeviceProfile& p) { return json_to_py(p.json()); });
  s.def("set_device_dir", &soc::set_device_dir, py::arg("dir"),
        "The folder named device profiles are read from (the package's devices/ on import).");
  s.def("device_dir", &soc::device_dir);
  s.def("known_devices", &soc::known_devices);
  s.def(
      "load_device", [](const std::string& name) { return *soc::load_device(name); },
      py::arg("name_or_path"), "A profile by name (device_dir()) or .json path.");
  s.attr("DEFAULT_DEVICE") = soc::kDefaultDevice;

  py::class_<soc::CostModel>(s, "CostModel")
      .def(py::init([](soc::DeviceProfile p, bool fast_sync, bool gpu_queue_kept) {
             return soc::CostModel(std::move(p), {fast_sync, gpu_queue_kept});
           }),
           py::arg("profile"), py::arg("fast_sync") = false, py::arg("gpu_queue_kept") = false,
           "fast_sync / gpu_queue_kept: GPU-NPU synchronization (soc.h SyncOptions)")
      .def_property_readonly("profile", &soc::CostModel::profile)
      .def(
          "latency_us",
          [](const soc::CostModel& c, const py::handle& op, const std::string& proc) {
            return c.latency_us(op_from_py(op), soc::processor_from_name(proc));
          },
          py::arg("op"), py::arg("processor"),
          "Latency (µs) of one operator, given as a dict: {'op': 'matmul', 'dtype': 'int8', "
          "'m':..., "
          "'k':..., 'n':...} (see soc.h OpDesc), on 'npu' | 'cpu' | 'gpu'.")
      .def("active_power_w",
           [](const soc::CostModel& c, const std::string& p) {
             return c.active_power_w(soc::processor_from_name(p));
           })
      .def("sync_us",
           [](const soc::CostModel& c, const std::string& a, const std::string& b) {
             return c.sync_us(soc::processor_from_name(a), soc::processor_from_name(b));
           })
      .def("shared_bandwidth_gbps",
           [](const soc::CostModel& c, const std::vector<std::string>& procs) {
             std::vector<soc::Processor> ps;
             for (const auto& p : procs) ps.push_back(soc::processor_from_name(p));
             return c.shared_bandwidth_gbps(ps);
           })
      .def("has_memory_model", &soc::CostModel::has_memory_model)
      .def("with_co_runner", &soc::CostModel::with_co_runner, py::arg("scenario"))
      .def_property_readonly("co_runner", &soc::CostModel::co_runner)
      .def("scenarios", &soc::CostModel::scenarios);
}

}  // namespace socllm::py_bind
