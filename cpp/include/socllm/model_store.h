// Read access to socllm's HDF5 files (io layer): the model file written by
// `socllm convert` (docs/MODEL_FORMAT.md) and, later, calibration artifacts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "socllm/core.h"

namespace socllm {

class H5File {
 public:
  // Opens read-only. MissingFile if absent, FormatError if not a readable HDF5 file
  // (wrong signature, truncated).
  explicit H5File(const std::string& path);
  ~H5File();
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& object_path) const;  // group or dataset, e.g. "/weights/final_norm"
  bool has_attr(const std::string& object_path, const std::string& name) const;
  int64_t attr_int(const std::string& object_path, const std::string& name) const;
  double attr_float(const std::string& object_path, const std::string& name) const;
  std::string attr_str(const std::string& object_path, const std::string& name) const;
  // Reads a numeric dataset converted to fp32. FormatError if absent or unreadable.
  TensorF32 read_f32(const std::string& dataset_path) const;

 private:
  std::string path_;
  int64_t id_ = -1;
};

}  // namespace socllm
