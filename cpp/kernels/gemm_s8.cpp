// Exact INT8 GEMM with runtime dispatch: AVX-512 VNNI (vpdpbusd), AVX2 (widen to int16 and
// vpmaddwd, exact: no saturating vpmaddubsw), scalar reference. All paths are bit-identical.
#include "socllm/gemm_s8.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "socllm/core.h"

namespace socllm::kernels {

namespace {

template <typename TA>
void gemm_scalar(const TA* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc,
                 int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      uint32_t acc = 0;  // unsigned: wraps modulo 2^32 like the hardware, without UB
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<uint32_t>(static_cast<int32_t>(A[m * lda + k]) * B[n * ldb + k]);
      C[m * ldc + n] = static_cast<int32_t>(acc);
    }
}

// ---- AVX2: 16 elements per step, widened to int16; vpmaddwd sums pairs into int32 ----------

template <typename TA>
__attribute__((target("avx2"))) inline __m256i widen16(const TA* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (std::is_same_v<TA, uint8_t>) return _mm256_cvtepu8_epi16(v);
  else return _mm256_cvtepi8_epi16(v);
}

__attribute__((target("avx2"))) inline int32_t hsum256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

template <typename TA, int MR, int NR>
__attribute__((target("avx2"))) void tile_avx2(const TA* A, int64_t lda, const int8_t* B,
                                               int64_t ldb, int32_t* C, int64_t ldc, int64_t K) {
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256i a[MR];
    for (int i = 0; i < MR; ++i) a[i] = widen16(A + i * lda + k);
    for (int j = 0; j < NR; ++j) {
      const __m256i b = widen16(B + j * ldb + k);
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(a[i], b));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      uint32_t s = static_cast<uint32_t>(hsum256(acc[i][j]));
      for (int64_t kk = k; kk < K; ++kk)
        s += static_cast<uint32_t>(static_cast<int32_t>(A[i * lda + kk]) * B[j * ldb + kk]);
      C[i * ldc + j] = static_cast<int32_t>(s);
    }
}

// Walks C in 2 x 4 tiles (8 accumulators + operands fit AVX2's 16 ymm registers), with edge
// tiles of one row and/or one column. Columns outside, rows inside: a tile's rows of B stay in
// L1 while A's rows stream from L2. Threads split the column blocks.
template <typename TA>
void gemm_avx2(const TA* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc,
               int64_t M, int64_t N, int64_t K) {
  constexpr int MR = 2, NR = 4;
  const int64_t n_full = N / NR, n_blocks = n_full + (N % NR);  // full blocks, then 1-wide
#pragma omp parallel for schedule(dynamic, 1) if (M * N * K >= (int64_t{1} << 20))
  for (int64_t nb = 0; nb < n_blocks; ++nb) {
    const bool full = nb < n_full;
    const int64_t n = full ? nb * NR : n_full * NR + (nb - n_full);
    const int8_t* b = B + n * ldb;
    int64_t m = 0;
    for (; m + MR <= M; m += MR) {
      if (full) tile_avx2<TA, MR, NR>(A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, K);
      else tile_avx2<TA, MR, 1>(A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, K);
    }
    for (; m < M; ++m) {
      if (full) tile_avx2<TA, 1, NR>(A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, K);
      else tile_avx2<TA, 1, 1>(A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, K);
    }
  }
}

// ---- AVX-512 VNNI: vpdpbusd on B packed so that one instruction yields 16 output columns ---
//
// Packed B: for each group of 4 k, for each column n, the 4 bytes B[n, 4g .. 4g+3] form one
// int32 lane; 16 consecutive columns fill a zmm. One broadcast int32 of A (4 k-values of one
// row) against it accumulates 4 products into each of 16 columns: no horizontal sums. K and
// N are zero-padded to multiples of 4 and 16 (zero B bytes contribute nothing, whatever A is).
constexpr int64_t kVnniCols = 16;           // int32 lanes per zmm
constexpr int kVnniRows = 6, kVnniVecs = 4;  // 6 x 64 tile: 24 accumulators of 32 zmm

#define SOCLLM_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

using detail::VnniPack;

VnniPack pack_b_vnni(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  VnniPack p;
  p.groups = (K + 3) / 4;
  p.cols = (N + kVnniCols - 1) / kVnniCols * kVnniCols;
  p.data.assign(static_cast<size_t>(p.groups * p.cols), 0);
  const int64_t full = K / 4;
  // Blocks of 64 columns: the 64 source rows are read forward, the packed rows written whole.
#pragma omp parallel for schedule(static) if (N * K >= (int64_t{1} << 20))
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t n1 = std::min(N, n0 + 64);
    for (int64_t g = 0; g < p.groups; ++g)
      for (int64_t n = n0; n < n1; ++n) {
        int32_t q = 0;
        if (g < full) std::memcpy(&q, B + n * ldb + 4 * g, 4);
        else std::memcpy(&q, B + n * ldb + 4 * g, static_cast<size_t>(K - 4 * g));
        p.data[static_cast<size_t>(g * p.cols + n)] = q;
      }
  }
  p.shift.assign(static_cast<size_t>(p.cols), 0);
#pragma omp parallel for schedule(static) if (N * K >= (int64_t{1} << 20))
  for (int64_t n = 0; n < N; ++n) {
    uint32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += static_cast<uint32_t>(int32_t{B[n * ldb + k]});
    p.shift[static_cast<size_t>(n)] = static_cast<int32_t>(sum * 128u);
  }
  return p;
}

// A as uint8 rows padded to a multiple of 4 bytes, ready for 4-byte broadcasts; int8 A gets
// + 128 per byte (bit 7 flipped), the zero-point shift that VnniPack::shift undoes. Padding
// bytes meet zero B bytes, so their value does not matter.
template <typename TA>
std::vector<uint8_t> shift_pad_a(const TA* A, int64_t lda, int64_t M, int64_t K, int64_t ld) {
  std::vector<uint8_t> out(static_cast<size_t>(M * ld), 0);
  const uint8_t flip = std::is_same_v<TA, int8_t> ? 0x80 : 0x00;
#pragma omp parallel for schedule(static) if (M * K >= (int64_t{1} << 20))
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      out[static_cast<size_t>(m * ld + k)] = static_cast<uint8_t>(A[m * lda + k]) ^ flip;
  return out;
}

template <bool kShift, int MR>
SOCLLM_VNNI_TARGET void tile_vnni(const uint8_t* A, int64_t lda, const VnniPack& pb, int64_t n0,
                                  int vecs, int32_t* C, int64_t ldc, int64_t N) {
  __m512i acc[MR][kVnniVecs];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kVnniVecs; ++j) acc[i][j] = _mm512_setzero_si512();
  const int32_t* bp = pb.data.data() + n0;
  for (int64_t g = 0; g < pb.groups; ++g, bp += pb.cols) {
    __m512i b[kVnniVecs];
    for (int j = 0; j < vecs; ++j) b[j] = _mm512_loadu_si512(bp + j * kVnniCols);
    for (int i = 0; i < MR; ++i) {
      int32_t q;
      std::memcpy(&q, A + i * lda + 4 * g, 4);
      const __m512i a = _mm512_set1_epi32(q);
      for (int j = 0; j < vecs; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], a, b[j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < vecs; ++j) {
      const int64_t n = n0 + j * kVnniCols;
      const int64_t valid = std::min<int64_t>(kVnniCols, N - n);
      const __mmask16 m = valid >= 16 ? __mmask16(0xffff) : __mmask16((1u << valid) - 1);
      __m512i v = acc[i][j];
      if constexpr (kShift)  // undo the +128 on int8 A (wrapping, hence exact)
        v = _mm512_sub_epi32(v, _mm512_loadu_si512(pb.shift.data() + n));
      _mm512_mask_storeu_epi32(C + i * ldc + n, m, v);
    }
}

template <typename TA>
void gemm_vnni(const TA* A, int64_t lda, const VnniPack& pb, int32_t* C, int64_t ldc, int64_t M,
               int64_t N, int64_t K) {
  const int64_t lda4 = pb.groups * 4;
  const std::vector<uint8_t> a_u8 = shift_pad_a(A, lda, M, K, lda4);
  constexpr bool kShift = std::is_same_v<TA, int8_t>;
  constexpr int64_t block_cols = kVnniCols * kVnniVecs;
  const int64_t n_blocks = (N + block_cols - 1) / block_cols;
  // Column blocks outside (their packed B, K * 64 bytes, stays in L2), rows inside.
#pragma omp parallel for schedule(dynamic, 1) if (M * N * K >= (int64_t{1} << 20))
  for (int64_t nb = 0; nb < n_blocks; ++nb) {
    const int64_t n0 = nb * block_cols;
    const int vecs = static_cast<int>(std::min<int64_t>(kVnniVecs, (N - n0 + kVnniCols - 1) / kVnniCols));
    int64_t m = 0;
    for (; m + kVnniRows <= M; m += kVnniRows)
      tile_vnni<kShift, kVnniRows>(a_u8.data() + m * lda4, lda4, pb, n0, vecs, C + m * ldc, ldc, N);
    for (; m < M; ++m)
      tile_vnni<kShift, 1>(a_u8.data() + m * lda4, lda4, pb, n0, vecs, C + m * ldc, ldc, N);
  }
}

void check_args(const char* fn, const void* A, int64_t lda, const void* B, int64_t ldb,
                const void* C, int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa) {
  if (M < 0 || N < 0 || K < 0)
    throw ShapeError(std::string("[") + fn + "] negative size M=" + std::to_string(M) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K));
  if (lda < K || ldb < K || ldc < N)
    throw ShapeError(std::string("[") + fn + "] leading dimensions lda=" + std::to_string(lda) +
                     " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) +
                     " too small for K=" + std::to_string(K) + " N=" + std::to_string(N));
  if ((M && K && !A) || (N && K && !B) || (M && N && !C))
    throw InvalidArgument(std::string("[") + fn + "] null operand");
  bool ok = false;
  for (Isa s : supported_isas()) ok |= s == isa;
  if (!ok)
    throw Unsupported(std::string("[") + fn + "] this CPU does not support the " +
                      isa_name(isa) + " path");
}

// The kernel of one path on unpacked B; arguments already checked.
template <typename TA>
void run_path(const TA* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc,
              int64_t M, int64_t N, int64_t K, Isa isa) {
  switch (isa) {
    case Isa::Avx512Vnni: return gemm_vnni(A, lda, pack_b_vnni(B, ldb, N, K), C, ldc, M, N, K);
    case Isa::Avx2: return gemm_avx2(A, lda, B, ldb, C, ldc, M, N, K);
    case Isa::Scalar: return gemm_scalar(A, lda, B, ldb, C, ldc, M, N, K);
  }
}

template <typename TA>
void gemm_dispatch(const char* fn, const TA* A, int64_t lda, const int8_t* B, int64_t ldb,
                   int32_t* C, int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa) {
  check_args(fn, A, lda, B, ldb, C, ldc, M, N, K, isa);
  if (M == 0 || N == 0) return;
  run_path(A, lda, B, ldb, C, ldc, M, N, K, isa);
}

}  // namespace

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512Vnni: return "avx512-vnni";
  }
  return "?";
}

Isa isa_from_name(const std::string& name) {
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni})
    if (isa_name(i) == name) return i;
  throw InvalidArgument("[isa] unknown instruction set '" + name +
                        "' (scalar, avx2, avx512-vnni)");
}

std::vector<Isa> supported_isas() {
  // The CPU does not change while the process runs: detect once (this is on every GEMM call).
  static const std::vector<Isa> isas = [] {
    std::vector<Isa> out{Isa::Scalar};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) out.push_back(Isa::Avx2);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))
      out.push_back(Isa::Avx512Vnni);
    return out;
  }();
  return isas;
}

Isa best_isa() { return supported_isas().back(); }

void gemm_s8s8s32(const int8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa) {
  gemm_dispatch("gemm_s8s8s32", A, lda, B, ldb, C, ldc, M, N, K, isa);
}

PackedWeightsS8::PackedWeightsS8(const int8_t* B, int64_t ldb, int64_t N, int64_t K)
    : n_(N), k_(K) {
  if (N < 0 || K < 0 || ldb < K || (N && K && !B))
    throw ShapeError("[PackedWeightsS8] bad weights N=" + std::to_string(N) +
                     " K=" + std::to_string(K) + " ldb=" + std::to_string(ldb));
  rows_.resize(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(rows_.data() + n * K, B + n * ldb, static_cast<size_t>(K));
  const auto isas = supported_isas();
  has_vnni_ = std::find(isas.begin(), isas.end(), Isa::Avx512Vnni) != isas.end();
  if (has_vnni_) vnni_ = pack_b_vnni(rows_.data(), K, N, K);
}

int64_t PackedWeightsS8::bytes() const {
  return static_cast<int64_t>(rows_.size() +
                              (vnni_.data.size() + vnni_.shift.size()) * sizeof(int32_t));
}

void gemm_s8s8s32_packed(const int8_t* A, int64_t lda, const PackedWeightsS8& W, int32_t* C,
                         int64_t ldc, int64_t M, Isa isa) {
  const int64_t N = W.n(), K = W.k();
  check_args("gemm_s8s8s32_packed", A, lda, W.rows().data(), K, C, ldc, M, N, K, isa);
  if (M == 0 || N == 0) return;
  if (isa == Isa::Avx512Vnni) return gemm_vnni(A, lda, *W.vnni(), C, ldc, M, N, K);
  run_path(A, lda, W.rows().data(), K, C, ldc, M, N, K, isa);
}

void gemm_u8s8s32(const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa) {
  gemm_dispatch("gemm_u8s8s32", A, lda, B, ldb, C, ldc, M, N, K, isa);
}

}  // namespace socllm::kernels
