// Dense fits (soc/fit.h) on cases solved by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "core/core.h"
#include "expect_error.h"
#include "soc/fit.h"

using namespace socllm;

TEST(Fit, LeastSquaresOfAnExactSystemIsItsSolution) {
  // 2x + y = 5, x - y = 1, x + y = 3: consistent, x = 2, y = 1
  const std::vector<double> A = {2, 1, 1, -1, 1, 1}, b = {5, 1, 3};
  const auto x = fit::linear_least_squares(A, 3, 2, b);
  EXPECT_NEAR(x[0], 2.0, 1e-12);
  EXPECT_NEAR(x[1], 1.0, 1e-12);
}

TEST(Fit, WeightedMeanIsTheWeightedLeastSquaresConstant) {
  // a constant fitted to 1, 2, 4 with weights 1, 1, 2: (1 + 2 + 8) / 4
  const std::vector<double> A = {1, 1, 1}, b = {1, 2, 4}, w = {1, 1, 2};
  EXPECT_NEAR(fit::linear_least_squares(A, 3, 1, b, w)[0], 11.0 / 4.0, 1e-12);
}

TEST(Fit, PolyfitLineThroughSeed000Latencies) {
  // 1, 2, 4 heads: 2, 3, 4 ms (seed 000 §3.4). Least squares by hand: slope = Sxy / Sxx with
  // mean x = 7/3, mean y = 3: Sxy = 4/3 + 5/3 = 3, Sxx = (16 + 1 + 25) / 9 = 14/3, so slope
  // 9/14 and intercept 3 - 9/14 * 7/3 = 3/2.
  const auto c = fit::polyfit(std::vector<double>{1, 2, 4}, std::vector<double>{2, 3, 4}, 1);
  EXPECT_NEAR(c[0], 9.0 / 14.0, 1e-12);
  EXPECT_NEAR(c[1], 1.5, 1e-12);
}

TEST(Fit, PolyfitRecoversSmallCoefficientsAtLargeX) {
  // y = 3e-6 x^2 + 0.5 x + 7 at x ~ 1e6 (token counts, bytes): the powers span 12 orders of
  // magnitude, and the constant must still come back.
  std::vector<double> x, y;
  for (double v : {1e6, 1.5e6, 2e6, 3e6, 4e6}) {
    x.push_back(v);
    y.push_back(3e-6 * v * v + 0.5 * v + 7.0);
  }
  const auto c = fit::polyfit(x, y, 2);
  EXPECT_NEAR(c[0], 3e-6, 1e-15);
  EXPECT_NEAR(c[1], 0.5, 1e-8);
  EXPECT_NEAR(c[2], 7.0, 1e-2);
}

TEST(Fit, RooflineRecoversAMemoryBoundModel) {
  // times made by t = 50 us + bytes / (20 GB/s) (compute never binds at 1e6 Gop/s): the grid
  // point nearest 20 GB/s (10^(6 * 2168 / 6000 - 3) = 20.04) and an overhead near 50
  const std::vector<double> flops = {1e6, 2e6, 4e6}, bytes = {1e6, 4e6, 1.6e7};
  std::vector<double> t;
  for (double b : bytes) t.push_back(50.0 + b / 20e3);
  const auto r = fit::fit_roofline(flops, bytes, t, 1e6);
  EXPECT_NEAR(r.weight_gbps, 20.0, 0.05);
  EXPECT_NEAR(r.overhead_us, 50.0, 2.0);
  EXPECT_LT(r.squared_relative_error, 1e-5);
}

TEST(Fit, LevenbergMarquardtFindsRosenbrocksMinimum) {
  // residuals (1 - x, 10 (y - x²)): minimum 0 at (1, 1)
  const auto f = [](const std::vector<double>& x) {
    return std::vector<double>{1 - x[0], 10 * (x[1] - x[0] * x[0])};
  };
  const auto r = fit::least_squares_bounded(f, {-1.2, 1.0}, {}, {}, {1e-7, 1e-14, 1e-14, 5000});
  EXPECT_TRUE(r.converged);
  EXPECT_NEAR(r.x[0], 1.0, 1e-5);
  EXPECT_NEAR(r.x[1], 1.0, 1e-5);
  // with x <= 0.5 the minimum is on the bound: x = 0.5, y = 0.25
  const std::vector<double> lo = {-2, -2}, hi = {0.5, 2};
  const auto b = fit::least_squares_bounded(f, {-1.2, 1.0}, lo, hi, {1e-7, 1e-14, 1e-14, 5000});
  EXPECT_DOUBLE_EQ(b.x[0], 0.5);
  EXPECT_NEAR(b.x[1], 0.25, 1e-5);
  EXPECT_NEAR(b.cost, 0.5 * 0.25, 1e-8);
}

TEST(Fit, BadInput) {
  expect_error<ShapeError>(
      [] { fit::linear_least_squares(std::vector<double>{1, 2}, 2, 2, std::vector<double>{1, 2}); },
      "A has 2 values, expected 4");
  expect_error<InvalidArgument>(
      [] {
        fit::linear_least_squares(std::vector<double>{1}, 1, 1, std::vector<double>{1},
                                  std::vector<double>{-1});
      },
      "weights[0] = -1.000000 is negative");
  expect_error<InvalidArgument>(
      [] { fit::least_squares_bounded([](const auto&) { return std::vector<double>{}; }, {1}); },
      "returned no residuals");
}
