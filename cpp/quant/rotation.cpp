#include "quant/rotation.h"

#include <Eigen/Dense>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/core.h"
#include "kernels/hadamard.h"
#include "kernels/kernels.h"

namespace socllm::quant {

std::string rotation_name(RotationKind k) {
  switch (k) {
    case RotationKind::None: return "none";
    case RotationKind::Hadamard: return "hadamard";
    case RotationKind::Random: return "random";
  }
  return "?";
}

RotationKind rotation_from_name(const std::string& name) {
  for (RotationKind k : {RotationKind::None, RotationKind::Hadamard, RotationKind::Random})
    if (rotation_name(k) == name) return k;
  throw InvalidArgument("[rotation] unknown rotation '" + name + "' (none, hadamard, random)");
}

ResidualRotation::ResidualRotation(RotationKind kind, int64_t d, uint64_t seed)
    : kind_(kind), d_(d), seed_(seed) {
  if (d <= 0)
    throw ShapeError("[ResidualRotation] size must be positive, got " + std::to_string(d));
  std::mt19937_64 rng(seed);
  if (kind == RotationKind::Hadamard) {
    hadamard_.emplace(d);  // InvalidArgument now if d has no construction
    signs_.resize(static_cast<size_t>(d));
    for (auto& s : signs_) s = (rng() & 1) ? 1.0f : -1.0f;
  } else if (kind == RotationKind::Random) {
    // Haar measure: Q of the QR of a standard Gaussian matrix, each column's sign set by R's
    // diagonal (Mezzadri 2007), in double, then stored as float Qᵀ
    std::normal_distribution<double> nd;
    Eigen::MatrixXd G(d, d);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) G(i, j) = nd(rng);
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(G);
    Eigen::MatrixXd Q = qr.householderQ();
    const Eigen::MatrixXd R = qr.matrixQR().triangularView<Eigen::Upper>();
    for (int64_t j = 0; j < d; ++j)
      if (R(j, j) < 0) Q.col(j) *= -1.0;
    q_t_.resize(static_cast<size_t>(d * d));
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j)
        q_t_[static_cast<size_t>(j * d + i)] = static_cast<float>(Q(i, j));
  }
}

void ResidualRotation::apply_rows(float* x, int64_t rows, int64_t ld) const {
  if (rows < 0 || ld < d_)
    throw ShapeError("[ResidualRotation] " + std::to_string(rows) + " rows of " +
                     std::to_string(d_) + " with row stride " + std::to_string(ld));
  if (kind_ == RotationKind::None || rows == 0) return;
  if (kind_ == RotationKind::Hadamard) {
    // x Q = (x ⊙ s) Hᵀ / sqrt(d): each row, as a column vector, is H (s ⊙ x) / sqrt(d)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < d_; ++j) x[r * ld + j] *= signs_[static_cast<size_t>(j)];
    hadamard_->apply(x, rows, ld);
    return;
  }
  std::vector<float> y(static_cast<size_t>(rows * d_));
  kernels::linear(x, rows, d_, ld, q_t_.data(), d_, nullptr, y.data(), d_);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(y.data() + r * d_, d_, x + r * ld);
}

std::vector<float> ResidualRotation::matrix() const {
  std::vector<float> Q(static_cast<size_t>(d_ * d_), 0.0f);
  if (kind_ == RotationKind::None) {
    for (int64_t i = 0; i < d_; ++i) Q[static_cast<size_t>(i * d_ + i)] = 1.0f;
  } else if (kind_ == RotationKind::Hadamard) {
    const auto M = hadamard_->matrix();  // H / sqrt(d)
    for (int64_t i = 0; i < d_; ++i)
      for (int64_t j = 0; j < d_; ++j)
        Q[static_cast<size_t>(i * d_ + j)] = signs_[static_cast<size_t>(i)] * M[j * d_ + i];
  } else {
    for (int64_t i = 0; i < d_; ++i)
      for (int64_t j = 0; j < d_; ++j)
        Q[static_cast<size_t>(i * d_ + j)] = q_t_[static_cast<size_t>(j * d_ + i)];
  }
  return Q;
}

namespace {

// W [out, in] with its columns mapped by the rotation: W' = Qᵀ W, whose column j is Qᵀ w_j,
// i.e. the row w_jᵀ Q: transpose, rotate the rows, transpose back.
TensorF32 rotate_columns(const TensorF32& W, const ResidualRotation& rot) {
  const int64_t out = W.dim(0), in = W.dim(1);
  std::vector<float> t(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) t[static_cast<size_t>(i * out + o)] = W.data[o * in + i];
  rot.apply_rows(t.data(), in, out);
  TensorF32 R(W.shape);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) R.data[o * in + i] = t[static_cast<size_t>(i * out + o)];
  return R;
}

// W [out, in] reading the normed stream: W' = W diag(γ) Q, row by row.
TensorF32 fold_gain_and_rotate(const TensorF32& W, const TensorF32& gain,
                               const ResidualRotation& rot) {
  TensorF32 R = W;
  const int64_t out = W.dim(0), in = W.dim(1);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) R.data[o * in + i] *= gain.data[i];
  rot.apply_rows(R.ptr(), out, in);
  return R;
}

TensorF32 ones_like(const TensorF32& t) {
  TensorF32 o(t.shape);
  std::fill(o.data.begin(), o.data.end(), 1.0f);
  return o;
}

}  // namespace

std::shared_ptr<const Model> rotate_residual(const Model& model, const ResidualRotation& rot) {
  const ModelConfig& c = model.config();
  const std::string label =
      "rotate=" + rotation_name(rot.kind()) +
      (rot.kind() == RotationKind::None ? "" : ",seed=" + std::to_string(rot.seed()));
  if (rot.dim() != c.d_model)
    throw ShapeError("[rotate_residual] a rotation of size " + std::to_string(rot.dim()) +
                     " for d_model " + std::to_string(c.d_model));
  if (c.post_norms)
    throw Unsupported("[rotate_residual] " + c.name +
                      " normalizes the attention and MLP outputs with per-channel gains before the "
                      "residual adds (Gemma 3's post norms): a rotated stream does not pass them "
                      "unchanged, so the weights cannot absorb the rotation");
  TensorF32 embed = model.embed_tokens();
  rot.apply_rows(embed.ptr(), c.vocab_size, c.d_model);
  TensorF32 head = fold_gain_and_rotate(model.lm_head(), model.final_norm(), rot);
  std::vector<LayerWeights> layers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = model.layer(l);
    LayerWeights R = L;
    R.wqkv = fold_gain_and_rotate(L.wqkv, L.attn_norm, rot);
    R.w_gate_up = fold_gain_and_rotate(L.w_gate_up, L.ffn_norm, rot);
    R.wo = rotate_columns(L.wo, rot);
    R.w_down = rotate_columns(L.w_down, rot);
    R.attn_norm = ones_like(L.attn_norm);
    R.ffn_norm = ones_like(L.ffn_norm);
    layers.push_back(std::move(R));
  }
  return model.with_weights(std::move(embed), std::move(head), ones_like(model.final_norm()),
                            std::move(layers), label);
}

}  // namespace socllm::quant
