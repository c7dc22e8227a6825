// Kernels layer: EdgeFlow's SIMD-friendly packing of per-channel-bit-width weights (seed 004
// §4.2, Fig. 7/8) and its unpacking kernels to INT8 rows (what the NPU computes on).
//
// Format. A tensor [rows, cols] of int8 codes, row i quantized at bits[i] in 1..8 (bitwidth.h):
//   code     u = q + 2^(B-1) for B >= 2 (q in [-2^(B-1), 2^(B-1) - 1]); B = 1: u = (q + 1) / 2
//            (q in {-1, +1}). Unpacking inverts it: q = u - 2^(B-1), or 2u - 1.
//   weightlets  B splits into 1-, 2- and 4-bit parts, most significant first (the paper's 3-bit
//            example: a 1-bit MSB part and a 2-bit part): 1 = 1, 2 = 2, 3 = 1+2, 4 = 4, 5 = 1+4,
//            6 = 2+4, 7 = 1+2+4, 8 = 4+4.
//   groups   each row is cut into groups of R consecutive weights (R = `group`, a format
//            parameter; 128 mirrors a 128-bit NEON/SSE register); the last group of a row may be
//            shorter (any multiple of 8). A group of G weights has 8 stripes of G/8 consecutive
//            weights; its w-bit parts are stored in w blocks of G bits (G/8 bytes), each block
//            holding 8/w stripes interleaved at stride 8/w: weight k of stripe s sits in byte k of
//            block s / (8/w), at bits [8 - w(p+1), 8 - w p) with p = s mod (8/w) (leading bits
//            first). A group's blocks are stored part by part (MSB part first), so a row takes
//            cols * B / 8 bytes and rows follow each other.
//   metadata one 3-bit code (B - 1) per row, little-endian bit stream (row i at bit 3i).
// cols must be a multiple of 8 (ShapeError otherwise).
//
// Unpacking paths, bit-exact with each other: a scalar reference written from the definition
// above, a 128-bit SSE2 path (the NEON analogue: per stripe, mask, align and merge each part,
// then subtract the code offset, Fig. 8) and an AVX2 path (two stripes of a 128-bit block per
// 256-bit register through per-lane shifts; whole stripes when R >= 256). Groups whose byte
// width the vector path has no form for (G/8 not 8, 16 or a multiple of 32) unpack scalar.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace socllm::kernels {

// Sse128 and Avx2 on x86-64, Neon128 on AArch64.
enum class UnpackIsa { Scalar, Sse128, Avx2, Neon128 };
std::string unpack_isa_name(UnpackIsa isa);  // scalar | sse128 | avx2 | neon128
UnpackIsa unpack_isa_from_name(const std::string& s);
std::vector<UnpackIsa> supported_unpack_isas();  // Scalar first
UnpackIsa best_unpack_isa();

// The weightlet widths of a B-bit code, most significant first.
std::vector<int> weightlet_parts(int bits);

// SIMD operations the 128-bit path executes (an instrumented instance of the same kernel
// template): loads, shifts, and/or/add/sub, stores; vector constants are not counted (they
// live in registers across the loop). Divided by the weights unpacked: instructions per weight.
struct UnpackOpCounts {
  int64_t loads = 0, shifts = 0, logic = 0, arith = 0, stores = 0, weights = 0;
  int64_t total() const { return loads + shifts + logic + arith + stores; }
};

class WeightletTensor {
 public:
  WeightletTensor() = default;
  // Packs codes q[rows, cols] (row-major) at per-row bits. InvalidArgument for a bit-width
  // outside 1..8, a code outside its row's range (naming row and column), group not a positive
  // multiple of 8; ShapeError for cols not a multiple of 8 or a bits span of the wrong length.
  static WeightletTensor pack(const int8_t* q, int64_t rows, int64_t cols,
                              std::span<const uint8_t> bits, int64_t group = 128);
  // From stored parts (a model file): FormatError if the metadata and data sizes disagree
  // (e.g. "metadata implies 1234 bytes, data has 1200"), a code outside 1..8 cannot occur (3 bits).
  WeightletTensor(int64_t rows, int64_t cols, int64_t group, std::vector<uint8_t> bit_metadata,
                  std::vector<uint8_t> data);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t group() const { return group_; }
  int bits(int64_t row) const;
  std::vector<uint8_t> bit_widths() const;
  const std::vector<uint8_t>& bit_metadata() const { return meta_; }
  const std::vector<uint8_t>& data() const { return data_; }
  // Bytes stored: packed data plus metadata.
  int64_t bytes() const { return static_cast<int64_t>(data_.size() + meta_.size()); }
  int64_t row_offset(int64_t row) const { return offsets_[static_cast<size_t>(row)]; }

  // Rows [r0, r1) to int8 out[(r1 - r0), cols]. InvalidArgument for an ISA this CPU lacks.
  void unpack_rows(int64_t r0, int64_t r1, int8_t* out, UnpackIsa isa) const;
  void unpack(int8_t* out, UnpackIsa isa) const { unpack_rows(0, rows_, out, isa); }
  // The 128-bit path, counting its operations (same results as unpack with Sse128 / Neon128).
  UnpackOpCounts unpack_counted(int8_t* out) const;

 private:
  void index_rows();
  int64_t rows_ = 0, cols_ = 0, group_ = 128;
  std::vector<uint8_t> meta_, data_;
  std::vector<int64_t> offsets_;  // [rows + 1] byte offset of each row in data_
};

// Bytes of the 3-bit metadata of `rows` rows.
int64_t weightlet_metadata_bytes(int64_t rows);
// Bytes of packed data the metadata of `rows` rows of `cols` weights implies (sum cols * B / 8);
// FormatError if the metadata has the wrong size.
int64_t weightlet_data_bytes(std::span<const uint8_t> bit_metadata, int64_t rows, int64_t cols);

}  // namespace socllm::kernels
