// Mirrors cpp/kernels/ (gemm_s8.h, weightlet.h, kernels.h, sparse_attention.h) as
// socllm._core.ops (numpy semantics: C = A @ B).
#include <pybind11/stl.h>

#include <array>
#include <tuple>
#include <type_traits>

#include "common.h"
#include "kernels/gemm_s8.h"
#include "kernels/hadamard.h"
#include "kernels/kernels.h"
#include "kernels/sparse_attention.h"
#include "kernels/weightlet.h"
#include "quant/rotation.h"

namespace socllm::py_bind {

namespace {

kernels::Isa isa_arg(const std::optional<std::string>& isa) {
  return isa ? kernels::isa_from_name(*isa) : kernels::best_isa();
}

// `obj` as an array of exactly T (no silent casts between integer types), in `Flags` order.
template <typename T, int Flags>
py::array_t<T, Flags> exact_array(const py::array& obj, const char* fn, const char* name) {
  if (!py::isinstance<py::array_t<T>>(obj))
    throw InvalidArgument(std::string("[") + fn + "] " + name + " must be a" +
                          (std::is_same_v<T, int8_t> ? "n int8" : " uint8") + " array, got " +
                          std::string(py::str(obj.dtype())));
  return py::array_t<T, Flags>::ensure(obj);
}
constexpr int kRowMajor = py::array::c_style | py::array::forcecast;
// A Fortran-ordered B[K, N] is row-major [N, K]: the kernels' weight layout, with ldb = K.
constexpr int kColMajor = py::array::f_style | py::array::forcecast;

// C[M, N] = A[M, K] @ B[K, N]; B is copied once into the kernels' [N, K] weight layout.
template <typename TA>
py::array_t<int32_t> gemm(const char* fn, const py::array& a_obj, const py::array& b_obj,
                          const std::optional<std::string>& isa,
                          void (*kernel)(const TA*, int64_t, const int8_t*, int64_t, int32_t*,
                                         int64_t, int64_t, int64_t, int64_t, kernels::Isa)) {
  auto A = exact_array<TA, kRowMajor>(a_obj, fn, "A");
  auto B = exact_array<int8_t, kColMajor>(b_obj, fn, "B");
  if (A.ndim() != 2 || B.ndim() != 2)
    throw ShapeError(std::string("[") + fn + "] A and B must be 2-D, got " +
                     std::to_string(A.ndim()) + "-D and " + std::to_string(B.ndim()) + "-D");
  const int64_t M = A.shape(0), K = A.shape(1), N = B.shape(1);
  if (B.shape(0) != K)
    throw ShapeError(std::string("[") + fn + "] A is [" + std::to_string(M) + ", " +
                     std::to_string(K) + "] but B is [" + std::to_string(B.shape(0)) + ", " +
                     std::to_string(N) + "]");
  py::array_t<int32_t> C({M, N});
  const kernels::Isa path = isa_arg(isa);
  {
    py::gil_scoped_release nogil;
    kernel(A.data(), K, B.data(), K, C.mutable_data(), N, M, N, K, path);
  }
  return C;
}

}  // namespace

// f(data) with the scores as const int32_t* (an int32 array) or const float* (any other numeric
// array, converted): the two score types the top-k kernels take.
template <class F>
static auto with_scores(const py::array& s, const char* what, F&& f) {
  if (py::isinstance<py::array_t<int32_t>>(s))
    return f(py::array_t<int32_t, kRowMajor>::ensure(s).data());
  return f(numeric_array<float>(s, what).data());
}

// Sparse-attention kernels and the per-layer prefill attention (sparse_attention.h,
// prefill_attention.h), on numpy's head-major layout: q [H, T, hd], k/v [Hkv, L, hd].
static void init_topk(py::module_& ops) {
  ops.def(
      "topk_indices",
      [](const py::array& s, int64_t k) {
        if (s.ndim() != 1)
          throw ShapeError("[topk_indices] scores must be 1-D, got " + shape_str(s));
        py::array_t<int32_t> idx(s.shape(0));
        const int64_t n = with_scores(s, "[topk_indices] scores", [&](const auto* a) {
          std::vector<std::remove_const_t<std::remove_pointer_t<decltype(a)>>> buf;
          return kernels::topk_indices(a, s.shape(0), k, idx.mutable_data(), buf);
        });
        return idx[py::slice(0, n, 1)].cast<py::array_t<int32_t>>();
      },
      py::arg("scores"), py::arg("k"),
      "Indices (ascending) of the k largest scores (float32 or int32); ties: earlier index.");
  ops.def(
      "topk_rows",
      [](const py::array& s, const py::handle& visible, const py::handle& k) {
        if (s.ndim() != 2)
          throw ShapeError("[topk_rows] scores must be 2-D [rows, keys], got " + shape_str(s));
        const int64_t rows = s.shape(0), n = s.shape(1);
        const auto vis = numeric_array<int64_t>(visible, "[topk_rows] visible");
        const auto kk = numeric_array<int64_t>(k, "[topk_rows] k");
        if (vis.ndim() != 1 || vis.shape(0) != rows || kk.ndim() != 1 || kk.shape(0) != rows)
          throw ShapeError("[topk_rows] visible and k must be 1-D with one entry per row (" +
                           std::to_string(rows) + "), got " + shape_str(vis) + " and " +
                           shape_str(kk));
        for (int64_t i = 0; i < rows; ++i)
          if (vis.data()[i] < 0 || vis.data()[i] > n)
            throw InvalidArgument("[topk_rows] visible[" + std::to_string(i) +
                                  "] = " + std::to_string(vis.data()[i]) + " is outside [0, " +
                                  std::to_string(n) + "]");
        py::array_t<int64_t> offs(rows + 1);
        std::vector<int32_t> idx;
        with_scores(s, "[topk_rows] scores", [&](const auto* a) {
          kernels::TopkHint hint;  // carried from row to row, as a prefill block does
          auto* o = offs.mutable_data();
          o[0] = 0;
          for (int64_t i = 0; i < rows; ++i) {
            const int64_t m = vis.data()[i];
            idx.resize(static_cast<size_t>(o[i] + m));
            o[i + 1] =
                o[i] + kernels::topk_indices(a + i * n, m, kk.data()[i], idx.data() + o[i], hint);
          }
          idx.resize(static_cast<size_t>(o[rows]));
        });
        py::array_t<int32_t> out(static_cast<py::ssize_t>(idx.size()));
        std::copy(idx.begin(), idx.end(), out.mutable_data());
        return py::make_tuple(out, offs);
      },
      py::arg("scores"), py::arg("visible"), py::arg("k"),
      "Per row i the indices (ascending) of the k[i] largest of scores[i, :visible[i]], row after "
      "row as a prefill block ranks its rows: each row's band is predicted from the previous "
      "one's k-th value (the same result as topk_indices per row). Returns (indices of every "
      "row concatenated, offsets [rows + 1]).");
}

static void init_weightlet(py::module_& ops) {
  using kernels::WeightletTensor;
  auto unpack_isa = [](const std::optional<std::string>& isa) {
    return isa ? kernels::unpack_isa_from_name(*isa) : kernels::best_unpack_isa();
  };
  auto bytes_of = [](const py::handle& obj, const char* what) {
    const auto a = numeric_array<uint8_t>(obj, what);
    return std::vector<uint8_t>(a.data(), a.data() + a.size());
  };
  ops.def("supported_unpack_isas", [] {
    std::vector<std::string> out;
    for (auto i : kernels::supported_unpack_isas()) out.push_back(kernels::unpack_isa_name(i));
    return out;
  });
  ops.def("weightlet_parts", &kernels::weightlet_parts, py::arg("bits"),
          "Weightlet widths of a B-bit code, most significant first.");
  py::class_<WeightletTensor>(
      ops, "WeightletTensor",
      "EdgeFlow's packed per-channel-bit-width weights (seed 004 §4.2; format in weightlet.h).")
      .def_static(
          "pack",
          [bytes_of](const py::handle& q_obj, const py::handle& bits_obj, int64_t group) {
            const auto q = numeric_array<int8_t>(q_obj, "[WeightletTensor.pack] q");
            if (q.ndim() != 2)
              throw ShapeError("[WeightletTensor.pack] q must be 2-D [rows, cols], got " +
                               std::to_string(q.ndim()) + "-D");
            const auto bits = bytes_of(bits_obj, "[WeightletTensor.pack] bits");
            py::gil_scoped_release nogil;
            return WeightletTensor::pack(q.data(), q.shape(0), q.shape(1), bits, group);
          },
          py::arg("q"), py::arg("bits"), py::arg("group") = 128)
      .def(py::init([bytes_of](int64_t rows, int64_t cols, int64_t group, const py::handle& meta,
                               const py::handle& data) {
             return WeightletTensor(rows, cols, group, bytes_of(meta, "[WeightletTensor] metadata"),
                                    bytes_of(data, "[WeightletTensor] data"));
           }),
           py::arg("rows"), py::arg("cols"), py::arg("group"), py::arg("bit_metadata"),
           py::arg("data"), "From stored parts; FormatError if they disagree.")
      .def_property_readonly(
          "shape", [](const WeightletTensor& t) { return py::make_tuple(t.rows(), t.cols()); })
      .def_property_readonly("group", &WeightletTensor::group)
      .def_property_readonly("bytes", &WeightletTensor::bytes)
      .def_property_readonly("bits",
                             [](const WeightletTensor& t) {
                               const auto b = t.bit_widths();
                               py::array_t<uint8_t> out(static_cast<py::ssize_t>(b.size()));
                               std::copy(b.begin(), b.end(), out.mutable_data());
                               return out;
                             })
      .def_property_readonly("data",
                             [](const WeightletTensor& t) {
                               py::array_t<uint8_t> out(static_cast<py::ssize_t>(t.data().size()));
                               std::copy(t.data().begin(), t.data().end(), out.mutable_data());
                               return out;
                             })
      .def_property_readonly("bit_metadata",
                             [](const WeightletTensor& t) {
                               const auto& m = t.bit_metadata();
                               py::array_t<uint8_t> out(static_cast<py::ssize_t>(m.size()));
                               std::copy(m.begin(), m.end(), out.mutable_data());
                               return out;
                             })
      .def(
          "unpack",
          [unpack_isa](const WeightletTensor& t, const std::optional<std::string>& isa) {
            py::array_t<int8_t> out({t.rows(), t.cols()});
            const auto path = unpack_isa(isa);
            int8_t* dst = out.mutable_data();
            py::gil_scoped_release nogil;
            t.unpack(dst, path);
            return out;
          },
          py::arg("isa") = py::none(),
          "int8 [rows, cols] (isa: scalar, sse128, avx2; default best).")
      .def(
          "unpack_into",
          [unpack_isa](const WeightletTensor& t, py::array_t<int8_t, py::array::c_style> out,
                       const std::optional<std::string>& isa) {
            if (out.size() != t.rows() * t.cols())
              throw ShapeError("[WeightletTensor.unpack_into] out has " +
                               std::to_string(out.size()) + " elements, need " +
                               std::to_string(t.rows() * t.cols()));
            const auto path = unpack_isa(isa);
            int8_t* dst = out.mutable_data();
            py::gil_scoped_release nogil;
            t.unpack(dst, path);
          },
          py::arg("out"), py::arg("isa") = py::none(),
          "Unpacks into a preallocated int8 array (benchmarks: no allocation timed).")
      .def(
          "unpack_counted",
          [](const WeightletTensor& t) {
            py::array_t<int8_t> out({t.rows(), t.cols()});
            const auto n = t.unpack_counted(out.mutable_data());
            py::dict d;
            d["loads"] = n.loads;
            d["shifts"] = n.shifts;
            d["logic"] = n.logic;
            d["arith"] = n.arith;
            d["stores"] = n.stores;
            d["total"] = n.total();
            d["weights"] = n.weights;
            return py::make_tuple(out, d);
          },
          "(int8 [rows, cols], SIMD operation counts of the 128-bit path).");
}

static void init_hadamard(py::module_& ops) {
  using H = kernels::HadamardTransform;
  py::class_<H>(ops, "HadamardTransform",
                "The orthonormal Hadamard transform H_n / sqrt(n), H_n = H_m ⊗ H_(2^k) with H_m by "
                "Paley's constructions (hadamard.h): issue 39's rotations.")
      .def(py::init<int64_t>(), py::arg("n"))
      .def_property_readonly("size", &H::size)
      .def_property_readonly("base_order", &H::base_order)
      .def_property_readonly("construction", &H::construction)
      .def(
          "apply",
          [](const H& t, const py::handle& x_obj, bool transpose, const std::string& path) {
            if (path != "vector" && path != "scalar")
              throw InvalidArgument("[HadamardTransform] path must be vector or scalar, got " +
                                    path);
            auto x = numeric_array<float>(x_obj, "[HadamardTransform] x");
            if (x.ndim() < 1 || x.shape(x.ndim() - 1) != t.size())
              throw ShapeError("[HadamardTransform] x must end in " + std::to_string(t.size()) +
                               " values, got shape " + shape_str(x));
            py::array_t<float> y(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
            std::copy_n(x.data(), x.size(), y.mutable_data());
            const int64_t rows = x.size() / t.size();
            py::gil_scoped_release nogil;
            t.apply(y.mutable_data(), rows, t.size(), transpose,
                    path == "scalar" ? H::Path::Scalar : H::Path::Vector);
            return y;
          },
          py::arg("x"), py::arg("transpose") = false, py::arg("path") = "vector",
          "H x / sqrt(n) along x's last axis (transpose: the inverse); path scalar is the "
          "reference loops, vector the build's SIMD (the same bits).")
      .def(
          "matrix",
          [](const H& t) {
            py::array_t<float> M({t.size(), t.size()});
            const auto m = t.matrix();
            std::copy(m.begin(), m.end(), M.mutable_data());
            return M;
          },
          "H / sqrt(n) as a dense [n, n] array.");
  ops.def(
      "rotation_matrix",
      [](const std::string& rotate, int64_t d, uint64_t seed) {
        const quant::ResidualRotation rot(quant::rotation_from_name(rotate), d, seed);
        py::array_t<float> Q({d, d});
        const auto q = rot.matrix();
        std::copy(q.begin(), q.end(), Q.mutable_data());
        return Q;
      },
      py::arg("rotate"), py::arg("d"), py::arg("seed") = 0,
      "The orthogonal Q [d, d] of Model.rotated(rotate, seed) at d = d_model: the residual stream "
      "x becomes x Q.");
}

void init_kernels(py::module_& m) {
  py::module_ ops = m.def_submodule("ops", "Exact kernels (INT8 GEMM, weightlet unpacking).");
  init_weightlet(ops);
  init_topk(ops);
  init_hadamard(ops);
  ops.def(
      "max_exact_k",
      [] {
        py::dict d;
        d["s8s8"] = kernels::kMaxExactKS8S8;
        d["u8s8"] = kernels::kMaxExactKU8S8;
        return d;
      },
      "Largest K each GEMM accepts: every result then fits in int32 (gemm_s8.h).");
  ops.def(
      "isa", [] { return kernels::isa_name(kernels::best_isa()); },
      "The INT8 GEMM path used by default on this CPU: amx-int8, avx512-vnni, avx2, i8mm, dotprod, "
      "neon or scalar.");
  ops.def("supported_isas", [] {
    std::vector<std::string> out;
    for (auto i : kernels::supported_isas()) out.push_back(kernels::isa_name(i));
    return out;
  });
  py::class_<kernels::PackedWeightsS8>(
      ops, "PackedWeightsS8",
      "int8 weights B [K, N] prepared once for many GEMMs (a static graph's weights).")
      .def(py::init([](const py::array& b_obj) {
             auto B = exact_array<int8_t, kColMajor>(b_obj, "PackedWeightsS8", "B");
             if (B.ndim() != 2)
               throw ShapeError("[PackedWeightsS8] B must be 2-D [K, N], got " +
                                std::to_string(B.ndim()) + "-D");
             return std::make_unique<kernels::PackedWeightsS8>(B.data(), B.shape(0), B.shape(1),
                                                               B.shape(0));
           }),
           py::arg("B"))
      .def_property_readonly(
          "shape", [](const kernels::PackedWeightsS8& w) { return py::make_tuple(w.k(), w.n()); })
      .def_property_readonly("bytes", &kernels::PackedWeightsS8::bytes);
  ops.def(
      "gemm_s8s8s32",
      [](const py::array& A, const kernels::PackedWeightsS8& W,
         const std::optional<std::string>& isa, std::optional<int64_t> n_cols) {
        auto a = exact_array<int8_t, kRowMajor>(A, "gemm_s8s8s32", "A");
        if (a.ndim() != 2 || a.shape(1) != W.k())
          throw ShapeError("[gemm_s8s8s32] A must be [M, " + std::to_string(W.k()) +
                           "] for these weights, got " + std::to_string(a.ndim()) + "-D with " +
                           std::to_string(a.ndim() == 2 ? a.shape(1) : -1) + " columns");
        if (n_cols && (*n_cols < 0 || *n_cols > W.n()))
          throw InvalidArgument("[gemm_s8s8s32] n_cols must be in [0, " + std::to_string(W.n()) +
                                "], got " + std::to_string(*n_cols));
        const int64_t M = a.shape(0), N = n_cols.value_or(W.n());
        py::array_t<int32_t> C({M, N});
        const kernels::Isa path = isa_arg(isa);
        py::gil_scoped_release nogil;
        if (n_cols)
          kernels::gemm_s8s8s32_packed_cols(a.data(), W.k(), W, C.mutable_data(), N, M, N, path);
        else kernels::gemm_s8s8s32_packed(a.data(), W.k(), W, C.mutable_data(), N, M, path);
        return C;
      },
      py::arg("A"), py::arg("B"), py::arg("isa") = py::none(), py::arg("n_cols") = py::none(),
      "With B = PackedWeightsS8(B): n_cols computes only C's first n_cols columns (a causal "
      "block's keys against keys packed once, as shadow-attn's estimate does).");
  ops.def(
      "gemm_s8s8s32",
      [](const py::array& A, const py::array& B, const std::optional<std::string>& isa) {
        return gemm<int8_t>("gemm_s8s8s32", A, B, isa, &kernels::gemm_s8s8s32);
      },
      py::arg("A"), py::arg("B"), py::arg("isa") = py::none(),
      "int32 C = A @ B for int8 A [M, K] and int8 B [K, N], exact (int32 accumulation; "
      "K <= max_exact_k()['s8s8'], ShapeError beyond).");
  py::class_<kernels::PackedGroupedWeightsS8>(
      ops, "PackedGroupedWeightsS8",
      "Per-group int8 weights B [K, N] with scales [N, K / group_size] (llama.cpp's Q8_0 / "
      "Q4_0 weight blocks), prepared once for gemm_grouped_s8s8f32.")
      .def(py::init([](const py::array& b_obj, const py::handle& scales_obj, int64_t group_size) {
             auto B = exact_array<int8_t, kColMajor>(b_obj, "PackedGroupedWeightsS8", "B");
             const auto sw = numeric_array<float>(scales_obj, "[PackedGroupedWeightsS8] scales");
             if (B.ndim() != 2 || group_size <= 0 || B.shape(0) % group_size != 0)
               throw ShapeError(
                   "[PackedGroupedWeightsS8] B must be 2-D [K, N] with K divisible "
                   "by group_size=" +
                   std::to_string(group_size) + ", got " +
                   shape_str({B.shape(), B.shape() + B.ndim()}));
             const int64_t K = B.shape(0), N = B.shape(1);
             if (sw.ndim() != 2 || sw.shape(0) != N || sw.shape(1) != K / group_size)
               throw ShapeError("[PackedGroupedWeightsS8] scales must be [" + std::to_string(N) +
                                ", " + std::to_string(K / group_size) + "], got " +
                                shape_str({sw.shape(), sw.shape() + sw.ndim()}));
             return std::make_unique<kernels::PackedGroupedWeightsS8>(B.data(), K, sw.data(), N, K,
                                                                      group_size);
           }),
           py::arg("B"), py::arg("scales"), py::arg("group_size"))
      .def_property_readonly(
          "shape",
          [](const kernels::PackedGroupedWeightsS8& w) { return py::make_tuple(w.k(), w.n()); })
      .def_property_readonly("group_size", &kernels::PackedGroupedWeightsS8::group)
      .def_property_readonly("bytes", &kernels::PackedGroupedWeightsS8::bytes);
  ops.def(
      "gemm_grouped_s8s8f32",
      [](const py::array& A, const py::handle& a_scales, const kernels::PackedGroupedWeightsS8& W,
         const std::optional<std::string>& isa) {
        auto a = exact_array<int8_t, kRowMajor>(A, "gemm_grouped_s8s8f32", "A");
        const auto sa = numeric_array<float>(a_scales, "[gemm_grouped_s8s8f32] a_scales");
        const int64_t M = a.ndim() == 2 ? a.shape(0) : -1, G = W.groups();
        if (a.ndim() != 2 || a.shape(1) != W.k() || sa.ndim() != 2 || sa.shape(0) != M ||
            sa.shape(1) != G)
          throw ShapeError("[gemm_grouped_s8s8f32] need A [M, " + std::to_string(W.k()) +
                           "] and a_scales [M, " + std::to_string(G) + "], got " +
                           shape_str({a.shape(), a.shape() + a.ndim()}) + " and " +
                           shape_str({sa.shape(), sa.shape() + sa.ndim()}));
        const int64_t N = W.n();
        py::array_t<float> C({M, N});
        const kernels::Isa path = isa_arg(isa);
        py::gil_scoped_release nogil;
        kernels::gemm_grouped_s8s8f32(a.data(), W.k(), sa.data(), G, W, C.mutable_data(), N, M, 0,
                                      N, path);
        return C;
      },
      py::arg("A"), py::arg("a_scales"), py::arg("W"), py::arg("isa") = py::none(),
      "float32 C [M, N] = sum over groups g of a_scales[:, g] * w_scales[:, g] * (A_g @ B_g), "
      "each group's dot exact in int32, groups summed in order with one fma each (gemm_s8.h): "
      "llama.cpp's Q8_0 x Q8_0 dot.");
  ops.def(
      "linear_f32",
      [](const py::handle& x_obj, const py::handle& W_obj) {
        const auto x = numeric_array<float>(x_obj, "[linear_f32] x");
        const auto W = numeric_array<float>(W_obj, "[linear_f32] W");
        if (x.ndim() != 2 || W.ndim() != 2 || x.shape(1) != W.shape(1))
          throw ShapeError("[linear_f32] need x [T, in] and W [out, in], got " +
                           shape_str({x.shape(), x.shape() + x.ndim()}) + " and " +
                           shape_str({W.shape(), W.shape() + W.ndim()}));
        const int64_t T = x.shape(0), in = x.shape(1), out = W.shape(0);
        py::array_t<float> y({T, out});
        py::gil_scoped_release nogil;
        kernels::linear(x.data(), T, in, in, W.data(), out, nullptr, y.mutable_data(), out);
        return y;
      },
      py::arg("x"), py::arg("W"),
      "y = x @ W.T in fp32 with the engine's OpenBLAS sgemm (the peer for INT8 benchmarks).");
  ops.def(
      "gemm_u8s8s32",
      [](const py::array& A, const py::array& B, const std::optional<std::string>& isa) {
        return gemm<uint8_t>("gemm_u8s8s32", A, B, isa, &kernels::gemm_u8s8s32);
      },
      py::arg("A"), py::arg("B"), py::arg("isa") = py::none(),
      "int32 C = A @ B for uint8 A [M, K] and int8 B [K, N] (VNNI's native form; "
      "K <= max_exact_k()['u8s8'], ShapeError beyond).");
}

}  // namespace socllm::py_bind
