// Quant layer: how one linear operator y = x·W^T + b is executed, and a linear prepared for
// that scheme (quantized/packed weights, smoothing factors, static scale constants).
//
// A scheme combines independent choices, each from the papers' baselines (seed 001 Table 4):
//   weights      fp32 | int8 / int4 symmetric, per-tensor / per-channel / per-group
//   activations  fp32 | fp16 (rounded, "a16") | int8-static-per-tensor (NPU: scale fixed at
//                graph build from calibration, seed 001 §2.3) | int8-dynamic-per-row
//                (LLM.int8's vector-wise) | int8-dynamic-per-group (llama.cpp K-quant's Q8 blocks)
//   smoothing    SmoothQuant's s_j = max|X_j|^α / max|W_j|^(1-α) (Xiao et al. 2023, Eq. 4):
//                x/s, W·s, foldable into the previous operator for all four linears of a
//                llama block (norm weights, V and up projections), so it costs nothing at run time
//   outliers     LLM.int8's decomposition (Dettmers et al. 2022): input columns with any
//                |x| > threshold in the segment run in float against float weights
//   shadow       llm.npu's shadow outlier execution (seed 001 §3.3, shadow_outlier.h): static
//                per-tensor INT8 on x clipped to a calibrated threshold, plus the part beyond it
//                in float on the CPU, with resident hot channels and pruned linears
//
// Execution: integer activations with per-tensor/per-channel weights run the exact
// s8·s8→s32 GEMM with a float epilogue s_x[row]·s_w[col] (what an NPU computes); all other
// combinations run on dequantized operands with an fp32 GEMM, which equals the per-group
// integer form up to fp32 summation order (each group's integer dot is exact in fp32).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "socllm/gemm_s8.h"
#include "socllm/quant.h"
#include "socllm/shadow_outlier.h"

namespace socllm::quant {

enum class WeightFormat { F32, Int8, Int4 };
enum class ActFormat { F32, F16, Int8StaticPerTensor, Int8DynamicPerRow, Int8DynamicPerGroup };

std::string weight_format_name(WeightFormat f);
std::string act_format_name(ActFormat f);

struct LinearScheme {
  WeightFormat weights = WeightFormat::F32;
  Granularity weight_granularity = Granularity::PerChannel;
  int64_t group_size = 32;  // weights and activations of the per-group modes
  ActFormat activations = ActFormat::F32;
  std::optional<double> smooth_alpha;       // SmoothQuant migration strength in [0, 1]
  std::optional<double> outlier_threshold;  // LLM.int8 float-column threshold (> 0)
  std::optional<ShadowOptions> shadow;      // shadow outlier execution (static int8 activations)

  bool is_fp32() const;
  // Static activation scales or smoothing need calibration statistics.
  bool needs_calibration() const;
  // Shadow outlier execution needs the outlier statistics (thresholds, counts) as well.
  bool needs_outlier_calibration() const { return shadow.has_value(); }
  // InvalidArgument naming the offending field and value.
  void validate() const;
  nlohmann::json to_json() const;
  // Strict: unknown keys or modes are InvalidArgument listing the known ones.
  static LinearScheme from_json(const nlohmann::json& j);
};

// Rows [begin, end) of a linear's input that belong together (one sequence or chunk), for the
// scheme parts that look across rows (LLM.int8's outlier columns). Padding rows are left out.
struct RowSegment {
  int64_t begin = 0, end = 0;
};

class PreparedLinear {
 public:
  // W[out, in] row-major, bias[out] or null. act_channel_absmax[in]: calibration statistics
  // of this linear's input (max |x_j| over the calibration set), required when
  // scheme.needs_calibration(); `shadow`: the profiled threshold, hot channels and pruning of
  // this input, required when scheme.shadow is set. With outlier handling (LLM.int8 columns,
  // shadow cold channels) and no smoothing, W is read at run time: it must outlive this object.
  PreparedLinear(const float* W, int64_t out, int64_t in, const float* bias,
                 const LinearScheme& scheme, std::span<const float> act_channel_absmax,
                 const ShadowLinearConfig* shadow = nullptr);

  // y[N, out] (ldy) (+)= x[N, in] · W^T + b. Rows outside every segment are computed (a static
  // graph computes its padding) but never influence other rows. call_stats, if given, also
  // receives this call's shadow counters (what one chunk measured, for the executed graph).
  void forward(const float* x, int64_t N, float* y, int64_t ldy, bool accumulate,
               std::span<const RowSegment> segments, ShadowStats* call_stats = nullptr) const;

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  const LinearScheme& scheme() const { return scheme_; }
  // The static activation scale (Int8StaticPerTensor), else 0: a constant of the built graph.
  float static_act_scale() const { return act_scale_; }
  // Bytes of the weights as the target stores them (int4 packed two per byte, scales fp32).
  int64_t weight_bytes() const;
  // Shadow outlier execution: its profiled configuration, the float weight bytes kept resident
  // for hot channels, and what the CPU part did so far.
  const ShadowLinearConfig* shadow() const { return scheme_.shadow ? &shadow_ : nullptr; }
  int64_t resident_float_bytes() const {
    return static_cast<int64_t>(w_hot_.size() * sizeof(float));
  }
  ShadowStats shadow_stats() const { return shadow_counters_.snapshot(); }
  void reset_shadow_stats() const { shadow_counters_.reset(); }

 private:
  void forward_integer(const float* xs, int64_t N, float* y, int64_t ldy, bool accumulate) const;
  // y += the residuals beyond the threshold times their weight columns (hot: resident; cold:
  // fetched from the float copy standing for the model file, and counted).
  void add_shadow_residuals(const std::vector<OutlierResidual>& parts, float* y, int64_t ldy,
                            ShadowStats* call_stats) const;
  int64_t out_ = 0, in_ = 0;
  LinearScheme scheme_;
  std::vector<float> bias_;
  std::vector<float> smooth_;                         // [in] divisor of x (empty: no smoothing)
  float act_scale_ = 0.0f;                            // static per-tensor scale
  std::vector<float> w_scales_;                       // [out] per-row weight scale (integer path)
  std::unique_ptr<kernels::PackedWeightsS8> packed_;  // integer path
  std::vector<float> w_hat_;    // [out, in] dequantized (smoothed) weights (float path)
  std::vector<float> w_float_;  // [out, in] smoothed float weights, when smoothing is on
  // Float weights outlier columns (LLM.int8) and cold shadow channels are read from: W itself
  // (the model file's copy, borrowed: W must outlive this object) or w_float_.
  const float* w_float_src_ = nullptr;
  ShadowLinearConfig shadow_;
  std::vector<float> w_hot_;      // [n_hot, out] resident float weight columns of hot channels
  std::vector<int64_t> hot_row_;  // [in] row of w_hot_ for a hot channel, -1 for a cold one
  mutable ShadowCounters shadow_counters_;
  int64_t stored_weight_bytes_ = 0;
};

// IEEE binary16 round trip (round to nearest even, overflow to inf): the "a16" activations.
float round_to_f16(float x);

}  // namespace socllm::quant
