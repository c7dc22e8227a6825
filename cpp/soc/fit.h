// SoC layer: the dense fits device numbers come from, on Eigen (DESIGN.md: Eigen for the dense
// fits and solvers). The device profiles' cost models are fitted to seed measurements by
// python/socllm/devices/fit.py and scripts/fit_cost_model.py, the end-to-end characterizations
// by scripts/llmnpu_e2e_fit.py and scripts/edgeflow_coldstart.py; they call these.
//
// Every function throws InvalidArgument for empty or mismatched inputs and non-finite values,
// naming what it was given; ShapeError for inconsistent sizes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace socllm::fit {

// The x minimising Σ w_i (A_i·x - b_i)² (w = 1 if empty): A is [rows, cols] row-major. Solved by
// column-pivoting Householder QR on the √w-scaled system, so a rank-deficient A gives a basic
// least-squares solution instead of garbage.
std::vector<double> linear_least_squares(std::span<const double> A, int64_t rows, int64_t cols,
                                         std::span<const double> b, std::span<const double> w = {});

// numpy.polyfit(x, y, degree): the coefficients of the least-squares polynomial, highest power
// first.
std::vector<double> polyfit(std::span<const double> x, std::span<const double> y, int degree);

// A matmul cost model t = overhead + max(flops / compute rate, weight bytes / weight rate)
// fitted to measured times (seed 001 Table 3; soc.h CostModel's roofline) for a fixed compute
// rate: the weight rate by a log-spaced search (10^log10_min .. 10^log10_max GB/s, `points`
// points), the overhead then in closed form as the non-negative minimiser of the squared
// relative error Σ ((overhead + roof_i) / t_i - 1)².
struct RooflineFit {
  double overhead_us = 0;
  double weight_gbps = 0;
  double squared_relative_error = 0;
};
RooflineFit fit_roofline(std::span<const double> flops, std::span<const double> weight_bytes,
                         std::span<const double> t_us, double compute_gops, double log10_min = -3.0,
                         double log10_max = 3.0, int64_t points = 6001);

// Non-linear least squares with bounds: the x in [lo, hi] (empty: unbounded) minimising
// ½ Σ r_i(x)², by Levenberg-Marquardt on a forward-difference Jacobian (step diff_step ·
// max(|x_j|, 1), taken inward at an upper bound) with every step projected into the box: the
// fits here have a handful of parameters and each residual costs a simulation, so evaluations,
// not algebra, are what is counted. Stops when the cost falls by less than ftol (relative),
// the step is below xtol (relative), or after max_evals residual evaluations.
struct BoundedFitOptions {
  double diff_step = 1e-3;
  double ftol = 1e-10;
  double xtol = 1e-10;
  int64_t max_evals = 2000;
};
struct BoundedFit {
  std::vector<double> x;
  std::vector<double> residuals;
  double cost = 0;  // ½ Σ r²
  int64_t evals = 0;
  bool converged = false;
};
using Residuals = std::function<std::vector<double>(const std::vector<double>&)>;
BoundedFit least_squares_bounded(const Residuals& residuals, std::vector<double> x0,
                                 std::span<const double> lo = {}, std::span<const double> hi = {},
                                 const BoundedFitOptions& o = {});

}  // namespace socllm::fit
