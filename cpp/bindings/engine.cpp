// Mirrors cpp/include/socllm/model.h and engine.h.
#include <pybind11/stl.h>

#include <optional>

#include "common.h"
#include "socllm/block.h"
#include "socllm/engine.h"
#include "socllm/model.h"
#include "socllm/static_graph.h"

namespace socllm::py_bind {

namespace {

py::dict graph_stats_to_py(const npu::GraphCacheStats& s) {
  py::dict d;
  d["requests"] = s.requests;
  d["built"] = s.built;
  d["reused"] = s.reused;
  d["built_shared"] = s.built_shared;
  d["built_per_chunk"] = s.built_per_chunk;
  d["weight_bytes"] = s.weight_bytes;
  d["activation_bytes"] = s.activation_bytes;
  return d;
}

std::string shape_str(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

std::vector<std::vector<int32_t>> to_batch(const py::handle& seqs, const char* fn) {
  std::vector<std::vector<int32_t>> out;
  for (py::handle s : py::iter(seqs)) out.push_back(to_token_ids(s, fn));
  if (out.empty()) throw InvalidArgument(std::string("[") + fn + "] no sequences given");
  return out;
}

LinearSite site_from_name(const std::string& site, const char* fn) {
  for (int s = 0; s < kNumLinearSites; ++s)
    if (site == linear_site_name(static_cast<LinearSite>(s))) return static_cast<LinearSite>(s);
  throw InvalidArgument(std::string("[") + fn + "] unknown site '" + site +
                        "' (attn_in, attn_out, mlp_in, mlp_act)");
}

// The per-site arrays of a Calibration by name, with their shape: [n_layers] or
// [n_layers, cols]. Integer statistics are int64, the rest float32.
struct CalibArray {
  std::vector<float>* f = nullptr;
  std::vector<int64_t>* i = nullptr;
  int64_t cols = 0;  // 0: one value per layer
};

CalibArray calib_array(Calibration& c, const std::string& name, LinearSite site) {
  const int s = static_cast<int>(site);
  if (name == "act_absmax") return {&c.channel_absmax[s], nullptr, c.width[s]};
  if (name == "abs_hist") return {nullptr, &c.abs_hist[s], Calibration::kAbsHistBins};
  if (name == "outlier_threshold") return {&c.outlier_threshold[s], nullptr, 0};
  if (name == "outlier_count") return {nullptr, &c.outlier_count[s], c.width[s]};
  if (name == "outlier_seq_channels") return {nullptr, &c.outlier_seq_channels[s], 0};
  if (name == "outlier_seqs") return {nullptr, &c.outlier_seqs[s], 0};
  throw InvalidArgument("[Calibration] unknown array '" + name +
                        "' (act_absmax, abs_hist, outlier_threshold, outlier_count, "
                        "outlier_seq_channels, outlier_seqs)");
}

py::object calib_get(Calibration& c, const std::string& name, const std::string& site) {
  const CalibArray a = calib_array(c, name, site_from_name(site, "Calibration"));
  const size_t n = a.f ? a.f->size() : a.i->size();
  if (n == 0) return py::none();
  std::vector<py::ssize_t> shape{c.n_layers};
  if (a.cols) shape.push_back(a.cols);
  if (a.f) return py::array_t<float>(shape, a.f->data());
  return py::array_t<int64_t>(shape, a.i->data());
}

void calib_set(Calibration& c, const std::string& name, const std::string& site,
               const py::array& arr) {
  const CalibArray a = calib_array(c, name, site_from_name(site, "Calibration"));
  const bool ok_shape = arr.ndim() == (a.cols ? 2 : 1) && arr.shape(0) == c.n_layers &&
                        (!a.cols || arr.shape(1) == a.cols);
  if (!ok_shape)
    throw ShapeError("[Calibration] '" + name + "' of site '" + site + "' needs shape [" +
                     std::to_string(c.n_layers) + (a.cols ? ", " + std::to_string(a.cols) : "") +
                     "], got " + shape_str(arr));
  if (a.f) {
    auto v = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(arr);
    a.f->assign(v.data(), v.data() + v.size());
  } else {
    auto v = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    a.i->assign(v.data(), v.data() + v.size());
  }
}

py::dict shadow_stats_to_py(const quant::ShadowStats& s) {
  py::dict d;
  d["segments"] = s.segments;
  d["syncs"] = s.syncs;
  d["outlier_values"] = s.outlier_values;
  d["outlier_channels"] = s.outlier_channels;
  d["hot_hits"] = s.hot_hits;
  d["cold_fetches"] = s.cold_fetches;
  d["cold_fetch_bytes"] = s.cold_fetch_bytes;
  d["pruned_values"] = s.pruned_values;
  return d;
}

}  // namespace

Plan plan_from_py(const py::handle& p) {
  if (py::isinstance<Plan>(p)) return p.cast<Plan>();
  if (py::isinstance<py::str>(p)) return Plan::parse(p.cast<std::string>());
  if (py::isinstance<py::dict>(p)) return Plan::from_json(py_to_json(p));
  throw InvalidArgument("[Plan] a plan is a name, a dict or a Plan, got " +
                        std::string(py::str(py::type::of(p).attr("__name__"))) +
                        " " + Plan::known_list());
}

void init_engine(py::module_& m) {
  py::class_<Model, std::shared_ptr<Model>>(m, "Model", "fp32 weights of a llama-family model.")
      .def_static("load", [](const std::string& path) {
        py::gil_scoped_release nogil;
        return std::const_pointer_cast<Model>(Model::load(path));
      }, py::arg("path"), "Load a socllm HDF5 model file (docs/MODEL_FORMAT.md).")
      .def_property_readonly("config", [](const Model& mdl) { return json_to_py(mdl.config().to_json()); })
      .def_property_readonly("path", &Model::path)
      .def_property_readonly("weight_bytes", &Model::weight_bytes);

  py::class_<Plan>(m, "Plan", "How each operator class runs. Build from a name or a dict.")
      .def(py::init([](const py::handle& p) { return plan_from_py(p); }), py::arg("plan"))
      .def_readonly("name", &Plan::name)
      .def_readonly("chunk_len", &Plan::chunk_len)
      .def_property_readonly("needs_calibration", &Plan::needs_calibration)
      .def("to_json", [](const Plan& p) { return json_to_py(p.to_json()); })
      .def_property_readonly("placement", [](const Plan& p) {
        py::dict d;
        for (int i = 0; i < kNumOpClasses; ++i) {
          const OpPlacement& o = p.placement[static_cast<size_t>(i)];
          py::dict e;
          e["processor"] = soc::processor_name(o.processor);
          e["format"] = soc::dtype_name(o.format);
          d[op_class_name(static_cast<OpClass>(i))] = e;
        }
        return d;
      }, "{op class: {'processor': ..., 'format': ...}} (plan.h)")
      .def("placed", [](const Plan& p, const std::string& op_class, const std::string& processor,
                        const std::optional<std::string>& format) {
        std::optional<soc::DType> f;
        if (format) f = soc::dtype_from_name(*format);
        return p.placed(op_class_from_name(op_class), soc::processor_from_name(processor), f);
      }, py::arg("op_class"), py::arg("processor"), py::arg("format") = py::none(),
      "A copy with one op class moved to another processor (and format).")
      .def("all_on", [](const Plan& p, const std::string& processor) {
        return p.all_on(soc::processor_from_name(processor));
      }, py::arg("processor"), "A copy with every op class on one processor (float ops in fp16 off the CPU).")
      .def("with_chunk_len", [](const Plan& p, int64_t chunk_len) {
        if (chunk_len < 0)
          throw InvalidArgument("[Plan] chunk_len must be >= 0, got " + std::to_string(chunk_len));
        Plan q = p;
        q.chunk_len = chunk_len;
        return q;
      }, py::arg("chunk_len"))
      .def_static("op_classes", [] {
        std::vector<std::string> out;
        for (int i = 0; i < kNumOpClasses; ++i) out.emplace_back(op_class_name(static_cast<OpClass>(i)));
        return out;
      })
      .def_static("known", &Plan::known)
      .def_static("describe", &Plan::describe, py::arg("name"))
      .def("__repr__", [](const Plan& p) { return "Plan(" + p.to_json().dump() + ")"; });

  py::class_<Calibration, std::shared_ptr<Calibration>>(
      m, "Calibration", "Per-channel absmax of every linear input, per layer (calibration.h).")
      .def_static("empty_for", [](const Model& mdl) {
        return std::make_shared<Calibration>(Calibration::empty_for(mdl.config()));
      }, py::arg("model"))
      .def_readwrite("tokens", &Calibration::tokens)
      .def_static("schema", [] {
        py::list l;
        for (const auto& a : Calibration::schema()) {
          py::dict d;
          d["name"] = a.name;
          d["dtype"] = a.dtype;
          d["shape"] = a.shape;
          d["step"] = a.step;
          d["required"] = a.required;
          d["description"] = a.description;
          l.append(d);
        }
        return l;
      }, "The arrays of the calibration artifact (calibration.h): name, dtype, per-site shape, "
         "the step that writes it, required, description.")
      .def_property_readonly_static("format_version", [](const py::object&) { return Calibration::kFormatVersion; })
      .def("save", [](const Calibration& c, const std::string& path, const Model& mdl,
                      const py::object& provenance) {
        const auto prov = py_to_json(provenance);
        py::gil_scoped_release nogil;
        c.save(path, mdl.config(), prov);
      }, py::arg("path"), py::arg("model"), py::arg("provenance"),
      "Write the artifact atomically with the provenance as root attributes.")
      .def_static("load", [](const std::string& path, const Model& mdl) {
        nlohmann::json prov;
        auto c = std::make_shared<Calibration>(Calibration::load(path, mdl.config(), &prov));
        return py::make_tuple(c, json_to_py(prov));
      }, py::arg("path"), py::arg("model"),
      "(Calibration, provenance dict) from an artifact file, checked against the model.")
      .def_static("sites", [] {
        std::vector<std::string> out;
        for (int s = 0; s < kNumLinearSites; ++s) out.push_back(linear_site_name(static_cast<LinearSite>(s)));
        return out;
      })
      .def("get", [](Calibration& c, const std::string& site) {
        return calib_get(c, "act_absmax", site);
      }, py::arg("site"), "[n_layers, width] float32 per-channel absmax of a site.")
      .def("set", [](Calibration& c, const std::string& site, const py::array& a) {
        calib_set(c, "act_absmax", site, a);
      }, py::arg("site"), py::arg("absmax"))
      .def("array", [](Calibration& c, const std::string& name, const std::string& site) {
        return calib_get(c, name, site);
      }, py::arg("name"), py::arg("site"),
      "A copy of one statistic of a site (None if not gathered): act_absmax [n_layers, width], "
      "abs_hist [n_layers, bins] (int64), outlier_threshold [n_layers], outlier_count "
      "[n_layers, width] (int64), outlier_seq_channels / outlier_seqs [n_layers] (int64).")
      .def("set_array", [](Calibration& c, const std::string& name, const std::string& site,
                           const py::array& arr) {
        calib_set(c, name, site, arr);
      }, py::arg("name"), py::arg("site"), py::arg("values"))
      .def("abs_percentile", [](const Calibration& c, int64_t layer, const std::string& site, double p) {
        return c.abs_percentile(layer, site_from_name(site, "Calibration.abs_percentile"), p);
      }, py::arg("layer"), py::arg("site"), py::arg("fraction"),
      "|x| below which `fraction` of the observed values lie (histogram bin edge, within 1.1%).")
      .def("set_outlier_thresholds", [](Calibration& c, const std::string& site,
                                        py::array_t<float, py::array::c_style | py::array::forcecast> t) {
        if (t.ndim() != 1)
          throw ShapeError("[Calibration] thresholds must be 1-D [n_layers], got " + shape_str(t));
        c.set_outlier_thresholds(site_from_name(site, "Calibration.set_outlier_thresholds"),
                                 {t.data(), static_cast<size_t>(t.size())});
      }, py::arg("site"), py::arg("thresholds"),
      "Fix the outlier thresholds of a site and reset its outlier counts (then observe again).")
      .def_property_readonly("has_outlier_stats", &Calibration::has_outlier_stats)
      .def("outlier_importance", [](const Calibration& c) {
        TensorF32 t({c.n_layers, kNumLinearSites});
        const auto imp = c.outlier_importance();
        for (size_t i = 0; i < imp.size(); ++i) t.data[i] = static_cast<float>(imp[i]);
        return to_numpy(std::move(t));
      }, "[n_layers, 4] largest |x| / (threshold / 127) of every linear input (seed 001 Fig. 12).")
      .def("shadow_configs", [](const Calibration& c, double pruning_rate, double hot_share) {
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
      }, py::arg("pruning_rate") = 0.85, py::arg("hot_share") = 0.8,
      "Per linear input: threshold, hot channels and pruning, as the shadow-outlier plan builds them.");

  py::class_<LinearGraph>(m, "LinearGraph", "One linear subgraph built for a fixed row count.")
      .def_property_readonly("rows", [](const LinearGraph& g) { return g.graph.key.rows; })
      .def_property_readonly("in_cols", [](const LinearGraph& g) { return g.graph.in_cols; })
      .def_property_readonly("out_cols", [](const LinearGraph& g) { return g.graph.out_cols; })
      .def_property_readonly("scales", [](const LinearGraph& g) { return g.graph.scales; })
      .def_property_readonly("weight_bytes", [](const LinearGraph& g) { return g.graph.weight_bytes; })
      .def("run", [](const LinearGraph& g, py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        if (x.ndim() != 2)
          throw ShapeError("[StaticGraph] input must be 2-D, got " + shape_str(x));
        TensorF32 y;
        {
          py::gil_scoped_release nogil;
          y = g.run(x.data(), x.shape(0), x.shape(1));
        }
        return to_numpy(std::move(y));
      }, py::arg("x"));

  m.def("graph_census", [](const py::object& config, const py::handle& plan, int64_t prompt_len,
                           int64_t chunk_len, bool sharing) {
        return graph_stats_to_py(
            graph_census(ModelConfig::from_json(py_to_json(config)), plan_from_py(plan), prompt_len,
                         chunk_len, sharing));
      }, py::arg("config"), py::arg("plan"), py::arg("prompt_len"), py::arg("chunk_len"),
      py::arg("sharing") = true,
      "Static graphs one chunked prefill builds, from a model config alone (seed 001 §3.2).");

  m.def("task_graph", [](const py::object& config, const py::handle& plan, int64_t prompt_len,
                         int64_t chunk_len, double shadow_channels) {
        const ModelConfig c = ModelConfig::from_json(py_to_json(config));
        const Plan p = plan_from_py(plan);
        PrefillGraphOptions o;
        if (p.linear.shadow) o.expected = expected_shadow_loads(c, *p.linear.shadow, shadow_channels);
        return prefill_task_graph(c, p, prompt_len, chunk_len, o);
      }, py::arg("config"), py::arg("plan"), py::arg("prompt_len"), py::arg("chunk_len"),
      py::arg("shadow_channels") = kDefaultShadowChannels,
      "The prefill task graph of a config (block.h), shadow loads expected (shadow_channels).");

  m.attr("DEFAULT_SHADOW_CHANNELS") = kDefaultShadowChannels;
  m.def("prefill_graph_rows", &prefill_graph_rows, py::arg("prompt_len"), py::arg("chunk_len"));

  m.def("decoder_block", [] {
        py::list l;
        for (const BlockOpInfo& op : decoder_block()) {
          py::dict d;
          d["name"] = op.name;
          d["op_class"] = op_class_name(op.op_class);
          d["subgraph"] = npu::subgraph_kind_name(op.subgraph);
          d["site"] = op.site ? py::object(py::str(linear_site_name(*op.site))) : py::object(py::none());
          l.append(d);
        }
        return l;
      }, "The ops of a decoder block in execution order (block.h).");

  py::class_<KVCache>(m, "KVCache", "Key/value cache of one sequence.")
      .def_property_readonly("length", &KVCache::length)
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly("bytes", &KVCache::bytes)
      .def("clear", &KVCache::clear);

  py::class_<Engine>(m, "Engine", "Runs a Model on token sequences under a Plan.")
      .def(py::init([](std::shared_ptr<Model> mdl) { return std::make_unique<Engine>(mdl); }),
           py::arg("model"))
      .def("new_cache", &Engine::new_cache, py::arg("capacity") = 0)
      .def("set_calibration", [](Engine& e, std::shared_ptr<Calibration> c) { e.set_calibration(c); },
           py::arg("calibration").none(true))
      .def("calibration", [](const Engine& e) {
        auto c = e.calibration();
        return c ? std::make_shared<Calibration>(*c) : std::shared_ptr<Calibration>();
      })
      .def("observe_activations", [](const Engine& e, const py::handle& seqs, Calibration& into) {
        auto batch = to_batch(seqs, "Engine.observe_activations");
        py::gil_scoped_release nogil;
        e.observe_activations(batch, into);
      }, py::arg("seqs"), py::arg("into"))
      .def("prepare", [](const Engine& e, const py::handle& plan) {
        Plan p = plan_from_py(plan);
        py::gil_scoped_release nogil;
        auto prep = e.prepare(p);
        return prep ? prep->weight_bytes() : int64_t{0};
      }, py::arg("plan"), "Prepare (quantize/pack) the plan's linears; returns their weight bytes.")
      .def("linear_graph", [](const Engine& e, const py::handle& plan, int64_t layer,
                              const std::string& site, int64_t rows) {
        Plan p = plan_from_py(plan);
        return e.linear_graph(p, layer, site_from_name(site, "Engine.linear_graph"), rows);
      }, py::arg("plan"), py::arg("layer"), py::arg("site"), py::arg("rows"),
      py::keep_alive<0, 1>(),  // an fp32 graph reads the engine's model weights
      "One linear static graph of the plan, built for `rows` rows (run(x) checks the shape).")
      .def("prefill", [](const Engine& e, const py::handle& tokens, const py::handle& plan,
                         bool all_positions, bool return_graph) -> py::object {
        auto ids = to_token_ids(tokens, "Engine.prefill");
        Plan p = plan_from_py(plan);
        Engine::Prefill r;
        {
          py::gil_scoped_release nogil;
          r = e.prefill(ids, p, all_positions, return_graph);
        }
        py::object logits = to_numpy(std::move(r.logits));
        if (!return_graph) return logits;
        return py::make_tuple(logits, std::move(r.graph));
      }, py::arg("tokens"), py::arg("plan"), py::arg("all_positions") = false,
      py::arg("return_graph") = false,
      "Prefill from an empty cache: logits of the last position (or all), and the executed task graph.")
      .def("task_graph", [](const Engine& e, const py::handle& plan, int64_t prompt_len, int64_t chunk_len) {
        Plan p = plan_from_py(plan);
        py::gil_scoped_release nogil;
        return e.task_graph(p, prompt_len, chunk_len);
      }, py::arg("plan"), py::arg("prompt_len"), py::arg("chunk_len"))
      .def("expected_shadow_loads", [](const Engine& e, const py::handle& plan) {
        py::list l;
        for (const auto& ld : e.expected_shadow_loads(plan_from_py(plan))) {
          py::dict d;
          d["pruned"] = ld.pruned;
          d["outlier_channels"] = ld.outlier_channels;
          d["cold_fetch_bytes"] = ld.cold_fetch_bytes;
          l.append(d);
        }
        return l;
      }, py::arg("plan"))
      .def("graph_stats", [](const Engine& e) { return graph_stats_to_py(e.graph_stats()); })
      .def("graph_events", [](const Engine& e) {
        py::list l;
        for (const auto& ev : e.graph_events()) {
          py::dict d;
          d["kind"] = npu::subgraph_kind_name(ev.key.kind);
          d["layer"] = ev.key.layer;
          d["rows"] = ev.key.rows;
          d["chunk_index"] = ev.key.chunk_index;
          d["weight_bytes"] = ev.weight_bytes;
          d["activation_bytes"] = ev.activation_bytes;
          l.append(d);
        }
        return l;
      })
      .def("clear_graphs", &Engine::clear_graphs)
      .def("shadow_stats", [](const Engine& e, const py::handle& plan, bool reset) {
        Plan p = plan_from_py(plan);
        if (!p.linear.shadow)
          throw InvalidArgument("[Engine.shadow_stats] plan '" + p.name +
                                "' does not use shadow outlier execution");
        std::shared_ptr<const PreparedLinears> prep;
        {
          py::gil_scoped_release nogil;
          prep = e.prepare(p);
        }
        py::list out;
        for (size_t l = 0; l < prep->layers.size(); ++l)
          for (int s = 0; s < kNumLinearSites; ++s) {
            const quant::PreparedLinear& lin = prep->at(static_cast<int64_t>(l), static_cast<LinearSite>(s));
            py::dict d = shadow_stats_to_py(lin.shadow_stats());
            d["layer"] = l;
            d["site"] = linear_site_name(static_cast<LinearSite>(s));
            d["threshold"] = lin.shadow()->threshold;
            d["pruned"] = lin.shadow()->pruned;
            d["hot_channels"] = lin.shadow()->hot_channels.size();
            d["resident_float_bytes"] = lin.resident_float_bytes();
            d["weight_bytes"] = lin.weight_bytes();
            d["in_features"] = lin.in();
            d["out_features"] = lin.out();
            if (reset) lin.reset_shadow_stats();
            out.append(d);
          }
        return out;
      }, py::arg("plan"), py::arg("reset") = false,
      "Per linear input of a shadow-outlier plan: its profiled configuration, resident float "
      "bytes, and what its CPU part did since the last reset (segments, syncs, outlier values "
      "and channels, hot hits, cold fetches and bytes, pruned values).")
      .def("logits",
           [](const Engine& e, const py::handle& seqs, const py::handle& plan) {
             auto batch = to_batch(seqs, "Engine.logits");
             Plan p = plan_from_py(plan);
             std::vector<TensorF32> out;
             {
               py::gil_scoped_release nogil;
               out = e.logits(batch, p);
             }
             py::list l;
             for (auto& t : out) l.append(to_numpy(std::move(t)));
             return l;
           },
           py::arg("seqs"), py::arg("plan") = "fp32",
           "Logits [T_i, vocab] float32 for every position of each sequence (fresh context).")
      .def("step",
           [](const Engine& e, KVCache& cache, const py::handle& tokens, bool all_positions,
              const py::handle& plan) {
             auto ids = to_token_ids(tokens, "Engine.step");
             Plan p = plan_from_py(plan);
             TensorF32 out;
             {
               py::gil_scoped_release nogil;
               out = e.step(cache, ids, all_positions, p);
             }
             return to_numpy(std::move(out));
           },
           py::arg("cache"), py::arg("tokens"), py::arg("all_positions") = false,
           py::arg("plan") = "fp32")
      .def("token_logprobs",
           [](const Engine& e, const py::handle& seqs, const py::handle& plan) {
             auto batch = to_batch(seqs, "Engine.token_logprobs");
             Plan p = plan_from_py(plan);
             std::vector<std::vector<float>> out;
             {
               py::gil_scoped_release nogil;
               out = e.token_logprobs(batch, p);
             }
             py::list l;
             for (auto& v : out) {
               TensorF32 t({static_cast<int64_t>(v.size())});
               t.data = std::move(v);
               l.append(to_numpy(std::move(t)));
             }
             return l;
           },
           py::arg("seqs"), py::arg("plan") = "fp32",
           "log p(x_t | x_<t) for t = 1..T-1 of each sequence, float32 arrays.")
      .def("generate_greedy",
           [](const Engine& e, const py::handle& prompt, int64_t max_new_tokens,
              const std::vector<int32_t>& stop_ids, const py::handle& plan) {
             auto ids = to_token_ids(prompt, "Engine.generate");
             Plan p = plan_from_py(plan);
             py::gil_scoped_release nogil;
             return e.generate_greedy(ids, max_new_tokens, stop_ids, p);
           },
           py::arg("prompt"), py::arg("max_new_tokens"), py::arg("stop_ids") = std::vector<int32_t>{},
           py::arg("plan") = "fp32");
}

}  // namespace socllm::py_bind
