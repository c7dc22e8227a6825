// Mirrors cpp/include/socllm/gemm_s8.h as socllm._core.ops (numpy semantics: C = A @ B).
#include <pybind11/stl.h>

#include "common.h"
#include "socllm/gemm_s8.h"
#include "socllm/kernels.h"

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

void init_ops(py::module_& m) {
  py::module_ ops = m.def_submodule("ops", "Exact kernels (INT8 GEMM).");
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
      "The INT8 GEMM path used by default on this CPU: avx512-vnni, avx2 or scalar.");
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
         const std::optional<std::string>& isa) {
        auto a = exact_array<int8_t, kRowMajor>(A, "gemm_s8s8s32", "A");
        if (a.ndim() != 2 || a.shape(1) != W.k())
          throw ShapeError("[gemm_s8s8s32] A must be [M, " + std::to_string(W.k()) +
                           "] for these weights, got " + std::to_string(a.ndim()) + "-D with " +
                           std::to_string(a.ndim() == 2 ? a.shape(1) : -1) + " columns");
        const int64_t M = a.shape(0), N = W.n();
        py::array_t<int32_t> C({M, N});
        const kernels::Isa path = isa_arg(isa);
        py::gil_scoped_release nogil;
        kernels::gemm_s8s8s32_packed(a.data(), W.k(), W, C.mutable_data(), N, M, path);
        return C;
      },
      py::arg("A"), py::arg("B"), py::arg("isa") = py::none());
  ops.def(
      "gemm_s8s8s32",
      [](const py::array& A, const py::array& B, const std::optional<std::string>& isa) {
        return gemm<int8_t>("gemm_s8s8s32", A, B, isa, &kernels::gemm_s8s8s32);
      },
      py::arg("A"), py::arg("B"), py::arg("isa") = py::none(),
      "int32 C = A @ B for int8 A [M, K] and int8 B [K, N], exact (int32 accumulation; "
      "K <= max_exact_k()['s8s8'], ShapeError beyond).");
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
