// Mirrors cpp/quant/quant.h and bitwidth.h as socllm._core.quant.
#include <pybind11/stl.h>

#include "common.h"
#include "quant/bitwidth.h"
#include "quant/gptq.h"
#include "quant/linear_scheme.h"
#include "quant/quant.h"

namespace socllm::py_bind {

namespace {

// A [rows, 8] float64 error table (channel_error_table's layout).
std::vector<double> error_table_arg(const py::handle& t_obj, const char* fn, int64_t& rows) {
  const auto t = numeric_array<double>(t_obj, std::string("[") + fn + "] table");
  if (t.ndim() != 2 || t.shape(1) != quant::kChannelBitLevels)
    throw ShapeError(std::string("[") + fn + "] table must be [rows, 8], got " +
                     shape_str({t.shape(), t.shape() + t.ndim()}));
  rows = t.shape(0);
  return {t.data(), t.data() + t.size()};
}

py::array_t<uint8_t> bits_array(const std::vector<uint8_t>& b) {
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(b.size()));
  std::copy(b.begin(), b.end(), out.mutable_data());
  return out;
}

py::array_t<float> weights_2d(const py::handle& W_obj, const char* fn) {
  auto W = numeric_array<float>(W_obj, std::string("[") + fn + "] W");
  if (W.ndim() != 2)
    throw ShapeError(std::string("[") + fn + "] W must be 2-D [out, in], got " +
                     std::to_string(W.ndim()) + "-D");
  return W;
}

// Summed table[i, bits[i] - 1] (allocation_error and allocation_cost are this sum).
double summed_table(const py::handle& t_obj, const py::handle& b_obj, const char* fn) {
  int64_t rows = 0;
  const auto t = error_table_arg(t_obj, fn, rows);
  const auto b = numeric_array<uint8_t>(b_obj, std::string("[") + fn + "] bits");
  if (b.ndim() != 1 || b.shape(0) != rows)
    throw ShapeError(std::string("[") + fn + "] bits must be [" + std::to_string(rows) + "], got " +
                     shape_str({b.shape(), b.shape() + b.ndim()}));
  return quant::allocation_cost(t, {b.data(), static_cast<size_t>(b.size())});
}

// (q int8 [rows, cols], scales: [1] per-tensor, [rows] per-channel, [rows, cols / group]).
py::tuple codes_and_scales(const quant::QuantizedWeights& w) {
  py::array_t<int8_t> qa({w.rows, w.cols});
  std::copy(w.q.begin(), w.q.end(), qa.mutable_data());
  std::vector<py::ssize_t> sshape;
  if (w.spec.granularity == quant::Granularity::PerTensor)
    sshape = {static_cast<py::ssize_t>(w.scales.size())};
  else if (w.spec.granularity == quant::Granularity::PerChannel) sshape = {w.rows};
  else sshape = {w.rows, w.cols / w.spec.group_size};
  py::array_t<float> sa(sshape);
  std::copy(w.scales.begin(), w.scales.end(), sa.mutable_data());
  return py::make_tuple(qa, sa);
}

// H as a [in, in] float32 array.
py::array_t<float> hessian_arg(const py::handle& H_obj, int64_t in, const char* fn) {
  auto H = numeric_array<float>(H_obj, std::string("[") + fn + "] H");
  if (H.ndim() != 2 || H.shape(0) != in || H.shape(1) != in)
    throw ShapeError(std::string("[") + fn + "] H must be [" + std::to_string(in) + ", " +
                     std::to_string(in) + "], got " + shape_str({H.shape(), H.shape() + H.ndim()}));
  return H;
}

}  // namespace

void init_quant(py::module_& m) {
  py::module_ q = m.def_submodule("quant", "Symmetric int8/int4 quantizers (rules in quant.h).");
  q.def(
      "stored_weight_bytes",
      [](const py::object& scheme, int64_t out, int64_t in, const std::vector<int64_t>& tensor_rows,
         bool bias) {
        return quant::stored_weight_bytes(quant::LinearScheme::from_json(py_to_json(scheme)), out,
                                          in, tensor_rows, bias);
      },
      py::arg("scheme"), py::arg("out_features"), py::arg("in_features"),
      py::arg("tensor_rows") = std::vector<int64_t>{}, py::arg("bias") = false,
      "Bytes a linear of the scheme (LinearScheme JSON, e.g. Plan(...).to_json()['ops']['linear'] "
      "without processor/format) stores for a weight [out_features, in_features] "
      "(linear_scheme.h).");
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
        return codes_and_scales(w);
      },
      py::arg("W"), py::arg("bits") = 8, py::arg("granularity") = "per-channel",
      py::arg("group_size") = 32,
      "(q int8 [out, in], scales float32: [1] per-tensor, [out] per-channel, [out, in/group]).");
  q.def(
      "gptq",
      [](const py::handle& W_obj, const py::handle& H_obj, int bits, const std::string& granularity,
         int64_t group_size, double damp, int64_t block, bool act_order,
         const py::object& row_bits_obj) {
        const auto W = weights_2d(W_obj, "gptq");
        const int64_t rows = W.shape(0), cols = W.shape(1);
        const auto H = hessian_arg(H_obj, cols, "gptq");
        std::vector<uint8_t> row_bits;
        if (!row_bits_obj.is_none()) {
          const auto b = numeric_array<uint8_t>(row_bits_obj, "[gptq] row_bits");
          row_bits.assign(b.data(), b.data() + b.size());
        }
        const quant::QuantSpec spec{bits, quant::granularity_from_name(granularity), group_size};
        const quant::GptqOptions o{damp, block, act_order};
        quant::QuantizedWeights w;
        {
          py::gil_scoped_release nogil;
          w = quant::gptq_quantize(W.data(), rows, cols, {H.data(), static_cast<size_t>(H.size())},
                                   spec, o, row_bits);
        }
        return codes_and_scales(w);
      },
      py::arg("W"), py::arg("H"), py::arg("bits") = 8, py::arg("granularity") = "per-channel",
      py::arg("group_size") = 32, py::arg("damp") = 0.01, py::arg("block") = 128,
      py::arg("act_order") = false, py::arg("row_bits") = py::none(),
      "GPTQ's rounding (quant/gptq.h): W [out, in] quantized against H = XᵀX/n [in, in] of its "
      "inputs; (q, scales) as quantize gives them (row_bits: EdgeFlow's per-row widths, "
      "per-channel).");
  q.def(
      "gptq_objective",
      [](const py::handle& W_obj, const py::handle& Wh_obj, const py::handle& H_obj) {
        const auto W = weights_2d(W_obj, "gptq_objective");
        const auto Wh = weights_2d(Wh_obj, "gptq_objective");
        if (Wh.shape(0) != W.shape(0) || Wh.shape(1) != W.shape(1))
          throw ShapeError("[gptq_objective] W_hat must have W's shape");
        const auto H = hessian_arg(H_obj, W.shape(1), "gptq_objective");
        return quant::gptq_objective(W.data(), Wh.data(), W.shape(0), W.shape(1),
                                     {H.data(), static_cast<size_t>(H.size())});
      },
      py::arg("W"), py::arg("W_hat"), py::arg("H"),
      "tr((W - W_hat) H (W - W_hat)ᵀ) / out: the output error GPTQ minimises.");
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

  // EdgeFlow's per-channel bit-widths (bitwidth.h, seed 004 §4.1).
  q.def(
      "quantize_rows",
      [](const py::handle& W_obj, const py::handle& bits_obj) {
        const auto W = weights_2d(W_obj, "quantize_rows");
        const auto bits = numeric_array<int64_t>(bits_obj, "[quantize_rows] bits");
        const int64_t rows = W.shape(0), cols = W.shape(1);
        if (bits.ndim() != 1 || bits.shape(0) != rows)
          throw ShapeError("[quantize_rows] bits must be [" + std::to_string(rows) + "], got " +
                           shape_str({bits.shape(), bits.shape() + bits.ndim()}));
        py::array_t<int8_t> qa({rows, cols});
        py::array_t<float> sa(rows);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t b = bits.data()[i];
          if (b < quant::kMinChannelBits || b > quant::kMaxChannelBits)
            throw InvalidArgument("[quantize_rows] row " + std::to_string(i) + " has bits " +
                                  std::to_string(b) + ", outside 1..8");
          sa.mutable_data()[i] = quant::quantize_row_bits(
              W.data() + i * cols, cols, static_cast<int>(b), qa.mutable_data() + i * cols);
        }
        return py::make_tuple(qa, sa);
      },
      py::arg("W"), py::arg("bits"),
      "(q int8 [out, in], scales float32 [out]): row i symmetric at bits[i] in 1..8 "
      "(1 bit: sign * mean|w|; bitwidth.h).");
  q.def(
      "error_table",
      [](const py::handle& W_obj, const std::string& metric) {
        const auto W = weights_2d(W_obj, "error_table");
        const auto m = quant::error_metric_from_name(metric);
        std::vector<double> t;
        {
          py::gil_scoped_release nogil;
          t = quant::channel_error_table(W.data(), W.shape(0), W.shape(1), m);
        }
        py::array_t<double> out({W.shape(0), py::ssize_t{quant::kChannelBitLevels}});
        std::copy(t.begin(), t.end(), out.mutable_data());
        return out;
      },
      py::arg("W"), py::arg("metric") = "closed-form",
      "RE(W_i, B) [out, 8] for B = 1..8 (column B - 1): 'closed-form' 2^-2B max^2/E[w^2] or "
      "'exact' cosine distance after quantization (seed 004 §4.1).");
  q.def("total_bits", &quant::total_channel_bits, py::arg("rows"), py::arg("avg_bits"),
        "floor(rows * avg_bits): the bits an average budget buys.");
  q.def(
      "allocate_bits",
      [](const py::handle& t_obj, double avg_bits, const std::string& method) {
        int64_t rows = 0;
        const auto t = error_table_arg(t_obj, "allocate_bits", rows);
        return bits_array(
            quant::allocate_bits(quant::bit_allocation_from_name(method), t, rows, avg_bits));
      },
      py::arg("table"), py::arg("avg_bits"), py::arg("method") = "greedy",
      "Bit-widths [rows] of one tensor at an average budget: greedy (Algorithm 1), uniform, "
      "int4-int8, cmpq.");
  q.def(
      "allocate_bits_greedy",
      [](const py::handle& t_obj, int64_t total) {
        int64_t rows = 0;
        const auto t = error_table_arg(t_obj, "allocate_bits_greedy", rows);
        return bits_array(quant::allocate_bits_greedy(t, rows, total));
      },
      py::arg("table"), py::arg("total_bits"), "Algorithm 1 spending exactly total_bits.");
  q.def(
      "allocate_bits_dp",
      [](const py::handle& t_obj, int64_t total) {
        int64_t rows = 0;
        const auto t = error_table_arg(t_obj, "allocate_bits_dp", rows);
        return bits_array(quant::allocate_bits_dp(t, rows, total));
      },
      py::arg("table"), py::arg("total_bits"),
      "The exact minimum of the summed error (dynamic programming; small tensors).");
  q.def(
      "allocate_bits_budgeted",
      [](const py::handle& e_obj, const py::handle& c_obj, double budget) {
        int64_t rows = 0, cost_rows = 0;
        const auto e = error_table_arg(e_obj, "allocate_bits_budgeted", rows);
        const auto c = error_table_arg(c_obj, "allocate_bits_budgeted", cost_rows);
        if (cost_rows != rows)
          throw ShapeError("[allocate_bits_budgeted] cost has " + std::to_string(cost_rows) +
                           " rows, error " + std::to_string(rows));
        return bits_array(quant::allocate_bits_budgeted(e, c, rows, budget));
      },
      py::arg("error"), py::arg("cost"), py::arg("budget"),
      "Bit-widths [rows] minimising the summed error [rows, 8] with the summed cost [rows, 8] "
      "at most budget: one heap over the channels' convex hulls (bitwidth.h).");
  q.def(
      "allocation_cost",
      [](const py::handle& t, const py::handle& b) {
        return summed_table(t, b, "allocation_cost");
      },
      py::arg("table"), py::arg("bits"),
      "Summed table[i, bits[i] - 1]: the cost (or error) of an allocation.");
  q.def(
      "allocation_error",
      [](const py::handle& t, const py::handle& b) {
        return summed_table(t, b, "allocation_error");
      },
      py::arg("table"), py::arg("bits"), "Summed table[i, bits[i] - 1] (allocation_cost).");
  q.def(
      "allocate_bits_waterfill",
      [](const py::handle& W_obj, int64_t total) {
        const auto W = weights_2d(W_obj, "allocate_bits_waterfill");
        return bits_array(quant::allocate_bits_waterfill(W.data(), W.shape(0), W.shape(1), total));
      },
      py::arg("W"), py::arg("total_bits"),
      "The closed form's continuous optimum, rounded to integers keeping the total.");
}

}  // namespace socllm::py_bind
