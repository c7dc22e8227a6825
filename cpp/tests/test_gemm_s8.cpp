// Exact INT8 GEMM: every dispatch path equals an int64 reference, bit for bit.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/core.h"
#include "kernels/gemm_s8.h"

namespace k = socllm::kernels;

namespace {
template <typename TA>
std::vector<int32_t> reference(const std::vector<TA>& A, int64_t lda, const std::vector<int8_t>& B,
                               int64_t ldb, int64_t M, int64_t N, int64_t K) {
  std::vector<int32_t> C(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int64_t kk = 0; kk < K; ++kk) acc += int64_t{A[m * lda + kk]} * B[n * ldb + kk];
      C[m * N + n] = static_cast<int32_t>(acc);
    }
  return C;
}

template <typename TA>
void check_all_paths(int64_t M, int64_t N, int64_t K, int pad, uint32_t seed, bool extremes) {
  const int64_t lda = K + pad, ldb = K + pad;  // pad > 0: rows not contiguous / misaligned
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> da(std::is_same_v<TA, uint8_t> ? 0 : -128,
                                        std::is_same_v<TA, uint8_t> ? 255 : 127);
  std::uniform_int_distribution<int> db(-128, 127);
  std::vector<TA> A(static_cast<size_t>(std::max<int64_t>(1, M * lda)));
  std::vector<int8_t> B(static_cast<size_t>(std::max<int64_t>(1, N * ldb)));
  for (auto& x : A)
    x = static_cast<TA>(extremes ? (std::is_same_v<TA, uint8_t> ? 255 : -128) : da(g));
  for (auto& x : B) x = static_cast<int8_t>(extremes ? -128 : db(g));
  const auto ref = reference(A, lda, B, ldb, M, N, K);
  for (k::Isa isa : k::supported_isas()) {
    std::vector<int32_t> C(static_cast<size_t>(std::max<int64_t>(1, M * N)), 12345);
    if constexpr (std::is_same_v<TA, int8_t>)
      k::gemm_s8s8s32(A.data(), lda, B.data(), ldb, C.data(), N, M, N, K, isa);
    else k::gemm_u8s8s32(A.data(), lda, B.data(), ldb, C.data(), N, M, N, K, isa);
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_EQ(C[i], ref[i]) << k::isa_name(isa) << " M=" << M << " N=" << N << " K=" << K
                              << " pad=" << pad << " at " << i;
  }
}
}  // namespace

TEST(GemmS8, ScalarIsAlwaysAvailable) {
  EXPECT_EQ(k::supported_isas().front(), k::Isa::Scalar);
  EXPECT_EQ(k::isa_from_name(k::isa_name(k::best_isa())), k::best_isa());
  EXPECT_THROW(k::isa_from_name("sse9"), socllm::InvalidArgument);
}

TEST(GemmS8, DetectedPathsAreTheExpectedOnes) {
  // scripts/test_aarch64.sh names the paths each emulated CPU must offer (qemu -cpu) and the one
  // SOCLLM_MAX_ISA leaves, so its log shows which kernels run-time detection chose.
  std::string got;
  for (k::Isa isa : k::supported_isas()) got += (got.empty() ? "" : ",") + k::isa_name(isa);
  std::printf("[   isa    ] supported %s, best %s\n", got.c_str(),
              k::isa_name(k::best_isa()).c_str());
  if (const char* want = std::getenv("SOCLLM_EXPECT_ISAS")) EXPECT_EQ(got, want);
  if (const char* want = std::getenv("SOCLLM_EXPECT_BEST_ISA"))
    EXPECT_EQ(k::isa_name(k::best_isa()), want);
    // Another architecture's path is refused, not run.
#if defined(__aarch64__)
  const k::Isa foreign = k::Isa::Avx2;
#else
  const k::Isa foreign = k::Isa::Neon;
#endif
  std::vector<int8_t> a(4, 1), b(4, 1);
  int32_t c = 0;
  EXPECT_THROW(k::gemm_s8s8s32(a.data(), 4, b.data(), 4, &c, 1, 1, 1, 4, foreign),
               socllm::Unsupported);
  for (const char* name : {"neon", "dotprod", "i8mm"})
    EXPECT_EQ(k::isa_name(k::isa_from_name(name)), name);
}

TEST(GemmS8, AllPathsExactOverSizes) {
  uint32_t seed = 1;
  for (int64_t M : {0, 1, 3, 4, 7, 17})
    for (int64_t N : {0, 1, 5, 8, 13})
      for (int64_t K : {0, 1, 15, 16, 17, 63, 64, 65, 200})
        for (int pad : {0, 3}) {
          check_all_paths<int8_t>(M, N, K, pad, seed, false);
          check_all_paths<uint8_t>(M, N, K, pad, seed++, false);
        }
}

TEST(GemmS8, AmxTileShapesAndTails) {
  // K a multiple of 64 and M >= 16 run on AMX tiles where the CPU has them: 1 or 2 row and
  // column tiles per block, partial last column tiles (N % 16), row tails (M % 16) on VNNI, a
  // task boundary (128 rows), and padded leading dimensions. Other CPUs check the same shapes
  // on their widest path.
  uint32_t seed = 100;
  for (int64_t M : {16, 31, 32, 48, 130})
    for (int64_t N : {1, 16, 17, 40, 64})
      for (int64_t K : {64, 192, 576})
        for (int pad : {0, 5}) {
          check_all_paths<int8_t>(M, N, K, pad, seed, false);
          check_all_paths<uint8_t>(M, N, K, pad, seed++, false);
        }
  // The largest products on every element: sums of 4096 * 2^14 = 2^26 in each accumulator.
  check_all_paths<int8_t>(32, 48, 4096, 0, 9, true);
  check_all_paths<uint8_t>(32, 48, 4096, 0, 9, true);
}

TEST(GemmS8, ExtremeValuesAndLongK) {
  // -128 x -128 everywhere is the largest product; K = 4099 crosses every vector width.
  check_all_paths<int8_t>(5, 6, 4099, 1, 7, true);
  check_all_paths<uint8_t>(5, 6, 4099, 1, 7, true);
  check_all_paths<int8_t>(9, 11, 3000, 0, 8, false);
}

TEST(GemmS8, BadArguments) {
  std::vector<int8_t> a(16), b(16);
  std::vector<int32_t> c(16);
  EXPECT_THROW(k::gemm_s8s8s32(a.data(), 2, b.data(), 4, c.data(), 4, 2, 2, 4, k::Isa::Scalar),
               socllm::ShapeError);
  EXPECT_THROW(k::gemm_s8s8s32(a.data(), 4, b.data(), 4, c.data(), 4, -1, 2, 4, k::Isa::Scalar),
               socllm::ShapeError);
}

TEST(GemmS8, PrepackedWeightsEqualUnpacked) {
  std::mt19937 g(11);
  std::uniform_int_distribution<int> d(-128, 127);
  for (auto [M, N, K] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 19, 65}, {13, 70, 300}, {40, 70, 128}}) {
    std::vector<int8_t> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(N * (K + 2)));
    for (auto& x : A) x = static_cast<int8_t>(d(g));
    for (auto& x : B) x = static_cast<int8_t>(d(g));
    k::PackedWeightsS8 W(B.data(), K + 2, N, K);
    EXPECT_EQ(W.n(), N);
    for (k::Isa isa : k::supported_isas()) {
      std::vector<int32_t> c1(static_cast<size_t>(M * N)), c2(c1.size());
      k::gemm_s8s8s32(A.data(), K, B.data(), K + 2, c1.data(), N, M, N, K, isa);
      k::gemm_s8s8s32_packed(A.data(), K, W, c2.data(), N, M, isa);
      EXPECT_EQ(c1, c2) << k::isa_name(isa);
    }
  }
}

namespace {
// The grouped GEMM's defined result (gemm_s8.h), written independently of the kernel: int64 dot
// per group, then acc = fma(dot, a_scale * w_scale, acc) over ascending groups.
std::vector<float> grouped_reference(const std::vector<int8_t>& A, const std::vector<float>& sa,
                                     const std::vector<int8_t>& B, const std::vector<float>& sw,
                                     int64_t M, int64_t N, int64_t K, int64_t gs) {
  const int64_t G = K / gs;
  std::vector<float> C(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t g = 0; g < G; ++g) {
        int64_t dot = 0;
        for (int64_t kk = g * gs; kk < (g + 1) * gs; ++kk)
          dot += int64_t{A[m * K + kk]} * B[n * K + kk];
        acc = std::fma(static_cast<float>(dot), sa[m * G + g] * sw[n * G + g], acc);
      }
      C[m * N + n] = acc;
    }
  return C;
}

struct GroupedCase {
  std::vector<int8_t> A, B;
  std::vector<float> sa, sw;
};

GroupedCase random_grouped(int64_t M, int64_t N, int64_t K, int64_t gs, uint32_t seed,
                           bool extremes) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(-128, 127);
  std::uniform_real_distribution<float> s(1e-3f, 2.0f);
  GroupedCase c{std::vector<int8_t>(static_cast<size_t>(M * K)),
                std::vector<int8_t>(static_cast<size_t>(N * K)),
                std::vector<float>(static_cast<size_t>(M * (K / gs))),
                std::vector<float>(static_cast<size_t>(N * (K / gs)))};
  for (auto& x : c.A) x = static_cast<int8_t>(extremes ? -128 : d(g));
  for (auto& x : c.B) x = static_cast<int8_t>(extremes ? -128 : d(g));
  for (auto& x : c.sa) x = s(g);
  for (auto& x : c.sw) x = s(g);
  return c;
}
}  // namespace

TEST(GemmGroupedS8, AllPathsEqualTheDefinedSumOrder) {
  uint32_t seed = 100;
  for (int64_t gs : {1, 2, 4, 6, 32, 48})  // 4, 32 and 48 also run on AMX tiles (M >= 16)
    for (int64_t M : {1, 3, 4, 5, 13, 16, 70})
      for (int64_t N : {1, 7, 16, 31, 33, 100})
        for (int64_t groups : {1, 3}) {
          const int64_t K = gs * groups;
          const GroupedCase c = random_grouped(M, N, K, gs, seed++, false);
          const k::PackedGroupedWeightsS8 W(c.B.data(), K, c.sw.data(), N, K, gs);
          const auto ref = grouped_reference(c.A, c.sa, c.B, c.sw, M, N, K, gs);
          for (k::Isa isa : k::supported_isas()) {
            std::vector<float> C(static_cast<size_t>(M * N), -1.0f);
            k::gemm_grouped_s8s8f32(c.A.data(), K, c.sa.data(), K / gs, W, C.data(), N, M, 0, N,
                                    isa);
            for (int64_t i = 0; i < M * N; ++i)
              ASSERT_EQ(C[i], ref[i]) << k::isa_name(isa) << " gs=" << gs << " M=" << M
                                      << " N=" << N << " K=" << K << " at " << i;
          }
        }
}

TEST(GemmGroupedS8, ExtremeCodesAndLargeGroups) {
  // -128 x -128 over a 1024-wide group is the largest dot (2^24): still exact as a float.
  // 32 rows: AMX tiles where the CPU has them, 64 k per tile product (16 of them per group).
  for (auto [gs, M] :
       std::vector<std::array<int64_t, 2>>{{1024, 5}, {64, 5}, {1024, 32}, {128, 32}}) {
    const int64_t N = 37, K = 2048;
    const GroupedCase c = random_grouped(M, N, K, gs, 7, gs == 1024);
    const k::PackedGroupedWeightsS8 W(c.B.data(), K, c.sw.data(), N, K, gs);
    const auto ref = grouped_reference(c.A, c.sa, c.B, c.sw, M, N, K, gs);
    for (k::Isa isa : k::supported_isas()) {
      std::vector<float> C(static_cast<size_t>(M * N));
      k::gemm_grouped_s8s8f32(c.A.data(), K, c.sa.data(), K / gs, W, C.data(), N, M, 0, N, isa);
      EXPECT_EQ(C, ref) << k::isa_name(isa) << " gs=" << gs;
    }
  }
}

TEST(GemmGroupedS8, ColumnBlocksEqualTheWholeAndLeaveTheRestAlone) {
  // A partitioned linear computes blocks of columns; each must carry the whole GEMM's bits.
  // 9 rows run on vectors; 37 and 48 rows on AMX tiles (with a 5-row tail) where there are any.
  for (int64_t M : {9, 37, 48}) {
    const int64_t N = 75, K = 96, gs = 32;
    const GroupedCase c = random_grouped(M, N, K, gs, 3, false);
    const k::PackedGroupedWeightsS8 W(c.B.data(), K, c.sw.data(), N, K, gs);
    const auto ref = grouped_reference(c.A, c.sa, c.B, c.sw, M, N, K, gs);
    for (k::Isa isa : k::supported_isas()) {
      for (auto [c0, c1] : std::vector<std::array<int64_t, 2>>{{5, 40}, {16, 48}, {70, 75}}) {
        std::vector<float> C(static_cast<size_t>(M * N), 7.0f);
        k::gemm_grouped_s8s8f32(c.A.data(), K, c.sa.data(), K / gs, W, C.data(), N, M, c0, c1, isa);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(C[m * N + n], n >= c0 && n < c1 ? ref[m * N + n] : 7.0f)
                << k::isa_name(isa) << " M=" << M << " columns [" << c0 << ", " << c1 << ") m=" << m
                << " n=" << n;
      }
      std::vector<float> C(static_cast<size_t>(M * N), 7.0f);  // the whole, block by block
      for (auto [c0, c1] : std::vector<std::array<int64_t, 2>>{{5, 40}, {40, N}, {0, 5}})
        k::gemm_grouped_s8s8f32(c.A.data(), K, c.sa.data(), K / gs, W, C.data(), N, M, c0, c1, isa);
      EXPECT_EQ(C, ref) << k::isa_name(isa) << " M=" << M;
    }
  }
}

TEST(GemmGroupedS8, BadArguments) {
  std::vector<int8_t> b(64);
  std::vector<float> s(8, 1.0f), c(16);
  EXPECT_THROW(k::PackedGroupedWeightsS8(b.data(), 16, s.data(), 4, 16, 5), socllm::ShapeError);
  EXPECT_THROW(k::PackedGroupedWeightsS8(b.data(), 16, nullptr, 4, 16, 8), socllm::InvalidArgument);
  const k::PackedGroupedWeightsS8 W(b.data(), 16, s.data(), 4, 16, 8);
  EXPECT_EQ(W.groups(), 2);
  std::vector<int8_t> a(32);
  EXPECT_THROW(
      k::gemm_grouped_s8s8f32(a.data(), 16, s.data(), 2, W, c.data(), 4, 2, 0, 5, k::Isa::Scalar),
      socllm::ShapeError);  // columns beyond N
  EXPECT_THROW(
      k::gemm_grouped_s8s8f32(a.data(), 16, s.data(), 1, W, c.data(), 4, 2, 0, 4, k::Isa::Scalar),
      socllm::ShapeError);  // one scale per row for two groups
}

// The first n_cols columns of a packed GEMM (a causal row block's visible keys) equal the
// scalar reference's, on every path; the other columns are left as they were.
namespace {
// Random int8 A [M, K] and B [N, K] and their product by the scalar path.
struct RandomGemm {
  std::vector<int8_t> A, B;
  std::vector<int32_t> ref;
  RandomGemm(unsigned seed, int64_t M, int64_t N, int64_t K)
      : A(static_cast<size_t>(M * K)),
        B(static_cast<size_t>(N * K)),
        ref(static_cast<size_t>(M * N)) {
    std::mt19937 g(seed);
    std::uniform_int_distribution<int> d(-128, 127);
    for (auto& x : A) x = static_cast<int8_t>(d(g));
    for (auto& x : B) x = static_cast<int8_t>(d(g));
    k::gemm_s8s8s32(A.data(), K, B.data(), K, ref.data(), N, M, N, K, k::Isa::Scalar);
  }
};
}  // namespace

TEST(GemmS8, PackedColumnPrefixEqualsScalarAndLeavesTheRest) {
  const int64_t M = 13, N = 70, K = 64;
  const RandomGemm r(13, M, N, K);
  const auto& [A, B, ref] = r;
  const k::PackedWeightsS8 W(B.data(), K, N, K);
  for (k::Isa isa : k::supported_isas())
    for (int64_t cols : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{33}, N}) {
      std::vector<int32_t> c(static_cast<size_t>(M * N), 12345);
      k::gemm_s8s8s32_packed_cols(A.data(), K, W, c.data(), N, M, cols, isa);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(c[m * N + n], n < cols ? ref[m * N + n] : 12345)
              << k::isa_name(isa) << " cols " << cols << " at " << m << "," << n;
    }
  std::vector<int32_t> c(static_cast<size_t>(M * N));
  EXPECT_THROW(k::gemm_s8s8s32_packed_cols(A.data(), K, W, c.data(), N, M, N + 1, k::Isa::Scalar),
               socllm::ShapeError);
}

// Weights packed for one path run on it (and on the scalar path) with the same result; another
// path is refused, not read from an absent layout.
TEST(GemmS8, WeightsPackedForOnePath) {
  const int64_t M = 5, N = 40, K = 64;
  const RandomGemm r(17, M, N, K);
  const auto& [A, B, ref] = r;
  const auto isas = k::supported_isas();
  for (k::Isa only : isas) {
    const k::PackedWeightsS8 W(B.data(), K, N, K, only);
    for (k::Isa isa : isas) {
      std::vector<int32_t> c(ref.size());
      const bool layout = isa == only || isa == k::Isa::Scalar ||
                          (only == k::Isa::AmxInt8 && isa == k::Isa::Avx512Vnni) ||
                          (only == k::Isa::Avx512Vnni && isa == k::Isa::AmxInt8) ||
                          isa == k::Isa::Neon;
      if (layout) {
        k::gemm_s8s8s32_packed(A.data(), K, W, c.data(), N, M, isa);
        EXPECT_EQ(c, ref) << "packed for " << k::isa_name(only) << ", run on " << k::isa_name(isa);
      } else {
        EXPECT_THROW(k::gemm_s8s8s32_packed(A.data(), K, W, c.data(), N, M, isa),
                     socllm::InvalidArgument)
            << "packed for " << k::isa_name(only) << ", run on " << k::isa_name(isa);
      }
    }
  }
}
