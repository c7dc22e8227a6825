#include "quant/gptq.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/core.h"
#include "quant/bitwidth.h"

namespace socllm::quant {

namespace {

using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatD = Eigen::MatrixXd;

// Round-to-nearest of one value on a symmetric grid (the rule of quant.h).
inline int8_t round_code(float w, float scale, int32_t qmax) {
  if (scale == 0.0f) return 0;
  const float r = std::nearbyint(w / scale);
  return static_cast<int8_t>(
      std::clamp(r, static_cast<float>(-qmax - 1), static_cast<float>(qmax)));
}

// The scale of values v[0..n) (stride) at `bits` (1: mean|v|, else max|v| / qmax).
float grid_scale(const float* v, int64_t n, int64_t stride, int bits) {
  if (bits == 1) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::abs(static_cast<double>(v[i * stride]));
    return n > 0 ? static_cast<float>(s / static_cast<double>(n)) : 0.0f;
  }
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(v[i * stride]));
  return amax / static_cast<float>((1 << (bits - 1)) - 1);
}

}  // namespace

bool GptqOptions::act_order_from_name(const std::string& name) {
  if (name != "natural" && name != "act")
    throw InvalidArgument("[gptq] the column order is natural or act, got '" + name + "'");
  return name == "act";
}

void GptqOptions::validate() const {
  if (!(damp > 0.0 && damp <= 1.0))
    throw InvalidArgument("[gptq] damp must be in (0, 1], got " + std::to_string(damp));
  if (block < 1) throw InvalidArgument("[gptq] block must be >= 1, got " + std::to_string(block));
}

QuantizedWeights gptq_quantize(const float* W, int64_t out, int64_t in, std::span<const float> H,
                               const QuantSpec& spec, const GptqOptions& opts,
                               std::span<const uint8_t> row_bits) {
  opts.validate();
  if (out <= 0 || in <= 0)
    throw ShapeError("[gptq] empty weight shape [" + std::to_string(out) + ", " +
                     std::to_string(in) + "]");
  if (static_cast<int64_t>(H.size()) != in * in)
    throw ShapeError("[gptq] H has " + std::to_string(H.size()) + " values, need " +
                     std::to_string(in) + " x " + std::to_string(in));
  spec.validate(in);
  const bool per_group = spec.granularity == Granularity::PerGroup;
  if (!row_bits.empty()) {
    if (spec.granularity != Granularity::PerChannel)
      throw InvalidArgument("[gptq] per-row bit-widths need per-channel scales");
    if (static_cast<int64_t>(row_bits.size()) != out)
      throw ShapeError("[gptq] " + std::to_string(row_bits.size()) + " row bit-widths for " +
                       std::to_string(out) + " rows");
    for (uint8_t b : row_bits)
      if (b < kMinChannelBits || b > kMaxChannelBits)
        throw InvalidArgument("[gptq] row bit-width " + std::to_string(b) + " outside 1..8");
  }
  for (int64_t i = 0; i < out * in; ++i)
    if (!std::isfinite(W[i]))
      throw InvalidArgument("[gptq] non-finite weight at index " + std::to_string(i));
  for (size_t i = 0; i < H.size(); ++i)
    if (!std::isfinite(H[i]))
      throw InvalidArgument("[gptq] non-finite H at index " + std::to_string(i));
  const auto bits_of = [&](int64_t r) { return row_bits.empty() ? spec.bits : int(row_bits[r]); };

  // Column order: natural or descending diag(H) (stable, so ties keep their order).
  std::vector<int64_t> perm(static_cast<size_t>(in));
  std::iota(perm.begin(), perm.end(), 0);
  if (opts.act_order)
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int64_t a, int64_t b) { return H[a * in + a] > H[b * in + b]; });
  // Wt: W transposed and permuted, [in, out]: column j of W is a contiguous row.
  MatF Wt(in, out);
  for (int64_t j = 0; j < in; ++j)
    for (int64_t r = 0; r < out; ++r) Wt(j, r) = W[r * in + perm[static_cast<size_t>(j)]];
  MatD Hp(in, in);
  for (int64_t a = 0; a < in; ++a)
    for (int64_t b = 0; b < in; ++b)
      Hp(a, b) = H[perm[static_cast<size_t>(a)] * in + perm[static_cast<size_t>(b)]];
  for (int64_t j = 0; j < in; ++j)
    if (Hp(j, j) == 0.0) {  // a dead input: nothing to preserve, a zero weight
      Hp(j, j) = 1.0;
      Wt.row(j).setZero();
    }
  const double mean_diag = Hp.diagonal().mean();
  Hp.diagonal().array() += opts.damp * mean_diag;
  // U upper with H⁻¹ = Uᵀ U: the Cholesky factor of the inverse (the paper's Cholesky form).
  Eigen::LLT<MatD> llt(Hp);
  if (llt.info() != Eigen::Success)
    throw InvalidArgument("[gptq] H + damping is not positive definite (damp " +
                          std::to_string(opts.damp) + "): a larger damp is needed");
  const MatD Hinv = llt.solve(MatD::Identity(in, in));
  Eigen::LLT<MatD> llt_inv(Hinv);
  if (llt_inv.info() != Eigen::Success)
    throw InvalidArgument("[gptq] the inverse Hessian is not positive definite (damp " +
                          std::to_string(opts.damp) + ")");
  const MatF U = MatD(llt_inv.matrixU()).cast<float>();

  QuantizedWeights qw;
  qw.rows = out;
  qw.cols = in;
  qw.spec = spec;
  qw.q.assign(static_cast<size_t>(out * in), 0);
  const int64_t groups = per_group ? in / spec.group_size : 1;
  // Scales fixed before the loop: per tensor, per channel, per row width, static groups.
  if (spec.granularity == Granularity::PerTensor) {
    qw.scales = {grid_scale(W, out * in, 1, spec.bits)};
  } else if (spec.granularity == Granularity::PerChannel) {
    qw.scales.resize(static_cast<size_t>(out));
    for (int64_t r = 0; r < out; ++r) qw.scales[r] = grid_scale(W + r * in, in, 1, bits_of(r));
  } else {
    qw.scales.assign(static_cast<size_t>(out * groups), 0.0f);
    if (opts.act_order)
      for (int64_t r = 0; r < out; ++r)
        for (int64_t g = 0; g < groups; ++g)
          qw.scales[r * groups + g] =
              grid_scale(W + r * in + g * spec.group_size, spec.group_size, 1, spec.bits);
  }
  const auto scale_of = [&](int64_t r, int64_t col) {
    if (spec.granularity == Granularity::PerTensor) return qw.scales[0];
    if (spec.granularity == Granularity::PerChannel) return qw.scales[r];
    return qw.scales[r * groups + col / spec.group_size];
  };
  int64_t B = opts.block;
  if (per_group && !opts.act_order)
    B = std::max(spec.group_size, B / spec.group_size * spec.group_size);

  MatF err(B, out);  // the block's scaled errors, one row per column
  std::vector<float> qrow(static_cast<size_t>(out));
  for (int64_t i1 = 0; i1 < in; i1 += B) {
    const int64_t i2 = std::min(i1 + B, in), nb = i2 - i1;
    for (int64_t i = i1; i < i2; ++i) {
      const int64_t col = perm[static_cast<size_t>(i)];  // the original column
      if (per_group && !opts.act_order && col % spec.group_size == 0)
        for (int64_t r = 0; r < out; ++r)  // the group's columns as updated so far
          qw.scales[r * groups + col / spec.group_size] =
              grid_scale(&Wt(i, r), spec.group_size, out, spec.bits);
      const float d = U(i, i);
      for (int64_t r = 0; r < out; ++r) {
        const float w = Wt(i, r), s = scale_of(r, col);
        const int bits = bits_of(r);
        int8_t q;
        if (bits == 1) q = w >= 0.0f ? 1 : -1;
        else q = round_code(w, s, (1 << (bits - 1)) - 1);
        qw.q[static_cast<size_t>(r * in + col)] = q;
        err(i - i1, r) = (w - q * s) / d;
      }
      // the error onto the block's later columns (rank-1)
      if (i + 1 < i2)
        Wt.middleRows(i + 1, i2 - i - 1).noalias() -=
            U.row(i).segment(i + 1, i2 - i - 1).transpose() * err.row(i - i1);
    }
    // the block's error onto every later column at once (the lazy batch)
    if (i2 < in)
      Wt.bottomRows(in - i2).noalias() -=
          U.block(i1, i2, nb, in - i2).transpose() * err.topRows(nb);
  }
  return qw;
}

double gptq_objective(const float* W, const float* W_hat, int64_t out, int64_t in,
                      std::span<const float> H) {
  if (static_cast<int64_t>(H.size()) != in * in)
    throw ShapeError("[gptq_objective] H has " + std::to_string(H.size()) + " values, need " +
                     std::to_string(in * in));
  MatD D(out, in);
  for (int64_t r = 0; r < out; ++r)
    for (int64_t j = 0; j < in; ++j) D(r, j) = double{W[r * in + j]} - W_hat[r * in + j];
  const Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> Hm(
      H.data(), in, in);
  return (D * Hm.cast<double>()).cwiseProduct(D).sum() / static_cast<double>(out);
}

}  // namespace socllm::quant
