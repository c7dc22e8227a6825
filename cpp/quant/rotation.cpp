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
    case RotationKind::Fold: return "fold";
    case RotationKind::Hadamard: return "hadamard";
    case RotationKind::Random: return "random";
  }
  return "?";
}

RotationKind rotation_from_name(const std::string& name) {
  for (RotationKind k : {RotationKind::Fold, RotationKind::Hadamard, RotationKind::Random})
    if (rotation_name(k) == name) return k;
  throw InvalidArgument("[rotation] unknown rotation '" + name + "' (fold, hadamard, random)");
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
  if (kind_ == RotationKind::Fold || rows == 0) return;
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
  if (kind_ == RotationKind::Fold) {
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

// The columns [col0, col0 + n) of W [out, in] mapped by H / sqrt(n): each row's slice w -> H w.
void hadamard_row_slices(TensorF32& W, const kernels::HadamardTransform& H, int64_t col0) {
  H.apply(W.ptr() + col0, W.dim(0), W.dim(1));
}

// Rows [row0, row0 + n) of W [out, in] (and of its bias) mapped by H / sqrt(n): W_h -> H W_h.
void hadamard_row_block(TensorF32& W, std::vector<float>* bias, const kernels::HadamardTransform& H,
                        int64_t row0) {
  const int64_t n = H.size(), in = W.dim(1);
  std::vector<float> t(static_cast<size_t>(in * n));  // the block transposed: [in, n]
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < in; ++i)
      t[static_cast<size_t>(i * n + r)] = W.data[(row0 + r) * in + i];
  H.apply(t.data(), in, n);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < in; ++i)
      W.data[(row0 + r) * in + i] = t[static_cast<size_t>(i * n + r)];
  if (bias && !bias->empty()) H.apply(bias->data() + row0, 1, n);
}

}  // namespace

std::string RotationSpec::name() const {
  std::string s;
  const auto add = [&](const std::string& part) { s += (s.empty() ? "" : ",") + part; };
  if (residual) {
    add(rotation_name(*residual));
    if (*residual != RotationKind::Fold) add("seed=" + std::to_string(seed));
  }
  if (online_down) add("down");
  if (heads) add("heads");
  return s.empty() ? "none" : s;
}

RotationSpec RotationSpec::from_name(const std::string& name) {
  RotationSpec r;
  if (name == "none") return r;
  size_t at = 0;
  while (at <= name.size()) {
    const size_t end = std::min(name.find(',', at), name.size());
    const std::string part = name.substr(at, end - at);
    if (part == "down") r.online_down = true;
    else if (part == "heads") r.heads = true;
    else if (part.rfind("seed=", 0) == 0 && part.size() > 5 &&
             part.find_first_not_of("0123456789", 5) == std::string::npos)
      r.seed = std::stoull(part.substr(5));
    else if (part == "fold" || part == "hadamard" || part == "random")
      r.residual = rotation_from_name(part);
    else
      throw InvalidArgument("[rotation] '" + name + "' has an unknown part '" + part +
                            "' (fold, hadamard, random, seed=N, down, heads)");
    at = end + 1;
  }
  if (r.name() != name)
    throw InvalidArgument("[rotation] '" + name + "' is not a rotation's name (e.g. '" + r.name() +
                          "')");
  return r;
}

std::shared_ptr<const Model> rotate_model(std::shared_ptr<const Model> model,
                                          const RotationSpec& spec) {
  if (spec.none()) return model;
  const ModelConfig& c = model->config();
  TensorF32 embed = model->embed_tokens(), head, final_norm = model->final_norm();
  std::vector<LayerWeights> layers;
  for (int64_t l = 0; l < c.n_layers; ++l) layers.push_back(model->layer(l));
  if (spec.residual) {
    const ResidualRotation rot(*spec.residual, c.d_model, spec.seed);
    if (c.post_norms)
      throw Unsupported("[rotate_model] " + c.name +
                        " normalizes the attention and MLP outputs with per-channel gains before "
                        "the residual adds (Gemma 3's post norms): a rotated stream does not pass "
                        "them unchanged, so the weights cannot absorb the rotation");
    rot.apply_rows(embed.ptr(), c.vocab_size, c.d_model);
    head = fold_gain_and_rotate(model->lm_head(), model->final_norm(), rot);
    final_norm = ones_like(final_norm);
    for (LayerWeights& R : layers) {
      R.wqkv = fold_gain_and_rotate(R.wqkv, R.attn_norm, rot);
      R.w_gate_up = fold_gain_and_rotate(R.w_gate_up, R.ffn_norm, rot);
      R.wo = rotate_columns(R.wo, rot);
      R.w_down = rotate_columns(R.w_down, rot);
      R.attn_norm = ones_like(R.attn_norm);
      R.ffn_norm = ones_like(R.ffn_norm);
    }
  }
  if (spec.heads) {
    const kernels::HadamardTransform H(c.head_dim);
    const int64_t v_row0 = (c.n_heads + c.n_kv_heads) * c.head_dim;
    for (LayerWeights& R : layers) {
      for (int64_t h = 0; h < c.n_kv_heads; ++h)
        hadamard_row_block(R.wqkv, &R.bqkv.data, H, v_row0 + h * c.head_dim);
      for (int64_t h = 0; h < c.n_heads; ++h) hadamard_row_slices(R.wo, H, h * c.head_dim);
    }
  }
  if (spec.online_down) {
    const kernels::HadamardTransform H(c.d_ff);
    for (LayerWeights& R : layers) hadamard_row_slices(R.w_down, H, 0);
  }
  return model->with_weights(std::move(embed), std::move(head), std::move(final_norm),
                             std::move(layers), {spec.name(), spec.online_down});
}

}  // namespace socllm::quant
