#include "quant/shadow_outlier.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/core.h"
#include "quant/linear_scheme.h"

namespace socllm::quant {

std::vector<int64_t> select_hot_channels(std::span<const int64_t> counts, double share) {
  if (!(share >= 0.0 && share <= 1.0))
    throw InvalidArgument("[select_hot_channels] share must be in [0, 1], got " +
                          std::to_string(share));
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<int64_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return counts[a] > counts[b]; });
  std::vector<int64_t> hot;
  int64_t covered = 0;
  for (int64_t c : order) {
    // covered >= share * total, in integers where possible to avoid rounding at the boundary
    if (total == 0 || static_cast<double>(covered) >= share * static_cast<double>(total)) break;
    hot.push_back(c);
    covered += counts[c];
  }
  std::sort(hot.begin(), hot.end());
  return hot;
}

double outlier_importance(double max_abs, double threshold) {
  if (!(threshold > 0.0) || !std::isfinite(threshold))
    throw InvalidArgument("[outlier_importance] threshold must be finite and > 0, got " +
                          std::to_string(threshold));
  return max_abs / (threshold / 127.0);
}

std::vector<bool> select_pruned(std::span<const double> importance, double rate) {
  if (!(rate >= 0.0 && rate <= 1.0))
    throw InvalidArgument("[select_pruned] pruning rate must be in [0, 1], got " +
                          std::to_string(rate));
  const size_t n = importance.size();
  const size_t k = static_cast<size_t>(std::llround(rate * static_cast<double>(n)));
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return importance[a] < importance[b]; });
  std::vector<bool> pruned(n, false);
  for (size_t i = 0; i < k; ++i) pruned[order[i]] = true;
  return pruned;
}

std::vector<OutlierResidual> shadow_outlier_split(float* x, int64_t N, int64_t in, float t,
                                                  std::span<const RowSegment> segments) {
  if (!(t > 0.0f) || !std::isfinite(t))
    throw InvalidArgument("[shadow_outlier_split] threshold must be finite and > 0, got " +
                          std::to_string(t));
  std::vector<OutlierResidual> out;
  const RowSegment whole{0, N};
  for (const RowSegment& seg :
       segments.empty() ? std::span<const RowSegment>(&whole, 1) : segments) {
    if (seg.begin < 0 || seg.end > N || seg.begin > seg.end)
      throw ShapeError("[shadow_outlier_split] row segment [" + std::to_string(seg.begin) + ", " +
                       std::to_string(seg.end) + ") outside [0, " + std::to_string(N) + ")");
    OutlierResidual r;
    r.row_begin = seg.begin;
    r.rows = seg.end - seg.begin;
    for (int64_t j = 0; j < in; ++j)
      for (int64_t m = seg.begin; m < seg.end; ++m)
        if (std::abs(x[m * in + j]) > t) {
          r.cols.push_back(j);
          break;
        }
    const int64_t nc = static_cast<int64_t>(r.cols.size());
    r.values.assign(static_cast<size_t>(r.rows * nc), 0.0f);
    for (int64_t m = seg.begin; m < seg.end; ++m)
      for (int64_t c = 0; c < nc; ++c) {
        float& v = x[m * in + r.cols[c]];
        const float clipped = std::clamp(v, -t, t);
        r.values[(m - seg.begin) * nc + c] = v - clipped;
        v = clipped;
      }
    out.push_back(std::move(r));
  }
  // Everything else (rows outside the segments included) is clipped for the NPU operand.
  for (int64_t i = 0; i < N * in; ++i) x[i] = std::clamp(x[i], -t, t);
  return out;
}

ShadowStats& ShadowStats::operator+=(const ShadowStats& o) {
  segments += o.segments;
  syncs += o.syncs;
  outlier_values += o.outlier_values;
  outlier_channels += o.outlier_channels;
  hot_hits += o.hot_hits;
  cold_fetches += o.cold_fetches;
  cold_fetch_bytes += o.cold_fetch_bytes;
  pruned_values += o.pruned_values;
  return *this;
}

void ShadowCounters::add(const ShadowStats& s) {
  std::lock_guard lock(mu_);
  total_ += s;
}

ShadowStats ShadowCounters::snapshot() const {
  std::lock_guard lock(mu_);
  return total_;
}

void ShadowCounters::reset() {
  std::lock_guard lock(mu_);
  total_ = {};
}

}  // namespace socllm::quant
