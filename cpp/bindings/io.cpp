// Mirrors cpp/io/gguf.h (GGUF reader, dequantization; with bitwidth.h, K-quant
// blocks to INT8 rows).
#include <pybind11/stl.h>

#include "common.h"
#include "io/gguf.h"
#include "io/model_store.h"
#include "quant/bitwidth.h"

namespace socllm::py_bind {

namespace {
uint32_t type_id(const py::handle& t) {
  if (py::isinstance<py::int_>(t)) {
    const long long v = PyLong_AsLongLong(t.ptr());
    if (PyErr_Occurred()) PyErr_Clear();
    else if (v >= 0 && v <= UINT32_MAX) return static_cast<uint32_t>(v);
    throw InvalidArgument("[dequantize] ggml type id " + std::string(py::str(t)) +
                          " is out of range");
  }
  std::string name = py::str(t);
  for (uint32_t id = 0; id < 64; ++id)
    if (ggml_type_name(id) == name) return id;
  throw InvalidArgument("[dequantize] unknown ggml type '" + name + "'");
}

py::dict tensor_info_dict(const GgufTensorInfo& t) {
  py::dict d;
  d["name"] = str_from_file(t.name);
  d["shape"] = py::tuple(py::cast(t.shape));
  d["type"] = ggml_type_name(t.type);
  d["offset"] = t.offset;
  d["n_bytes"] = t.n_bytes;
  return d;
}
}  // namespace

void init_io(py::module_& m) {
  py::class_<GgufFile>(m, "GgufFile", "A GGUF file: metadata, tensor index, dequantization.")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def_property_readonly("path", &GgufFile::path)
      .def_property_readonly("version", &GgufFile::version)
      .def_property_readonly("alignment", &GgufFile::alignment)
      .def_property_readonly("data_offset", &GgufFile::data_offset)
      .def_property_readonly(
          "metadata", [](const GgufFile& f) { return json_to_py(f.metadata()); },
          "GGUF key -> value (arrays as lists).")
      .def("tensor_names",
           [](const GgufFile& f) {
             py::list names;
             for (const auto& t : f.tensors()) names.append(str_from_file(t.name));
             return names;
           })
      .def(
          "has_tensor",
          [](const GgufFile& f, const py::handle& n) { return f.has_tensor(str_to_file(n)); },
          py::arg("name"))
      .def(
          "tensor_info",
          [](const GgufFile& f, const py::handle& n) {
            return tensor_info_dict(f.tensor(str_to_file(n)));
          },
          py::arg("name"), "dict(name, shape (numpy order), type, offset, n_bytes)")
      .def(
          "raw",
          [](const GgufFile& f, const py::handle& n) {
            auto r = f.raw(str_to_file(n));
            return py::bytes(reinterpret_cast<const char*>(r.data()), r.size());
          },
          py::arg("name"))
      .def(
          "dequantize",
          [](const GgufFile& f, const py::handle& name) {
            const std::string n = str_to_file(name);
            TensorF32 t;
            {
              py::gil_scoped_release nogil;
              t = f.dequantize(n);
            }
            return to_numpy(std::move(t));
          },
          py::arg("name"), "fp32 numpy array in numpy shape order (a copy owned by the array).");

  m.def("ggml_type_name", &ggml_type_name, py::arg("type_id"));
  m.def("ggml_supported_types", &ggml_supported_types);
  m.def(
      "dequantize",
      [](const py::handle& type, const py::object& data, int64_t n) {
        const uint32_t id = type_id(type);
        // Raw bytes are read as one contiguous block: numpy views (strided, reversed) are
        // made contiguous first; bytes-like objects are contiguous already.
        py::module_ np = py::module_::import("numpy");
        py::array arr = py::isinstance<py::array>(data) ? np.attr("ascontiguousarray")(data)
                                                        : np.attr("frombuffer")(data, "uint8");
        py::buffer_info b = arr.request();
        const int64_t need = n / ggml_block_elems(id) * ggml_block_bytes(id);
        if (n < 0 || n % ggml_block_elems(id) != 0)
          throw ShapeError("[dequantize] " + std::to_string(n) + " elements is not a multiple of " +
                           ggml_type_name(id) + "'s block of " +
                           std::to_string(ggml_block_elems(id)));
        if (b.size * b.itemsize != need)
          throw ShapeError("[dequantize] " + std::to_string(n) + " elements of " +
                           ggml_type_name(id) + " need " + std::to_string(need) + " bytes, got " +
                           std::to_string(b.size * b.itemsize));
        TensorF32 out({n});
        dequantize_row(id, static_cast<const uint8_t*>(b.ptr), out.ptr(), n);
        return to_numpy(std::move(out));
      },
      py::arg("type"), py::arg("data"), py::arg("n"),
      "Dequantize n elements of raw ggml block data (bytes or uint8 array) to fp32.");
  m.def(
      "dequantize_to_int8_rows",
      [](const py::handle& type, const py::handle& data_obj, int64_t rows, int64_t cols,
         py::array_t<int8_t, py::array::c_style> q, py::array_t<float, py::array::c_style> scales) {
        // What a K-quant file costs to turn into an NPU's INT8 rows: each row dequantized to
        // fp32, then quantized per row at 8 bits (sub-block scales do not survive otherwise).
        const uint32_t id = type_id(type);
        const auto data = numeric_array<uint8_t>(data_obj, "[dequantize_to_int8_rows] data");
        const int64_t row_bytes = cols / ggml_block_elems(id) * ggml_block_bytes(id);
        if (rows < 0 || cols % ggml_block_elems(id) != 0 || data.size() != rows * row_bytes ||
            q.size() != rows * cols || scales.size() != rows)
          throw ShapeError("[dequantize_to_int8_rows] need cols a multiple of " +
                           std::to_string(ggml_block_elems(id)) + ", data of rows * " +
                           std::to_string(row_bytes) + " bytes, q [rows, cols], scales [rows]");
        const uint8_t* src = data.data();
        int8_t* dst = q.mutable_data();
        float* sc = scales.mutable_data();
        py::gil_scoped_release nogil;
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t i = 0; i < rows; ++i) {
          dequantize_row(id, src + i * row_bytes, row.data(), cols);
          sc[i] = quant::quantize_row_bits(row.data(), cols, 8, dst + i * cols);
        }
      },
      py::arg("type"), py::arg("data"), py::arg("rows"), py::arg("cols"), py::arg("q"),
      py::arg("scales"),
      "K-quant (any dequantizable ggml type) rows to per-row int8 into q [rows, cols] and "
      "scales [rows], single-threaded (the K-quant peer of scripts/bench_unpack.py).");
  m.attr("H5_ATTRIBUTES_CHECKSUM") = kAttributesChecksum;
  m.def(
      "seal_h5_attributes", [](const std::string& path) { seal_attributes(path); }, py::arg("path"),
      "Adds the attributes' CRC-32 (H5_ATTRIBUTES_CHECKSUM) to every object with attributes of a "
      "closed HDF5 file (docs/MODEL_FORMAT.md, Integrity).");
  m.def(
      "verify_h5_attributes",
      [](const std::string& path, bool required) {
        return H5File(path).verify_attributes(required);
      },
      py::arg("path"), py::arg("required") = true,
      "Checks every object's attributes against their CRC-32; FormatError naming the object and "
      "the file on a mismatch, or (required) on attributes without one. Returns the number of "
      "objects checked.");
  m.def(
      "h5_canonical_attributes",
      [](const std::string& path, const std::string& object_path) {
        return py::bytes(H5File(path).canonical_attributes(object_path));
      },
      py::arg("path"), py::arg("object_path"),
      "The bytes an object's attribute CRC-32 covers (for checking against another "
      "implementation).");
}

}  // namespace socllm::py_bind
