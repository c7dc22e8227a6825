// Exact INT8 GEMM (kernels layer): the mobile NPU's INT8 x INT8 -> INT32 arithmetic
// (seed 001 §2.2; seed 004 §3.2), bit-exact on every dispatch path.
//
//   C[M, N] (int32, ldc) = A[M, K] (int8 or uint8, lda) · B[N, K]^T (int8, ldb)
//
// B is in weight layout ([out, in], rows contiguous in K), as linear layers store it.
// Accumulation is int32 like the hardware's; K is bounded so that every possible result fits
// (the limits below), and a larger K is a ShapeError rather than a silently wrapped result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace socllm::kernels {

// Each architecture's paths in order of width. x86-64: AmxInt8 (Intel AMX tiles, Sapphire Rapids
// and later) runs the shapes its tiles fit (blocks of 16 rows; K a multiple of 64, or for the
// per-group GEMM a group of 4..64 k or a multiple of 64) and the VNNI path for the rest.
// AArch64: Neon (baseline Advanced SIMD, smull), Dotprod (sdot, Armv8.2 DotProd), I8mm (smmla,
// Armv8.6 Int8 matrix multiply).
enum class Isa { Scalar, Avx2, Avx512Vnni, AmxInt8, Neon, Dotprod, I8mm };

// Largest K for which no input can overflow int32: s8 x s8 products reach 128 * 128 = 2^14
// (so K * 2^14 <= 2^31 - 1), u8 x s8 products reach -255 * 128 (so K * 32640 <= 2^31).
constexpr int64_t kMaxExactKS8S8 = ((int64_t{1} << 31) - 1) / (128 * 128);  // 131071
constexpr int64_t kMaxExactKU8S8 = (int64_t{1} << 31) / (255 * 128);        // 65793

std::string isa_name(Isa isa);
Isa isa_from_name(const std::string& name);  // InvalidArgument for unknown names
// Best path this CPU supports (at most the environment's SOCLLM_MAX_ISA, read once; a path of
// another architecture is an InvalidArgument), and every path it supports (Scalar first).
Isa best_isa();
std::vector<Isa> supported_isas();

// s8 x s8 -> s32. The VNNI path runs as u8 x s8 on A + 128 and subtracts 128 * sum_k B[n, k]
// (the zero-point correction), which is exact in wrapping int32 arithmetic.
void gemm_s8s8s32(const int8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa);
namespace detail {
// B in vpdpbusd layout: per group of 4 k, per column, one int32 of 4 bytes; columns padded
// to 16, k to 4 (with zeros). shift[n] = 128 * sum_k B[n, k] undoes the +128 on int8 A.
struct VnniPack {
  int64_t groups = 0, cols = 0;
  std::vector<int32_t> data;   // [groups][cols]
  std::vector<int32_t> shift;  // [cols]
};
// B for the AVX2 path: per pair of k, per column, one int32 holding the two int16 values
// B[n, 2p], B[n, 2p + 1] (vpmaddwd's operand); columns padded to 8, k to 2 (with zeros).
struct Avx2Pack {
  int64_t pairs = 0, cols = 0;
  std::vector<int32_t> data;  // [pairs][cols]
};
// B for the Arm sdot path: the VNNI layout (per group of 4 k, per column, one int32 of 4
// bytes), k padded to 16 (one 16-byte load of A feeds 4 sdot lanes) and columns to 16.
struct DotprodPack {
  int64_t quads = 0, cols = 0;
  std::vector<int32_t> data;  // [quads][cols]
};
// B for the Arm smmla path: per 8 k, per pair of columns, 16 bytes (the 8 k of column 2p, then
// of 2p + 1: smmla's 2 x 8 right operand); k padded to 8, columns to 8.
struct I8mmPack {
  int64_t octs = 0, cols = 0;
  std::vector<int8_t> data;  // [octs][cols / 2][16]
};
}  // namespace detail

// int8 weights B[N, K] prepared once for many GEMMs, as a static graph's weights are: the
// rows as given (scalar path) and the layouts of the vector paths this CPU supports.
class PackedWeightsS8 {
 public:
  // only: pack the layout of that one path (a short-lived pack, as one head's keys for one
  // prefill): the GEMM then runs on it or the scalar path, and another is InvalidArgument.
  PackedWeightsS8(const int8_t* B, int64_t ldb, int64_t N, int64_t K,
                  std::optional<Isa> only = std::nullopt);
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t bytes() const;
  const std::vector<int8_t>& rows() const { return rows_; }
  const detail::VnniPack* vnni() const { return has_vnni_ ? &vnni_ : nullptr; }
  const detail::Avx2Pack* avx2() const { return has_avx2_ ? &avx2_ : nullptr; }
  const detail::DotprodPack* dotprod() const { return has_dotprod_ ? &dotprod_ : nullptr; }
  const detail::I8mmPack* i8mm() const { return has_i8mm_ ? &i8mm_ : nullptr; }

 private:
  int64_t n_ = 0, k_ = 0;
  std::vector<int8_t> rows_;  // [N, K]
  bool has_vnni_ = false;
  detail::VnniPack vnni_;
  bool has_avx2_ = false;
  detail::Avx2Pack avx2_;
  bool has_dotprod_ = false;
  detail::DotprodPack dotprod_;
  bool has_i8mm_ = false;
  detail::I8mmPack i8mm_;
};

// C[M, N] = A[M, K] · W^T with prepacked weights; same results as gemm_s8s8s32.
void gemm_s8s8s32_packed(const int8_t* A, int64_t lda, const PackedWeightsS8& W, int32_t* C,
                         int64_t ldc, int64_t M, Isa isa);

// The same for the first n_cols columns of W only (C's other columns untouched): a causal row
// block's visible keys, against keys packed once per head (shadowAttn's estimate, seed 000 §3.2).
void gemm_s8s8s32_packed_cols(const int8_t* A, int64_t lda, const PackedWeightsS8& W, int32_t* C,
                              int64_t ldc, int64_t M, int64_t n_cols, Isa isa);

// Per-group int8 weights for the K-quant-like schemes (llama.cpp's Q8_0 / Q4_0 x Q8_0 dot;
// seed 001 Fig. 3b): codes B[N, K] (int4 codes stored as int8 values) with one float scale per
// column and group of `group` consecutive k.
class PackedGroupedWeightsS8 {
 public:
  // scales[N, K / group] row-major; group must divide K and be at most kMaxGroupSize.
  PackedGroupedWeightsS8(const int8_t* B, int64_t ldb, const float* scales, int64_t N, int64_t K,
                         int64_t group);
  static constexpr int64_t kMaxGroupSize = 1024;  // |dot_g| <= 2^24: exact as a float
  int64_t n() const { return codes_.n(); }
  int64_t k() const { return codes_.k(); }
  int64_t group() const { return group_; }
  int64_t groups() const { return group_ ? k() / group_ : 0; }
  int64_t bytes() const;
  const PackedWeightsS8& codes() const { return codes_; }
  // Column-major per group, padded to the packed column count: scale(g, n) = scales_t[g][n].
  int64_t ld() const { return ld_; }
  const float* scales_t() const { return scales_t_.data(); }
  // VNNI's zero-point correction per group: 128 * sum over the group's k of B[n, k].
  const int32_t* group_shift() const { return shift_.data(); }

 private:
  PackedWeightsS8 codes_;
  int64_t group_ = 0, ld_ = 0;
  std::vector<float> scales_t_;  // [groups][ld]
  std::vector<int32_t> shift_;   // [groups][ld] (VNNI only)
};

// C[m, n] (float, ldc) = sum over groups g of (a_scales[m, g] * w_scale[n, g]) * dot_g, with
// dot_g = sum_{k in g} A[m, k] * B[n, k] exact in int32, for the columns [col_begin, col_end)
// only (a partitioned linear's block; the others are left untouched). Every path sums the
// groups in ascending order with one fused multiply-add each, acc = fma(float(dot_g),
// a_scale * w_scale, acc) from acc = 0, so all paths are bit-identical and a column's value does
// not depend on the block it is computed in. a_scales is [M, K / group] with leading dim lds.
void gemm_grouped_s8s8f32(const int8_t* A, int64_t lda, const float* a_scales, int64_t lds,
                          const PackedGroupedWeightsS8& W, float* C, int64_t ldc, int64_t M,
                          int64_t col_begin, int64_t col_end, Isa isa);

// u8 x s8 -> s32: the form VNNI's vpdpbusd computes natively.
void gemm_u8s8s32(const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa);

}  // namespace socllm::kernels
