// Hadamard transforms (issue 39): Paley's matrices against their defining property, the fast
// transform against a dense product in double, both paths, the constructions chosen, errors.
#include "kernels/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "core/core.h"
#include "expect_error.h"

namespace k = socllm::kernels;
using Path = k::HadamardTransform::Path;

// H_m Hᵀ_m = m I, with +-1 entries, for Paley I and II orders up to 140 (each the smallest order
// for its size, so the transform of that size uses it).
TEST(Hadamard, PaleyMatricesAreHadamard) {
  int64_t orders = 0;
  for (int64_t m : {12, 20, 28, 36, 44, 60, 68, 76, 84, 108, 140}) {
    const k::HadamardTransform t(m);
    ASSERT_EQ(t.base_order(), m) << t.construction();
    const auto& H = t.base();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        ASSERT_TRUE(H[i * m + j] == 1 || H[i * m + j] == -1);
        int64_t dot = 0;
        for (int64_t c = 0; c < m; ++c) dot += H[i * m + c] * H[j * m + c];
        ASSERT_EQ(dot, i == j ? m : 0) << t.construction() << " rows " << i << ", " << j;
      }
    ++orders;
  }
  EXPECT_EQ(orders, 11);
  EXPECT_EQ(k::HadamardTransform(28).construction(), "paley2(q=13)");
}

// The sizes our models need and the construction each takes (hadamard.h).
TEST(Hadamard, ConstructionsOfTheModelsSizes) {
  EXPECT_EQ(k::HadamardTransform(576).construction(), "paley2(q=17) x sylvester(16)");
  EXPECT_EQ(k::HadamardTransform(1536).construction(), "paley1(q=11) x sylvester(128)");
  EXPECT_EQ(k::HadamardTransform(640).construction(), "paley1(q=19) x sylvester(32)");
  EXPECT_EQ(k::HadamardTransform(64).construction(), "sylvester(64)");
  EXPECT_EQ(k::HadamardTransform(1).construction(), "sylvester(1)");
  EXPECT_EQ(k::HadamardTransform(2048).base_order(), 1);
}

// apply = the dense H / sqrt(n) (built from the closed forms: Sylvester's entry is
// (-1)^popcount(i & j)) times x, in double, on both paths and transposed; both paths give the
// same bits; the transform then its transpose is the identity.
TEST(Hadamard, FastTransformEqualsDenseProductOnEveryPath) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (int64_t n : {1, 2, 8, 64, 12, 36, 576, 640, 1536}) {
    const k::HadamardTransform t(n);
    const int64_t m = t.base_order(), p = n / m, rows = 3, ld = n + 5;
    std::vector<float> x(static_cast<size_t>(rows * ld));
    for (auto& v : x) v = nd(rng);
    for (bool transpose : {false, true}) {
      std::vector<double> ref(static_cast<size_t>(rows * n), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) {
            const int64_t a = (transpose ? j : i) / p, c = (transpose ? i : j) / p;
            const int hm = m == 1 ? 1 : t.base()[a * m + c];
            const int hp = std::popcount(static_cast<uint64_t>((i % p) & (j % p))) % 2 ? -1 : 1;
            ref[r * n + i] += hm * hp * double{x[r * ld + j]} / std::sqrt(double(n));
          }
      std::vector<float> ys = x, yv = x;
      t.apply(ys.data(), rows, ld, transpose, Path::Scalar);
      t.apply(yv.data(), rows, ld, transpose, Path::Vector);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_NEAR(yv[r * ld + i], ref[r * n + i], 2e-6 * std::sqrt(double(n)))
              << t.construction() << " transpose " << transpose;
          ASSERT_EQ(yv[r * ld + i], ys[r * ld + i]) << t.construction() << " paths differ";
        }
        for (int64_t i = n; i < ld; ++i) ASSERT_EQ(yv[r * ld + i], x[r * ld + i]);  // untouched
      }
      t.apply(yv.data(), rows, ld, !transpose);
      for (int64_t j = 0; j < rows * ld; ++j) ASSERT_NEAR(yv[j], x[j], 1e-5) << t.construction();
    }
    // the dense matrix is orthonormal and is what apply multiplies by
    const auto M = t.matrix();
    for (int64_t i = 0; i < std::min<int64_t>(n, 40); ++i) {
      double dot = 0;
      for (int64_t c = 0; c < n; ++c) dot += double{M[i * n + c]} * M[((i + 7) % n) * n + c];
      ASSERT_NEAR(dot, i == (i + 7) % n ? 1.0 : 0.0, 1e-5) << t.construction();
    }
  }
}

TEST(Hadamard, SizesWithoutAConstructionAndBadShapesAreErrors) {
  expect_error<socllm::InvalidArgument>([] { k::HadamardTransform(0); }, "got 0");
  expect_error<socllm::InvalidArgument>([] { k::HadamardTransform(9); },
                                        "no construction for size 9");
  expect_error<socllm::InvalidArgument>([] { k::HadamardTransform(18); }, "size 18");
  // 43 * 64: 172, 344 and 688 are no Paley orders (QuaRot tabulates a 172 from Sloane's library)
  expect_error<socllm::InvalidArgument>([] { k::HadamardTransform(43 * 64); }, "size 2752");
  EXPECT_EQ(k::HadamardTransform(6 * 1024).base_order(), 12);  // 3 * 2^11: 12 (Paley I) x 512
  const k::HadamardTransform t(64);
  std::vector<float> x(64);
  expect_error<socllm::ShapeError>([&] { t.apply(x.data(), 1, 32); }, "row stride 32");
}
