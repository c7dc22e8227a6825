// Mirrors cpp/calibrate/steps.h: the registered calibration steps and their C++ parts.
#include <pybind11/stl.h>

#include "calibrate/steps.h"
#include "common.h"

namespace socllm::py_bind {

namespace {

py::dict step_to_py(const calibrate::StepInfo& s) {
  py::dict d;
  d["name"] = s.name;
  d["description"] = s.description;
  d["needs"] = s.needs;
  d["writes"] = calibrate::writes(s);
  d["options"] = options_to_py(s.options);
  d["runs_in_cpp"] = static_cast<bool>(s.run);
  return d;
}

}  // namespace

void init_calibrate(py::module_& m) {
  m.def(
      "calibration_steps",
      [] {
        py::list out;
        for (const auto* s : calibrate::steps()) out.append(step_to_py(*s));
        return out;
      },
      "The registered calibration steps in order (calibrate/steps.h): name, description, needs "
      "(schema arrays, or 'attr:NAME'), writes (schema arrays, then 'attr:NAME'), options "
      "([{name, default, help, choices}]), runs_in_cpp.");
  m.def(
      "calibration_step_options",
      [](const std::string& name, const py::handle& given) {
        return json_to_py(calibrate::options_with_defaults(
            calibrate::step(name), py_to_json(given, "calibration_step_options")));
      },
      py::arg("step"), py::arg("options"),
      "The options of a step with the defaults filled in; an unknown option or a value of "
      "another type is an InvalidArgumentError naming it.");
  m.def(
      "run_calibration_step",
      [](const Engine& engine, const std::string& name, Calibration& stats,
         const py::handle& windows, const py::handle& rows, const py::handle& options,
         const py::object& progress) {
        const auto wins = windows.is_none() ? std::vector<std::vector<int32_t>>{}
                                            : to_batch(windows, "run_calibration_step");
        std::vector<std::vector<int64_t>> picks;
        if (!rows.is_none())
          for (py::handle r : py::iter(rows)) picks.push_back(r.cast<std::vector<int64_t>>());
        const nlohmann::json opts = py_to_json(options, "run_calibration_step");
        std::function<void(int64_t, int64_t, const std::string&)> report;
        if (!progress.is_none())
          report = [&progress](int64_t done, int64_t total, const std::string& unit) {
            py::gil_scoped_acquire gil;
            progress(done, total, unit);
          };
        nlohmann::json provenance;
        {
          py::gil_scoped_release nogil;
          provenance = calibrate::run_step(name, engine, stats, wins, picks, opts, report);
        }
        return json_to_py(provenance);
      },
      py::arg("engine"), py::arg("step"), py::arg("stats"), py::arg("windows"),
      py::arg("rows") = py::none(), py::arg("options") = py::dict(),
      py::arg("progress") = py::none(),
      "Runs a step's C++ part on `stats` (its arrays written in place) over calibration "
      "windows (token ids; `rows`: per window the rows sampled, for smoothing and bitwidths); "
      "returns the root attributes it writes. One call per step: every layer, site and grid "
      "point. `progress(done, total, unit)` is called as it goes (None: spdlog).");
}

}  // namespace socllm::py_bind
