// Exact INT8 GEMM with runtime dispatch: AMX-INT8 (tdpbssd/tdpbusd tiles), AVX-512 VNNI
// (vpdpbusd), AVX2 (int16 pairs and vpmaddwd, exact: no saturating vpmaddubsw) on x86-64; the
// AArch64 paths live in gemm_s8_arm.cpp; scalar reference. All paths are bit-identical.
#include "kernels/gemm_s8.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/core.h"
#if defined(__aarch64__)
#include "kernels/gemm_s8_arm.h"
#endif

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

#if defined(__x86_64__)
// ---- AVX2: vpmaddwd on int16 pairs, laid out so that one instruction yields 8 columns ------
//
// AVX2 has no exact 8-bit multiply-add (vpmaddubsw saturates), so operands are widened to
// int16 once: packed B holds, for each pair of k, the two int16 B[n, 2p], B[n, 2p+1] of each
// column n in one int32 lane (8 columns per ymm); A rows are widened to int16 and padded to an
// even K. One broadcast int32 of A (a k-pair of one row) times a B vector gives 8 columns'
// pair sums in int32 (exact: |sum| <= 2 * 128 * 128), accumulated with vpaddd. Like the VNNI
// path there are no horizontal sums; K and N are zero-padded to multiples of 2 and 8.
constexpr int64_t kAvx2Cols = 8;             // int32 lanes per ymm
constexpr int kAvx2Rows = 6, kAvx2Vecs = 2;  // 6 x 16 tile: 12 accumulators of 16 ymm
constexpr int64_t kAvx2PairBlock = 128;      // k-pairs per K block: B 8 KB; 512 rows of A 256 KB

using detail::Avx2Pack;

// body(t) for t < n, on the OpenMP team only when the work is worth it (`parallel`). A region
// whose if clause is false still starts a team of one (in libgomp, a nested one allocates it):
// on the fused top-k's tiles of 24 rows x 256 keys (issue 38) that cost 7% of shadow-attn.
template <typename Body>
void for_tasks(bool parallel, int64_t n, Body&& body) {
  if (!parallel) {
    for (int64_t t = 0; t < n; ++t) body(t);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < n; ++t) body(t);
}

// Packs B[N, K] into data[lanes][cols]: entry (l, n) = lane(n, l), the int32 holding the k
// values of lane l of column n; cols >= N (the caller rounds up to its vector width), the
// padding columns zero.
// Blocks of 64 columns: the 64 source rows are read forward, the packed rows written whole.
template <typename LaneFn>
std::vector<int32_t> pack_lanes(int64_t N, int64_t K, int64_t lanes, int64_t cols, LaneFn lane) {
  std::vector<int32_t> data(static_cast<size_t>(lanes * cols), 0);
#pragma omp parallel for schedule(static) if (N * K >= (int64_t{1} << 20))
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t n1 = std::min(N, n0 + 64);
    for (int64_t l = 0; l < lanes; ++l)
      for (int64_t n = n0; n < n1; ++n) data[static_cast<size_t>(l * cols + n)] = lane(n, l);
  }
  return data;
}

Avx2Pack pack_b_avx2(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  Avx2Pack p;
  p.pairs = (K + 1) / 2;
  p.cols = (N + kAvx2Cols - 1) / kAvx2Cols * kAvx2Cols;
  p.data = pack_lanes(N, K, p.pairs, p.cols, [&](int64_t n, int64_t q) {
    const int8_t* b = B + n * ldb + 2 * q;
    const uint16_t lo = static_cast<uint16_t>(int16_t{b[0]});
    const uint16_t hi = 2 * q + 1 < K ? static_cast<uint16_t>(int16_t{b[1]}) : 0;
    return static_cast<int32_t>(lo | (uint32_t{hi} << 16));
  });
  return p;
}

// A rows widened to int16, each padded to `ld` (even) values with zeros, in the calling thread's
// buffer (valid until its next call: a fresh vector per call was a malloc and a memset on every
// small GEMM, 5% of the fused top-k's tiles in issue 38).
template <typename TA>
const int16_t* widen_pad_a(const TA* A, int64_t lda, int64_t M, int64_t K, int64_t ld) {
  thread_local std::vector<int16_t> out;
  if (out.size() < static_cast<size_t>(M * ld)) out.resize(static_cast<size_t>(M * ld));
  int16_t* base = out.data();
  for_tasks(M * K >= (int64_t{1} << 20), M, [&](int64_t m) {
    const TA* __restrict a = A + m * lda;  // locals: the loop vectorizes
    int16_t* __restrict o = base + m * ld;
    for (int64_t k = 0; k < K; ++k) o[k] = a[k];
    std::fill(o + K, o + ld, int16_t{0});
  });
  return base;
}

// One MR x (vecs * 8) tile over the k-pairs [q0, q1); adds to C when `accumulate` (a later K
// block: int32 adds wrap like the accumulators, so blocking stays exact).
template <int MR>
__attribute__((target("avx2"))) void tile_avx2(const int16_t* A, int64_t lda, const Avx2Pack& pb,
                                               int64_t q0, int64_t q1, int64_t n0, int vecs,
                                               int32_t* C, int64_t ldc, int64_t N,
                                               bool accumulate) {
  __m256i acc[MR][kAvx2Vecs];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kAvx2Vecs; ++j) acc[i][j] = _mm256_setzero_si256();
  const int32_t* bp = pb.data.data() + q0 * pb.cols + n0;
  for (int64_t q = q0; q < q1; ++q, bp += pb.cols) {
    __m256i b[kAvx2Vecs];
    for (int j = 0; j < vecs; ++j)
      b[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + j * kAvx2Cols));
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, A + i * lda + 2 * q, 4);
      const __m256i a = _mm256_set1_epi32(pair);
      for (int j = 0; j < vecs; ++j)
        acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(a, b[j]));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < vecs; ++j) {
      const int64_t n = n0 + j * kAvx2Cols;
      const int64_t valid = std::min<int64_t>(kAvx2Cols, N - n);
      int32_t* c = C + i * ldc + n;
      alignas(32) int32_t tmp[kAvx2Cols];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), acc[i][j]);
      for (int64_t v = 0; v < valid; ++v)
        c[v] =
            accumulate
                ? static_cast<int32_t>(static_cast<uint32_t>(c[v]) + static_cast<uint32_t>(tmp[v]))
                : tmp[v];
    }
}

template <typename TA>
void gemm_avx2(const TA* A, int64_t lda, const Avx2Pack& pb, int32_t* C, int64_t ldc, int64_t M,
               int64_t N, int64_t K) {
  const int64_t lda2 = pb.pairs * 2;
  const int16_t* a16 = widen_pad_a(A, lda, M, K, lda2);
  constexpr int64_t block_cols = kAvx2Cols * kAvx2Vecs, row_block = 16 * kAvx2Rows;
  const int64_t n_blocks = (N + block_cols - 1) / block_cols;
  const int64_t n_row_blocks = (M + row_block - 1) / row_block;
  // Tasks of (column block, row block), K blocks of kAvx2PairBlock pairs inside: a column
  // block's packed B block stays in a 32 KB L1 across the task's rows, and its A block in L2.
  for_tasks(M * N * K >= (int64_t{1} << 20), n_blocks * n_row_blocks, [&](int64_t task) {
    const int64_t nb = task / n_row_blocks, rb = task % n_row_blocks;
    const int64_t n0 = nb * block_cols;
    const int vecs =
        static_cast<int>(std::min<int64_t>(kAvx2Vecs, (N - n0 + kAvx2Cols - 1) / kAvx2Cols));
    const int64_t m1 = std::min(M, (rb + 1) * row_block);
    for (int64_t q0 = 0; q0 == 0 || q0 < pb.pairs; q0 += kAvx2PairBlock) {  // once for K = 0
      const int64_t q1 = std::min(pb.pairs, q0 + kAvx2PairBlock);
      const bool acc = q0 > 0;
      int64_t m = rb * row_block;
      for (; m + kAvx2Rows <= m1; m += kAvx2Rows)
        tile_avx2<kAvx2Rows>(a16 + m * lda2, lda2, pb, q0, q1, n0, vecs, C + m * ldc, ldc, N, acc);
      for (; m < m1; ++m)
        tile_avx2<1>(a16 + m * lda2, lda2, pb, q0, q1, n0, vecs, C + m * ldc, ldc, N, acc);
    }
  });
}

// ---- AVX-512 VNNI: vpdpbusd on B packed so that one instruction yields 16 output columns ---
//
// Packed B: for each group of 4 k, for each column n, the 4 bytes B[n, 4g .. 4g+3] form one
// int32 lane; 16 consecutive columns fill a zmm. One broadcast int32 of A (4 k-values of one
// row) against it accumulates 4 products into each of 16 columns: no horizontal sums. K and
// N are zero-padded to multiples of 4 and 16 (zero B bytes contribute nothing, whatever A is).
constexpr int64_t kVnniCols = 16;            // int32 lanes per zmm
constexpr int kVnniRows = 6, kVnniVecs = 2;  // 6 x 32 tile: 12 accumulators of 32 zmm

#define SOCLLM_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

using detail::VnniPack;

VnniPack pack_b_vnni(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  VnniPack p;
  p.groups = (K + 3) / 4;
  p.cols = (N + kVnniCols - 1) / kVnniCols * kVnniCols;
  p.data = pack_lanes(N, K, p.groups, p.cols, [&](int64_t n, int64_t g) {
    int32_t q = 0;
    std::memcpy(&q, B + n * ldb + 4 * g, static_cast<size_t>(std::min<int64_t>(4, K - 4 * g)));
    return q;
  });
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
// bytes meet zero B bytes (zeroed all the same). In the calling thread's buffer, like
// widen_pad_a's.
template <typename TA>
const uint8_t* shift_pad_a(const TA* A, int64_t lda, int64_t M, int64_t K, int64_t ld) {
  thread_local std::vector<uint8_t> out;
  if (out.size() < static_cast<size_t>(M * ld)) out.resize(static_cast<size_t>(M * ld));
  uint8_t* base = out.data();
  const uint8_t flip = std::is_same_v<TA, int8_t> ? 0x80 : 0x00;
  for_tasks(M * K >= (int64_t{1} << 20), M, [&](int64_t m) {
    // locals: through the captured references the loop reloaded them per byte (12% of
    // shadow-attn's fused estimate at 24 rows a call)
    const TA* __restrict a = A + m * lda;
    uint8_t* __restrict o = base + m * ld;
    for (int64_t k = 0; k < K; ++k) o[k] = static_cast<uint8_t>(a[k]) ^ flip;
    std::fill(o + K, o + ld, uint8_t{0});
  });
  return base;
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
  const uint8_t* a_u8 = shift_pad_a(A, lda, M, K, lda4);
  constexpr bool kShift = std::is_same_v<TA, int8_t>;
  constexpr int64_t block_cols = kVnniCols * kVnniVecs, row_block = 16 * kVnniRows;
  const int64_t n_blocks = (N + block_cols - 1) / block_cols;
  const int64_t n_row_blocks = (M + row_block - 1) / row_block;
  // Tasks of (column block, row block): a column block's packed B (K * 32 bytes) stays in L2
  // across its row blocks, and both threads get work even when N has few blocks.
  for_tasks(M * N * K >= (int64_t{1} << 20), n_blocks * n_row_blocks, [&](int64_t task) {
    const int64_t nb = task / n_row_blocks, rb = task % n_row_blocks;
    const int64_t n0 = nb * block_cols;
    const int vecs =
        static_cast<int>(std::min<int64_t>(kVnniVecs, (N - n0 + kVnniCols - 1) / kVnniCols));
    const int64_t m1 = std::min(M, (rb + 1) * row_block);
    int64_t m = rb * row_block;
    for (; m + kVnniRows <= m1; m += kVnniRows)
      tile_vnni<kShift, kVnniRows>(a_u8 + m * lda4, lda4, pb, n0, vecs, C + m * ldc, ldc, N);
    for (; m < m1; ++m)
      tile_vnni<kShift, 1>(a_u8 + m * lda4, lda4, pb, n0, vecs, C + m * ldc, ldc, N);
  });
}

// ---- AMX-INT8: 16 x 16 int32 tiles from 16 x 64 int8 A tiles and the VNNI-packed B ----------
//
// An AMX B tile is 16 rows of 64 bytes, row r holding k = 4r .. 4r+3 of 16 columns: exactly 16
// consecutive groups of VnniPack at one column block, so B tiles load from the VNNI pack (stride
// cols * 4 bytes) with no second copy. tdpbssd (s8 x s8) and tdpbusd (u8 x s8) accumulate in
// int32 with wrapping adds, so the result equals every other path's bit for bit. Tiles are
// always full (16 rows, 64 bytes): K must be a multiple of 64 and M's last M % 16 rows run on
// the VNNI path (gemm_amx's caller); N is padded to 16 in the pack and a partial column tile
// is stored through a buffer.
constexpr int64_t kAmxRows = 16, kAmxK = 64, kAmxCols = 16;
constexpr int64_t kAmxRowBlock = 128;  // rows per task: its B column block stays in L1/L2

#define SOCLLM_AMX_TARGET __attribute__((target("amx-tile,amx-int8")))
// The per-group kernel's float epilogue runs on AVX-512 registers.
#define SOCLLM_AMX_AVX512_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw")))

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0-3: C (2 x 2 tiles), tmm4-5: A, tmm6-7: B. A tiles hold `k_bytes` (4..64) k per row and
// B tiles k_bytes / 4 rows; C tiles, and every tile of the plain GEMM (k_bytes 64), are full.
inline AmxTileConfig amx_config(int k_bytes = 64) {
  AmxTileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = t == 4 || t == 5 ? static_cast<uint16_t>(k_bytes) : 64;
    c.rows[t] = t >= 6 ? static_cast<uint8_t>(k_bytes / 4) : 16;
  }
  return c;
}

// The tile products of one k-chunk shared by both AMX kernels: C tiles 0-3 (2 x 2, the first
// MT rows and NT columns in use) += A tiles (rows of A at a, a + 16 lda) x B tiles (b, b + 16).
template <int MT, int NT>
SOCLLM_AMX_TARGET inline void amx_zero_c() {
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (MT > 1) _tile_zero(2);
  if constexpr (MT > 1 && NT > 1) _tile_zero(3);
}

template <bool kSigned, int MT, int NT>
SOCLLM_AMX_TARGET inline void amx_step(const int8_t* a, int64_t lda, const int32_t* b,
                                       int64_t b_stride) {
  _tile_loadd(4, a, lda);
  if constexpr (MT > 1) _tile_loadd(5, a + kAmxRows * lda, lda);
  _tile_loadd(6, b, b_stride);
  if constexpr (NT > 1) _tile_loadd(7, b + kAmxCols, b_stride);
  if constexpr (kSigned) {
    _tile_dpbssd(0, 4, 6);
    if constexpr (NT > 1) _tile_dpbssd(1, 4, 7);
    if constexpr (MT > 1) _tile_dpbssd(2, 5, 6);
    if constexpr (MT > 1 && NT > 1) _tile_dpbssd(3, 5, 7);
  } else {
    _tile_dpbusd(0, 4, 6);
    if constexpr (NT > 1) _tile_dpbusd(1, 4, 7);
    if constexpr (MT > 1) _tile_dpbusd(2, 5, 6);
    if constexpr (MT > 1 && NT > 1) _tile_dpbusd(3, 5, 7);
  }
}

// C[MT*16 rows, NT*16 cols] at (A, n0) over all of K; `valid` columns of the last column tile
// are stored (16 = all).
template <bool kSigned, int MT, int NT>
SOCLLM_AMX_TARGET void tile_amx(const int8_t* A, int64_t lda, const VnniPack& pb, int64_t n0,
                                int64_t K, int32_t* C, int64_t ldc, int64_t valid_last) {
  amx_zero_c<MT, NT>();
  const int64_t b_stride = pb.cols * 4;
  for (int64_t k0 = 0; k0 < K; k0 += kAmxK)
    amx_step<kSigned, MT, NT>(A + k0, lda, pb.data.data() + (k0 / 4) * pb.cols + n0, b_stride);
  // Tile t = 2 * row tile + column tile (AMX intrinsics take tile numbers as literals); a
  // partial last column tile goes through `buf`.
  alignas(64) int32_t buf[kAmxRows * kAmxCols];
#define SOCLLM_AMX_STORE(t, i, j)                                                          \
  do {                                                                                     \
    int32_t* c = C + (i) * kAmxRows * ldc + (j) * kAmxCols;                                \
    if ((j) < NT - 1 || valid_last == kAmxCols) {                                          \
      _tile_stored(t, c, ldc * 4);                                                         \
    } else {                                                                               \
      _tile_stored(t, buf, kAmxCols * 4);                                                  \
      for (int64_t r = 0; r < kAmxRows; ++r)                                               \
        std::memcpy(c + r * ldc, buf + r * kAmxCols, static_cast<size_t>(valid_last) * 4); \
    }                                                                                      \
  } while (0)
  SOCLLM_AMX_STORE(0, 0, 0);
  if constexpr (NT > 1) SOCLLM_AMX_STORE(1, 0, 1);
  if constexpr (MT > 1) SOCLLM_AMX_STORE(2, 1, 0);
  if constexpr (MT > 1 && NT > 1) SOCLLM_AMX_STORE(3, 1, 1);
#undef SOCLLM_AMX_STORE
}

// One task of gemm_amx: rows [m0, m1) (whole tiles) of the column block at n0.
template <bool kSigned>
SOCLLM_AMX_TARGET void amx_task(const int8_t* A, int64_t lda, const VnniPack& pb, int32_t* C,
                                int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t N,
                                int64_t K) {
  const AmxTileConfig cfg = amx_config();
  _tile_loadconfig(&cfg);  // tile state is per thread
  const int64_t cols = std::min(2 * kAmxCols, N - n0);
  const bool two_cols = cols > kAmxCols;
  const int64_t valid_last = cols - (two_cols ? kAmxCols : 0);
  for (int64_t m = m0; m < m1; m += 2 * kAmxRows) {
    const int8_t* a = A + m * lda;
    int32_t* c = C + m * ldc + n0;
    const bool two_rows = m + 2 * kAmxRows <= m1;
    if (two_rows && two_cols) tile_amx<kSigned, 2, 2>(a, lda, pb, n0, K, c, ldc, valid_last);
    else if (two_rows) tile_amx<kSigned, 2, 1>(a, lda, pb, n0, K, c, ldc, valid_last);
    else if (two_cols) tile_amx<kSigned, 1, 2>(a, lda, pb, n0, K, c, ldc, valid_last);
    else tile_amx<kSigned, 1, 1>(a, lda, pb, n0, K, c, ldc, valid_last);
  }
  _tile_release();
}

// Rows [0, M) with M a multiple of 16 and K of 64 (gemm_amx_or_vnni checks).
template <typename TA>
void gemm_amx(const TA* A, int64_t lda, const VnniPack& pb, int32_t* C, int64_t ldc, int64_t M,
              int64_t N, int64_t K) {
  constexpr bool kSigned = std::is_same_v<TA, int8_t>;
  const auto* a8 = reinterpret_cast<const int8_t*>(A);  // tdpbusd reads the same bytes as u8
  const int64_t n_blocks = (N + 2 * kAmxCols - 1) / (2 * kAmxCols);
  const int64_t n_row_blocks = (M + kAmxRowBlock - 1) / kAmxRowBlock;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (M * N * K >= (int64_t{1} << 20))
  for (int64_t nb = 0; nb < n_blocks; ++nb)
    for (int64_t rb = 0; rb < n_row_blocks; ++rb)
      amx_task<kSigned>(a8, lda, pb, C, ldc, rb * kAmxRowBlock,
                        std::min(M, (rb + 1) * kAmxRowBlock), nb * 2 * kAmxCols, N, K);
}

// The AMX path where its tiles fit (K a multiple of 64, at least 16 rows), the VNNI path for
// the rest: both give the same bits.
template <typename TA>
void gemm_amx_or_vnni(const TA* A, int64_t lda, const VnniPack& pb, int32_t* C, int64_t ldc,
                      int64_t M, int64_t N, int64_t K) {
  const int64_t m_amx = K > 0 && K % kAmxK == 0 ? M / kAmxRows * kAmxRows : 0;
  if (m_amx > 0) gemm_amx(A, lda, pb, C, ldc, m_amx, N, K);
  if (m_amx < M) gemm_vnni(A + m_amx * lda, lda, pb, C + m_amx * ldc, ldc, M - m_amx, N, K);
}

// ---- Per-group GEMM (Q8_0 x Q8_0): integer dots per group, float accumulation over groups --
//
// The same packed codes and inner loops as above, restarted at every group boundary: after a
// group's vpdpbusd (or vpmaddwd) steps the int32 accumulators are converted (exact: |dot| <=
// 2^24) and added to float accumulators with a_scale * w_scale, in the fused multiply-add the
// scalar path computes with std::fma.

// Lanes [lo, hi) of the vector at column n holding columns of [c0, c1) (lo >= hi: none).
inline std::pair<int64_t, int64_t> lanes_in(int64_t n, int64_t width, int64_t c0, int64_t c1) {
  return {std::max<int64_t>(0, c0 - n), std::min(width, c1 - n)};
}

// GCC 12's _mm512_cvtepi32_ps passes an intentionally undefined source vector and then warns
// about it (-Wmaybe-uninitialized, a false positive inside avx512fintrin.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <int MR, int NV>
SOCLLM_VNNI_TARGET void tile_grouped_vnni(const uint8_t* A, int64_t lda, const float* as,
                                          int64_t lds, const PackedGroupedWeightsS8& W, int64_t n0,
                                          float* C, int64_t ldc, int64_t c0, int64_t c1) {
  const VnniPack& pb = *W.codes().vnni();
  const int64_t quads = W.group() / 4, ld = W.ld();
  __m512 facc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) facc[i][j] = _mm512_setzero_ps();
  const int32_t* bp = pb.data.data() + n0;
  for (int64_t g = 0; g < W.groups(); ++g) {
    __m512i acc[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_si512();
    const uint8_t* ag = A + g * W.group();
    for (int64_t q = 0; q < quads; ++q, bp += pb.cols) {
      __m512i b[NV];
      for (int j = 0; j < NV; ++j) b[j] = _mm512_loadu_si512(bp + j * kVnniCols);
      for (int i = 0; i < MR; ++i) {
        int32_t v;
        std::memcpy(&v, ag + i * lda + 4 * q, 4);
        const __m512i a = _mm512_set1_epi32(v);
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], a, b[j]);
      }
    }
    const float* ws = W.scales_t() + g * ld + n0;
    const int32_t* sh = W.group_shift() + g * ld + n0;
    for (int i = 0; i < MR; ++i) {
      const __m512 sa = _mm512_set1_ps(as[i * lds + g]);
      for (int j = 0; j < NV; ++j) {
        const __m512i dot =
            _mm512_sub_epi32(acc[i][j], _mm512_loadu_si512(sh + j * kVnniCols));  // undo +128
        const __m512 scale = _mm512_mul_ps(sa, _mm512_loadu_ps(ws + j * kVnniCols));
        facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, facc[i][j]);
      }
    }
  }
  for (int j = 0; j < NV; ++j) {
    const auto [lo, hi] = lanes_in(n0 + j * kVnniCols, kVnniCols, c0, c1);
    if (lo >= hi) continue;
    const auto m = static_cast<__mmask16>(((1u << (hi - lo)) - 1) << lo);
    for (int i = 0; i < MR; ++i)
      _mm512_mask_storeu_ps(C + i * ldc + n0 + j * kVnniCols, m, facc[i][j]);
  }
}
#pragma GCC diagnostic pop

template <int MR, int NV>
__attribute__((target("avx2,fma"))) void tile_grouped_avx2(const int16_t* A, int64_t lda,
                                                           const float* as, int64_t lds,
                                                           const PackedGroupedWeightsS8& W,
                                                           int64_t n0, float* C, int64_t ldc,
                                                           int64_t c0, int64_t c1) {
  const Avx2Pack& pb = *W.codes().avx2();
  const int64_t pairs = W.group() / 2, ld = W.ld();
  __m256 facc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) facc[i][j] = _mm256_setzero_ps();
  const int32_t* bp = pb.data.data() + n0;
  for (int64_t g = 0; g < W.groups(); ++g) {
    __m256i acc[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm256_setzero_si256();
    const int16_t* ag = A + g * W.group();
    for (int64_t q = 0; q < pairs; ++q, bp += pb.cols) {
      __m256i b[NV];
      for (int j = 0; j < NV; ++j)
        b[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bp + j * kAvx2Cols));
      for (int i = 0; i < MR; ++i) {
        int32_t v;
        std::memcpy(&v, ag + i * lda + 2 * q, 4);
        const __m256i a = _mm256_set1_epi32(v);
        for (int j = 0; j < NV; ++j)
          acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(a, b[j]));
      }
    }
    const float* ws = W.scales_t() + g * ld + n0;
    for (int i = 0; i < MR; ++i) {
      const __m256 sa = _mm256_set1_ps(as[i * lds + g]);
      for (int j = 0; j < NV; ++j) {
        const __m256 scale = _mm256_mul_ps(sa, _mm256_loadu_ps(ws + j * kAvx2Cols));
        facc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][j]), scale, facc[i][j]);
      }
    }
  }
  for (int j = 0; j < NV; ++j) {
    const auto [lo, hi] = lanes_in(n0 + j * kAvx2Cols, kAvx2Cols, c0, c1);
    if (lo >= hi) continue;
    for (int i = 0; i < MR; ++i) {
      alignas(32) float tmp[kAvx2Cols];
      _mm256_store_ps(tmp, facc[i][j]);
      std::memcpy(C + i * ldc + n0 + j * kAvx2Cols + lo, tmp + lo,
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
  }
}

// The per-group GEMM on AMX tiles: per group, the int32 dots of a 32 x 32 block in four C
// tiles (one tile product per `chunk` k of the group), stored to `dot` and folded into float
// accumulators with the same fma per group as the VNNI tile (bit-identical). A is read as int8
// (tdpbssd), so no zero-point shift. Columns outside [c0, c1) are not written.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // _mm512_cvtepi32_ps, as above
template <int MT, int NT>
SOCLLM_AMX_AVX512_TARGET void tile_grouped_amx(const int8_t* A, int64_t lda, const float* as,
                                               int64_t lds, const PackedGroupedWeightsS8& W,
                                               int64_t n0, float* C, int64_t ldc, int64_t c0,
                                               int64_t c1, int64_t chunk) {
  const VnniPack& pb = *W.codes().vnni();
  const int64_t gs = W.group(), ld = W.ld(), b_stride = pb.cols * 4;
  constexpr int64_t kCols = 2 * kAmxCols;
  alignas(64) int32_t dot[2 * kAmxRows][kCols];
  __m512 facc[MT * kAmxRows][NT];
  for (auto& row : facc)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t g = 0; g < W.groups(); ++g) {
    amx_zero_c<MT, NT>();
    for (int64_t k0 = g * gs; k0 < (g + 1) * gs; k0 += chunk)
      amx_step<true, MT, NT>(A + k0, lda, pb.data.data() + (k0 / 4) * pb.cols + n0, b_stride);
    _tile_stored(0, &dot[0][0], kCols * 4);
    if constexpr (NT > 1) _tile_stored(1, &dot[0][kAmxCols], kCols * 4);
    if constexpr (MT > 1) _tile_stored(2, &dot[kAmxRows][0], kCols * 4);
    if constexpr (MT > 1 && NT > 1) _tile_stored(3, &dot[kAmxRows][kAmxCols], kCols * 4);
    const float* ws = W.scales_t() + g * ld + n0;
    for (int i = 0; i < MT * kAmxRows; ++i) {
      const __m512 sa = _mm512_set1_ps(as[i * lds + g]);
      for (int j = 0; j < NT; ++j) {
        const __m512 scale = _mm512_mul_ps(sa, _mm512_loadu_ps(ws + j * kAmxCols));
        const __m512 d = _mm512_cvtepi32_ps(_mm512_load_si512(&dot[i][j * kAmxCols]));
        facc[i][j] = _mm512_fmadd_ps(d, scale, facc[i][j]);
      }
    }
  }
  for (int j = 0; j < NT; ++j) {
    const auto [lo, hi] = lanes_in(n0 + j * kAmxCols, kAmxCols, c0, c1);
    if (lo >= hi) continue;
    const auto m = static_cast<__mmask16>(((1u << (hi - lo)) - 1) << lo);
    for (int i = 0; i < MT * kAmxRows; ++i)
      _mm512_mask_storeu_ps(C + i * ldc + n0 + j * kAmxCols, m, facc[i][j]);
  }
}
#pragma GCC diagnostic pop

// One task of gemm_grouped_amx: rows [m0, m1) (whole tiles) of 1 or 2 column tiles at n0.
SOCLLM_AMX_AVX512_TARGET void grouped_amx_task(const int8_t* A, int64_t lda, const float* as,
                                               int64_t lds, const PackedGroupedWeightsS8& W,
                                               float* C, int64_t ldc, int64_t m0, int64_t m1,
                                               int64_t n0, int64_t col_tiles, int64_t c0,
                                               int64_t c1, int64_t chunk) {
  const AmxTileConfig cfg = amx_config(static_cast<int>(chunk));
  _tile_loadconfig(&cfg);
  for (int64_t m = m0; m < m1; m += 2 * kAmxRows) {
    const bool two_rows = m + 2 * kAmxRows <= m1;
    auto run = [&]<int R, int N>() {
      tile_grouped_amx<R, N>(A + m * lda, lda, as + m * lds, lds, W, n0, C + m * ldc, ldc, c0, c1,
                             chunk);
    };
    if (two_rows && col_tiles > 1) run.template operator()<2, 2>();
    else if (two_rows) run.template operator()<2, 1>();
    else if (col_tiles > 1) run.template operator()<1, 2>();
    else run.template operator()<1, 1>();
  }
  _tile_release();
}

// Rows [0, M) (a multiple of 16) of the columns [c0, c1), in tasks of (32 columns, 128 rows).
void gemm_grouped_amx(const int8_t* A, int64_t lda, const float* as, int64_t lds,
                      const PackedGroupedWeightsS8& W, float* C, int64_t ldc, int64_t M, int64_t c0,
                      int64_t c1, int64_t chunk) {
  const int64_t t0 = c0 / kAmxCols, t1 = (c1 + kAmxCols - 1) / kAmxCols;  // column tiles
  const int64_t n_blocks = (t1 - t0 + 1) / 2;
  const int64_t n_row_blocks = (M + kAmxRowBlock - 1) / kAmxRowBlock;
#pragma omp parallel for collapse(2) \
    schedule(dynamic, 1) if (M * (c1 - c0) * W.k() >= (int64_t{1} << 20))
  for (int64_t nb = 0; nb < n_blocks; ++nb)
    for (int64_t rb = 0; rb < n_row_blocks; ++rb) {
      const int64_t tile = t0 + 2 * nb;
      grouped_amx_task(A, lda, as, lds, W, C, ldc, rb * kAmxRowBlock,
                       std::min(M, (rb + 1) * kAmxRowBlock), tile * kAmxCols,
                       std::min<int64_t>(2, t1 - tile), c0, c1, chunk);
    }
}
#endif  // __x86_64__

void gemm_grouped_scalar(const int8_t* A, int64_t lda, const float* as, int64_t lds,
                         const PackedGroupedWeightsS8& W, float* C, int64_t ldc, int64_t M,
                         int64_t c0, int64_t c1) {
  const int8_t* B = W.codes().rows().data();
  const int64_t K = W.k(), gs = W.group();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = c0; n < c1; ++n) {
      float acc = 0.0f;
      for (int64_t g = 0; g < W.groups(); ++g) {
        int32_t dot = 0;
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k)
          dot += int32_t{A[m * lda + k]} * B[n * K + k];
        const float scale = as[m * lds + g] * W.scales_t()[g * W.ld() + n];
        acc = std::fma(static_cast<float>(dot), scale, acc);
      }
      C[m * ldc + n] = acc;
    }
}

#if defined(__x86_64__)
// Runs tile(rows_tag, vecs_tag, m, n0) over rows [0, M) (of K columns) and the column blocks
// touching [c0, c1), in parallel over (column block, row block): MR x NV tiles, single rows at a
// row block's end, and single vectors where a whole block would read beyond the packed columns.
template <int MR, int NV, typename Tile>
void grouped_blocks(int64_t M, int64_t K, int64_t width, int64_t packed_cols, int64_t c0,
                    int64_t c1, Tile tile) {
  using R = std::integral_constant<int, MR>;
  using V = std::integral_constant<int, NV>;
  using One = std::integral_constant<int, 1>;
  constexpr int64_t kRowBlock = 16 * MR;
  const int64_t block_cols = width * NV;
  const int64_t nb0 = c0 / block_cols, n_col_blocks = (c1 + block_cols - 1) / block_cols - nb0;
  const int64_t n_row_blocks = (M + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for collapse(2) \
    schedule(dynamic, 1) if (M * (c1 - c0) * K >= (int64_t{1} << 20))
  for (int64_t cb = 0; cb < n_col_blocks; ++cb)
    for (int64_t rb = 0; rb < n_row_blocks; ++rb) {
      const int64_t n0 = (nb0 + cb) * block_cols;
      const int64_t m0 = rb * kRowBlock, m1 = std::min(M, m0 + kRowBlock);
      if (n0 + block_cols <= packed_cols) {
        int64_t m = m0;
        for (; m + MR <= m1; m += MR) tile(R{}, V{}, m, n0);
        for (; m < m1; ++m) tile(One{}, V{}, m, n0);
      } else {
        for (int64_t n = n0; n < c1; n += width) {
          int64_t m = m0;
          for (; m + MR <= m1; m += MR) tile(R{}, One{}, m, n);
          for (; m < m1; ++m) tile(One{}, One{}, m, n);
        }
      }
    }
}
#endif  // __x86_64__

// K beyond which int32 accumulation could wrap for operand type TA (gemm_s8.h).
template <typename TA>
constexpr int64_t max_exact_k() {
  return std::is_same_v<TA, uint8_t> ? kMaxExactKU8S8 : kMaxExactKS8S8;
}

void check_args(const char* fn, const void* A, int64_t lda, const void* B, int64_t ldb,
                const void* C, int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa,
                int64_t max_k) {
  if (M < 0 || N < 0 || K < 0)
    throw ShapeError(std::string("[") + fn + "] negative size M=" + std::to_string(M) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K));
  if (K > max_k)
    throw ShapeError(std::string("[") + fn + "] K=" + std::to_string(K) +
                     " is beyond the exact int32 range (K <= " + std::to_string(max_k) + ")");
  if (lda < K || ldb < K || ldc < N)
    throw ShapeError(std::string("[") + fn + "] leading dimensions lda=" + std::to_string(lda) +
                     " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) +
                     " too small for K=" + std::to_string(K) + " N=" + std::to_string(N));
  if ((M && K && !A) || (N && K && !B) || (M && N && !C))
    throw InvalidArgument(std::string("[") + fn + "] null operand");
  bool ok = false;
  for (Isa s : supported_isas()) ok |= s == isa;
  if (!ok)
    throw Unsupported(std::string("[") + fn + "] this CPU does not support the " + isa_name(isa) +
                      " path");
}

// The kernel of one path on unpacked B; arguments already checked.
template <typename TA>
void run_path(const TA* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc,
              int64_t M, int64_t N, int64_t K, Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case Isa::AmxInt8: return gemm_amx_or_vnni(A, lda, pack_b_vnni(B, ldb, N, K), C, ldc, M, N, K);
    case Isa::Avx512Vnni: return gemm_vnni(A, lda, pack_b_vnni(B, ldb, N, K), C, ldc, M, N, K);
    case Isa::Avx2: return gemm_avx2(A, lda, pack_b_avx2(B, ldb, N, K), C, ldc, M, N, K);
#endif
#if defined(__aarch64__)
    case Isa::Neon:
    case Isa::Dotprod:
    case Isa::I8mm: return arm::gemm(A, lda, B, ldb, C, ldc, M, N, K, isa);
#endif
    default: return gemm_scalar(A, lda, B, ldb, C, ldc, M, N, K);  // check_args refused the rest
  }
}

template <typename TA>
void gemm_dispatch(const char* fn, const TA* A, int64_t lda, const int8_t* B, int64_t ldb,
                   int32_t* C, int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa) {
  check_args(fn, A, lda, B, ldb, C, ldc, M, N, K, isa, max_exact_k<TA>());
  if (M == 0 || N == 0) return;
  run_path(A, lda, B, ldb, C, ldc, M, N, K, isa);
}

}  // namespace

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512Vnni: return "avx512-vnni";
    case Isa::AmxInt8: return "amx-int8";
    case Isa::Neon: return "neon";
    case Isa::Dotprod: return "dotprod";
    case Isa::I8mm: return "i8mm";
  }
  return "?";
}

Isa isa_from_name(const std::string& name) {
  for (Isa i :
       {Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::AmxInt8, Isa::Neon, Isa::Dotprod, Isa::I8mm})
    if (isa_name(i) == name) return i;
  throw InvalidArgument("[isa] unknown instruction set '" + name +
                        "' (scalar, avx2, avx512-vnni, amx-int8, neon, dotprod, i8mm)");
}

namespace {
// Every path of the architecture this was compiled for, in order of width.
std::vector<Isa> architecture_isas() {
#if defined(__x86_64__)
  return {Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::AmxInt8};
#elif defined(__aarch64__)
  return {Isa::Scalar, Isa::Neon, Isa::Dotprod, Isa::I8mm};
#else
  return {Isa::Scalar};
#endif
}

#if defined(__x86_64__)
// AMX needs the CPU's AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24, 25) and, on Linux, the
// process's permission to use the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM), which a
// kernel without AMX support refuses.
bool amx_int8_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!((edx >> 24) & 1u) || !((edx >> 25) & 1u)) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif  // __x86_64__
}  // namespace

std::vector<Isa> supported_isas() {
  // The CPU does not change while the process runs: detect once (this is on every GEMM call).
  static const std::vector<Isa> isas = [] {
    std::vector<Isa> out{Isa::Scalar};
#if defined(__aarch64__)
    out.push_back(Isa::Neon);  // Advanced SIMD is part of every AArch64 core
    if (arm::cpu_has_dotprod()) out.push_back(Isa::Dotprod);
    if (arm::cpu_has_i8mm()) out.push_back(Isa::I8mm);
#endif
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) out.push_back(Isa::Avx2);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni")) {
      out.push_back(Isa::Avx512Vnni);
      if (amx_int8_usable()) out.push_back(Isa::AmxInt8);  // its tails run on the VNNI path
    }
#endif
    return out;
  }();
  return isas;
}

Isa best_isa() {
  // SOCLLM_MAX_ISA caps the dispatch (like oneDNN's ONEDNN_MAX_CPU_ISA), so one machine can
  // measure the narrower paths the plans would take on older CPUs (scripts/bench_eval.py).
  static const Isa best = [] {
    const Isa hw = supported_isas().back();
    const char* cap = std::getenv("SOCLLM_MAX_ISA");
    if (cap == nullptr || *cap == '\0') return hw;
    Isa capped;
    try {
      capped = isa_from_name(cap);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("SOCLLM_MAX_ISA: ") + e.what());
    }
    const auto arch = architecture_isas();
    if (std::find(arch.begin(), arch.end(), capped) == arch.end()) {
      std::string names;
      for (Isa i : arch) names += (names.empty() ? "" : ", ") + isa_name(i);
      throw InvalidArgument(std::string("SOCLLM_MAX_ISA: '") + cap +
                            "' is not a path of this architecture (" + names + ")");
    }
    // The widest supported path not wider than the cap (the enum orders each architecture's).
    Isa best = Isa::Scalar;
    for (Isa i : supported_isas())
      if (i <= capped) best = i;
    return best;
  }();
  return best;
}

void gemm_s8s8s32(const int8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa) {
  gemm_dispatch("gemm_s8s8s32", A, lda, B, ldb, C, ldc, M, N, K, isa);
}

PackedWeightsS8::PackedWeightsS8(const int8_t* B, int64_t ldb, int64_t N, int64_t K,
                                 std::optional<Isa> only)
    : n_(N), k_(K) {
  if (N < 0 || K < 0 || ldb < K || (N && K && !B))
    throw ShapeError("[PackedWeightsS8] bad weights N=" + std::to_string(N) +
                     " K=" + std::to_string(K) + " ldb=" + std::to_string(ldb));
  if (K > kMaxExactKS8S8)
    throw ShapeError("[PackedWeightsS8] K=" + std::to_string(K) +
                     " is beyond the exact int32 range (K <= " + std::to_string(kMaxExactKS8S8) +
                     ")");
  rows_.resize(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(rows_.data() + n * K, B + n * ldb, static_cast<size_t>(K));
  const auto isas = supported_isas();
  const auto has = [&](Isa i) {
    if (only && *only != i && !(i == Isa::Avx512Vnni && *only == Isa::AmxInt8)) return false;
    return std::find(isas.begin(), isas.end(), i) != isas.end();
  };
#if defined(__x86_64__)
  has_vnni_ = has(Isa::Avx512Vnni);
  if (has_vnni_) vnni_ = pack_b_vnni(rows_.data(), K, N, K);
  has_avx2_ = has(Isa::Avx2);
  if (has_avx2_) avx2_ = pack_b_avx2(rows_.data(), K, N, K);
#endif
#if defined(__aarch64__)
  has_dotprod_ = has(Isa::Dotprod);
  if (has_dotprod_) dotprod_ = arm::pack_b_dotprod(rows_.data(), K, N, K);
  has_i8mm_ = has(Isa::I8mm);
  if (has_i8mm_) i8mm_ = arm::pack_b_i8mm(rows_.data(), K, N, K);
#endif
}

int64_t PackedWeightsS8::bytes() const {
  return static_cast<int64_t>(
      rows_.size() + i8mm_.data.size() +
      (vnni_.data.size() + vnni_.shift.size() + avx2_.data.size() + dotprod_.data.size()) *
          sizeof(int32_t));
}

void gemm_s8s8s32_packed(const int8_t* A, int64_t lda, const PackedWeightsS8& W, int32_t* C,
                         int64_t ldc, int64_t M, Isa isa) {
  gemm_s8s8s32_packed_cols(A, lda, W, C, ldc, M, W.n(), isa);
}

// The packs' columns are independent: the first N of them are a GEMM with N columns (the
// packed row stride stays the pack's).
void gemm_s8s8s32_packed_cols(const int8_t* A, int64_t lda, const PackedWeightsS8& W, int32_t* C,
                              int64_t ldc, int64_t M, int64_t n_cols, Isa isa) {
  const int64_t N = n_cols, K = W.k();
  if (n_cols < 0 || n_cols > W.n())
    throw ShapeError("[gemm_s8s8s32_packed] columns " + std::to_string(n_cols) + " of " +
                     std::to_string(W.n()));
  check_args("gemm_s8s8s32_packed", A, lda, W.rows().data(), K, C, ldc, M, N, K, isa,
             kMaxExactKS8S8);
  // scalar and neon run on the rows every pack keeps; the others need their own layout
  const bool packed_for_isa = isa == Isa::Scalar || isa == Isa::Neon ||
                              ((isa == Isa::AmxInt8 || isa == Isa::Avx512Vnni) && W.vnni()) ||
                              (isa == Isa::Avx2 && W.avx2()) ||
                              (isa == Isa::Dotprod && W.dotprod()) ||
                              (isa == Isa::I8mm && W.i8mm());
  if (!packed_for_isa)
    throw InvalidArgument("[gemm_s8s8s32_packed] the weights were packed without the " +
                          isa_name(isa) + " layout");
  if (M == 0 || N == 0) return;
#if defined(__x86_64__)
  if (isa == Isa::AmxInt8) return gemm_amx_or_vnni(A, lda, *W.vnni(), C, ldc, M, N, K);
  if (isa == Isa::Avx512Vnni) return gemm_vnni(A, lda, *W.vnni(), C, ldc, M, N, K);
  if (isa == Isa::Avx2) return gemm_avx2(A, lda, *W.avx2(), C, ldc, M, N, K);
#endif
#if defined(__aarch64__)
  if (isa == Isa::Dotprod || isa == Isa::I8mm)
    return arm::gemm_packed(A, lda, W, N, C, ldc, M, isa);
#endif
  run_path(A, lda, W.rows().data(), K, C, ldc, M, N, K, isa);
}

void gemm_u8s8s32(const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa) {
  gemm_dispatch("gemm_u8s8s32", A, lda, B, ldb, C, ldc, M, N, K, isa);
}

PackedGroupedWeightsS8::PackedGroupedWeightsS8(const int8_t* B, int64_t ldb, const float* scales,
                                               int64_t N, int64_t K, int64_t group)
    : codes_(B, ldb, N, K), group_(group) {
  if (group <= 0 || group > kMaxGroupSize || K % group != 0)
    throw ShapeError("[PackedGroupedWeightsS8] group size " + std::to_string(group) +
                     " must be in 1.." + std::to_string(kMaxGroupSize) +
                     " and divide K=" + std::to_string(K));
  if (N && K && !scales) throw InvalidArgument("[PackedGroupedWeightsS8] null scales");
  const int64_t G = groups();
  // VNNI's and sdot's column padding (AVX2's and smmla's divide it): every path's columns fit.
  constexpr int64_t kWidestCols = 16;
  ld_ = (N + kWidestCols - 1) / kWidestCols * kWidestCols;
  scales_t_.assign(static_cast<size_t>(G * ld_), 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) scales_t_[g * ld_ + n] = scales[n * G + g];
  if (codes_.vnni()) {
    shift_.assign(static_cast<size_t>(G * ld_), 0);
    const int8_t* rows = codes_.rows().data();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) {
        int32_t sum = 0;
        for (int64_t k = g * group; k < (g + 1) * group; ++k) sum += rows[n * K + k];
        shift_[g * ld_ + n] = 128 * sum;  // |sum| <= 1024 * 128: no overflow
      }
  }
}

int64_t PackedGroupedWeightsS8::bytes() const {
  return codes_.bytes() +
         static_cast<int64_t>(scales_t_.size() * sizeof(float) + shift_.size() * sizeof(int32_t));
}

void gemm_grouped_s8s8f32(const int8_t* A, int64_t lda, const float* a_scales, int64_t lds,
                          const PackedGroupedWeightsS8& W, float* C, int64_t ldc, int64_t M,
                          int64_t col_begin, int64_t col_end, Isa isa) {
  const int64_t N = W.n(), K = W.k();
  check_args("gemm_grouped_s8s8f32", A, lda, W.codes().rows().data(), K, C, ldc, M, N, K, isa,
             kMaxExactKS8S8);
  if (col_begin < 0 || col_end > N || col_begin > col_end)
    throw ShapeError("[gemm_grouped_s8s8f32] columns [" + std::to_string(col_begin) + ", " +
                     std::to_string(col_end) + ") outside [0, " + std::to_string(N) + ")");
  if (lds < W.groups() || (M && W.groups() && !a_scales))
    throw ShapeError("[gemm_grouped_s8s8f32] activation scales need " + std::to_string(W.groups()) +
                     " per row, lds=" + std::to_string(lds));
  if (M == 0 || col_begin == col_end) return;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m) std::fill(C + m * ldc + col_begin, C + m * ldc + col_end, 0.f);
    return;
  }
#if defined(__aarch64__)
  if (isa != Isa::Scalar)
    return arm::gemm_grouped(A, lda, a_scales, lds, W, C, ldc, M, col_begin, col_end, isa);
#endif
#if defined(__x86_64__)
  const int64_t gs = W.group();
  // A path whose operand step does not divide the group runs the next narrower one (all paths
  // give the same bits). AMX takes whole 16-row blocks when a group is 4..64 k or a multiple
  // of 64 (one or more tile products per group); its row tail runs on VNNI.
  if (isa == Isa::AmxInt8) {
    const int64_t chunk = gs % kAmxK == 0 ? kAmxK : gs;
    const int64_t m_amx = gs % 4 == 0 && chunk <= kAmxK ? M / kAmxRows * kAmxRows : 0;
    if (m_amx > 0)
      gemm_grouped_amx(A, lda, a_scales, lds, W, C, ldc, m_amx, col_begin, col_end, chunk);
    if (m_amx < M)
      gemm_grouped_s8s8f32(A + m_amx * lda, lda, a_scales + m_amx * lds, lds, W, C + m_amx * ldc,
                           ldc, M - m_amx, col_begin, col_end, Isa::Avx512Vnni);
    return;
  }
  if (isa == Isa::Avx512Vnni && gs % 4 != 0) isa = Isa::Avx2;
  if (isa == Isa::Avx2 && gs % 2 != 0) isa = Isa::Scalar;
  if (isa == Isa::Avx512Vnni) {
    const uint8_t* a = shift_pad_a(A, lda, M, K, K);
    grouped_blocks<6, 2>(M, K, kVnniCols, W.codes().vnni()->cols, col_begin, col_end,
                         [&](auto r, auto v, int64_t m, int64_t n0) {
                           tile_grouped_vnni<decltype(r)::value, decltype(v)::value>(
                               a + m * K, K, a_scales + m * lds, lds, W, n0, C + m * ldc, ldc,
                               col_begin, col_end);
                         });
  } else if (isa == Isa::Avx2) {
    const int16_t* a = widen_pad_a(A, lda, M, K, K);
    grouped_blocks<6, 2>(M, K, kAvx2Cols, W.codes().avx2()->cols, col_begin, col_end,
                         [&](auto r, auto v, int64_t m, int64_t n0) {
                           tile_grouped_avx2<decltype(r)::value, decltype(v)::value>(
                               a + m * K, K, a_scales + m * lds, lds, W, n0, C + m * ldc, ldc,
                               col_begin, col_end);
                         });
  } else {
    gemm_grouped_scalar(A, lda, a_scales, lds, W, C, ldc, M, col_begin, col_end);
  }
#else
  gemm_grouped_scalar(A, lda, a_scales, lds, W, C, ldc, M, col_begin, col_end);
#endif
}

}  // namespace socllm::kernels
