// Exact INT8 GEMM: every dispatch path equals an int64 reference, bit for bit.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <vector>

#include "socllm/core.h"
#include "socllm/gemm_s8.h"

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
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 19, 65}, {13, 70, 300}}) {
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
