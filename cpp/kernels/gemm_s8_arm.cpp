// The AArch64 paths of the exact INT8 GEMMs: Neon (smull + sadalp, any Armv8-A core), Dotprod
// (sdot) and I8mm (smmla). The last two are compiled for their extension function by function
// (target attributes, as the x86 paths are) and entered only after the hwcap check, so nothing
// else in the library, inlined templates included, can pick up an instruction an older core
// lacks. uint8 A runs as int8 A - 128 (bit 7 flipped) plus 128 * sum_k B[n, k] per column:
// exact in wrapping int32 arithmetic, the mirror of the VNNI path's zero-point shift.
#include "kernels/gemm_s8_arm.h"

#include <arm_neon.h>
#include <sys/auxv.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

// The strings arm_neon.h itself uses around vdotq/vmmlaq (GCC 12), so its intrinsics inline.
#define SOCLLM_DOTPROD_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#define SOCLLM_I8MM_TARGET __attribute__((target("arch=armv8.2-a+i8mm")))

namespace socllm::kernels::arm {

bool cpu_has_dotprod() { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
bool cpu_has_i8mm() { return (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0; }

namespace {

using detail::DotprodPack;
using detail::I8mmPack;

constexpr int64_t kParallelWork = int64_t{1} << 20;  // M * N * K below this: one thread

inline int8_t signed_of(int8_t a) { return a; }
inline int8_t signed_of(uint8_t a) { return static_cast<int8_t>(a ^ 0x80u); }  // a - 128

// A as int8 rows of `ld` >= K bytes, zero-padded (uint8 A shifted by -128).
template <typename TA>
std::vector<int8_t> signed_pad_a(const TA* A, int64_t lda, int64_t M, int64_t K, int64_t ld) {
  std::vector<int8_t> out(static_cast<size_t>(M * ld), 0);
#pragma omp parallel for schedule(static) if (M * K >= kParallelWork)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      out[static_cast<size_t>(m * ld + k)] = signed_of(A[m * lda + k]);
  return out;
}

// 128 * sum_k B[n, k] per column: what shifting uint8 A by -128 took away. Empty for int8 A.
template <typename TA>
std::vector<int32_t> column_shift(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  if constexpr (std::is_same_v<TA, int8_t>) return {};
  std::vector<int32_t> shift(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    uint32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += static_cast<uint32_t>(int32_t{B[n * ldb + k]});
    shift[static_cast<size_t>(n)] = static_cast<int32_t>(sum * 128u);
  }
  return shift;
}

// Writes (or, for a later K block, adds) one output value; adds wrap like the accumulators.
inline void put(int32_t* c, int32_t v, const int32_t* shift, int64_t n, bool accumulate) {
  uint32_t x = static_cast<uint32_t>(v);
  if (accumulate) x += static_cast<uint32_t>(*c);
  else if (shift != nullptr) x += static_cast<uint32_t>(shift[n]);
  *c = static_cast<int32_t>(x);
}

// ---- Neon: smull (int8 x int8 -> int16, exact) and sadalp (pairs into int32) on B's rows -----

// out[j] = sum_k a[k] * b[j][k] for NB rows of B, wrapping int32 like the reference.
template <int NB>
void dots_neon(const int8_t* a, const int8_t* const* b, int64_t K, int32_t* out) {
  int32x4_t acc[NB];
  for (int j = 0; j < NB; ++j) acc[j] = vdupq_n_s32(0);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const int8x16_t av = vld1q_s8(a + k);
    for (int j = 0; j < NB; ++j) {
      const int8x16_t bv = vld1q_s8(b[j] + k);
      acc[j] = vpadalq_s16(acc[j], vmull_s8(vget_low_s8(av), vget_low_s8(bv)));
      acc[j] = vpadalq_s16(acc[j], vmull_high_s8(av, bv));
    }
  }
  for (; k + 8 <= K; k += 8) {
    const int8x8_t av = vld1_s8(a + k);
    for (int j = 0; j < NB; ++j) acc[j] = vpadalq_s16(acc[j], vmull_s8(av, vld1_s8(b[j] + k)));
  }
  for (int j = 0; j < NB; ++j) {
    uint32_t s = static_cast<uint32_t>(vaddvq_s32(acc[j]));
    for (int64_t t = k; t < K; ++t) s += static_cast<uint32_t>(int32_t{a[t]} * b[j][t]);
    out[j] = static_cast<int32_t>(s);
  }
}

constexpr int64_t kNeonColBlock = 64;  // columns per task: their B rows stay in L2 across rows

void gemm_neon(const int8_t* A, int64_t lda, const int8_t* B, int64_t ldb, const int32_t* shift,
               int32_t* C, int64_t ldc, int64_t M, int64_t N, int64_t K) {
  const int64_t n_blocks = (N + kNeonColBlock - 1) / kNeonColBlock;
#pragma omp parallel for collapse(2) schedule(static) if (M * N * K >= kParallelWork)
  for (int64_t nb = 0; nb < n_blocks; ++nb)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t n1 = std::min(N, (nb + 1) * kNeonColBlock);
      int64_t n = nb * kNeonColBlock;
      int32_t out[4];
      for (; n + 4 <= n1; n += 4) {
        const int8_t* b[4] = {B + n * ldb, B + (n + 1) * ldb, B + (n + 2) * ldb, B + (n + 3) * ldb};
        dots_neon<4>(A + m * lda, b, K, out);
        for (int j = 0; j < 4; ++j) put(C + m * ldc + n + j, out[j], shift, n + j, false);
      }
      for (; n < n1; ++n) {
        const int8_t* b = B + n * ldb;
        dots_neon<1>(A + m * lda, &b, K, out);
        put(C + m * ldc + n, out[0], shift, n, false);
      }
    }
}

// ---- Dotprod: sdot on B in the VNNI layout, one 16-byte load of A feeding 4 lanes -----------
//
// vdotq_laneq_s32(acc, b, a, l) adds, to each of the 4 columns in b, the dot of that column's 4
// bytes with bytes 4l .. 4l + 3 of a. A row's 16 bytes (4 quads of k) thus serve 4 steps
// against 4 consecutive rows of the packed B, with no horizontal sums.
constexpr int64_t kDotCols = 4;            // int32 lanes per register
constexpr int kDotRows = 4, kDotVecs = 4;  // 4 x 16 tile: 16 accumulators of 32 registers
constexpr int64_t kDotQuadBlock = 256;     // quads per K block: 16 KB of B per 16 columns
constexpr int64_t kDotRowBlock = 16 * kDotRows;

// Packs B[N, K] into [quads][cols] from blocks of 64 columns (source rows read forward).
DotprodPack pack_dotprod(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  DotprodPack p;
  p.quads = (K + 15) / 16 * 4;
  p.cols = (N + 15) / 16 * 16;
  p.data.assign(static_cast<size_t>(p.quads * p.cols), 0);
#pragma omp parallel for schedule(static) if (N * K >= kParallelWork)
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t n1 = std::min(N, n0 + 64);
    for (int64_t q = 0; 4 * q < K; ++q)
      for (int64_t n = n0; n < n1; ++n)
        std::memcpy(&p.data[static_cast<size_t>(q * p.cols + n)], B + n * ldb + 4 * q,
                    static_cast<size_t>(std::min<int64_t>(4, K - 4 * q)));
  }
  return p;
}

template <int L, int MR>
SOCLLM_DOTPROD_TARGET inline void sdot_lane(int32x4_t (&acc)[MR][kDotVecs],
                                            const int8x16_t (&a)[MR], const int32_t* b_row) {
  int8x16_t b[kDotVecs];
  for (int j = 0; j < kDotVecs; ++j) b[j] = vreinterpretq_s8_s32(vld1q_s32(b_row + j * kDotCols));
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kDotVecs; ++j) acc[i][j] = vdotq_laneq_s32(acc[i][j], b[j], a[i], L);
}

// One MR x 16 tile over the quads [q0, q1) (multiples of 4); `valid` columns are stored.
template <int MR>
SOCLLM_DOTPROD_TARGET void tile_dotprod(const int8_t* A, int64_t lda, const DotprodPack& pb,
                                        int64_t q0, int64_t q1, int64_t n0, int64_t valid,
                                        const int32_t* shift, int32_t* C, int64_t ldc,
                                        bool accumulate) {
  int32x4_t acc[MR][kDotVecs];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kDotVecs; ++j) acc[i][j] = vdupq_n_s32(0);
  const int64_t cols = pb.cols;
  const int32_t* bp = pb.data.data() + q0 * cols + n0;
  for (int64_t q = q0; q < q1; q += 4, bp += 4 * cols) {
    int8x16_t a[MR];
    for (int i = 0; i < MR; ++i) a[i] = vld1q_s8(A + i * lda + 4 * q);
    sdot_lane<0, MR>(acc, a, bp);
    sdot_lane<1, MR>(acc, a, bp + cols);
    sdot_lane<2, MR>(acc, a, bp + 2 * cols);
    sdot_lane<3, MR>(acc, a, bp + 3 * cols);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kDotVecs; ++j) {
      int32_t t[kDotCols];
      vst1q_s32(t, acc[i][j]);
      for (int64_t v = 0; v < kDotCols && j * kDotCols + v < valid; ++v) {
        const int64_t n = n0 + j * kDotCols + v;
        put(C + i * ldc + n, t[v], shift, n, accumulate);
      }
    }
}

// A: int8 rows of lda = pb.quads * 4 bytes (zero-padded).
void gemm_dotprod(const int8_t* A, int64_t lda, const DotprodPack& pb, const int32_t* shift,
                  int32_t* C, int64_t ldc, int64_t M, int64_t N) {
  constexpr int64_t block_cols = kDotCols * kDotVecs;
  const int64_t n_blocks = (N + block_cols - 1) / block_cols;
  const int64_t n_row_blocks = (M + kDotRowBlock - 1) / kDotRowBlock;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (M * N * pb.quads * 4 >= kParallelWork)
  for (int64_t nb = 0; nb < n_blocks; ++nb)
    for (int64_t rb = 0; rb < n_row_blocks; ++rb) {
      const int64_t n0 = nb * block_cols, valid = std::min(block_cols, N - n0);
      const int64_t m1 = std::min(M, (rb + 1) * kDotRowBlock);
      for (int64_t q0 = 0; q0 == 0 || q0 < pb.quads; q0 += kDotQuadBlock) {  // once for K = 0
        const int64_t q1 = std::min(pb.quads, q0 + kDotQuadBlock);
        int64_t m = rb * kDotRowBlock;
        for (; m + kDotRows <= m1; m += kDotRows)
          tile_dotprod<kDotRows>(A + m * lda, lda, pb, q0, q1, n0, valid, shift, C + m * ldc, ldc,
                                 q0 > 0);
        for (; m < m1; ++m)
          tile_dotprod<1>(A + m * lda, lda, pb, q0, q1, n0, valid, shift, C + m * ldc, ldc, q0 > 0);
      }
    }
}

// ---- I8mm: smmla, a 2 x 8 by 8 x 2 int8 product into a 2 x 2 int32 block per instruction ----
//
// A rows go in pairs, interleaved per 8 k (row 2r's 8 bytes, then row 2r + 1's), B columns in
// pairs likewise (I8mmPack); the accumulator of row pair r and column pair p holds
// [C(2r, 2p), C(2r, 2p + 1), C(2r + 1, 2p), C(2r + 1, 2p + 1)].
constexpr int kMmlaRowPairs = 4, kMmlaColPairs = 4;  // 8 x 8 tile: 16 accumulators
constexpr int64_t kMmlaCols = 2 * kMmlaColPairs;
constexpr int64_t kMmlaOctBlock = 128;  // octs per K block: 8 KB of B per 8 columns
constexpr int64_t kMmlaRowBlock = 64;   // rows per task

I8mmPack pack_i8mm(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  I8mmPack p;
  p.octs = (K + 7) / 8;
  p.cols = (N + kMmlaCols - 1) / kMmlaCols * kMmlaCols;
  p.data.assign(static_cast<size_t>(p.octs * p.cols * 8), 0);
#pragma omp parallel for schedule(static) if (N * K >= kParallelWork)
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const int64_t n1 = std::min(N, n0 + 64);
    for (int64_t o = 0; o < p.octs; ++o)
      for (int64_t n = n0; n < n1; ++n)
        std::memcpy(&p.data[static_cast<size_t>((o * p.cols / 2 + n / 2) * 16 + (n % 2) * 8)],
                    B + n * ldb + 8 * o, static_cast<size_t>(std::min<int64_t>(8, K - 8 * o)));
  }
  return p;
}

// A as [ceil(M / 2) row pairs][octs][16] int8 (uint8 shifted by -128), zero-padded.
template <typename TA>
std::vector<int8_t> interleave_a(const TA* A, int64_t lda, int64_t M, int64_t K, int64_t octs) {
  std::vector<int8_t> out(static_cast<size_t>((M + 1) / 2 * octs * 16), 0);
#pragma omp parallel for schedule(static) if (M * K >= kParallelWork)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      out[static_cast<size_t>(((m / 2) * octs + k / 8) * 16 + (m % 2) * 8 + k % 8)] =
          signed_of(A[m * lda + k]);
  return out;
}

// RP row pairs (from the pair at `a`, each octs * 16 bytes) x 8 columns over the octs [o0, o1);
// `rows` (<= 2 RP) rows and `valid` columns are stored.
template <int RP>
SOCLLM_I8MM_TARGET void tile_i8mm(const int8_t* a, int64_t octs, const I8mmPack& pb, int64_t o0,
                                  int64_t o1, int64_t n0, int64_t rows, int64_t valid,
                                  const int32_t* shift, int32_t* C, int64_t ldc, bool accumulate) {
  int32x4_t acc[RP][kMmlaColPairs];
  for (int r = 0; r < RP; ++r)
    for (int p = 0; p < kMmlaColPairs; ++p) acc[r][p] = vdupq_n_s32(0);
  const int64_t b_stride = pb.cols * 8;  // bytes per oct
  const int8_t* bp = pb.data.data() + o0 * b_stride + n0 * 8;
  for (int64_t o = o0; o < o1; ++o, bp += b_stride) {
    int8x16_t b[kMmlaColPairs];
    for (int p = 0; p < kMmlaColPairs; ++p) b[p] = vld1q_s8(bp + 16 * p);
    for (int r = 0; r < RP; ++r) {
      const int8x16_t av = vld1q_s8(a + (r * octs + o) * 16);
      for (int p = 0; p < kMmlaColPairs; ++p) acc[r][p] = vmmlaq_s32(acc[r][p], av, b[p]);
    }
  }
  for (int r = 0; r < RP; ++r) {
    int32_t t[kMmlaColPairs][4];
    for (int p = 0; p < kMmlaColPairs; ++p) vst1q_s32(t[p], acc[r][p]);
    for (int h = 0; h < 2 && 2 * r + h < rows; ++h)
      for (int64_t c = 0; c < valid; ++c)
        put(C + (2 * r + h) * ldc + n0 + c, t[c / 2][2 * h + c % 2], shift, n0 + c, accumulate);
  }
}

// A interleaved by interleave_a with pb.octs octs.
void gemm_i8mm(const int8_t* A, const I8mmPack& pb, const int32_t* shift, int32_t* C, int64_t ldc,
               int64_t M, int64_t N) {
  const int64_t octs = pb.octs, n_blocks = (N + kMmlaCols - 1) / kMmlaCols;
  const int64_t n_row_blocks = (M + kMmlaRowBlock - 1) / kMmlaRowBlock;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (M * N * octs * 8 >= kParallelWork)
  for (int64_t nb = 0; nb < n_blocks; ++nb)
    for (int64_t rb = 0; rb < n_row_blocks; ++rb) {
      const int64_t n0 = nb * kMmlaCols, valid = std::min(kMmlaCols, N - n0);
      const int64_t m1 = std::min(M, (rb + 1) * kMmlaRowBlock);
      for (int64_t o0 = 0; o0 == 0 || o0 < octs; o0 += kMmlaOctBlock) {  // once for K = 0
        const int64_t o1 = std::min(octs, o0 + kMmlaOctBlock);
        int64_t m = rb * kMmlaRowBlock;  // even: row blocks are whole pairs
        for (; m + 2 * kMmlaRowPairs <= m1; m += 2 * kMmlaRowPairs)
          tile_i8mm<kMmlaRowPairs>(A + m / 2 * octs * 16, octs, pb, o0, o1, n0, 2 * kMmlaRowPairs,
                                   valid, shift, C + m * ldc, ldc, o0 > 0);
        for (; m < m1; m += 2)
          tile_i8mm<1>(A + m / 2 * octs * 16, octs, pb, o0, o1, n0, std::min<int64_t>(2, m1 - m),
                       valid, shift, C + m * ldc, ldc, o0 > 0);
      }
    }
}

// ---- Per-group GEMM: the same inner products restarted per group, then one fma per group ----
//
// As on x86 (gemm_s8.cpp): acc = fma(float(dot_g), a_scale * w_scale, acc) over ascending
// groups, dot_g exact in int32 and exactly converted (|dot_g| <= 2^24), so every path gives the
// scalar reference's bits.

template <int MR, int NV>
SOCLLM_DOTPROD_TARGET void tile_grouped_dotprod(const int8_t* A, int64_t lda, const float* as,
                                                int64_t lds, const PackedGroupedWeightsS8& W,
                                                int64_t n0, float* C, int64_t ldc, int64_t c0,
                                                int64_t c1) {
  const DotprodPack& pb = *W.codes().dotprod();
  const int64_t quads = W.group() / 4, ld = W.ld();
  float32x4_t facc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) facc[i][j] = vdupq_n_f32(0.0f);
  const int32_t* bp = pb.data.data() + n0;
  for (int64_t g = 0; g < W.groups(); ++g) {
    int32x4_t acc[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = vdupq_n_s32(0);
    const int8_t* ag = A + g * W.group();
    for (int64_t q = 0; q < quads; ++q, bp += pb.cols) {
      int8x16_t b[NV];
      for (int j = 0; j < NV; ++j) b[j] = vreinterpretq_s8_s32(vld1q_s32(bp + j * kDotCols));
      for (int i = 0; i < MR; ++i) {
        int32_t v;
        std::memcpy(&v, ag + i * lda + 4 * q, 4);
        const int8x16_t a = vreinterpretq_s8_s32(vdupq_n_s32(v));
        for (int j = 0; j < NV; ++j) acc[i][j] = vdotq_s32(acc[i][j], b[j], a);
      }
    }
    const float* ws = W.scales_t() + g * ld + n0;
    for (int i = 0; i < MR; ++i) {
      const float32x4_t sa = vdupq_n_f32(as[i * lds + g]);
      for (int j = 0; j < NV; ++j) {
        const float32x4_t scale = vmulq_f32(sa, vld1q_f32(ws + j * kDotCols));
        facc[i][j] = vfmaq_f32(facc[i][j], vcvtq_f32_s32(acc[i][j]), scale);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) {
      float t[kDotCols];
      vst1q_f32(t, facc[i][j]);
      for (int64_t v = 0; v < kDotCols; ++v) {
        const int64_t n = n0 + j * kDotCols + v;
        if (n >= c0 && n < c1) C[i * ldc + n] = t[v];
      }
    }
}

// RP row pairs x 8 columns; `rows` (<= 2 RP) rows are valid, so a padded row's scale (beyond
// the caller's array) is never read.
template <int RP>
SOCLLM_I8MM_TARGET void tile_grouped_i8mm(const int8_t* a, int64_t octs, const float* as,
                                          int64_t lds, int64_t rows,
                                          const PackedGroupedWeightsS8& W, int64_t n0, float* C,
                                          int64_t ldc, int64_t c0, int64_t c1) {
  const I8mmPack& pb = *W.codes().i8mm();
  const int64_t group_octs = W.group() / 8, ld = W.ld(), b_stride = pb.cols * 8;
  float32x4_t facc[RP][kMmlaColPairs];
  for (int r = 0; r < RP; ++r)
    for (int p = 0; p < kMmlaColPairs; ++p) facc[r][p] = vdupq_n_f32(0.0f);
  const int8_t* bp = pb.data.data() + n0 * 8;
  for (int64_t g = 0; g < W.groups(); ++g) {
    int32x4_t acc[RP][kMmlaColPairs];
    for (int r = 0; r < RP; ++r)
      for (int p = 0; p < kMmlaColPairs; ++p) acc[r][p] = vdupq_n_s32(0);
    for (int64_t o = g * group_octs; o < (g + 1) * group_octs; ++o, bp += b_stride) {
      int8x16_t b[kMmlaColPairs];
      for (int p = 0; p < kMmlaColPairs; ++p) b[p] = vld1q_s8(bp + 16 * p);
      for (int r = 0; r < RP; ++r) {
        const int8x16_t av = vld1q_s8(a + (r * octs + o) * 16);
        for (int p = 0; p < kMmlaColPairs; ++p) acc[r][p] = vmmlaq_s32(acc[r][p], av, b[p]);
      }
    }
    const float* ws = W.scales_t() + g * ld + n0;
    for (int r = 0; r < RP; ++r) {
      const float s0 = as[2 * r * lds + g], s1 = 2 * r + 1 < rows ? as[(2 * r + 1) * lds + g] : 0.f;
      const float32x4_t sa = vcombine_f32(vdup_n_f32(s0), vdup_n_f32(s1));
      for (int p = 0; p < kMmlaColPairs; ++p) {
        const float32x2_t w = vld1_f32(ws + 2 * p);
        const float32x4_t scale = vmulq_f32(sa, vcombine_f32(w, w));
        facc[r][p] = vfmaq_f32(facc[r][p], vcvtq_f32_s32(acc[r][p]), scale);
      }
    }
  }
  for (int r = 0; r < RP; ++r) {
    float t[kMmlaColPairs][4];
    for (int p = 0; p < kMmlaColPairs; ++p) vst1q_f32(t[p], facc[r][p]);
    for (int h = 0; h < 2 && 2 * r + h < rows; ++h)
      for (int64_t c = 0; c < kMmlaCols; ++c) {
        const int64_t n = n0 + c;
        if (n >= c0 && n < c1) C[(2 * r + h) * ldc + n] = t[c / 2][2 * h + c % 2];
      }
  }
}

void gemm_grouped_neon(const int8_t* A, int64_t lda, const float* as, int64_t lds,
                       const PackedGroupedWeightsS8& W, float* C, int64_t ldc, int64_t M,
                       int64_t c0, int64_t c1) {
  const int8_t* B = W.codes().rows().data();
  const int64_t K = W.k(), gs = W.group(), ld = W.ld();
  const int64_t n_blocks = (c1 - c0 + kNeonColBlock - 1) / kNeonColBlock;
#pragma omp parallel for collapse(2) schedule(static) if (M * (c1 - c0) * K >= kParallelWork)
  for (int64_t nb = 0; nb < n_blocks; ++nb)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t n1 = std::min(c1, c0 + (nb + 1) * kNeonColBlock);
      for (int64_t n = c0 + nb * kNeonColBlock; n < n1; n += 4) {
        const int nc = static_cast<int>(std::min<int64_t>(4, n1 - n));
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t g = 0; g < W.groups(); ++g) {
          const int8_t* b[4];
          for (int j = 0; j < 4; ++j) b[j] = B + std::min(n + j, n1 - 1) * K + g * gs;
          int32_t dot[4];
          dots_neon<4>(A + m * lda + g * gs, b, gs, dot);
          for (int j = 0; j < nc; ++j) {
            const float scale = as[m * lds + g] * W.scales_t()[g * ld + n + j];
            acc[j] = std::fma(static_cast<float>(dot[j]), scale, acc[j]);
          }
        }
        for (int j = 0; j < nc; ++j) C[m * ldc + n + j] = acc[j];
      }
    }
}

// Runs tile(rows_tag, m, n0) over rows [0, M) in steps of `step` (1 at the end of a row block)
// and the column blocks of `width` touching [c0, c1), whole blocks lying inside the packing.
template <int MR, typename Tile>
void grouped_blocks(int64_t M, int64_t K, int64_t step, int64_t width, int64_t c0, int64_t c1,
                    Tile tile) {
  using R = std::integral_constant<int, MR>;
  using One = std::integral_constant<int, 1>;
  constexpr int64_t kRowBlock = 64;
  const int64_t nb0 = c0 / width, n_col_blocks = (c1 + width - 1) / width - nb0;
  const int64_t n_row_blocks = (M + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (M * (c1 - c0) * K >= kParallelWork)
  for (int64_t cb = 0; cb < n_col_blocks; ++cb)
    for (int64_t rb = 0; rb < n_row_blocks; ++rb) {
      const int64_t n0 = (nb0 + cb) * width;
      const int64_t m1 = std::min(M, (rb + 1) * kRowBlock);
      int64_t m = rb * kRowBlock;
      for (; m + MR * step <= m1; m += MR * step) tile(R{}, m, n0);
      for (; m < m1; m += step) tile(One{}, m, n0);
    }
}

}  // namespace

DotprodPack pack_b_dotprod(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  return pack_dotprod(B, ldb, N, K);
}

I8mmPack pack_b_i8mm(const int8_t* B, int64_t ldb, int64_t N, int64_t K) {
  return pack_i8mm(B, ldb, N, K);
}

template <typename TA>
void gemm(const TA* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc,
          int64_t M, int64_t N, int64_t K, Isa isa) {
  const std::vector<int32_t> shift = column_shift<TA>(B, ldb, N, K);
  const int32_t* sh = shift.empty() ? nullptr : shift.data();
  if (isa == Isa::I8mm) {
    const I8mmPack pb = pack_i8mm(B, ldb, N, K);
    gemm_i8mm(interleave_a(A, lda, M, K, pb.octs).data(), pb, sh, C, ldc, M, N);
  } else if (isa == Isa::Dotprod) {
    const DotprodPack pb = pack_dotprod(B, ldb, N, K);
    const std::vector<int8_t> a = signed_pad_a(A, lda, M, K, pb.quads * 4);
    gemm_dotprod(a.data(), pb.quads * 4, pb, sh, C, ldc, M, N);
  } else if constexpr (std::is_same_v<TA, int8_t>) {
    gemm_neon(A, lda, B, ldb, nullptr, C, ldc, M, N, K);
  } else {
    gemm_neon(signed_pad_a(A, lda, M, K, K).data(), K, B, ldb, sh, C, ldc, M, N, K);
  }
}

template void gemm<int8_t>(const int8_t*, int64_t, const int8_t*, int64_t, int32_t*, int64_t,
                           int64_t, int64_t, int64_t, Isa);
template void gemm<uint8_t>(const uint8_t*, int64_t, const int8_t*, int64_t, int32_t*, int64_t,
                            int64_t, int64_t, int64_t, Isa);

void gemm_packed(const int8_t* A, int64_t lda, const PackedWeightsS8& W, int64_t N, int32_t* C,
                 int64_t ldc, int64_t M, Isa isa) {
  const int64_t K = W.k();
  if (isa == Isa::I8mm) {
    const I8mmPack& pb = *W.i8mm();
    gemm_i8mm(interleave_a(A, lda, M, K, pb.octs).data(), pb, nullptr, C, ldc, M, N);
  } else if (isa == Isa::Dotprod) {
    const DotprodPack& pb = *W.dotprod();
    const std::vector<int8_t> a = signed_pad_a(A, lda, M, K, pb.quads * 4);
    gemm_dotprod(a.data(), pb.quads * 4, pb, nullptr, C, ldc, M, N);
  } else {
    gemm_neon(A, lda, W.rows().data(), K, nullptr, C, ldc, M, N, K);
  }
}

void gemm_grouped(const int8_t* A, int64_t lda, const float* as, int64_t lds,
                  const PackedGroupedWeightsS8& W, float* C, int64_t ldc, int64_t M, int64_t c0,
                  int64_t c1, Isa isa) {
  // A path whose operand step does not divide the group runs a narrower one (same bits).
  const int64_t gs = W.group(), K = W.k();
  if (isa == Isa::I8mm && gs % 8 != 0) isa = W.codes().dotprod() ? Isa::Dotprod : Isa::Neon;
  if (isa == Isa::Dotprod && gs % 4 != 0) isa = Isa::Neon;
  if (isa == Isa::I8mm) {
    const int64_t octs = W.codes().i8mm()->octs;
    const std::vector<int8_t> a = interleave_a(A, lda, M, K, octs);
    grouped_blocks<kMmlaRowPairs>(M, K, 2, kMmlaCols, c0, c1, [&](auto r, int64_t m, int64_t n0) {
      constexpr int rp = decltype(r)::value;
      tile_grouped_i8mm<rp>(a.data() + m / 2 * octs * 16, octs, as + m * lds, lds,
                            std::min<int64_t>(2 * rp, M - m), W, n0, C + m * ldc, ldc, c0, c1);
    });
  } else if (isa == Isa::Dotprod) {
    grouped_blocks<4>(M, K, 1, 2 * kDotCols, c0, c1, [&](auto r, int64_t m, int64_t n0) {
      tile_grouped_dotprod<decltype(r)::value, 2>(A + m * lda, lda, as + m * lds, lds, W, n0,
                                                  C + m * ldc, ldc, c0, c1);
    });
  } else {
    gemm_grouped_neon(A, lda, as, lds, W, C, ldc, M, c0, c1);
  }
}

}  // namespace socllm::kernels::arm
