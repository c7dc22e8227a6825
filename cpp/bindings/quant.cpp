// Mirrors cpp/include/socllm/quant.h as socllm._core.quant.
#include <pybind11/stl.h>

#include "common.h"
#include "socllm/quant.h"

namespace socllm::py_bind {

void init_quant(py::module_& m) {
  py::module_ q = m.def_submodule("quant", "Symmetric int8/int4 quantizers (rules in quant.h).");
  q.def(
      "quantize",
      [](const py::handle& W_obj, int bits, const std::string& granularity, int64_t group_size) {
        const auto W = numeric_array<float>(W_obj, "[quantize] W");
        if (W.ndim() != 2)
          throw ShapeError("[quantize] W must be 2-D [out, in], got " + std::to_string(W.ndim()) +
                           "-D");
        const int64_t rows = W.shape(0), cols = W.shape(1);
        quant::QuantSpec spec{bits, quant::granularity_from_name(granularity), group_size};
        quant::QuantizedWeights w;
        {
          py::gil_scoped_release nogil;
          w = quant::quantize_weights(W.data(), rows, cols, spec);
        }
        py::array_t<int8_t> qa({rows, cols});
        std::copy(w.q.begin(), w.q.end(), qa.mutable_data());
        std::vector<py::ssize_t> sshape;
        if (spec.granularity == quant::Granularity::PerTensor)
          sshape = {static_cast<py::ssize_t>(w.scales.size())};
        else if (spec.granularity == quant::Granularity::PerChannel) sshape = {rows};
        else sshape = {rows, cols / group_size};
        py::array_t<float> sa(sshape);
        std::copy(w.scales.begin(), w.scales.end(), sa.mutable_data());
        return py::make_tuple(qa, sa);
      },
      py::arg("W"), py::arg("bits") = 8, py::arg("granularity") = "per-channel",
      py::arg("group_size") = 32,
      "(q int8 [out, in], scales float32: [1] per-tensor, [out] per-channel, [out, in/group]).");
  q.def(
      "dequantize",
      [](const py::handle& q_obj, const py::handle& scales_obj) {
        const auto qa = numeric_array<int8_t>(q_obj, "[dequantize] q");
        const auto scales = numeric_array<float>(scales_obj, "[dequantize] scales");
        if (qa.ndim() != 2) throw ShapeError("[dequantize] q must be 2-D");
        const int64_t n = qa.size(), ns = scales.size();
        if (n > 0 && (ns == 0 || n % ns != 0 || (ns > 1 && (n / ns) > qa.shape(1)) ||
                      (ns > 1 && qa.shape(1) % (n / ns) != 0)))
          throw ShapeError("[dequantize] " + std::to_string(ns) +
                           " scales do not tile q of shape [" + std::to_string(qa.shape(0)) + ", " +
                           std::to_string(qa.shape(1)) + "]");
        quant::QuantizedWeights w;
        w.rows = qa.shape(0);
        w.cols = qa.shape(1);
        w.q.assign(qa.data(), qa.data() + n);
        w.scales.assign(scales.data(), scales.data() + ns);
        py::array_t<float> out({w.rows, w.cols});
        quant::dequantize_weights(w, out.mutable_data());
        return out;
      },
      py::arg("q"), py::arg("scales"), "q * scale, each scale covering a row-major block of q.");
  q.def(
      "quantize_static",
      [](const py::handle& x_obj, float scale, int bits) {
        const auto x = numeric_array<float>(x_obj, "[quantize_static] x");
        py::array_t<int8_t> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
        quant::quantize_static(x.data(), x.size(), scale, bits, out.mutable_data());
        return out;
      },
      py::arg("x"), py::arg("scale"), py::arg("bits") = 8,
      "int8 saturate(round_half_even(x / scale)) with a static (calibrated) scale.");
}

}  // namespace socllm::py_bind
