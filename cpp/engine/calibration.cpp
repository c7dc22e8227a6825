#include "socllm/calibration.h"

#include <algorithm>
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
  const int64_t w = width[static_cast<int>(s)];
  float* m = channel_absmax[static_cast<int>(s)].data() + layer * w;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < w; ++j) m[j] = std::max(m[j], std::abs(x[r * ld + j]));
}

}  // namespace socllm
