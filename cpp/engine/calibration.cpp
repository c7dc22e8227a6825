#include "socllm/calibration.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "socllm/core.h"

namespace socllm {

const char* linear_site_name(LinearSite s) {
  constexpr const char* kNames[] = {"attn_in", "attn_out", "mlp_in", "mlp_act"};
  return kNames[static_cast<int>(s)];
}

int64_t linear_site_width(const ModelConfig& c, LinearSite s) {
  switch (s) {
    case LinearSite::AttnIn: return c.d_model;
    case LinearSite::AttnOut: return c.q_dim();
    case LinearSite::MlpIn: return c.d_model;
    case LinearSite::MlpAct: return c.d_ff;
  }
  return 0;
}

Calibration Calibration::empty_for(const ModelConfig& c) {
  Calibration cal;
  cal.n_layers = c.n_layers;
  for (int s = 0; s < kNumLinearSites; ++s) {
    cal.width[s] = linear_site_width(c, static_cast<LinearSite>(s));
    cal.channel_absmax[s].assign(static_cast<size_t>(c.n_layers * cal.width[s]), 0.0f);
    cal.abs_hist[s].assign(static_cast<size_t>(c.n_layers * kAbsHistBins), 0);
  }
  return cal;
}

void Calibration::check_matches(const ModelConfig& c) const {
  if (n_layers != c.n_layers)
    throw ShapeError("[Calibration] statistics are for " + std::to_string(n_layers) +
                     " layers, the model has " + std::to_string(c.n_layers) +
                     " (calibration file from another model?)");
  for (int s = 0; s < kNumLinearSites; ++s) {
    const auto site = static_cast<LinearSite>(s);
    const int64_t w = linear_site_width(c, site);
    if (width[s] != w || static_cast<int64_t>(channel_absmax[s].size()) != n_layers * w)
      throw ShapeError(std::string("[Calibration] site '") + linear_site_name(site) + "' has width " +
                       std::to_string(width[s]) + ", the model's is " + std::to_string(w) +
                       " (calibration file from another model?)");
    if (!abs_hist[s].empty() && static_cast<int64_t>(abs_hist[s].size()) != n_layers * kAbsHistBins)
      throw ShapeError(std::string("[Calibration] site '") + linear_site_name(site) +
                       "' has a |x| histogram of " + std::to_string(abs_hist[s].size()) +
                       " bins, expected " + std::to_string(n_layers * kAbsHistBins));
    if (!outlier_threshold[s].empty() &&
        (static_cast<int64_t>(outlier_threshold[s].size()) != n_layers ||
         static_cast<int64_t>(outlier_count[s].size()) != n_layers * w))
      throw ShapeError(std::string("[Calibration] site '") + linear_site_name(site) +
                       "' has outlier statistics of the wrong shape (calibration file from another "
                       "model?)");
    for (size_t i = 0; i < channel_absmax[s].size(); ++i)
      if (!std::isfinite(channel_absmax[s][i]) || channel_absmax[s][i] < 0.0f)
        throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                              "' has an invalid absmax " + std::to_string(channel_absmax[s][i]) +
                              " at flat index " + std::to_string(i));
  }
}

std::span<const float> Calibration::absmax(int64_t layer, LinearSite s) const {
  const int64_t w = width[static_cast<int>(s)];
  return {channel_absmax[static_cast<int>(s)].data() + layer * w, static_cast<size_t>(w)};
}

void Calibration::observe(int64_t layer, LinearSite s, const float* x, int64_t rows, int64_t ld) {
  const int si = static_cast<int>(s);
  const int64_t w = width[si];
  float* m = channel_absmax[si].data() + layer * w;
  int64_t* hist = abs_hist[si].empty() ? nullptr : abs_hist[si].data() + layer * kAbsHistBins;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < w; ++j) {
      const float a = std::abs(x[r * ld + j]);
      m[j] = std::max(m[j], a);
      if (hist) ++hist[std::bit_cast<uint32_t>(a) >> kAbsHistShift];
    }
  if (outlier_threshold[si].empty()) return;
  const float t = outlier_threshold[si][static_cast<size_t>(layer)];
  int64_t* count = outlier_count[si].data() + layer * w;
  int64_t channels = 0;
  for (int64_t j = 0; j < w; ++j) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; ++r) n += std::abs(x[r * ld + j]) > t;
    count[j] += n;
    channels += n > 0;
  }
  outlier_seq_channels[si][static_cast<size_t>(layer)] += channels;
  ++outlier_seqs[si][static_cast<size_t>(layer)];
}

float Calibration::abs_percentile(int64_t layer, LinearSite s, double p) const {
  const int si = static_cast<int>(s);
  if (!(p > 0.0 && p <= 1.0))
    throw InvalidArgument("[Calibration] percentile fraction must be in (0, 1], got " +
                          std::to_string(p));
  if (layer < 0 || layer >= n_layers)
    throw InvalidArgument("[Calibration] layer " + std::to_string(layer) + " outside [0, " +
                          std::to_string(n_layers) + ")");
  const auto m = absmax(layer, s);
  const float exact_max = m.empty() ? 0.0f : *std::max_element(m.begin(), m.end());
  if (p == 1.0) return exact_max;
  if (abs_hist[si].empty())
    throw InvalidArgument("[Calibration] no |x| histogram (calibrate with step act-scales)");
  const int64_t* hist = abs_hist[si].data() + layer * kAbsHistBins;
  int64_t total = 0;
  for (int64_t b = 0; b < kAbsHistBins; ++b) total += hist[b];
  if (total == 0) throw InvalidArgument("[Calibration] nothing observed for this input");
  const double want = p * static_cast<double>(total);
  int64_t cum = 0;
  for (int64_t b = 0; b < kAbsHistBins; ++b) {
    cum += hist[b];
    if (static_cast<double>(cum) >= want) {
      const float upper = std::bit_cast<float>(static_cast<uint32_t>((b + 1) << kAbsHistShift));
      return std::min(upper, exact_max);
    }
  }
  return exact_max;
}

void Calibration::set_outlier_thresholds(LinearSite s, std::span<const float> thresholds) {
  const int si = static_cast<int>(s);
  if (static_cast<int64_t>(thresholds.size()) != n_layers)
    throw ShapeError("[Calibration] " + std::to_string(thresholds.size()) + " thresholds for " +
                     std::to_string(n_layers) + " layers of site '" + linear_site_name(s) + "'");
  for (size_t l = 0; l < thresholds.size(); ++l)
    if (!(thresholds[l] > 0.0f) || !std::isfinite(thresholds[l]))
      throw InvalidArgument(std::string("[Calibration] outlier threshold of layer ") +
                            std::to_string(l) + " site '" + linear_site_name(s) +
                            "' must be finite and > 0, got " + std::to_string(thresholds[l]));
  outlier_threshold[si].assign(thresholds.begin(), thresholds.end());
  outlier_count[si].assign(static_cast<size_t>(n_layers * width[si]), 0);
  outlier_seq_channels[si].assign(static_cast<size_t>(n_layers), 0);
  outlier_seqs[si].assign(static_cast<size_t>(n_layers), 0);
}

bool Calibration::has_outlier_stats() const {
  for (int s = 0; s < kNumLinearSites; ++s)
    if (outlier_threshold[s].empty()) return false;
  return true;
}

std::vector<double> Calibration::outlier_importance() const {
  if (!has_outlier_stats())
    throw InvalidArgument("[Calibration] no outlier statistics (calibrate with step 'outliers')");
  std::vector<double> imp(static_cast<size_t>(n_layers * kNumLinearSites));
  for (int64_t l = 0; l < n_layers; ++l)
    for (int s = 0; s < kNumLinearSites; ++s) {
      const auto m = absmax(l, static_cast<LinearSite>(s));
      imp[l * kNumLinearSites + s] = quant::outlier_importance(
          *std::max_element(m.begin(), m.end()), outlier_threshold[s][static_cast<size_t>(l)]);
    }
  return imp;
}

std::vector<quant::ShadowLinearConfig> Calibration::shadow_configs(
    const quant::ShadowOptions& opts) const {
  const std::vector<double> imp = outlier_importance();
  const std::vector<bool> pruned = quant::select_pruned(imp, opts.pruning_rate);
  std::vector<quant::ShadowLinearConfig> out(imp.size());
  for (int64_t l = 0; l < n_layers; ++l)
    for (int s = 0; s < kNumLinearSites; ++s) {
      const size_t i = static_cast<size_t>(l * kNumLinearSites + s);
      const int64_t w = width[s];
      out[i].threshold = outlier_threshold[s][static_cast<size_t>(l)];
      out[i].hot_channels = quant::select_hot_channels(
          {outlier_count[s].data() + l * w, static_cast<size_t>(w)}, opts.hot_share);
      out[i].pruned = pruned[i];
    }
  return out;
}

}  // namespace socllm
