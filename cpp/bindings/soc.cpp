// Mirrors cpp/soc/ (soc.h, fit.h) as part of socllm._core.sim: device profiles (and the folder
// named ones are read from), cost models, and the dense fits device numbers come from.
#include <pybind11/stl.h>

#include "common.h"
#include "soc/fit.h"
#include "soc/soc.h"

namespace socllm::py_bind {

namespace {
soc::OpDesc op_from_py(const py::handle& o) { return soc::OpDesc::from_json(py_to_json(o)); }

std::vector<double> doubles(const py::handle& a, const std::string& what, int ndim = 1) {
  const auto arr = numeric_array<double>(a, "[fit] " + what);
  if (arr.ndim() != ndim)
    throw ShapeError("[fit] " + what + " must be " + std::to_string(ndim) + "-D, got " +
                     shape_str(arr));
  return {arr.data(), arr.data() + arr.size()};
}

}  // namespace

std::shared_ptr<const soc::DeviceProfile> device_from_py(const py::handle& profile) {
  if (py::isinstance<soc::DeviceProfile>(profile))
    return std::make_shared<const soc::DeviceProfile>(profile.cast<soc::DeviceProfile>());
  if (py::isinstance<py::str>(profile) ||
      py::isinstance(profile, py::module_::import("os").attr("PathLike")))
    return soc::load_device(py::str(profile).cast<std::string>());
  const auto j = py_to_json(profile, "DeviceProfile");
  // load_profile records the file a dict came from under "_file" (messages name it).
  std::string origin = "profile";
  if (j.is_object() && j.contains("_file") && j["_file"].is_string()) origin = j["_file"];
  else if (j.is_object() && j.contains("name") && j["name"].is_string()) origin = j["name"];
  return std::make_shared<const soc::DeviceProfile>(soc::DeviceProfile::from_json(j, origin));
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

  // fit.h
  s.def(
      "linear_least_squares",
      [](const py::handle& A, const py::handle& b, const py::handle& w) {
        const auto a = numeric_array<double>(A, "[fit] A");
        if (a.ndim() != 2) throw ShapeError("[fit] A must be 2-D, got " + shape_str(a));
        const auto bv = doubles(b, "b");
        const auto wv = w.is_none() ? std::vector<double>{} : doubles(w, "weights");
        return fit::linear_least_squares({a.data(), static_cast<size_t>(a.size())}, a.shape(0),
                                         a.shape(1), bv, wv);
      },
      py::arg("A"), py::arg("b"), py::arg("weights") = py::none(),
      "x minimising sum w_i (A_i x - b_i)^2 (fit.h; column-pivoting QR on Eigen).");
  s.def(
      "polyfit",
      [](const py::handle& x, const py::handle& y, int degree) {
        return fit::polyfit(doubles(x, "x"), doubles(y, "y"), degree);
      },
      py::arg("x"), py::arg("y"), py::arg("degree"),
      "numpy.polyfit's least-squares polynomial, highest power first (fit.h).");
  s.def(
      "fit_roofline",
      [](const py::handle& flops, const py::handle& bytes, const py::handle& t_us,
         double compute_gops) {
        const auto r = fit::fit_roofline(doubles(flops, "flops"), doubles(bytes, "weight_bytes"),
                                         doubles(t_us, "t_us"), compute_gops);
        py::dict d;
        d["overhead_us"] = r.overhead_us;
        d["weight_gbps"] = r.weight_gbps;
        d["squared_relative_error"] = r.squared_relative_error;
        return d;
      },
      py::arg("flops"), py::arg("weight_bytes"), py::arg("t_us"), py::arg("compute_gops"),
      "A matmul roofline t = overhead + max(flops / compute, bytes / weight rate) fitted to "
      "measured times at a fixed compute rate (fit.h): {overhead_us, weight_gbps, "
      "squared_relative_error}.");
  s.def(
      "least_squares_bounded",
      [](const py::function& residuals, const py::handle& x0, const py::handle& lo,
         const py::handle& hi, double diff_step, double ftol, double xtol, int64_t max_evals) {
        fit::BoundedFitOptions o{diff_step, ftol, xtol, max_evals};
        const auto lov = lo.is_none() ? std::vector<double>{} : doubles(lo, "lower bounds");
        const auto hiv = hi.is_none() ? std::vector<double>{} : doubles(hi, "upper bounds");
        // the residuals are Python (they run simulations): the GIL stays held
        const auto r = fit::least_squares_bounded(
            [&](const std::vector<double>& x) { return doubles(residuals(x), "residuals"); },
            doubles(x0, "x0"), lov, hiv, o);
        py::dict d;
        d["x"] = r.x;
        d["residuals"] = r.residuals;
        d["cost"] = r.cost;
        d["evals"] = r.evals;
        d["converged"] = r.converged;
        return d;
      },
      py::arg("residuals"), py::arg("x0"), py::arg("lo") = py::none(), py::arg("hi") = py::none(),
      py::arg("diff_step") = 1e-3, py::arg("ftol") = 1e-10, py::arg("xtol") = 1e-10,
      py::arg("max_evals") = 2000,
      "Bounded non-linear least squares, min 1/2 sum r(x)^2 over lo <= x <= hi, by "
      "Levenberg-Marquardt on a forward-difference Jacobian (fit.h): {x, residuals, cost, evals, "
      "converged}.");
}

}  // namespace socllm::py_bind
