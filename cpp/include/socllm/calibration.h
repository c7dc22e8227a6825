// Engine layer: activation statistics of a model's linear inputs, gathered offline on a
// calibration corpus (calibration/, `socllm calibrate --steps act-scales`) and read by the
// plans that fix static scales or smoothing factors when their graphs are built
// (seed 001 §2.3, §3.3: per-tensor scales from max-min on calibration data).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "socllm/model.h"

namespace socllm {

// The four linear inputs of a llama block: input of q/k/v, of o, of gate/up and of down.
enum class LinearSite : int { AttnIn = 0, AttnOut = 1, MlpIn = 2, MlpAct = 3 };
constexpr int kNumLinearSites = 4;
const char* linear_site_name(LinearSite s);  // "attn_in", "attn_out", "mlp_in", "mlp_act"
int64_t linear_site_width(const ModelConfig& c, LinearSite s);

struct Calibration {
  int64_t n_layers = 0;
  std::array<int64_t, kNumLinearSites> width{};
  // Per site: [n_layers, width] row-major running max of |x| per input channel.
  std::array<std::vector<float>, kNumLinearSites> channel_absmax;
  int64_t tokens = 0;  // rows observed

  static Calibration empty_for(const ModelConfig& c);
  // ShapeError when the statistics were gathered on a model with other shapes.
  void check_matches(const ModelConfig& c) const;
  std::span<const float> absmax(int64_t layer, LinearSite s) const;
  // Folds rows x[rows, width] (ld) into the running max of (layer, site).
  void observe(int64_t layer, LinearSite s, const float* x, int64_t rows, int64_t ld);
};

}  // namespace socllm
