// GGUF reader (io layer): header, metadata, tensor index, alignment, and
// dequantization of ggml block formats to fp32. Format: ggml docs/gguf.md.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/core.h"

namespace socllm {

// ggml tensor type ids as stored in GGUF (ggml.h `enum ggml_type`).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

// Name as ggml prints it ("Q4_K"); "type<N>" for ids socllm does not know.
std::string ggml_type_name(uint32_t type);
// Elements per block and bytes per block; throws Unsupported for types without a dequantizer.
int64_t ggml_block_elems(uint32_t type);
int64_t ggml_block_bytes(uint32_t type);
// Types dequantize_row accepts.
std::vector<std::string> ggml_supported_types();

// Dequantizes `n` elements (a multiple of the block size) of `type` from `src` into `dst`.
void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // numpy order: outermost first (GGUF stores ne[0] innermost)
  uint32_t type = 0;
  uint64_t offset = 0;  // absolute offset in the file
  uint64_t n_bytes = 0;
  int64_t numel() const;
};

class GgufFile {
 public:
  // Maps the file and parses header, metadata and tensor index. Throws MissingFile,
  // FormatError (bad magic, truncation, inconsistent index) or Unsupported (version).
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  // Metadata key -> value; integers, floats, bools, strings, and arrays of those.
  const nlohmann::json& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  bool has_tensor(const std::string& name) const;
  const GgufTensorInfo& tensor(const std::string& name) const;  // InvalidArgument if absent
  std::span<const uint8_t> raw(const std::string& name) const;
  TensorF32 dequantize(const std::string& name) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  nlohmann::json metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace socllm
