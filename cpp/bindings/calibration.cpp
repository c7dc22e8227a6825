// Mirrors cpp/calibration/calibration.h: activation statistics of the linear inputs.
#include <pybind11/stl.h>

#include <optional>

#include "calibration/calibration.h"
#include "common.h"
#include "model/model.h"

namespace socllm::py_bind {

namespace {

// The array's view; `site` is required for per-site arrays and ignored for the others.
Calibration::ArrayRef calib_ref(Calibration& c, const std::string& name,
                                const std::optional<std::string>& site) {
  if (!Calibration::spec(name).per_site) return c.array(name, LinearSite::AttnIn);
  if (!site)
    throw InvalidArgument("[Calibration] array '" + name +
                          "' is per linear site: give site= (attn_in, attn_out, mlp_in, mlp_act)");
  return c.array(name, site_from_name(*site, "Calibration"));
}

py::object calib_get(Calibration& c, const std::string& name,
                     const std::optional<std::string>& site) {
  const auto a = calib_ref(c, name, site);
  const size_t n = a.f ? a.f->size() : a.i->size();
  if (n == 0 || (Calibration::spec(name).step == std::string("act-scales") && !c.has_act_scales()))
    return py::none();
  std::vector<py::ssize_t> shape(a.shape.begin(), a.shape.end());
  if (shape[0] == -1) shape[0] = static_cast<py::ssize_t>(n) / (shape[1] * shape[2]);
  if (a.f) return py::array_t<float>(shape, a.f->data());
  return py::array_t<int64_t>(shape, a.i->data());
}

void calib_set(Calibration& c, const std::string& name, const std::optional<std::string>& site_opt,
               const py::array& arr) {
  const auto a = calib_ref(c, name, site_opt);
  const std::string site = site_opt.value_or("-");
  bool ok_shape = arr.ndim() == static_cast<py::ssize_t>(a.shape.size());
  for (size_t k = 0; ok_shape && k < a.shape.size(); ++k)
    ok_shape = a.shape[k] == -1 ? arr.shape(k) >= 1 : arr.shape(k) == a.shape[k];
  if (!ok_shape) {
    std::string want = "[";
    for (size_t k = 0; k < a.shape.size(); ++k) {
      if (k) want += ", ";
      want += std::to_string(a.shape[k]);
    }
    throw ShapeError("[Calibration] '" + name + "' of site '" + site + "' needs shape " + want +
                     "], got " + shape_str(arr));
  }
  const std::string what = "[Calibration] '" + name + "' of site '" + site + "'";
  if (a.f) {
    const auto v = numeric_array<float>(arr, what);
    a.f->assign(v.data(), v.data() + v.size());
  } else {
    const auto v = numeric_array<int64_t>(arr, what);
    a.i->assign(v.data(), v.data() + v.size());
  }
}

}  // namespace

LinearSite site_from_name(const std::string& site, const char* fn) {
  for (int s = 0; s < kNumLinearSites; ++s)
    if (site == linear_site_name(static_cast<LinearSite>(s))) return static_cast<LinearSite>(s);
  throw InvalidArgument(std::string("[") + fn + "] unknown site '" + site +
                        "' (attn_in, attn_out, mlp_in, mlp_act)");
}

void init_calibration(py::module_& m) {
  py::class_<Calibration, std::shared_ptr<Calibration>>(
      m, "Calibration", "Per-channel absmax of every linear input, per layer (calibration.h).")
      .def_static(
          "empty_for",
          [](const Model& mdl) {
            auto cal = std::make_shared<Calibration>(Calibration::empty_for(mdl.config()));
            cal->rotation = mdl.rotation();
            return cal;
          },
          py::arg("model"),
          "Empty statistics for the model, recording its rotation (Model.rotation).")
      .def_readwrite("tokens", &Calibration::tokens)
      .def_readonly("rotation", &Calibration::rotation,
                    "The rotation of the model the statistics were observed on: they serve the "
                    "plans with that rotation (Plan rotate parts) only.")
      .def_static(
          "schema",
          [] {
            py::list l;
            for (const auto& a : Calibration::schema()) {
              py::dict d;
              d["name"] = a.name;
              d["dtype"] = a.dtype;
              d["shape"] = a.shape;
              d["step"] = a.step;
              d["required"] = a.required;
              d["per_site"] = a.per_site;
              d["description"] = a.description;
              l.append(d);
            }
            return l;
          },
          "The arrays of the calibration artifact (calibration.h): name, dtype, per-site shape, "
          "the step that writes it, required, description.")
      .def_property_readonly_static("format_version",
                                    [](const py::object&) { return Calibration::kFormatVersion; })
      .def_property_readonly_static(
          "oldest_format_version",
          [](const py::object&) { return Calibration::kOldestFormatVersion; })
      .def_property_readonly_static(
          "smooth_alpha_grid", [](const py::object&) { return Calibration::kSmoothAlphaGrid; },
          "Points of step smoothing's alpha grid (0, 0.1, ..., 1).")
      .def(
          "save",
          [](const Calibration& c, const std::string& path, const Model& mdl,
             const py::object& provenance) {
            const auto prov = py_to_json(provenance);
            py::gil_scoped_release nogil;
            c.save(path, mdl.config(), prov);
          },
          py::arg("path"), py::arg("model"), py::arg("provenance"),
          "Write the artifact atomically with the provenance as root attributes.")
      .def_static(
          "load",
          [](const std::string& path, const Model& mdl) {
            nlohmann::json prov;
            auto c = std::make_shared<Calibration>(Calibration::load(path, mdl.config(), &prov));
            return py::make_tuple(c, json_to_py(prov));
          },
          py::arg("path"), py::arg("model"),
          "(Calibration, provenance dict) from an artifact file, checked against the model.")
      .def_static("sites",
                  [] {
                    std::vector<std::string> out;
                    for (int s = 0; s < kNumLinearSites; ++s)
                      out.push_back(linear_site_name(static_cast<LinearSite>(s)));
                    return out;
                  })
      .def(
          "get",
          [](Calibration& c, const std::string& site) { return calib_get(c, "act_absmax", site); },
          py::arg("site"), "[n_layers, width] float32 per-channel absmax of a site.")
      .def(
          "set",
          [](Calibration& c, const std::string& site, const py::array& a) {
            calib_set(c, "act_absmax", site, a);
          },
          py::arg("site"), py::arg("absmax"))
      .def(
          "array",
          [](Calibration& c, const std::string& name, const std::optional<std::string>& site) {
            return calib_get(c, name, site);
          },
          py::arg("name"), py::arg("site") = py::none(),
          "A copy of one statistic of a site (None if not gathered): act_absmax [n_layers, width], "
          "abs_hist [n_layers, bins] (int64), outlier_threshold [n_layers], outlier_count "
          "[n_layers, width] (int64), outlier_seq_channels / outlier_seqs [n_layers] (int64), "
          "out_absmax [n_layers, out_width], smooth_alpha [n_layers], smooth_alpha_error "
          "[n_layers, 11], channel_bits [n_layers, out_width] (int64).")
      .def(
          "set_array",
          [](Calibration& c, const std::string& name, const std::optional<std::string>& site,
             const py::array& arr) { calib_set(c, name, site, arr); },
          py::arg("name"), py::arg("site"), py::arg("values"),
          "Set one statistic (site=None for the attention arrays); the shape must be the "
          "schema's.")
      .def(
          "abs_percentile",
          [](const Calibration& c, int64_t layer, const std::string& site, double p) {
            return c.abs_percentile(layer, site_from_name(site, "Calibration.abs_percentile"), p);
          },
          py::arg("layer"), py::arg("site"), py::arg("fraction"),
          "|x| below which `fraction` of the observed values lie (histogram bin edge, within "
          "1.1%).")
      .def(
          "set_outlier_thresholds",
          [](Calibration& c, const std::string& site, const py::handle& thresholds) {
            const auto t = numeric_array<float>(thresholds, "[Calibration] thresholds");
            if (t.ndim() != 1)
              throw ShapeError("[Calibration] thresholds must be 1-D [n_layers], got " +
                               shape_str(t));
            c.set_outlier_thresholds(site_from_name(site, "Calibration.set_outlier_thresholds"),
                                     {t.data(), static_cast<size_t>(t.size())});
          },
          py::arg("site"), py::arg("thresholds"),
          "Fix the outlier thresholds of a site and reset its outlier counts (then observe again).")
      .def_property_readonly("has_outlier_stats", &Calibration::has_outlier_stats)
      .def(
          "outlier_importance",
          [](const Calibration& c) {
            TensorF32 t({c.n_layers, kNumLinearSites});
            const auto imp = c.outlier_importance();
            for (size_t i = 0; i < imp.size(); ++i) t.data[i] = static_cast<float>(imp[i]);
            return to_numpy(std::move(t));
          },
          "[n_layers, 4] largest |x| / (threshold / 127) of every linear input (seed 001 Fig. 12).")
      .def(
          "shadow_configs",
          [](const Calibration& c, double pruning_rate, double hot_share) {
            py::list out;
            const auto cfgs = c.shadow_configs({pruning_rate, hot_share});
            for (int64_t l = 0; l < c.n_layers; ++l)
              for (int s = 0; s < kNumLinearSites; ++s) {
                const auto& cfg = cfgs[static_cast<size_t>(l * kNumLinearSites + s)];
                py::dict d;
                d["layer"] = l;
                d["site"] = linear_site_name(static_cast<LinearSite>(s));
                d["threshold"] = cfg.threshold;
                d["hot_channels"] = cfg.hot_channels;
                d["pruned"] = cfg.pruned;
                out.append(d);
              }
            return out;
          },
          py::arg("pruning_rate") = 0.85, py::arg("hot_share") = 0.8,
          "Per linear input: threshold, hot channels and pruning, as the shadow-outlier plan "
          "builds them.");
}

}  // namespace socllm::py_bind
