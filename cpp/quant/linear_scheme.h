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
//   channel bits EdgeFlow's per-output-channel bit-widths (seed 004 §4.1, bitwidth.h): int8
//                per-channel weights whose rows are quantized at 1..8 bits, allocated per weight
//                tensor (q, k, v, gate, up separately in the fused linears) at an average budget
//   npu smoothing EdgeFlow's NPU-aware smoothing (§4.1): x / S_I^α and W' = diag(S_I^α) W
//                diag(S_O^-β) with S_I, S_O the calibrated input / output channel maxima; the
//                input factor folds into the preceding norm or linear, the output factor into
//                the dequantization (Engine::prepare folds; a lone PreparedLinear divides x)
//   output quant the NPU's per-tensor static quantization of a linear's output (int8 / int16)
//                with a scale fixed from calibration, dequantized by the next op (what β is for:
//                with β = 1 every output channel's range is 1 before the per-tensor grid)
//   rounding     how the weights' integers are chosen: round-to-nearest, or GPTQ's
//                error-compensating rounding against the calibrated Hessian of the input
//                (quant/gptq.h; Frantar et al. 2023): the same scales and format, other codes
//
// Execution: integer activations with per-tensor/per-channel weights run the exact
// s8·s8→s32 GEMM with a float epilogue s_x[row]·s_w[col] (what an NPU computes); per-group
// weights with per-group activations run llama.cpp's Q8_0 form (gemm_grouped_s8s8f32: exact
// integer dots per group, float sum over groups); all other combinations run on dequantized
// operands with an fp32 GEMM.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/gemm_s8.h"
#include "model/model.h"
#include "quant/bitwidth.h"
#include "quant/gptq.h"
#include "quant/quant.h"
#include "quant/shadow_outlier.h"

namespace socllm::quant {

enum class WeightFormat { F32, Int8, Int4 };
enum class ActFormat { F32, F16, Int8StaticPerTensor, Int8DynamicPerRow, Int8DynamicPerGroup };
enum class OutputQuant { None, Int8, Int16 };
enum class Rounding { Nearest, Gptq };
std::string rounding_name(Rounding r);  // nearest | gptq
// InvalidArgument naming the value and the known ones.
Rounding rounding_from_name(const std::string& name);

std::string weight_format_name(WeightFormat f);
std::string act_format_name(ActFormat f);
std::string output_quant_name(OutputQuant q);  // none | int8 | int16

// Per-output-channel bit-widths of the weights (seed 004 Algorithm 1 and baselines).
struct ChannelBits {
  double bits = 5.0;  // average budget per tensor, in [1, 8]
  BitAllocation allocation = BitAllocation::Greedy;
  ErrorMetric metric = ErrorMetric::ClosedForm;
  // Use the calibration's stored bit-widths (step bitwidths, e.g. the TTFT-budgeted global
  // allocation) instead of allocating per tensor at prepare time.
  bool stored = false;
};

// EdgeFlow's NPU-aware smoothing (seed 004 §4.1).
struct NpuSmoothing {
  // Input exponent α in [0, 1]; nullopt with alpha_calibrated: per input site and layer from
  // calibration step 'smoothing' (grid search); nullopt otherwise: no input part (SmoothQuant's
  // own smoothing may run instead).
  std::optional<double> alpha;
  bool alpha_calibrated = false;
  double beta = 1.0;  // output exponent in [0, 1]
  // Engine::prepare folds the input divisor into the preceding norm / linear rows (free at run
  // time); false divides every linear's input at run time instead (the same numbers in fp32).
  bool fold = true;
  bool has_input_part() const { return alpha.has_value() || alpha_calibrated; }
};

struct LinearScheme {
  WeightFormat weights = WeightFormat::F32;
  Granularity weight_granularity = Granularity::PerChannel;
  int64_t group_size = 32;  // weights and activations of the per-group modes
  int weight_bits = 8;      // int8 weights quantized on a B-bit grid (2..8; int4 format: 4)
  ActFormat activations = ActFormat::F32;
  std::optional<double> smooth_alpha;       // SmoothQuant migration strength in [0, 1]
  std::optional<double> outlier_threshold;  // LLM.int8 float-column threshold (> 0)
  std::optional<ShadowOptions> shadow;      // shadow outlier execution (static int8 activations)
  std::optional<ChannelBits> channel_bits;  // per-channel bit-widths of int8 per-channel weights
  std::optional<NpuSmoothing> npu_smoothing;
  OutputQuant output_quant = OutputQuant::None;
  Rounding rounding = Rounding::Nearest;
  GptqOptions gptq;  // rounding gptq
  // Static per-tensor activations: the scale maps this percentile of the calibrated |x| (in
  // (0, 100]) to 127 instead of the maximum, clipping the values beyond it (act_percentile).
  std::optional<double> act_percentile;

  bool is_fp32() const;
  // GPTQ rounding needs the calibrated Hessians of the inputs (step gptq).
  bool needs_hessians() const { return rounding == Rounding::Gptq; }
  // Static activation scales, smoothing, stored bit-widths or GPTQ need calibration statistics.
  bool needs_calibration() const;
  // Shadow outlier execution needs the outlier statistics (thresholds, counts) as well.
  bool needs_outlier_calibration() const { return shadow.has_value(); }
  // Output smoothing or output quantization need the linears' output channel maxima.
  bool needs_output_absmax() const {
    return output_quant != OutputQuant::None || (npu_smoothing && npu_smoothing->beta != 0.0);
  }
  // The calibrated α of step 'smoothing'.
  bool needs_smoothing_calibration() const {
    return npu_smoothing && npu_smoothing->alpha_calibrated;
  }
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

// What a prepared linear takes besides its weights and scheme (spans must outlive the
// constructor only).
struct LinearContext {
  // [in] calibrated max |x_j| of this linear's input; required when scheme.needs_calibration().
  std::span<const float> act_absmax;
  // [out] calibrated max |y_c| of its output; required when scheme.needs_output_absmax().
  std::span<const float> out_absmax;
  // The profiled threshold, hot channels and pruning of this input (scheme.shadow).
  const ShadowLinearConfig* shadow = nullptr;
  // [in] npu smoothing's input divisor S_I^α; empty: computed here from act_absmax and the
  // scheme's fixed α (a calibrated α needs it given). input_folded: the preceding op already
  // divided x by it (Engine::prepare folds it into the norm or the previous linear's rows).
  std::span<const float> input_smooth;
  bool input_folded = false;
  // [out] a multiplier applied after dequantization (bias included): the next linear's input
  // divisor folded into these rows (v_proj for o_proj's input, up_proj for down_proj's).
  std::span<const float> row_post;
  // Rows of each weight tensor fused into this linear (q, k, v / gate, up): bit-widths are
  // allocated and output scales fixed per tensor. Empty: one tensor.
  std::span<const int64_t> tensor_rows;
  // [out] stored bit-widths (ChannelBits.stored).
  std::span<const uint8_t> row_bits;
  // [in, in] XᵀX / n of this input (rounding gptq; calibration step gptq).
  std::span<const float> hessian;
  // The calibrated |x| at the scheme's act_percentile (> 0 when it has one).
  float act_clip = 0.0f;
  // Input statistics and the shadow configuration only.
  static LinearContext of(std::span<const float> act_absmax, const ShadowLinearConfig* shadow) {
    LinearContext c;
    c.act_absmax = act_absmax;
    c.shadow = shadow;
    return c;
  }
};

// S_I^α per input channel (npu smoothing), max|x_j| clamped below at 1e-5 as SmoothQuant does.
std::vector<float> npu_input_smoothing(std::span<const float> act_absmax, double alpha);

class PreparedLinear {
 public:
  // W[out, in] row-major, bias[out] or null. With outlier handling (LLM.int8 columns, shadow
  // cold channels) and no smoothing, W is read at run time: it must outlive this object.
  PreparedLinear(const float* W, int64_t out, int64_t in, const float* bias,
                 const LinearScheme& scheme, const LinearContext& ctx);
  // From a model file's prequantized weights (what weight_codes() and the accessors below
  // gave when it was converted): the same linear, bit for bit. Integer static schemes only;
  // InvalidArgument / ShapeError for sizes that disagree.
  PreparedLinear(const LinearScheme& scheme, const PackedLinearWeights& w);
  // act_channel_absmax[in] (calibration, when scheme.needs_calibration()) and the shadow
  // configuration (scheme.shadow) only.
  PreparedLinear(const float* W, int64_t out, int64_t in, const float* bias,
                 const LinearScheme& scheme, std::span<const float> act_channel_absmax,
                 const ShadowLinearConfig* shadow = nullptr)
      : PreparedLinear(W, out, in, bias, scheme, LinearContext::of(act_channel_absmax, shadow)) {}

  // y[N, out] (ldy) (+)= x[N, in] · W^T + b. Rows outside every segment are computed (a static
  // graph computes its padding) but never influence other rows. call_stats, if given, also
  // receives this call's shadow counters (what one chunk measured, for the executed graph).
  void forward(const float* x, int64_t N, float* y, int64_t ldy, bool accumulate,
               std::span<const RowSegment> segments, ShadowStats* call_stats = nullptr) const;

  // The block y[row_begin:row_end, col_begin:col_end] (ldy) = x[rows] · W[cols]^T + b[cols] of a
  // partitioned linear (seed 002 §4.1: the parts on the NPU and its partner processor): each
  // output element is computed from its row as forward() computes it (integer paths exactly;
  // the fp32 GEMM of float paths up to its blocking, which the engine fixes by running it tile
  // by tile). Unsupported for LLM.int8's outlier columns and shadow outliers, which look
  // across a sequence's rows.
  void forward_block(const float* x, float* y, int64_t ldy, int64_t row_begin, int64_t row_end,
                     int64_t col_begin, int64_t col_end) const;

  // Dequantized weights on the fp32 GEMM, no outlier parts or smoothing (a partitioned linear
  // on the NPU computes such a scheme on the NPU's tile grid, engine.cpp).
  bool float_path() const;
  // An output element's value does not depend on the columns computed with it (exact integer
  // products), so a linear may be cut anywhere without changing its numbers.
  bool exact_blocks() const { return packed_ || grouped_; }
  // The format the linear computes in, as it runs: "int8" (integer GEMM or integer activations),
  // "fp16" (binary16 activations on dequantized weights) or "fp32".
  const char* compute_format() const;

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  const LinearScheme& scheme() const { return scheme_; }
  // The static activation scale (Int8StaticPerTensor), else 0: a constant of the built graph.
  float static_act_scale() const { return act_scale_; }
  // Bit-width of every output row ([out]; 8 for int8 weights without channel bits, empty for
  // float weights), and the stored bits per weight including scales and bit-width metadata.
  const std::vector<uint8_t>& row_bits() const { return row_bits_; }
  double stored_bits_per_weight() const;
  // The integer path's weight codes [out, in] (null without it) and per-row scales, the
  // multipliers after dequantization and the static output scales (per row; 0 without
  // output quantization): what a packed model file stores (socllm convert).
  const std::vector<int8_t>* weight_codes() const { return packed_ ? &packed_->rows() : nullptr; }
  const std::vector<float>& weight_scales() const { return w_scales_; }
  const std::vector<float>& row_post() const { return post_; }
  const std::vector<float>& output_scales() const { return out_scale_; }
  const std::vector<float>& bias() const { return bias_; }
  const std::vector<float>& input_divisor() const { return smooth_; }  // x / it at run time
  // Bytes of the weights as the target stores them (int4 packed two per byte; scales fp16 per
  // group, fp32 per row or tensor).
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
  // y[:, col_begin:col_end] of the integer path (packed_): exact int32 products, float epilogue.
  void forward_integer(const float* xs, int64_t N, float* y, int64_t ldy, bool accumulate,
                       int64_t col_begin, int64_t col_end) const;
  // Per-group weights and activations (grouped_): y[:, cols] of x's rows, quantized here.
  void forward_grouped(const float* xs, int64_t N, float* y, int64_t ldy, bool accumulate,
                       int64_t col_begin, int64_t col_end) const;
  // The float path's activation format applied in place to xs [N, in] (fp16 rounding, int8
  // fake quantization).
  void quantize_activations_float(std::vector<float>& xs, int64_t N) const;
  // y += the residuals beyond the threshold times their weight columns (hot: resident; cold:
  // fetched from the float copy standing for the model file, and counted).
  void add_shadow_residuals(const std::vector<OutlierResidual>& parts, float* y, int64_t ldy,
                            ShadowStats* call_stats) const;
  int64_t out_ = 0, in_ = 0;
  LinearScheme scheme_;
  std::vector<float> bias_;
  std::vector<float> smooth_;      // [in] divisor of x (empty: no smoothing)
  float act_scale_ = 0.0f;         // static per-tensor scale
  std::vector<float> w_scales_;    // [out] per-row weight scale (integer path)
  std::vector<uint8_t> row_bits_;  // [out] bit-width per row (integer weights)
  std::vector<float> post_;        // [out] multiplier after dequantization (empty: 1)
  std::vector<float> out_scale_;   // [out] static output scale of its tensor (empty: none)
  std::unique_ptr<kernels::PackedWeightsS8> packed_;          // integer path
  std::unique_ptr<kernels::PackedGroupedWeightsS8> grouped_;  // per-group integer path
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

// Bytes a linear of `scheme` with weight [out, in] stores (what PreparedLinear::weight_bytes
// reports once built): codes at their width, packed; scales (fp32 per tensor or row, fp16 per
// group as llama.cpp's Q4_0/Q8_0 store them);
// EdgeFlow's per-row bit-widths at the average budget per fused tensor (tensor_rows; empty: one
// tensor) with their metadata bits; the bias in fp32.
int64_t stored_weight_bytes(const LinearScheme& scheme, int64_t out, int64_t in,
                            std::span<const int64_t> tensor_rows = {}, bool bias = false);

// IEEE binary16 round trip (round to nearest even, overflow to inf): the "a16" activations.
float round_to_f16(float x);

}  // namespace socllm::quant
