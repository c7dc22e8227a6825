// socllm's HDF5 files (io layer): read access to the model file written by `socllm convert`
// (docs/MODEL_FORMAT.md) and to calibration artifacts; an atomic writer for artifacts (the
// calibration schema itself is defined in calibration.h). Every size read from a file is checked
// before memory is reserved.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/core.h"

namespace socllm {

// HDF5's Fletcher-32 covers datasets, not attributes, yet attributes hold values that change
// results (a model's rope_theta, a packed layer's activation scales). So every object with
// attributes carries one more, `attributes_crc32`: zlib's CRC-32 of its canonical attribute text
// (docs/MODEL_FORMAT.md, "Integrity"), written by H5Writer::commit and seal_attributes.
inline constexpr const char* kAttributesChecksum = "attributes_crc32";

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
  // Reads a numeric dataset converted to fp32. FormatError if absent, not numeric or unreadable
  // (a Fletcher-32 checksum mismatch included); with `expected`, also if its shape differs,
  // checked before any memory is reserved.
  TensorF32 read_f32(const std::string& dataset_path) const;
  TensorF32 read_f32(const std::string& dataset_path, const std::vector<int64_t>& expected) const;
  // Whether a dataset carries HDF5's Fletcher-32 checksum filter (verified on every read).
  bool has_checksum(const std::string& dataset_path) const;
  // Links in a group (its datasets and subgroups).
  int64_t count_members(const std::string& group_path) const;
  // Reads an integer dataset as int64; FormatError if absent, not integer, or unreadable.
  std::vector<int64_t> read_i64(const std::string& dataset_path) const;
  // An 8-bit integer dataset's raw bytes (int8 or uint8); FormatError if it is not 8-bit
  // integer data, unreadable, or does not hold expected_elems elements (checked first).
  std::vector<uint8_t> read_bytes(const std::string& dataset_path, int64_t expected_elems) const;
  // The shape of a dataset; FormatError if absent.
  std::vector<int64_t> shape(const std::string& dataset_path) const;
  // Names of the root group's attributes.
  std::vector<std::string> attr_names(const std::string& object_path) const;
  // Checks every object's attributes against its kAttributesChecksum (below); FormatError
  // naming the object and the file on a mismatch, and, if `required`, on an object with
  // attributes but no checksum. Returns the number of objects checked.
  int64_t verify_attributes(bool required) const;
  // The canonical text one object's checksum covers (the checksum itself left out); empty if
  // the object has no other attribute. FormatError for a type it cannot represent.
  std::string canonical_attributes(const std::string& object_path) const;
  // An attribute as JSON: string, integer, float (scalars only); FormatError otherwise.
  nlohmann::json attr_json(const std::string& object_path, const std::string& name) const;

 private:
  std::string path_;
  int64_t id_ = -1;
};

// Adds (or replaces) the checksum attribute on every object with attributes, in a closed file
// written by another writer (h5py: `socllm convert`).
void seal_attributes(const std::string& path);

// Writes an HDF5 file atomically: everything goes to a temporary file ".NAME.PID-HEX.tmp" beside
// `path`, which replaces `path` only at commit() (mode 0666 minus the umask as any new file, or
// the mode of the file it replaces); destroyed without commit, the temporary file is removed and
// `path` is untouched. Temporary files of writers that died (their PID is gone) are removed. A
// symlink is written through; a path that exists and is not a regular file is InvalidArgument.
// Datasets carry a Fletcher-32 checksum, and objects with attributes kAttributesChecksum.
class H5Writer {
 public:
  explicit H5Writer(std::string path);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;
  // Attributes of an object ("/" or a group written before); JSON string, integer, float or bool.
  // Writing a name again replaces the value.
  void attr(const std::string& object_path, const std::string& name, const nlohmann::json& value);
  // Datasets (gzip-compressed); intermediate groups are created.
  void write(const std::string& dataset_path, const std::vector<int64_t>& shape, const float* data);
  void write(const std::string& dataset_path, const std::vector<int64_t>& shape,
             const int64_t* data);
  void write(const std::string& dataset_path, const std::vector<int64_t>& shape,
             const uint8_t* data);
  // A boolean mask (nonzero = true), stored as h5py stores numpy bools.
  void write_mask(const std::string& dataset_path, const std::vector<int64_t>& shape,
                  const uint8_t* data);
  void group(const std::string& group_path);
  void commit();

 private:
  void write_raw(const std::string& path, const std::vector<int64_t>& shape, int64_t file_type,
                 int64_t mem_type, const void* data);
  std::string path_, tmp_;
  int64_t id_ = -1;
  bool committed_ = false;
};

}  // namespace socllm
