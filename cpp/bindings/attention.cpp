// Mirrors cpp/attention/ (attention_scheme.h): the registered attention schemes with their
// options, their shared helpers, and one layer's prefill attention under a scheme, as part of
// socllm._core.ops on numpy's head-major layout: q [H, T, hd], k/v [Hkv, L, hd].
#include <pybind11/stl.h>

#include <array>
#include <tuple>

#include "attention/attention_scheme.h"
#include "common.h"

namespace socllm::py_bind {

void init_attention(py::module_& m) {
  py::module_ ops = m.attr("ops");
  ops.def(
      "attention_schemes",
      [] {
        py::list l;
        for (const attention::SchemeKind* k : attention::schemes()) {
          py::dict d;
          d["name"] = k->name();
          d["description"] = k->description();
          d["options"] = options_to_py(k->options());
          l.append(d);
        }
        return l;
      },
      "The attention schemes a plan can name (attention/registry.cpp): name, description and "
      "options (name, default, help, choices), each declared in the scheme's own file.");
  ops.def("bucket_offsets", &attention::bucket_offsets, py::arg("n"),
          "Lattice offsets (a, b) of n scale buckets: bucket i is <λ̄Q·step^a, λ̄K·step^b>.");
  ops.def(
      "nearest_bucket",
      [](float lq, float lk, const std::vector<float>& bq, const std::vector<float>& bk) {
        return attention::nearest_bucket(lq, lk, bq, bk);
      },
      py::arg("lq"), py::arg("lk"), py::arg("bucket_q"), py::arg("bucket_k"),
      "The bucket whose <λQ, λK> is nearest (MSE) to (lq, lk); ties: the lower index.");
  ops.def(
      "head_keep_ratios",
      [](const py::array& head_imp, const py::array& layer_imp, double keep,
         double clamp_quantile) {
        const auto h = numeric_array<float>(head_imp, "[head_keep_ratios] head_importance");
        const auto l = numeric_array<float>(layer_imp, "[head_keep_ratios] layer_importance");
        if (h.ndim() != 2 || l.ndim() != 1 || h.shape(0) != l.shape(0))
          throw ShapeError("[head_keep_ratios] need [n_layers, n_heads] and [n_layers], got " +
                           shape_str(h) + " and " + shape_str(l));
        const auto r = attention::head_keep_ratios({h.data(), static_cast<size_t>(h.size())},
                                                   {l.data(), static_cast<size_t>(l.size())},
                                                   h.shape(1), keep, clamp_quantile);
        py::array_t<double> out({h.shape(0), h.shape(1)});
        std::copy(r.begin(), r.end(), out.mutable_data());
        return out;
      },
      py::arg("head_importance"), py::arg("layer_importance"), py::arg("keep"),
      py::arg("clamp_quantile") = attention::kDefaultClampQuantile,
      "Per-head keep ratios by seed 000 Eq. 3 (attention_scheme.h).");
  ops.def("keys_kept", &attention::keys_kept, py::arg("visible"), py::arg("ratio"),
          py::arg("min_keys") = 1);
  ops.def(
      "prefill_attention",
      [](const py::array& q_obj, const py::array& k_obj, const py::array& v_obj,
         const py::handle& scheme, int64_t past, const std::optional<std::vector<double>>& ratio,
         const std::optional<std::vector<float>>& bucket_q,
         const std::optional<std::vector<float>>& bucket_k,
         const std::optional<std::array<float, 3>>& static_qkv, bool trace, int64_t window) {
        const auto q = numeric_array<float>(q_obj, "[prefill_attention] q");
        const auto kk = numeric_array<float>(k_obj, "[prefill_attention] k");
        const auto v = numeric_array<float>(v_obj, "[prefill_attention] v");
        if (q.ndim() != 3 || kk.ndim() != 3 || v.ndim() != 3 || kk.shape(0) != v.shape(0) ||
            kk.shape(1) != v.shape(1) || q.shape(2) != kk.shape(2) || kk.shape(2) != v.shape(2))
          throw ShapeError("[prefill_attention] need q [H, T, hd], k and v [Hkv, L, hd], got " +
                           shape_str(q) + ", " + shape_str(kk) + ", " + shape_str(v));
        const int64_t H = q.shape(0), T = q.shape(1), hd = q.shape(2), G = kk.shape(0),
                      L = kk.shape(1);
        if (L != past + T)
          throw ShapeError("[prefill_attention] " + std::to_string(L) + " keys for past " +
                           std::to_string(past) + " + " + std::to_string(T) + " queries");
        const auto s = py::isinstance<py::str>(scheme)
                           ? attention::AttentionScheme::parse(scheme.cast<std::string>())
                           : attention::AttentionScheme::from_json(py_to_json(scheme, "scheme"));
        attention::LayerConsts c = attention::uniform_layer_consts(s, H);
        if (ratio) c.head_ratio = *ratio;
        if (bucket_q) c.bucket_q = *bucket_q;
        if (bucket_k) c.bucket_k = *bucket_k;
        c.buckets = bucket_q ? static_cast<int64_t>(bucket_q->size()) / H : 0;
        if (static_qkv)
          std::tie(c.static_q, c.static_k, c.static_v) =
              std::tuple((*static_qkv)[0], (*static_qkv)[1], (*static_qkv)[2]);
        // head-major -> the engine's interleaved rows
        std::vector<float> qr(static_cast<size_t>(T * H * hd)), kr(static_cast<size_t>(L * G * hd)),
            vr(kr.size()), o(qr.size());
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < T; ++t)
            std::copy_n(q.data() + (h * T + t) * hd, hd, qr.data() + t * H * hd + h * hd);
        for (int64_t g = 0; g < G; ++g)
          for (int64_t j = 0; j < L; ++j) {
            std::copy_n(kk.data() + (g * L + j) * hd, hd, kr.data() + j * G * hd + g * hd);
            std::copy_n(v.data() + (g * L + j) * hd, hd, vr.data() + j * G * hd + g * hd);
          }
        attention::Trace tr;
        {
          py::gil_scoped_release nogil;
          attention::prefill_attention(s, c, qr.data(), H * hd, kr.data(), vr.data(), G * hd,
                                       {T, past, H, G, hd, window}, o.data(), H * hd,
                                       trace ? &tr : nullptr);
        }
        py::array_t<float> out({H, T, hd});
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < T; ++t)
            std::copy_n(o.data() + t * H * hd + h * hd, hd, out.mutable_data() + (h * T + t) * hd);
        if (!trace) return py::object(out);
        py::array_t<uint8_t> mask({H, T, L});
        std::fill_n(mask.mutable_data(), mask.size(), 0);
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < T; ++t)
            for (int32_t j : tr.keys[static_cast<size_t>(h * T + t)])
              mask.mutable_data()[(h * T + t) * L + j] = 1;
        py::dict d;
        d["out"] = out;
        d["selected"] = mask;
        d["bucket"] = tr.bucket;
        d["input_q"] = tr.input_q;
        d["input_k"] = tr.input_k;
        d["rescored"] = tr.rescored;
        d["fused_rows"] = tr.fused_rows;
        d["missed_rows"] = tr.missed_rows;
        d["kept"] = tr.kept;
        return py::object(d);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scheme"), py::arg("past") = 0,
      py::arg("head_ratio") = py::none(), py::arg("bucket_q") = py::none(),
      py::arg("bucket_k") = py::none(), py::arg("static_qkv") = py::none(),
      py::arg("trace") = false, py::arg("window") = 0,
      "One layer's prefill attention under a scheme (attention_scheme.h): out [H, T, hd]; "
      "window > 0: a sliding-window layer (position p sees keys p - window + 1 .. p); with "
      "trace a dict of out, selected [H, T, L] (uint8 mask of the keys each row kept; sparse "
      "kinds), bucket, input_q, input_k (shadow-attn), rescored (per head, keys rescored in fp32 "
      "by certified shadow-attn), fused_rows, missed_rows (per head, shadow-attn: rows whose top-k "
      "ran fused into the estimate, and those whose predicted band missed and were rescored), "
      "kept (per head, (row, key) pairs attended). bucket_q/k: "
      "[H * buckets].");
}

}  // namespace socllm::py_bind
