#include <algorithm>
#include <cmath>

#include "core/core.h"
#include "quant/quant.h"

namespace socllm::quant {

namespace {
inline float round_clamp(float x, float scale, float lo, float hi) {
  // nearbyint rounds half to even under the default rounding mode, like np.round.
  return std::clamp(std::nearbyint(x / scale), lo, hi);
}

// q[i] = clamp(round(x[i] / scale), -qmax - 1, qmax); 0 for a zero scale. No NaN in x (checked
// by the callers), so the loop vectorizes with the same result per element.
void quantize_block(const float* x, int64_t n, float scale, int32_t qmax, int8_t* q) {
  if (scale == 0.0f) {
    std::fill(q, q + n, int8_t{0});
    return;
  }
  const float lo = static_cast<float>(-qmax - 1), hi = static_cast<float>(qmax);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(round_clamp(x[i], scale, lo, hi));
}

// Index of the first NaN (or, with `inf_too`, +-inf) in x[0, n), -1 if none. The scan is a
// branch-free reduction (vectorized, parallel for large n); the index is searched only on error.
int64_t first_bad(const float* x, int64_t n, bool inf_too) {
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) bad |= inf_too ? !std::isfinite(x[i]) : std::isnan(x[i]);
  if (!bad) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (inf_too ? !std::isfinite(x[i]) : std::isnan(x[i])) return i;
  return -1;
}

// max |x[i]| (no NaN in x: the order of the reduction does not matter).
float absmax(const float* x, int64_t n) {
  float m = 0.0f;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(x[i]));
  return m;
}
}  // namespace

Granularity granularity_from_name(const std::string& name) {
  for (Granularity g : {Granularity::PerTensor, Granularity::PerChannel, Granularity::PerGroup})
    if (granularity_name(g) == name) return g;
  throw InvalidArgument("[quantize] unknown granularity '" + name +
                        "' (per-tensor, per-channel, per-group)");
}

std::string granularity_name(Granularity g) {
  switch (g) {
    case Granularity::PerTensor: return "per-tensor";
    case Granularity::PerChannel: return "per-channel";
    case Granularity::PerGroup: return "per-group";
  }
  return "?";
}

void QuantSpec::validate(int64_t cols) const {
  if (bits < 2 || bits > 8)
    throw InvalidArgument("[quantize] bits must be in 2..8, got " + std::to_string(bits));
  if (granularity == Granularity::PerGroup && (group_size <= 0 || cols % group_size != 0))
    throw InvalidArgument("[quantize] group_size " + std::to_string(group_size) +
                          " must be > 0 and divide the row length " + std::to_string(cols));
}

QuantizedWeights quantize_weights(const float* W, int64_t rows, int64_t cols,
                                  const QuantSpec& spec) {
  if (rows < 0 || cols < 0)
    throw ShapeError("[quantize] negative shape [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "]");
  spec.validate(cols);
  if (const int64_t bad = first_bad(W, rows * cols, true); bad >= 0)
    throw InvalidArgument("[quantize] non-finite value at flat index " + std::to_string(bad));
  QuantizedWeights out;
  out.rows = rows;
  out.cols = cols;
  out.spec = spec;
  out.q.resize(static_cast<size_t>(rows * cols));
  const int64_t block = spec.granularity == Granularity::PerTensor    ? rows * cols
                        : spec.granularity == Granularity::PerChannel ? cols
                                                                      : spec.group_size;
  const int64_t n_blocks = block ? rows * cols / block : 0;
  out.scales.resize(static_cast<size_t>(std::max<int64_t>(n_blocks, rows * cols ? 1 : 0)));
  const float qmax = static_cast<float>(spec.qmax());
  // Row-major blocks of `block` consecutive elements: the whole tensor, a row, or a group.
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* x = W + b * block;
    const float scale = absmax(x, block) / qmax;
    out.scales[static_cast<size_t>(b)] = scale;
    quantize_block(x, block, scale, spec.qmax(), out.q.data() + b * block);
  }
  return out;
}

void fake_quantize(float* x, int64_t rows, int64_t cols, const QuantSpec& spec) {
  if (rows < 0 || cols < 0)
    throw ShapeError("[quantize] negative shape [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "]");
  spec.validate(cols);
  const int64_t n = rows * cols;
  if (const int64_t bad = first_bad(x, n, true); bad >= 0)
    throw InvalidArgument("[quantize] non-finite value at flat index " + std::to_string(bad));
  const int64_t block = spec.granularity == Granularity::PerTensor    ? n
                        : spec.granularity == Granularity::PerChannel ? cols
                                                                      : spec.group_size;
  if (block == 0) return;
  const int32_t qmax = spec.qmax();
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t b = 0; b < n / block; ++b) {
    float* xb = x + b * block;
    const float scale = absmax(xb, block) / static_cast<float>(qmax);
    if (scale == 0.0f) {  // all zeros: +0 as 0 * scale gives
      std::fill(xb, xb + block, 0.0f);
      continue;
    }
    const float lo = static_cast<float>(-qmax - 1), hi = static_cast<float>(qmax);
#pragma omp simd
    for (int64_t i = 0; i < block; ++i) xb[i] = round_clamp(xb[i], scale, lo, hi) * scale;
  }
}

void dequantize_weights(const QuantizedWeights& w, float* out) {
  const int64_t n = w.rows * w.cols;
  if (n == 0) return;
  const int64_t block = n / static_cast<int64_t>(w.scales.size());
  for (int64_t i = 0; i < n; ++i)
    out[i] =
        static_cast<float>(w.q[static_cast<size_t>(i)]) * w.scales[static_cast<size_t>(i / block)];
}

void quantize_static(const float* x, int64_t n, float scale, int bits, int8_t* out) {
  QuantSpec{bits, Granularity::PerTensor, 0}.validate(n);
  if (!(scale > 0.0f) || !std::isfinite(scale))
    throw InvalidArgument("[quantize_static] scale must be finite and > 0, got " +
                          std::to_string(scale));
  const int32_t qmax = QuantSpec{bits, Granularity::PerTensor, 0}.qmax();
  if (const int64_t bad = first_bad(x, n, false); bad >= 0)
    throw InvalidArgument("[quantize_static] NaN at index " + std::to_string(bad));
  // +-inf saturate; parallel in blocks that each vectorize
  constexpr int64_t kBlock = 4096;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t b = 0; b < n; b += kBlock)
    quantize_block(x + b, std::min(kBlock, n - b), scale, qmax, out + b);
}

}  // namespace socllm::quant
