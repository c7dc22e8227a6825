#include "soc/fit.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <string>

#include "core/core.h"

namespace socllm::fit {

namespace {

void check_finite(std::span<const double> v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw InvalidArgument("[fit] " + what + "[" + std::to_string(i) +
                            "] = " + std::to_string(v[i]) + " is not finite");
}

void check_size(size_t got, size_t want, const std::string& what) {
  if (got != want)
    throw ShapeError("[fit] " + what + " has " + std::to_string(got) + " values, expected " +
                     std::to_string(want));
}

double clamp_to(double v, std::span<const double> lo, std::span<const double> hi, size_t j) {
  if (!lo.empty()) v = std::max(v, lo[j]);
  if (!hi.empty()) v = std::min(v, hi[j]);
  return v;
}

}  // namespace

std::vector<double> linear_least_squares(std::span<const double> A, int64_t rows, int64_t cols,
                                         std::span<const double> b, std::span<const double> w) {
  if (rows <= 0 || cols <= 0)
    throw InvalidArgument("[fit] least squares needs rows and columns, got " +
                          std::to_string(rows) + " x " + std::to_string(cols));
  check_size(A.size(), static_cast<size_t>(rows * cols), "A");
  check_size(b.size(), static_cast<size_t>(rows), "b");
  if (!w.empty()) check_size(w.size(), static_cast<size_t>(rows), "weights");
  check_finite(A, "A");
  check_finite(b, "b");
  check_finite(w, "weights");
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] < 0)
      throw InvalidArgument("[fit] weights[" + std::to_string(i) + "] = " + std::to_string(w[i]) +
                            " is negative");
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMajor M = Eigen::Map<const RowMajor>(A.data(), rows, cols);
  Eigen::VectorXd y = Eigen::Map<const Eigen::VectorXd>(b.data(), rows);
  if (!w.empty()) {
    const Eigen::VectorXd s = Eigen::Map<const Eigen::VectorXd>(w.data(), rows).cwiseSqrt();
    M = s.asDiagonal() * M;
    y = s.asDiagonal() * y;
  }
  const Eigen::VectorXd x = M.colPivHouseholderQr().solve(y);
  return {x.data(), x.data() + x.size()};
}

std::vector<double> polyfit(std::span<const double> x, std::span<const double> y, int degree) {
  if (degree < 0)
    throw InvalidArgument("[fit] polyfit degree must be >= 0, got " + std::to_string(degree));
  check_size(y.size(), x.size(), "y");
  if (x.size() <= static_cast<size_t>(degree))
    throw InvalidArgument("[fit] polyfit of degree " + std::to_string(degree) +
                          " needs more than " + std::to_string(degree) + " points, got " +
                          std::to_string(x.size()));
  const auto cols = static_cast<size_t>(degree) + 1;
  std::vector<double> V(x.size() * cols), norm(cols, 0.0);
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < cols; ++j) {
      const double v = std::pow(x[i], static_cast<double>(static_cast<size_t>(degree) - j));
      V[i * cols + j] = v;
      norm[j] += v * v;
    }
  // Columns scaled to unit norm, as numpy.polyfit does: the powers of a large x span many
  // orders of magnitude, and the QR's rank threshold would otherwise drop the small ones.
  for (double& n : norm) n = n > 0 ? std::sqrt(n) : 1.0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < cols; ++j) V[i * cols + j] /= norm[j];
  auto c = linear_least_squares(V, static_cast<int64_t>(x.size()), static_cast<int64_t>(cols), y);
  for (size_t j = 0; j < cols; ++j) c[j] /= norm[j];
  return c;
}

RooflineFit fit_roofline(std::span<const double> flops, std::span<const double> weight_bytes,
                         std::span<const double> t_us, double compute_gops, double log10_min,
                         double log10_max, int64_t points) {
  if (t_us.empty()) throw InvalidArgument("[fit] fit_roofline needs measurements, got none");
  check_size(flops.size(), t_us.size(), "flops");
  check_size(weight_bytes.size(), t_us.size(), "weight_bytes");
  check_finite(flops, "flops");
  check_finite(weight_bytes, "weight_bytes");
  check_finite(t_us, "t_us");
  for (size_t i = 0; i < t_us.size(); ++i)
    if (!(t_us[i] > 0))
      throw InvalidArgument("[fit] t_us[" + std::to_string(i) + "] = " + std::to_string(t_us[i]) +
                            " must be > 0");
  if (!(compute_gops > 0) || points < 2 || !(log10_max > log10_min))
    throw InvalidArgument(
        "[fit] fit_roofline needs compute_gops > 0 and a grid of >= 2 points "
        "over an increasing range, got " +
        std::to_string(compute_gops) + ", " + std::to_string(points));
  const auto n = static_cast<Eigen::Index>(t_us.size());
  const Eigen::ArrayXd f = Eigen::Map<const Eigen::ArrayXd>(flops.data(), n);
  const Eigen::ArrayXd wb = Eigen::Map<const Eigen::ArrayXd>(weight_bytes.data(), n);
  const Eigen::ArrayXd t = Eigen::Map<const Eigen::ArrayXd>(t_us.data(), n);
  const Eigen::ArrayXd w = t.square().inverse();  // relative error: residuals divided by t
  RooflineFit best;
  best.squared_relative_error = HUGE_VAL;
  for (int64_t i = 0; i < points; ++i) {
    const double gbps =
        std::pow(10.0, log10_min + (log10_max - log10_min) * static_cast<double>(i) /
                                       static_cast<double>(points - 1));
    const Eigen::ArrayXd roof = (f / (compute_gops * 1e3)).max(wb / (gbps * 1e3));
    // overhead a >= 0 minimising Σ ((a + roof) / t - 1)²: a weighted mean of t - roof
    const double a = std::max(0.0, (w * (t - roof)).sum() / w.sum());
    const double err = ((a + roof) / t - 1.0).square().sum();
    if (err < best.squared_relative_error) best = {a, gbps, err};
  }
  return best;
}

BoundedFit least_squares_bounded(const Residuals& residuals, std::vector<double> x0,
                                 std::span<const double> lo, std::span<const double> hi,
                                 const BoundedFitOptions& o) {
  const size_t p = x0.size();
  if (p == 0) throw InvalidArgument("[fit] least_squares_bounded needs parameters, got none");
  if (!lo.empty()) check_size(lo.size(), p, "lower bounds");
  if (!hi.empty()) check_size(hi.size(), p, "upper bounds");
  check_finite(x0, "x0");
  for (size_t j = 0; j < p && !lo.empty() && !hi.empty(); ++j)
    if (!(lo[j] < hi[j]))
      throw InvalidArgument("[fit] bounds of parameter " + std::to_string(j) + " are empty: [" +
                            std::to_string(lo[j]) + ", " + std::to_string(hi[j]) + "]");
  if (!(o.diff_step > 0) || o.max_evals < 1)
    throw InvalidArgument("[fit] least_squares_bounded needs diff_step > 0 and max_evals >= 1");
  BoundedFit fit;
  auto eval = [&](const std::vector<double>& x) {
    ++fit.evals;
    auto r = residuals(x);
    if (r.empty()) throw InvalidArgument("[fit] the residual function returned no residuals");
    check_finite(r, "residuals");
    return r;
  };
  for (size_t j = 0; j < p; ++j) x0[j] = clamp_to(x0[j], lo, hi, j);
  std::vector<double> x = x0, r = eval(x);
  const auto m = static_cast<Eigen::Index>(r.size());
  auto half_sq = [](const std::vector<double>& v) {
    double s = 0;
    for (double e : v) s += e * e;
    return 0.5 * s;
  };
  double cost = half_sq(r), lambda = 1e-3;
  while (fit.evals < o.max_evals && !fit.converged) {
    Eigen::MatrixXd J(m, static_cast<Eigen::Index>(p));
    for (size_t j = 0; j < p; ++j) {
      double h = o.diff_step * std::max(std::abs(x[j]), 1.0);
      if (!hi.empty() && x[j] + h > hi[j]) h = -h;  // inward at the upper bound
      std::vector<double> xh = x;
      xh[j] += h;
      const auto rh = eval(xh);
      check_size(rh.size(), r.size(), "residuals");
      for (Eigen::Index i = 0; i < m; ++i)
        J(i, static_cast<Eigen::Index>(j)) =
            (rh[static_cast<size_t>(i)] - r[static_cast<size_t>(i)]) / h;
    }
    const Eigen::VectorXd rv = Eigen::Map<const Eigen::VectorXd>(r.data(), m);
    const Eigen::MatrixXd A = J.transpose() * J;
    const Eigen::VectorXd g = J.transpose() * rv;
    if (g.lpNorm<Eigen::Infinity>() <= 1e-15 * std::max(1.0, cost)) {
      fit.converged = true;
      break;
    }
    // Active set: a parameter on a bound whose descent direction points outward stays there,
    // and the step is solved for the others (projecting a full step instead zig-zags along the
    // bound).
    std::vector<Eigen::Index> free;
    for (size_t j = 0; j < p; ++j) {
      const auto jj = static_cast<Eigen::Index>(j);
      const bool at_hi = !hi.empty() && x[j] >= hi[j] && g(jj) < 0;
      const bool at_lo = !lo.empty() && x[j] <= lo[j] && g(jj) > 0;
      if (!at_hi && !at_lo) free.push_back(jj);
    }
    if (free.empty()) {
      fit.converged = true;  // every parameter pinned at a bound it presses against
      break;
    }
    const auto nf = static_cast<Eigen::Index>(free.size());
    Eigen::MatrixXd Af(nf, nf);
    Eigen::VectorXd gf(nf);
    for (Eigen::Index a = 0; a < nf; ++a) {
      gf(a) = g(free[static_cast<size_t>(a)]);
      for (Eigen::Index b = 0; b < nf; ++b)
        Af(a, b) = A(free[static_cast<size_t>(a)], free[static_cast<size_t>(b)]);
    }
    bool stepped = false;
    while (fit.evals < o.max_evals) {
      Eigen::MatrixXd D = Af;
      for (Eigen::Index j = 0; j < nf; ++j) D(j, j) += lambda * std::max(Af(j, j), 1e-12);
      const Eigen::VectorXd df = D.ldlt().solve(-gf);
      Eigen::VectorXd delta = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(p));
      for (Eigen::Index a = 0; a < nf; ++a) delta(free[static_cast<size_t>(a)]) = df(a);
      std::vector<double> xn(p);
      double step = 0, norm = 0;
      for (size_t j = 0; j < p; ++j) {
        xn[j] = clamp_to(x[j] + delta(static_cast<Eigen::Index>(j)), lo, hi, j);
        step += (xn[j] - x[j]) * (xn[j] - x[j]);
        norm += x[j] * x[j];
      }
      if (std::sqrt(step) <= o.xtol * (std::sqrt(norm) + o.xtol)) {
        fit.converged = true;  // the projected step vanished: at a (bounded) minimum
        break;
      }
      const auto rn = eval(xn);
      check_size(rn.size(), r.size(), "residuals");
      const double cn = half_sq(rn);
      if (cn < cost) {
        fit.converged = cost - cn <= o.ftol * cost;
        x = xn, r = rn, cost = cn;
        lambda = std::max(lambda / 3.0, 1e-12);
        stepped = true;
        break;
      }
      lambda *= 10.0;
      if (lambda > 1e16) {
        fit.converged = true;  // no descent direction left at this resolution
        break;
      }
    }
    if (!stepped && !fit.converged) break;  // evaluations exhausted
  }
  fit.x = x;
  fit.residuals = r;
  fit.cost = cost;
  return fit;
}

}  // namespace socllm::fit
