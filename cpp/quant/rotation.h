// Quant layer: rotations of the residual stream (QuaRot, Ashkboos et al. 2024 §4.1
// "computational invariance"; SpinQuant, Liu et al. 2024), folded into the weights so that the
// model computes the same function in fp32 while its activations have their outliers spread over
// every channel, which is what makes low-bit static activations work (issue 39).
//
// With an orthogonal Q (d_model x d_model), the residual stream x becomes x Q:
//   embeddings                           E' = E Q
//   linears reading the stream           W' = W diag(γ) Q   (the RMSNorm gain γ folded in; the
//     (q/k/v, gate/up)                                        norm keeps unit gain, and
//                                                             RMSNorm(x Q) = RMSNorm(x) Q, eps too,
//                                                             since |x Q| = |x|)
//   linears writing it (o, down)         W' = Qᵀ W
//   LM head                              W' = W diag(γ_final) Q   (untied from the embeddings)
// Biases of the reading linears are unchanged. A model whose stream passes a per-channel gain
// after a linear (Gemma 3's post-attention and post-MLP norms) has no such invariance: refused.
//
// Two rotations inside the block (QuaRot §4.2), each optional and independent of the stream's:
//   down   the down projection's input x (d_ff wide) is rotated online, x -> x Hᵀ with H the
//          normalized Hadamard matrix of size d_ff (kernels::HadamardTransform, the block's
//          down_rotate op, timed in the task graph), and W_down' = W_down Hᵀ offline;
//   heads  every head's values are rotated by the head_dim Hadamard folded offline into v_proj's
//          rows (and bias) and o_proj's columns of that head: o_proj's input has its outliers
//          spread within each head at no run-time cost. QuaRot adds an online Hadamard across
//          heads before o_proj; we leave it out (o_proj's input stays rotated per head only).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/hadamard.h"
#include "model/model.h"

namespace socllm::quant {

enum class RotationKind {
  // Q = I: only the RMSNorm gains folded into the reading linears (what every rotation does
  // besides rotating; an ablation that separates the two).
  Fold,
  // QuaRot's randomized Hadamard: Q = diag(s) Hᵀ / sqrt(d), s random signs from the seed, H by
  // kernels::HadamardTransform (Paley x Sylvester for sizes like 576); applied in O(d log d).
  Hadamard,
  // A Haar-random orthogonal matrix from the seed (QR of a Gaussian matrix, signs fixed by R's
  // diagonal; SpinQuant's starting point), applied as a dense product.
  Random,
};
std::string rotation_name(RotationKind k);
RotationKind rotation_from_name(const std::string& name);  // InvalidArgument naming it

// The orthogonal map of one kind and seed on rows of d values: x -> x Q.
class ResidualRotation {
 public:
  ResidualRotation(RotationKind kind, int64_t d, uint64_t seed);
  RotationKind kind() const { return kind_; }
  int64_t dim() const { return d_; }
  uint64_t seed() const { return seed_; }
  // Each row of x [rows, d] (row stride ld) replaced by x Q.
  void apply_rows(float* x, int64_t rows, int64_t ld) const;
  // Q, dense [d, d] row-major.
  std::vector<float> matrix() const;

 private:
  RotationKind kind_;
  int64_t d_;
  uint64_t seed_;
  std::optional<kernels::HadamardTransform> hadamard_;  // Hadamard: H
  std::vector<float> signs_;                            // Hadamard: s
  std::vector<float> q_t_;  // Random: Qᵀ [d, d] (the linear kernel's weight layout)
};

// What a plan rotates (its parts rotate, rotate_seed, rotate_down, rotate_heads; plan.h).
struct RotationSpec {
  std::optional<RotationKind> residual;  // the stream's rotation (nullopt: none)
  uint64_t seed = 0;                     // of the residual rotation
  bool online_down = false;              // the down projection's input, online
  bool heads = false;                    // every head's values, folded
  bool none() const { return !residual && !online_down && !heads; }
  // "none", or its parts joined by ',': "hadamard,seed=3", "fold", "down", "heads", e.g.
  // "hadamard,seed=0,down,heads" (what a calibration records and a model's rotation() says).
  std::string name() const;
  // The inverse of name(); InvalidArgument naming the part it does not know.
  static RotationSpec from_name(const std::string& name);
  bool operator==(const RotationSpec&) const = default;
};

// The model rotated as `spec` says (the tables above); the model itself for spec none.
// Unsupported for a residual rotation of a model with post-linear norms; InvalidArgument for a
// Hadamard size no construction reaches (hadamard.h) or a model transformed already.
std::shared_ptr<const Model> rotate_model(std::shared_ptr<const Model> model,
                                          const RotationSpec& spec);

}  // namespace socllm::quant
