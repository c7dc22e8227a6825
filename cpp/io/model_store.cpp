#include "io/model_store.h"

#include <hdf5.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>

namespace socllm {
namespace {

// HDF5 prints its error stack to stderr by default; socllm reports errors as exceptions.
void silence_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

// Bounds on what one attribute may claim before it is read (socllm writes scalars and short
// strings; a tokenizer's JSON is a dataset).
constexpr size_t kMaxStringAttrBytes = size_t{1} << 20;
constexpr hssize_t kMaxArrayAttrElements = hssize_t{1} << 20;

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
// Opens an attribute that must hold one value: an array-valued attribute would overflow the
// scalar it is read into.
hid_t open_attr(int64_t file, const std::string& path, const std::string& obj,
                const std::string& name) {
  hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0)
    throw FormatError("[H5File] '" + path + "' has no attribute '" + name + "' on '" + obj + "'");
  hid_t sp = H5Aget_space(a);
  const hssize_t n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
  if (sp >= 0) H5Sclose(sp);
  if (n != 1) {
    H5Aclose(a);
    throw FormatError("[H5File] attribute '" + obj + "@" + name + "' in '" + path +
                      "' must hold one value, holds " + std::to_string(n));
  }
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
  Handle t{H5Aget_type(a.id), H5Tclose};
  const H5T_class_t cls = H5Tget_class(t.id);
  if (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_ENUM)
    throw FormatError("[H5File] attribute '" + obj + "@" + name + "' in '" + path_ +
                      "' is not a number");
  double v = 0;
  if (H5Aread(a.id, H5T_NATIVE_DOUBLE, &v) < 0)
    throw FormatError("[H5File] attribute '" + obj + "@" + name + "' in '" + path_ +
                      "' is not a number");
  return v;
}

namespace {
// A string attribute's bytes (variable length, or fixed and NUL-padded). `where` names it in
// errors.
std::string read_string_attr(hid_t a, hid_t t, const std::string& where) {
  if (H5Tis_variable_str(t) > 0) {
    Handle mem{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(mem.id, H5T_VARIABLE);
    H5Tset_cset(mem.id, H5Tget_cset(t));
    char* s = nullptr;
    if (H5Aread(a, mem.id, &s) < 0 || !s) throw FormatError("[H5File] cannot read " + where);
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(t);
  if (n > kMaxStringAttrBytes)
    throw FormatError("[H5File] " + where + " is a string of " + std::to_string(n) + " bytes");
  std::string out(n, '\0');
  if (H5Aread(a, t, out.data()) < 0) throw FormatError("[H5File] cannot read " + where);
  out.resize(out.find('\0') == std::string::npos ? n : out.find('\0'));
  return out;
}
}  // namespace

std::string H5File::attr_str(const std::string& obj, const std::string& name) const {
  Handle a{open_attr(id_, path_, obj, name), H5Aclose};
  Handle t{H5Aget_type(a.id), H5Tclose};
  const std::string where = "attribute '" + obj + "@" + name + "' in '" + path_ + "'";
  if (H5Tget_class(t.id) != H5T_STRING) throw FormatError("[H5File] " + where + " is not a string");
  return read_string_attr(a.id, t.id, where);
}

std::vector<int64_t> H5File::shape(const std::string& dataset_path) const {
  if (!has(dataset_path))
    throw FormatError("[H5File] '" + path_ + "' has no dataset '" + dataset_path + "'");
  Handle d{H5Dopen2(id_, dataset_path.c_str(), H5P_DEFAULT), H5Dclose};
  if (d.id < 0)
    throw FormatError("[H5File] '" + dataset_path + "' in '" + path_ + "' is not a dataset");
  Handle sp{H5Dget_space(d.id), H5Sclose};
  int nd = H5Sget_simple_extent_ndims(sp.id);
  if (nd < 0 || nd > 8) throw FormatError("[H5File] bad dataspace for '" + dataset_path + "'");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(sp.id, dims.data(), nullptr);
  // The data must fit in the file: bounds every allocation by the file's size (gzip aside,
  // which HDF5 checks when reading).
  double n = 1;
  for (hsize_t x : dims) n *= static_cast<double>(x);
  struct stat st {};
  ::stat(path_.c_str(), &st);
  // Only a compressing filter lets the data outgrow the file; Fletcher-32 only checks it.
  Handle plist{H5Dget_create_plist(d.id), H5Pclose};
  bool compressed = false;
  const int n_filters = plist.id >= 0 ? H5Pget_nfilters(plist.id) : 0;
  for (int i = 0; i < n_filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t n_values = 0;
    compressed |= H5Pget_filter2(plist.id, static_cast<unsigned>(i), &flags, &n_values, nullptr, 0,
                                 nullptr, &config) != H5Z_FILTER_FLETCHER32;
  }
  if (!compressed && n > static_cast<double>(st.st_size))
    throw FormatError("[H5File] dataset '" + dataset_path + "' in '" + path_ + "' claims " +
                      std::to_string(static_cast<int64_t>(n)) + " values in a file of " +
                      std::to_string(st.st_size) + " bytes");
  if (n > 4e9)
    throw FormatError("[H5File] dataset '" + dataset_path + "' in '" + path_ + "' is too large (" +
                      std::to_string(static_cast<int64_t>(n)) + " values)");
  return {dims.begin(), dims.end()};
}

std::vector<int64_t> H5File::read_i64(const std::string& dataset_path) const {
  const auto sh = shape(dataset_path);
  Handle d{H5Dopen2(id_, dataset_path.c_str(), H5P_DEFAULT), H5Dclose};
  Handle t{H5Dget_type(d.id), H5Tclose};
  const H5T_class_t cls = H5Tget_class(t.id);
  if (cls != H5T_INTEGER && cls != H5T_ENUM)
    throw FormatError("[H5File] dataset '" + dataset_path + "' in '" + path_ + "' is not integer");
  int64_t n = 1;
  for (int64_t x : sh) n *= x;
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (n > 0 && H5Dread(d.id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw FormatError("[H5File] cannot read dataset '" + dataset_path + "' from '" + path_ +
                      "' (checksum mismatch, truncated or corrupt)");
  return out;
}

std::vector<uint8_t> H5File::read_bytes(const std::string& dataset_path,
                                        int64_t expected_elems) const {
  const auto sh = shape(dataset_path);
  Handle d{H5Dopen2(id_, dataset_path.c_str(), H5P_DEFAULT), H5Dclose};
  Handle t{H5Dget_type(d.id), H5Tclose};
  if (H5Tget_class(t.id) != H5T_INTEGER || H5Tget_size(t.id) != 1)
    throw FormatError("[H5File] dataset '" + dataset_path + "' in '" + path_ +
                      "' is not 8-bit integer data");
  int64_t n = 1;
  for (int64_t x : sh) n *= x;
  if (n != expected_elems)
    throw FormatError("[H5File] dataset '" + dataset_path + "' in '" + path_ + "' holds " +
                      std::to_string(n) + " bytes, expected " + std::to_string(expected_elems));
  std::vector<uint8_t> out(static_cast<size_t>(n));
  const hid_t mem = H5Tget_sign(t.id) == H5T_SGN_2 ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8;
  if (n > 0 && H5Dread(d.id, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw FormatError("[H5File] cannot read dataset '" + dataset_path + "' from '" + path_ +
                      "' (checksum mismatch, truncated or corrupt)");
  return out;
}

namespace {
// An object's attribute names, sorted bytewise.
std::vector<std::string> attribute_names(hid_t obj, const std::string& where) {
  std::vector<std::string> out;
  hsize_t idx = 0;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  if (H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &out) < 0)
    throw FormatError("[H5File] cannot read the attributes of " + where);
  std::sort(out.begin(), out.end());
  return out;
}

// Every object reached by a hard link, "/" first, then sorted by path.
std::vector<std::string> object_paths(hid_t file, const std::string& file_path) {
  std::vector<std::string> out;
  auto collect = [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    if (info->type == H5L_TYPE_HARD)
      static_cast<std::vector<std::string>*>(data)->push_back("/" + std::string(name));
    return 0;
  };
  if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect, &out) < 0)
    throw FormatError("[H5File] cannot list the objects of '" + file_path + "'");
  std::sort(out.begin(), out.end());
  out.insert(out.begin(), "/");
  return out;
}

// One attribute's canonical value (docs/MODEL_FORMAT.md, "Integrity"): "s:" and the string's
// bytes; "i:" and decimal integers (enums by value); "f:" and the 16 hex digits of each value's
// IEEE binary64 bits; array elements joined by ','.
std::string canonical_value(hid_t obj, const std::string& name, const std::string& where) {
  Handle a{H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose};
  if (a.id < 0) throw FormatError("[H5File] cannot open " + where);
  Handle t{H5Aget_type(a.id), H5Tclose};
  Handle sp{H5Aget_space(a.id), H5Sclose};
  const hssize_t n = sp.id >= 0 ? H5Sget_simple_extent_npoints(sp.id) : -1;
  if (t.id < 0 || n < 0 || n > kMaxArrayAttrElements)
    throw FormatError("[H5File] " + where + " has an unreadable type or " + std::to_string(n) +
                      " elements");
  const size_t count = static_cast<size_t>(n);
  std::string out;
  const auto join = [&](auto&& values, auto&& format) {
    for (size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + format(values[i]);
  };
  switch (H5Tget_class(t.id)) {
    case H5T_STRING:
      if (n != 1)
        throw FormatError("[H5File] " + where + " is an array of strings, which socllm writes " +
                          "nowhere and cannot checksum");
      return "s:" + read_string_attr(a.id, t.id, where);
    case H5T_INTEGER:
    case H5T_ENUM:
      out = "i:";
      if (H5Tget_class(t.id) == H5T_INTEGER && H5Tget_sign(t.id) == H5T_SGN_NONE) {
        std::vector<uint64_t> v(count);
        if (count && H5Aread(a.id, H5T_NATIVE_UINT64, v.data()) < 0)
          throw FormatError("[H5File] cannot read " + where);
        join(v, [](uint64_t x) { return std::to_string(x); });
      } else {
        std::vector<int64_t> v(count);
        if (count && H5Aread(a.id, H5T_NATIVE_INT64, v.data()) < 0)
          throw FormatError("[H5File] cannot read " + where);
        join(v, [](int64_t x) { return std::to_string(x); });
      }
      return out;
    case H5T_FLOAT: {
      out = "f:";
      std::vector<double> v(count);
      if (count && H5Aread(a.id, H5T_NATIVE_DOUBLE, v.data()) < 0)
        throw FormatError("[H5File] cannot read " + where);
      join(v, [](double x) {
        uint64_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(bits));
        return std::string(hex);
      });
      return out;
    }
    default:
      throw FormatError("[H5File] " + where + " has a type socllm cannot checksum (not a " +
                        "string, integer or float)");
  }
}

// The object's path, then "name\0value\n" per attribute in name order, the checksum left out;
// empty if the object has no other attribute.
std::string canonical_text(hid_t obj, const std::string& object_path,
                           const std::vector<std::string>& names, const std::string& file_path) {
  std::string text;
  for (const auto& name : names) {
    if (name == kAttributesChecksum) continue;
    text += name + '\0' +
            canonical_value(obj, name,
                            "attribute '" + object_path + "@" + name + "' in '" + file_path + "'") +
            '\n';
  }
  return text.empty() ? text : object_path + '\n' + text;
}

uint32_t crc32_of(const std::string& text) {
  return static_cast<uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
}

// Writes kAttributesChecksum on every object of an open, writable file that has attributes.
void seal_open_file(hid_t file, const std::string& file_path) {
  for (const auto& p : object_paths(file, file_path)) {
    Handle o{H5Oopen(file, p.c_str(), H5P_DEFAULT), H5Oclose};
    const std::string where = "'" + p + "' in '" + file_path + "'";
    if (o.id < 0) throw InvalidArgument("[seal_attributes] cannot open " + where);
    const std::string text = canonical_text(o.id, p, attribute_names(o.id, where), file_path);
    if (text.empty()) continue;
    if (H5Aexists(o.id, kAttributesChecksum) > 0) H5Adelete(o.id, kAttributesChecksum);
    const int64_t crc = crc32_of(text);
    Handle sp{H5Screate(H5S_SCALAR), H5Sclose};
    Handle a{H5Acreate2(o.id, kAttributesChecksum, H5T_STD_I64LE, sp.id, H5P_DEFAULT, H5P_DEFAULT),
             H5Aclose};
    if (a.id < 0 || H5Awrite(a.id, H5T_NATIVE_INT64, &crc) < 0)
      throw InvalidArgument("[seal_attributes] cannot write the checksum of " + where);
  }
}
}  // namespace

std::vector<std::string> H5File::attr_names(const std::string& obj) const {
  Handle o{H5Oopen(id_, obj.c_str(), H5P_DEFAULT), H5Oclose};
  if (o.id < 0) throw FormatError("[H5File] '" + path_ + "' has no object '" + obj + "'");
  return attribute_names(o.id, "'" + obj + "' in '" + path_ + "'");
}

std::string H5File::canonical_attributes(const std::string& obj) const {
  Handle o{H5Oopen(id_, obj.c_str(), H5P_DEFAULT), H5Oclose};
  if (o.id < 0) throw FormatError("[H5File] '" + path_ + "' has no object '" + obj + "'");
  return canonical_text(o.id, obj, attribute_names(o.id, "'" + obj + "' in '" + path_ + "'"),
                        path_);
}

int64_t H5File::verify_attributes(bool required) const {
  int64_t checked = 0;
  for (const auto& p : object_paths(id_, path_)) {
    Handle o{H5Oopen(id_, p.c_str(), H5P_DEFAULT), H5Oclose};
    const std::string where = "'" + p + "' in '" + path_ + "'";
    if (o.id < 0) throw FormatError("[H5File] cannot open " + where);
    const auto names = attribute_names(o.id, where);
    const bool sealed = std::binary_search(names.begin(), names.end(), kAttributesChecksum);
    const std::string text = canonical_text(o.id, p, names, path_);
    if (!sealed) {
      if (required && !text.empty())
        throw FormatError("[H5File] the attributes of " + where + " have no " +
                          kAttributesChecksum + " (its format version requires one)");
      continue;
    }
    int64_t stored = -1;
    {
      Handle a{H5Aopen(o.id, kAttributesChecksum, H5P_DEFAULT), H5Aclose};
      Handle t{H5Aget_type(a.id), H5Tclose};
      if (H5Tget_class(t.id) != H5T_INTEGER || H5Aread(a.id, H5T_NATIVE_INT64, &stored) < 0)
        throw FormatError("[H5File] " + std::string(kAttributesChecksum) + " of " + where +
                          " is not an integer");
    }
    const uint32_t computed = crc32_of(text);
    if (stored != static_cast<int64_t>(computed))
      throw FormatError("[H5File] the attributes of " + where + " do not match their CRC-32 " +
                        "(stored " + std::to_string(stored) + ", computed " +
                        std::to_string(computed) + "): the file is corrupt");
    ++checked;
  }
  return checked;
}

void seal_attributes(const std::string& path) {
  silence_hdf5();
  Handle f{H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
  if (f.id < 0) throw InvalidArgument("[seal_attributes] cannot open '" + path + "' for writing");
  seal_open_file(f.id, path);
}

nlohmann::json H5File::attr_json(const std::string& obj, const std::string& name) const {
  H5T_class_t cls;
  {
    Handle a{open_attr(id_, path_, obj, name), H5Aclose};
    Handle t{H5Aget_type(a.id), H5Tclose};
    cls = H5Tget_class(t.id);
  }
  switch (cls) {
    case H5T_STRING: return attr_str(obj, name);
    case H5T_INTEGER:
    case H5T_ENUM: return attr_int(obj, name);
    case H5T_FLOAT: return attr_float(obj, name);
    default:
      throw FormatError("[H5File] attribute '" + obj + "@" + name + "' in '" + path_ +
                        "' is neither a string nor a number");
  }
}

TensorF32 H5File::read_f32(const std::string& dataset_path) const {
  return read_f32(dataset_path, this->shape(dataset_path));
}

TensorF32 H5File::read_f32(const std::string& dataset_path,
                           const std::vector<int64_t>& expected) const {
  const std::vector<int64_t> shape = this->shape(dataset_path);
  // Checked before allocating: a corrupt file's shape must not decide how much memory we take.
  if (shape != expected)
    throw FormatError("[H5File] dataset '" + dataset_path + "' in '" + path_ + "' has shape " +
                      shape_str(shape) + ", expected " + shape_str(expected));
  Handle d{H5Dopen2(id_, dataset_path.c_str(), H5P_DEFAULT), H5Dclose};
  Handle t{H5Dget_type(d.id), H5Tclose};
  const H5T_class_t cls = H5Tget_class(t.id);
  if (cls != H5T_INTEGER && cls != H5T_FLOAT)
    throw FormatError("[H5File] dataset '" + dataset_path + "' in '" + path_ +
                      "' does not hold numbers");
  TensorF32 out(shape);
  if (out.numel() > 0 &&
      H5Dread(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.ptr()) < 0)
    throw FormatError("[H5File] cannot read dataset '" + dataset_path + "' from '" + path_ +
                      "' (checksum mismatch, truncated or corrupt)");
  return out;
}

bool H5File::has_checksum(const std::string& dataset_path) const {
  Handle d{H5Dopen2(id_, dataset_path.c_str(), H5P_DEFAULT), H5Dclose};
  if (d.id < 0)
    throw FormatError("[H5File] '" + dataset_path + "' in '" + path_ + "' is not a dataset");
  Handle plist{H5Dget_create_plist(d.id), H5Pclose};
  unsigned flags = 0;
  size_t n_values = 0;
  return H5Pget_filter_by_id2(plist.id, H5Z_FILTER_FLETCHER32, &flags, &n_values, nullptr, 0,
                              nullptr, nullptr) >= 0;
}

int64_t H5File::count_members(const std::string& group_path) const {
  Handle g{H5Gopen2(id_, group_path.c_str(), H5P_DEFAULT), H5Gclose};
  if (g.id < 0) throw FormatError("[H5File] '" + path_ + "' has no group '" + group_path + "'");
  H5G_info_t info{};
  if (H5Gget_info(g.id, &info) < 0)
    throw FormatError("[H5File] cannot read group '" + group_path + "' in '" + path_ + "'");
  return static_cast<int64_t>(info.nlinks);
}

}  // namespace socllm

// ---------------------------------------------------------------------------------------------

namespace socllm {

namespace {
namespace fs = std::filesystem;

// Temporary files are ".NAME.PID-HEX.tmp" beside NAME (the convention io_utils.py follows too):
// a killed writer's file is recognised by its dead PID and removed by the next writer.
std::string temp_prefix(const fs::path& dest) { return "." + dest.filename().string() + "."; }

void remove_stale_temps(const fs::path& dest) {
  std::error_code ec;
  const std::string prefix = temp_prefix(dest);
  for (const auto& e : fs::directory_iterator(dest.parent_path(), ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() <= prefix.size() + 4 || n.compare(0, prefix.size(), prefix) != 0 ||
        n.compare(n.size() - 4, 4, ".tmp") != 0)
      continue;
    const std::string mid = n.substr(prefix.size(), n.size() - prefix.size() - 4);
    const auto dash = mid.find('-');
    if (dash == 0 || dash == std::string::npos || mid.find_first_not_of("0123456789") != dash)
      continue;
    const long pid = std::strtol(mid.substr(0, dash).c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      fs::remove(e.path(), ec);  // its writer is gone
  }
}

// Where `path` really is: a symlink is written through (its target replaced, the link kept).
fs::path write_target(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  // Followed by hand: a dangling link names the file to create, which canonical() cannot give.
  constexpr int kMaxLinkHops = 40;  // as the kernel's ELOOP limit
  for (int hops = 0; fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    if (hops == kMaxLinkHops)
      throw InvalidArgument("[H5Writer] too many levels of symbolic links in '" + path + "'");
    const fs::path t = fs::read_symlink(p, ec);
    p = t.is_absolute() ? t : p.parent_path() / t;
  }
  const auto st = fs::status(p, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw InvalidArgument("[H5Writer] cannot write an HDF5 file to '" + path +
                          "': it exists and is not a regular file");
  return p;
}
}  // namespace

H5Writer::H5Writer(std::string path) : path_(write_target(path).string()) {
  silence_hdf5();
  const fs::path dest(path_);
  const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  remove_stale_temps(dest.has_parent_path() ? dest : fs::path(".") / dest);
  std::random_device rd;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(rd()));
  tmp_ = (dir / (temp_prefix(dest) + std::to_string(::getpid()) + "-" + hex + ".tmp")).string();
  id_ = H5Fcreate(tmp_.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
  if (id_ < 0)
    throw InvalidArgument("[H5Writer] cannot write '" + path + "': cannot create a file in '" +
                          dir.string() + "' (" + std::strerror(errno) + ")");
}

H5Writer::~H5Writer() {
  if (id_ >= 0) H5Fclose(id_);
  if (!committed_) std::remove(tmp_.c_str());
}

void H5Writer::group(const std::string& group_path) {
  Handle lcpl{H5Pcreate(H5P_LINK_CREATE), H5Pclose};
  H5Pset_create_intermediate_group(lcpl.id, 1);
  if (H5Lexists(id_, group_path.c_str(), H5P_DEFAULT) > 0) return;
  Handle g{H5Gcreate2(id_, group_path.c_str(), lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
  if (g.id < 0) throw InvalidArgument("[H5Writer] cannot create group '" + group_path + "'");
}

void H5Writer::attr(const std::string& obj, const std::string& name, const nlohmann::json& v) {
  Handle o{H5Oopen(id_, obj.c_str(), H5P_DEFAULT), H5Oclose};
  if (o.id < 0) throw InvalidArgument("[H5Writer] no object '" + obj + "' for attribute " + name);
  if (H5Aexists(o.id, name.c_str()) > 0) H5Adelete(o.id, name.c_str());  // last write wins
  Handle sp{H5Screate(H5S_SCALAR), H5Sclose};
  herr_t rc = -1;
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    Handle t{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(t.id, H5T_VARIABLE);
    H5Tset_cset(t.id, H5T_CSET_UTF8);
    Handle a{H5Acreate2(o.id, name.c_str(), t.id, sp.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    const char* c = str.c_str();
    rc = H5Awrite(a.id, t.id, &c);
  } else if (v.is_boolean() || v.is_number_integer()) {
    const int64_t x = v.is_boolean() ? int64_t{v.get<bool>()} : v.get<int64_t>();
    Handle a{H5Acreate2(o.id, name.c_str(), H5T_STD_I64LE, sp.id, H5P_DEFAULT, H5P_DEFAULT),
             H5Aclose};
    rc = H5Awrite(a.id, H5T_NATIVE_INT64, &x);
  } else if (v.is_number()) {
    const double x = v.get<double>();
    Handle a{H5Acreate2(o.id, name.c_str(), H5T_IEEE_F64LE, sp.id, H5P_DEFAULT, H5P_DEFAULT),
             H5Aclose};
    rc = H5Awrite(a.id, H5T_NATIVE_DOUBLE, &x);
  } else {
    throw InvalidArgument("[H5Writer] attribute '" + name +
                          "' must be a string, number or bool, got " + json_text(v));
  }
  if (rc < 0) throw InvalidArgument("[H5Writer] cannot write attribute '" + name + "'");
}

void H5Writer::write_raw(const std::string& path, const std::vector<int64_t>& shape,
                         int64_t file_type, int64_t mem_type, const void* data) {
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) group(path.substr(0, slash));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle sp{H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose};
  Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  hsize_t n = 1;
  for (hsize_t x : dims) n *= x;
  if (n > 0 && !dims.empty()) {
    H5Pset_chunk(dcpl.id, static_cast<int>(dims.size()), dims.data());
    H5Pset_deflate(dcpl.id, 4);
    H5Pset_fletcher32(dcpl.id);  // verified by every read: a flipped byte is an error
  }
  Handle d{H5Dcreate2(id_, path.c_str(), file_type, sp.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT),
           H5Dclose};
  if (d.id < 0 || (n > 0 && H5Dwrite(d.id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
    throw InvalidArgument("[H5Writer] cannot write dataset '" + path + "' to '" + path_ +
                          "' (disk full?)");
}

void H5Writer::write(const std::string& p, const std::vector<int64_t>& shape, const float* data) {
  write_raw(p, shape, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data);
}
void H5Writer::write(const std::string& p, const std::vector<int64_t>& shape, const int64_t* data) {
  write_raw(p, shape, H5T_STD_I64LE, H5T_NATIVE_INT64, data);
}
void H5Writer::write(const std::string& p, const std::vector<int64_t>& shape, const uint8_t* data) {
  write_raw(p, shape, H5T_STD_U8LE, H5T_NATIVE_UINT8, data);
}

void H5Writer::write_mask(const std::string& p, const std::vector<int64_t>& shape,
                          const uint8_t* data) {
  // h5py's bool: an enum of int8 with FALSE = 0, TRUE = 1 (numpy reads it as bool).
  Handle t{H5Tenum_create(H5T_NATIVE_INT8), H5Tclose};
  const int8_t f = 0, tr = 1;
  H5Tenum_insert(t.id, "FALSE", &f);
  H5Tenum_insert(t.id, "TRUE", &tr);
  std::vector<int8_t> v(
      data, data + [&] {
        int64_t n = 1;
        for (int64_t x : shape) n *= x;
        return n;
      }());
  for (auto& x : v) x = x != 0;
  write_raw(p, shape, t.id, t.id, v.data());
}

void H5Writer::commit() {
  seal_open_file(id_, path_);
  if (H5Fclose(id_) < 0) {
    id_ = -1;
    throw InvalidArgument("[H5Writer] cannot finish writing '" + path_ + "' (disk full?)");
  }
  id_ = -1;
  struct stat old {};
  if (::stat(path_.c_str(), &old) == 0) ::chmod(tmp_.c_str(), old.st_mode & 07777);  // keep mode
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw InvalidArgument("[H5Writer] cannot replace '" + path_ + "' (" + std::strerror(errno) +
                          ")");
  committed_ = true;
}

}  // namespace socllm
