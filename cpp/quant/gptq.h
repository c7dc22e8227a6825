// Quant layer: GPTQ's error-compensating rounding of a linear's weights (Frantar et al. 2023,
// "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers",
// Algorithm 1; issue 39). It minimises the layer's output error on calibration inputs X,
//   tr((W - Ŵ) H (W - Ŵ)ᵀ),  H = XᵀX / n,
// by quantizing one input column at a time and moving its rounding error onto the columns not
// yet quantized along the inverse Hessian's Cholesky rows (Optimal Brain Surgeon, one column
// for all rows at once). Only the stored integers change: scales and formats are those of the
// round-to-nearest quantizers (quant.h, bitwidth.h), so every execution path runs it unchanged.
//
//   damping   H + λ·mean(diag H)·I (λ = damp, the paper's 1%); a column no input reached
//             (diag 0) gets H_jj = 1 and a zero weight, as the reference implementation does
//   order     natural, or descending diag(H) ("act-order": the columns with the largest inputs
//             first, while most columns remain to absorb their error)
//   blocks    "lazy batch" updates: the error of B columns is applied to the rest as one GEMM
//   scales    per tensor / per channel / per row at its own width (EdgeFlow's channel bits,
//             bitwidth.h, 1 bit: sign x mean|w|): from the original weights, fixed before the
//             loop; per group: from the group's weights as updated when its first column is
//             reached (the reference's default). Our choice for act-order with groups: the
//             scales of the original weights (the reference's static_groups), since a group
//             stays a run of consecutive columns in our storage. The block size is rounded
//             down to a multiple of the group size so that no group straddles two blocks.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "quant/quant.h"

namespace socllm::quant {

struct GptqOptions {
  double damp = 0.01;      // λ in (0, 1]
  int64_t block = 128;     // lazy-batch columns B >= 1
  bool act_order = false;  // descending diag(H)
  // InvalidArgument naming the field.
  void validate() const;
  // The column order's name ("natural" | "act") and back (InvalidArgument naming the value).
  std::string order_name() const { return act_order ? "act" : "natural"; }
  static bool act_order_from_name(const std::string& name);
};

// W [out, in] row-major, H [in, in] (symmetric, XᵀX / n of the linear's inputs). row_bits empty:
// spec.bits for every row; else one width in 1..8 per row (per-channel spec only). Returns the
// codes and scales as quantize_weights does (1 bit: codes ±1, scale mean|w|). InvalidArgument /
// ShapeError naming the value for bad options, shapes or non-finite inputs.
QuantizedWeights gptq_quantize(const float* W, int64_t out, int64_t in, std::span<const float> H,
                               const QuantSpec& spec, const GptqOptions& opts,
                               std::span<const uint8_t> row_bits = {});

// tr((W - Ŵ) H (W - Ŵ)ᵀ) / out, in double: the loss GPTQ minimises (Ŵ [out, in]).
double gptq_objective(const float* W, const float* W_hat, int64_t out, int64_t in,
                      std::span<const float> H);

}  // namespace socllm::quant
