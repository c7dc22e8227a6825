#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace socllm {
namespace {

// GGUF metadata value types (ggml docs/gguf.md, `gguf_metadata_value_type`).
enum : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// Bounds-checked little-endian cursor over the mapped file.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}

  template <typename T>
  T read() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string() {
    uint64_t n = read<uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  void need(uint64_t n) const {
    if (n > size_ - pos_)
      throw FormatError("[GgufFile] truncated file '" + path_ + "': need " + std::to_string(n) +
                        " bytes at offset " + std::to_string(pos_) + ", file has " +
                        std::to_string(size_));
  }
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

nlohmann::json read_scalar(Cursor& c, uint32_t type, const std::string& key) {
  switch (type) {
    case kU8: return c.read<uint8_t>();
    case kI8: return c.read<int8_t>();
    case kU16: return c.read<uint16_t>();
    case kI16: return c.read<int16_t>();
    case kU32: return c.read<uint32_t>();
    case kI32: return c.read<int32_t>();
    case kF32: return c.read<float>();
    case kBool: return c.read<uint8_t>() != 0;
    case kString: return c.read_string();
    case kU64: return c.read<uint64_t>();
    case kI64: return c.read<int64_t>();
    case kF64: return c.read<double>();
    default:
      throw FormatError("[GgufFile] metadata key '" + key + "' has unknown value type " +
                        std::to_string(type));
  }
}

// Bytes an element of a metadata type takes at least (a string: its u64 length).
uint64_t min_value_bytes(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool: return 1;
    case kU16:
    case kI16: return 2;
    case kU32:
    case kI32:
    case kF32: return 4;
    default: return 8;  // u64, i64, f64, string length, array header
  }
}

nlohmann::json read_value(Cursor& c, uint32_t type, const std::string& key,
                          const std::string& path) {
  if (type != kArray) return read_scalar(c, type, key);
  uint32_t elem = c.read<uint32_t>();
  uint64_t n = c.read<uint64_t>();
  if (elem == kArray) throw Unsupported("[GgufFile] nested arrays in metadata key '" + key + "'");
  // The count is checked against the bytes left before anything is read or reserved: a corrupt
  // count must not grow memory until the file runs out.
  if (n > c.remaining() / min_value_bytes(elem))
    throw FormatError("[GgufFile] metadata array '" + key + "' in '" + path + "' claims " +
                      std::to_string(n) + " elements, more than the " +
                      std::to_string(c.remaining()) + " bytes left in the file hold");
  nlohmann::json arr = nlohmann::json::array();
  for (uint64_t i = 0; i < n; ++i) arr.push_back(read_scalar(c, elem, key));
  return arr;
}

// Bytes a tensor index entry takes at least: name length, n_dims, one dimension, type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
// A metadata entry: key length, value type, a one-byte value.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;

}  // namespace

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n = checked_mul(n, d, "[GgufFile] tensor '" + name + "'");
  return n;
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw MissingFile("[GgufFile] cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError("[GgufFile] '" + path + "' is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 4) {
    ::close(fd);
    throw FormatError("[GgufFile] '" + path + "' is too small to be GGUF (" +
                      std::to_string(size_) + " bytes)");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw Error("[GgufFile] mmap failed for '" + path + "'");
  map_ = static_cast<const uint8_t*>(m);

  try {
    Cursor c(map_, size_, path_);
    if (std::memcmp(map_, "GGUF", 4) != 0)
      throw FormatError("[GgufFile] '" + path + "' has wrong magic (not a GGUF file)");
    c.read<uint32_t>();
    version_ = c.read<uint32_t>();
    if (version_ < 2 || version_ > 3)
      throw Unsupported("[GgufFile] GGUF version " + std::to_string(version_) + " in '" + path +
                        "' (supported: 2, 3)");
    uint64_t n_tensors = c.read<uint64_t>();
    uint64_t n_kv = c.read<uint64_t>();
    if (n_kv > c.remaining() / kMinKvBytes)
      throw FormatError("[GgufFile] '" + path + "' claims " + std::to_string(n_kv) +
                        " metadata entries (n_kv), more than its " + std::to_string(size_) +
                        " bytes hold");
    if (n_tensors > c.remaining() / kMinTensorInfoBytes)
      throw FormatError("[GgufFile] '" + path + "' claims " + std::to_string(n_tensors) +
                        " tensors (n_tensors), more than its " + std::to_string(size_) +
                        " bytes hold");
    metadata_ = nlohmann::json::object();
    for (uint64_t i = 0; i < n_kv; ++i) {
      std::string key = c.read_string();
      uint32_t type = c.read<uint32_t>();
      metadata_[key] = read_value(c, type, key, path);
    }
    if (metadata_.contains("general.alignment")) {
      const auto& a = metadata_["general.alignment"];
      if (!a.is_number_unsigned() || a.get<uint64_t>() == 0 ||
          (a.get<uint64_t>() & (a.get<uint64_t>() - 1)) != 0)
        throw FormatError("[GgufFile] general.alignment must be a power of two, got " +
                          json_text(a));
      if (a.get<uint64_t>() > size_)  // also keeps the data offset's rounding from wrapping
        throw FormatError("[GgufFile] general.alignment " + json_text(a) +
                          " exceeds the size of '" + path + "'");
      alignment_ = a.get<uint64_t>();
    }
    tensors_.reserve(n_tensors);
    std::vector<uint64_t> rel_offsets;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensorInfo t;
      t.name = c.read_string();
      uint32_t n_dims = c.read<uint32_t>();
      if (n_dims == 0 || n_dims > 4)
        throw FormatError("[GgufFile] tensor '" + t.name + "' has " + std::to_string(n_dims) +
                          " dims");
      std::vector<int64_t> ne(n_dims);
      for (auto& d : ne) {
        uint64_t v = c.read<uint64_t>();
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          throw FormatError("[GgufFile] tensor '" + t.name + "' has a bad dimension");
        d = static_cast<int64_t>(v);
      }
      t.shape.assign(ne.rbegin(), ne.rend());
      int64_t numel = 1;
      for (int64_t d : ne)
        if (d != 0 && numel > static_cast<int64_t>(size_) / d)  // more elements than file bytes
          throw FormatError("[GgufFile] tensor '" + t.name + "' has shape " + shape_str(t.shape) +
                            ", larger than the file '" + path + "'");
        else numel *= d;
      t.type = c.read<uint32_t>();
      rel_offsets.push_back(c.read<uint64_t>());
      if (index_.count(t.name)) throw FormatError("[GgufFile] duplicate tensor '" + t.name + "'");
      index_[t.name] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
    data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      auto& t = tensors_[i];
      // Offsets are relative to the data section, aligned (gguf.md), and inside the file:
      // checked before adding so a huge offset cannot wrap around 2^64.
      if (rel_offsets[i] % alignment_ != 0)
        throw FormatError("[GgufFile] tensor '" + t.name + "' in '" + path + "' has offset " +
                          std::to_string(rel_offsets[i]) + ", not a multiple of the alignment " +
                          std::to_string(alignment_));
      if (data_offset_ > size_ || rel_offsets[i] > size_ - data_offset_)
        throw FormatError("[GgufFile] tensor '" + t.name + "' in '" + path + "' has offset " +
                          std::to_string(rel_offsets[i]) + " past the end of the file (" +
                          std::to_string(size_) + " bytes)");
      t.offset = data_offset_ + rel_offsets[i];
      // Size is only known for types we can decode; others are listed but not readable.
      try {
        int64_t be = ggml_block_elems(t.type);
        if (t.shape.back() % be != 0)
          throw FormatError("[GgufFile] tensor '" + t.name + "' row of " +
                            std::to_string(t.shape.back()) + " elements is not a multiple of " +
                            ggml_type_name(t.type) + "'s block of " + std::to_string(be));
        t.n_bytes = static_cast<uint64_t>(t.numel() / be * ggml_block_bytes(t.type));
      } catch (const Unsupported&) {
        t.n_bytes = 0;
        continue;
      }
      if (t.n_bytes > size_ - t.offset)
        throw FormatError("[GgufFile] truncated file '" + path + "': tensor '" + t.name +
                          "' needs bytes up to " + std::to_string(t.offset + t.n_bytes) +
                          ", file has " + std::to_string(size_));
    }
    // No two tensors may share bytes: one would silently read the other's data.
    std::vector<const GgufTensorInfo*> by_offset;
    for (const auto& t : tensors_)
      if (t.n_bytes > 0) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const auto* a, const auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const auto &a = *by_offset[i - 1], &b = *by_offset[i];
      if (a.offset + a.n_bytes > b.offset)
        throw FormatError("[GgufFile] tensors '" + a.name + "' and '" + b.name + "' in '" + path +
                          "' overlap (bytes " + std::to_string(a.offset) + "+" +
                          std::to_string(a.n_bytes) + " and " + std::to_string(b.offset) + ")");
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
    throw;
  }
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

bool GgufFile::has_tensor(const std::string& name) const { return index_.count(name) > 0; }

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw InvalidArgument("[GgufFile.tensor] no tensor named '" + name + "' in '" + path_ + "'");
  return tensors_[it->second];
}

std::span<const uint8_t> GgufFile::raw(const std::string& name) const {
  const auto& t = tensor(name);
  ggml_block_bytes(t.type);  // throws Unsupported for unknown types
  return {map_ + t.offset, t.n_bytes};
}

TensorF32 GgufFile::dequantize(const std::string& name) const {
  const auto& t = tensor(name);
  auto bytes = raw(name);
  TensorF32 out(t.shape);
  int64_t row = t.shape.back();
  int64_t rows = t.numel() / std::max<int64_t>(row, 1);
  int64_t row_bytes = row / ggml_block_elems(t.type) * ggml_block_bytes(t.type);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(t.type, bytes.data() + r * row_bytes, out.ptr() + r * row, row);
  return out;
}

}  // namespace socllm
