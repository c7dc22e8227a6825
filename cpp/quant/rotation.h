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
  None,
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

// The model with its residual stream rotated by `rot` (the table above). Unsupported for models
// with post-linear norms; ShapeError when rot's size is not d_model.
std::shared_ptr<const Model> rotate_residual(const Model& model, const ResidualRotation& rot);

}  // namespace socllm::quant
