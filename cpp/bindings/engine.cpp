// Mirrors cpp/engine/ (engine.h; with block/kv_cache.h and npu/static_graph.h): the engine,
// its KV caches and linear static graphs, and the statistics of its graph cache.
#include <pybind11/stl.h>

#include <optional>

#include "common.h"
#include "engine/engine.h"
#include "npu/static_graph.h"

namespace socllm::py_bind {

std::vector<std::vector<int32_t>> to_batch(const py::handle& seqs, const char* fn) {
  std::vector<std::vector<int32_t>> out;
  for (py::handle s : py::iter(seqs)) out.push_back(to_token_ids(s, fn));
  if (out.empty()) throw InvalidArgument(std::string("[") + fn + "] no sequences given");
  return out;
}

namespace {

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

void init_engine(py::module_& m) {
  py::class_<LinearGraph>(m, "LinearGraph", "One linear subgraph built for a fixed row count.")
      .def_property_readonly("rows", [](const LinearGraph& g) { return g.graph.key.rows; })
      .def_property_readonly("in_cols", [](const LinearGraph& g) { return g.graph.in_cols; })
      .def_property_readonly("out_cols", [](const LinearGraph& g) { return g.graph.out_cols; })
      .def_property_readonly("scales", [](const LinearGraph& g) { return g.graph.scales; })
      .def_property_readonly("weight_bytes",
                             [](const LinearGraph& g) { return g.graph.weight_bytes; })
      .def(
          "run",
          [](const LinearGraph& g, const py::handle& x_obj) {
            const auto x = numeric_array<float>(x_obj, "[StaticGraph] input");
            if (x.ndim() != 2)
              throw ShapeError("[StaticGraph] input must be 2-D, got " + shape_str(x));
            TensorF32 y;
            {
              py::gil_scoped_release nogil;
              y = g.run(x.data(), x.shape(0), x.shape(1));
            }
            return to_numpy(std::move(y));
          },
          py::arg("x"));

  py::class_<KVCache>(m, "KVCache", "Key/value cache of one sequence.")
      .def_property_readonly("length", &KVCache::length)
      .def_property_readonly("capacity", &KVCache::capacity)
      .def_property_readonly("bytes", &KVCache::bytes)
      .def("clear", &KVCache::clear);

  py::class_<Engine>(m, "Engine", "Runs a Model on token sequences under a Plan.")
      .def(py::init([](std::shared_ptr<Model> mdl) { return std::make_unique<Engine>(mdl); }),
           py::arg("model"))
      .def("new_cache", &Engine::new_cache, py::arg("capacity") = 0)
      .def(
          "set_calibration",
          [](Engine& e, std::shared_ptr<Calibration> c) { e.set_calibration(c); },
          py::arg("calibration").none(true))
      .def("calibration",
           [](const Engine& e) {
             auto c = e.calibration();
             return c ? std::make_shared<Calibration>(*c) : std::shared_ptr<Calibration>();
           })
      .def("calibrated_rotations", &Engine::calibrated_rotations,
           "The rotations with statistics loaded (set_calibration routes a rotated model's "
           "statistics to the plans of its rotation).")
      .def(
          "observe_activations",
          [](const Engine& e, const py::handle& seqs, Calibration& into) {
            auto batch = to_batch(seqs, "Engine.observe_activations");
            py::gil_scoped_release nogil;
            e.observe_activations(batch, into);
          },
          py::arg("seqs"), py::arg("into"))
      .def(
          "observe_attention_scales",
          [](const Engine& e, const py::handle& seqs, Calibration& into) {
            auto batch = to_batch(seqs, "Engine.observe_attention_scales");
            py::gil_scoped_release nogil;
            e.observe_attention_scales(batch, into);
          },
          py::arg("seqs"), py::arg("into"),
          "Step qk-scales: append each window's per-head max |Q|, |K|, |V| (engine.h).")
      .def(
          "capture",
          [](const Engine& e, const py::handle& tokens, const std::vector<int64_t>& layers) {
            const auto ids = to_token_ids(tokens, "Engine.capture");
            std::vector<Engine::Capture> caps;
            {
              py::gil_scoped_release nogil;
              caps = e.capture(ids, layers);
            }
            py::list l;
            for (auto& c : caps) {
              py::dict d;
              d["q"] = to_numpy(std::move(c.q));
              d["k"] = to_numpy(std::move(c.k));
              d["v"] = to_numpy(std::move(c.v));
              l.append(d);
            }
            return l;
          },
          py::arg("tokens"), py::arg("layers"),
          "Per layer {'q': [n_heads, T, head_dim], 'k', 'v': [n_kv_heads, T, head_dim]}, "
          "post-RoPE fp32, from one run.")
      .def(
          "layer_inputs",
          [](const Engine& e, const py::handle& tokens) {
            const auto ids = to_token_ids(tokens, "Engine.layer_inputs");
            std::vector<TensorF32> xs;
            {
              py::gil_scoped_release nogil;
              xs = e.layer_inputs(ids);
            }
            py::list l;
            for (auto& x : xs) l.append(to_numpy(std::move(x)));
            return l;
          },
          py::arg("tokens"), "The residual stream entering each layer, [T, d_model] each (fp32).")
      .def(
          "ablation_logprobs",
          [](const Engine& e, const py::handle& tokens, int64_t layer, const py::array& x,
             const py::array& masks) {
            const auto ids = to_token_ids(tokens, "Engine.ablation_logprobs");
            const auto xa = numeric_array<float>(x, "[Engine.ablation_logprobs] x");
            const auto ma = numeric_array<float>(masks, "[Engine.ablation_logprobs] masks");
            if (xa.ndim() != 2 || ma.ndim() != 2)
              throw ShapeError(
                  "[Engine.ablation_logprobs] x must be [T, d_model] and masks "
                  "[n_masks, n_heads], got " +
                  shape_str(xa) + " and " + shape_str(ma));
            TensorF32 xt({xa.shape(0), xa.shape(1)});
            std::copy(xa.data(), xa.data() + xa.size(), xt.data.begin());
            std::vector<std::vector<float>> mv;
            for (py::ssize_t i = 0; i < ma.shape(0); ++i)
              mv.emplace_back(ma.data() + i * ma.shape(1), ma.data() + (i + 1) * ma.shape(1));
            std::vector<std::vector<float>> out;
            {
              py::gil_scoped_release nogil;
              out = e.ablation_logprobs(ids, layer, xt, mv);
            }
            py::array_t<float> r(
                {static_cast<py::ssize_t>(out.size()), static_cast<py::ssize_t>(ids.size()) - 1});
            for (size_t i = 0; i < out.size(); ++i)
              std::copy(out[i].begin(), out[i].end(), r.mutable_data() + i * (ids.size() - 1));
            return r;
          },
          py::arg("tokens"), py::arg("layer"), py::arg("x"), py::arg("masks"),
          "Head ablation (seed 000 Eq. 1/2): [n_masks, T-1] log p(x_t | x_<t) of running layers "
          "layer.. from x with each head mask (1 keep, 0 zero) applied at `layer`.")
      .def(
          "attention_constants",
          [](const Engine& e, const py::handle& plan) {
            Plan p = plan_from_py(plan);
            std::shared_ptr<const std::vector<attention::LayerConsts>> a;
            {
              py::gil_scoped_release nogil;
              a = e.prepare_attention(p);
            }
            py::list l;
            if (!a) return l;
            for (const auto& c : *a) {
              py::dict d;
              d["head_ratio"] = c.head_ratio;
              d["bucket_q"] = c.bucket_q;
              d["bucket_k"] = c.bucket_k;
              d["buckets"] = c.buckets;
              d["static_q"] = c.static_q;
              d["static_k"] = c.static_k;
              d["static_v"] = c.static_v;
              l.append(d);
            }
            return l;
          },
          py::arg("plan"),
          "Per layer, what the plan's attention scheme fixed from calibration: head_ratio, "
          "bucket_q/bucket_k ([n_heads * buckets]), static_q/k/v (npu-int8); [] for fp32.")
      .def(
          "prepare",
          [](const Engine& e, const py::handle& plan) {
            Plan p = plan_from_py(plan);
            py::gil_scoped_release nogil;
            auto prep = e.prepare(p);
            return prep ? prep->weight_bytes() : int64_t{0};
          },
          py::arg("plan"),
          "Prepare (quantize/pack) the plan's linears; returns their weight bytes.")
      .def(
          "prepared_state",
          [](const Engine& e, const py::handle& plan) {
            Plan p = plan_from_py(plan);
            std::shared_ptr<const PreparedLinears> prep;
            {
              py::gil_scoped_release nogil;
              prep = e.prepare(p);
            }
            if (!prep)
              throw InvalidArgument("[Engine.prepared_state] plan '" + p.name +
                                    "' has fp32 linears: nothing is prequantized");
            auto floats = [](const std::vector<float>& v) -> py::object {
              if (v.empty()) return py::none();
              py::array_t<float> a(static_cast<py::ssize_t>(v.size()));
              std::copy(v.begin(), v.end(), a.mutable_data());
              return a;
            };
            py::list layers;
            for (size_t l = 0; l < prep->layers.size(); ++l) {
              py::dict sites;
              for (int s = 0; s < kNumLinearSites; ++s) {
                const quant::PreparedLinear& lin = *prep->layers[l][s];
                const auto* codes = lin.weight_codes();
                if (!codes)
                  throw InvalidArgument("[Engine.prepared_state] plan '" + p.name +
                                        "' does not run its linears on integer codes");
                py::dict d;
                py::array_t<int8_t> q({lin.out(), lin.in()});
                std::copy(codes->begin(), codes->end(), q.mutable_data());
                d["codes"] = q;
                const auto& b = lin.row_bits();
                py::array_t<uint8_t> bits(static_cast<py::ssize_t>(b.size()));
                std::copy(b.begin(), b.end(), bits.mutable_data());
                d["bits"] = bits;
                d["scales"] = floats(lin.weight_scales());
                d["post"] = floats(lin.row_post());
                d["out_scale"] = floats(lin.output_scales());
                d["bias"] = floats(lin.bias());
                d["input_smooth"] = floats(lin.input_divisor());
                d["act_scale"] = lin.static_act_scale();
                sites[linear_site_name(static_cast<LinearSite>(s))] = d;
              }
              layers.append(sites);
            }
            py::object gains = py::none();
            if (!prep->norm_gains.empty()) {
              py::list g;
              for (const auto& pair : prep->norm_gains)
                g.append(py::make_tuple(floats(pair[0]), floats(pair[1])));
              gains = g;
            }
            py::dict out;
            out["scheme"] = json_to_py(p.linear.to_json());
            out["plan"] = json_to_py(p.to_json());
            out["layers"] = layers;
            out["norm_gains"] = gains;
            return out;
          },
          py::arg("plan"),
          "What the plan's prepared linears hold, per layer and site: codes int8 [out, in], "
          "bits, scales, post, out_scale, bias, input_smooth (None when absent), act_scale; "
          "the folded norm gains; the scheme and plan JSON (socllm convert --edgeflow-bits).")
      .def(
          "linear_graph",
          [](const Engine& e, const py::handle& plan, int64_t layer, const std::string& site,
             int64_t rows) {
            Plan p = plan_from_py(plan);
            return e.linear_graph(p, layer, site_from_name(site, "Engine.linear_graph"), rows);
          },
          py::arg("plan"), py::arg("layer"), py::arg("site"), py::arg("rows"),
          py::keep_alive<0, 1>(),  // an fp32 graph reads the engine's model weights
          "One linear static graph of the plan, built for `rows` rows (run(x) checks the shape).")
      .def(
          "linear_inputs",
          [](const Engine& e, const py::handle& tokens, const std::vector<int64_t>& rows) {
            const auto ids = to_token_ids(tokens, "Engine.linear_inputs");
            std::vector<std::array<TensorF32, kNumLinearSites>> xs;
            {
              py::gil_scoped_release nogil;
              xs = e.linear_inputs(ids, rows);
            }
            py::list l;
            for (auto& layer : xs) {
              py::dict d;
              for (int s = 0; s < kNumLinearSites; ++s)
                d[linear_site_name(static_cast<LinearSite>(s))] = to_numpy(std::move(layer[s]));
              l.append(d);
            }
            return l;
          },
          py::arg("tokens"), py::arg("rows"),
          "Per layer {site: [len(rows), width]}: the linear inputs of an fp32 run at those rows.")
      .def(
          "linear_forward",
          [](const Engine& e, const py::handle& plan, int64_t layer, const std::string& site,
             const py::handle& x_obj, std::optional<double> alpha) {
            Plan p = plan_from_py(plan);
            const auto x = numeric_array<float>(x_obj, "[Engine.linear_forward] x");
            const LinearSite st = site_from_name(site, "Engine.linear_forward");
            const int64_t in = linear_site_width(e.model().config(), st);
            if (x.ndim() != 2 || x.shape(1) != in)
              throw ShapeError("[Engine.linear_forward] x must be [rows, " + std::to_string(in) +
                               "], got " + shape_str(x));
            const int64_t rows = x.shape(0), out = linear_out_width(e.model().config(), st);
            py::array_t<float> y({rows, out});
            float* yp = y.mutable_data();
            const float* xp = x.data();
            py::gil_scoped_release nogil;
            const auto lin = e.prepare_linear(p, layer, st, alpha);
            const quant::RowSegment all{0, rows};
            lin->forward(xp, rows, yp, out, false, {&all, 1});
            return y;
          },
          py::arg("plan"), py::arg("layer"), py::arg("site"), py::arg("x"),
          py::arg("alpha") = py::none(),
          "y [rows, out] of one linear of the plan built alone (its input smoothing divided at "
          "run time, not folded); alpha replaces npu smoothing's input exponent.")
      .def(
          "linear_info",
          [](const Engine& e, const py::handle& plan, int64_t layer, const std::string& site,
             std::optional<double> alpha) {
            Plan p = plan_from_py(plan);
            const LinearSite st = site_from_name(site, "Engine.linear_info");
            std::unique_ptr<quant::PreparedLinear> lin;
            {
              py::gil_scoped_release nogil;
              lin = e.prepare_linear(p, layer, st, alpha);
            }
            py::dict d;
            const auto& b = lin->row_bits();
            py::array_t<uint8_t> bits(static_cast<py::ssize_t>(b.size()));
            std::copy(b.begin(), b.end(), bits.mutable_data());
            d["bits"] = bits;
            d["bits_per_weight"] = lin->stored_bits_per_weight();
            d["weight_bytes"] = lin->weight_bytes();
            d["act_scale"] = lin->static_act_scale();
            d["input_smoothing"] = e.input_smoothing(p, layer, st, alpha);
            return d;
          },
          py::arg("plan"), py::arg("layer"), py::arg("site"), py::arg("alpha") = py::none(),
          "What one linear of the plan holds: bits [out] per row, bits_per_weight (scales and "
          "bit-width metadata counted), weight_bytes, act_scale, input_smoothing [in] (npu "
          "smoothing's divisor S_I^alpha; [] without).")
      .def(
          "prefill",
          [](const Engine& e, const py::handle& tokens, const py::handle& plan, bool all_positions,
             bool return_graph, const py::handle& decode_tokens,
             bool return_records) -> py::object {
            auto ids = to_token_ids(tokens, "Engine.prefill");
            const int64_t n_decode = to_int64(decode_tokens, "Engine.prefill", "decode_tokens");
            Plan p = plan_from_py(plan);
            Engine::Prefill r;
            {
              py::gil_scoped_release nogil;
              r = e.prefill(ids, p, all_positions, return_graph, n_decode, return_records);
            }
            py::object logits = to_numpy(std::move(r.logits));
            if (!return_graph && !return_records && n_decode == 0) return logits;
            py::dict d;
            d["logits"] = logits;
            d["decoded"] = r.decoded;
            if (return_graph) d["graph"] = std::move(r.graph);
            if (return_records) {
              py::list recs;
              for (const auto& rec : r.records) recs.append(json_to_py(rec.to_json()));
              d["records"] = recs;
            }
            return d;
          },
          py::arg("tokens"), py::arg("plan"), py::arg("all_positions") = false,
          py::arg("return_graph") = false, py::arg("decode_tokens") = 0,
          py::arg("return_records") = false,
          "Prefill from an empty cache, then decode_tokens greedy decoding steps: the logits of "
          "the prompt's last position (or all); with decode_tokens, return_graph or "
          "return_records a dict of logits, decoded (the tokens), graph (the executed task "
          "graph) and records (what each op's run did: block.h OpRecord).")
      .def(
          "task_graph",
          [](const Engine& e, const py::handle& plan, int64_t prompt_len, int64_t chunk_len,
             int64_t decode_tokens) {
            Plan p = plan_from_py(plan);
            py::gil_scoped_release nogil;
            return e.task_graph(p, prompt_len, chunk_len, decode_tokens);
          },
          py::arg("plan"), py::arg("prompt_len"), py::arg("chunk_len"),
          py::arg("decode_tokens") = 0)
      .def(
          "lm_head_weight_bytes",
          [](const Engine& e, const py::handle& plan) {
            return e.lm_head_weight_bytes(plan_from_py(plan));
          },
          py::arg("plan"), "Bytes of the LM head's weights as the plan's numerics hold them.")
      .def(
          "expected_shadow_loads",
          [](const Engine& e, const py::handle& plan) {
            py::list l;
            for (const auto& ld : e.expected_shadow_loads(plan_from_py(plan))) {
              py::dict d;
              d["pruned"] = ld.pruned;
              d["outlier_channels"] = ld.outlier_channels;
              d["cold_fetch_bytes"] = ld.cold_fetch_bytes;
              l.append(d);
            }
            return l;
          },
          py::arg("plan"))
      .def("graph_stats", [](const Engine& e) { return graph_stats_to_py(e.graph_stats()); })
      .def("graph_events",
           [](const Engine& e) {
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
      .def(
          "shadow_stats",
          [](const Engine& e, const py::handle& plan, bool reset) {
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
                const quant::PreparedLinear& lin =
                    prep->at(static_cast<int64_t>(l), static_cast<LinearSite>(s));
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
          },
          py::arg("plan"), py::arg("reset") = false,
          "Per linear input of a shadow-outlier plan: its profiled configuration, resident float "
          "bytes, and what its CPU part did since the last reset (segments, syncs, outlier values "
          "and channels, hot hits, cold fetches and bytes, pruned values).")
      .def(
          "logits",
          [](const Engine& e, const py::handle& seqs, const py::handle& plan,
             const std::optional<std::vector<int64_t>>& last_rows) {
            auto batch = to_batch(seqs, "Engine.logits");
            Plan p = plan_from_py(plan);
            std::vector<TensorF32> out;
            {
              py::gil_scoped_release nogil;
              out = e.logits(batch, p, last_rows.value_or(std::vector<int64_t>{}));
            }
            py::list l;
            for (auto& t : out) l.append(to_numpy(std::move(t)));
            return l;
          },
          py::arg("seqs"), py::arg("plan") = "fp32", py::arg("last_rows") = py::none(),
          "Logits [T_i, vocab] float32 for every position of each sequence (fresh context), or "
          "with last_rows (a count per sequence) those of its last last_rows[i] positions only.")
      .def(
          "step",
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
      .def(
          "token_logprobs",
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
      .def(
          "generate_greedy",
          [](const Engine& e, const py::handle& prompt, const py::handle& max_new_tokens,
             const py::handle& stop_ids, const py::handle& plan) {
            auto ids = to_token_ids(prompt, "Engine.generate");
            const int64_t n = to_int64(max_new_tokens, "Engine.generate", "max_new_tokens");
            auto stop = to_token_ids(stop_ids, "Engine.generate");
            Plan p = plan_from_py(plan);
            py::gil_scoped_release nogil;
            return e.generate_greedy(ids, n, stop, p);
          },
          py::arg("prompt"), py::arg("max_new_tokens"), py::arg("stop_ids") = py::list(),
          py::arg("plan") = "fp32");
}

}  // namespace socllm::py_bind
