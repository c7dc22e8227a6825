#include "socllm/model_store.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <mutex>

namespace socllm {
namespace {

// HDF5 prints its error stack to stderr by default; socllm reports errors as exceptions.
void silence_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

// Closes an HDF5 handle at scope exit.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~Handle() {
    if (id >= 0) close(id);
  }
};

}  // namespace

H5File::H5File(const std::string& path) : path_(path) {
  silence_hdf5();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw MissingFile("[H5File] no such file '" + path + "'");
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw FormatError("[H5File] '" + path + "' is not an HDF5 file");
  id_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id_ < 0)
    throw FormatError("[H5File] cannot open '" + path + "' (truncated or corrupt HDF5 file)");
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

bool H5File::has(const std::string& object_path) const {
  // H5Lexists needs every intermediate link to exist, so walk the path.
  if (object_path == "/") return true;
  std::string prefix;
  size_t start = object_path[0] == '/' ? 1 : 0;
  while (start <= object_path.size()) {
    size_t end = object_path.find('/', start);
    if (end == std::string::npos) end = object_path.size();
    prefix += "/" + object_path.substr(start, end - start);
    if (H5Lexists(id_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    start = end + 1;
  }
  return true;
}

bool H5File::has_attr(const std::string& object_path, const std::string& name) const {
  return has(object_path) &&
         H5Aexists_by_name(id_, object_path.c_str(), name.c_str(), H5P_DEFAULT) > 0;
}

namespace {
hid_t open_attr(int64_t file, const std::string& path, const std::string& obj,
                const std::string& name) {
  hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0)
    throw FormatError("[H5File] '" + path + "' has no attribute '" + name + "' on '" + obj + "'");
  return a;
}
}  // namespace

int64_t H5File::attr_int(const std::string& obj, const std::string& name) const {
  Handle a{open_attr(id_, path_, obj, name), H5Aclose};
  Handle t{H5Aget_type(a.id), H5Tclose};
  H5T_class_t cls = H5Tget_class(t.id);
  if (cls != H5T_INTEGER && cls != H5T_ENUM)  // h5py stores bools as an enum
    throw FormatError("[H5File] attribute '" + obj + "@" + name + "' in '" + path_ +
                      "' is not an integer");
  int64_t v = 0;
  if (H5Aread(a.id, H5T_NATIVE_INT64, &v) < 0)
    throw FormatError("[H5File] cannot read attribute '" + obj + "@" + name + "'");
  return v;
}

double H5File::attr_float(const std::string& obj, const std::string& name) const {
  Handle a{open_attr(id_, path_, obj, name), H5Aclose};
  double v = 0;
  if (H5Aread(a.id, H5T_NATIVE_DOUBLE, &v) < 0)
    throw FormatError("[H5File] attribute '" + obj + "@" + name + "' in '" + path_ +
                      "' is not a number");
  return v;
}

std::string H5File::attr_str(const std::string& obj, const std::string& name) const {
  Handle a{open_attr(id_, path_, obj, name), H5Aclose};
  Handle t{H5Aget_type(a.id), H5Tclose};
  if (H5Tget_class(t.id) != H5T_STRING)
    throw FormatError("[H5File] attribute '" + obj + "@" + name + "' in '" + path_ +
                      "' is not a string");
  if (H5Tis_variable_str(t.id) > 0) {
    Handle mem{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(mem.id, H5T_VARIABLE);
    H5Tset_cset(mem.id, H5Tget_cset(t.id));
    char* s = nullptr;
    if (H5Aread(a.id, mem.id, &s) < 0 || !s)
      throw FormatError("[H5File] cannot read attribute '" + obj + "@" + name + "'");
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  size_t n = H5Tget_size(t.id);
  std::string out(n, '\0');
  if (H5Aread(a.id, t.id, out.data()) < 0)
    throw FormatError("[H5File] cannot read attribute '" + obj + "@" + name + "'");
  out.resize(out.find('\0') == std::string::npos ? n : out.find('\0'));
  return out;
}

TensorF32 H5File::read_f32(const std::string& dataset_path) const {
  if (!has(dataset_path))
    throw FormatError("[H5File] '" + path_ + "' has no dataset '" + dataset_path + "'");
  Handle d{H5Dopen2(id_, dataset_path.c_str(), H5P_DEFAULT), H5Dclose};
  if (d.id < 0) throw FormatError("[H5File] '" + dataset_path + "' in '" + path_ + "' is not a dataset");
  Handle sp{H5Dget_space(d.id), H5Sclose};
  int nd = H5Sget_simple_extent_ndims(sp.id);
  if (nd < 0) throw FormatError("[H5File] bad dataspace for '" + dataset_path + "'");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(sp.id, dims.data(), nullptr);
  std::vector<int64_t> shape(dims.begin(), dims.end());
  TensorF32 out(shape);
  if (out.numel() > 0 && H5Dread(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.ptr()) < 0)
    throw FormatError("[H5File] cannot read dataset '" + dataset_path + "' from '" + path_ +
                      "' (truncated or corrupt)");
  return out;
}

}  // namespace socllm
