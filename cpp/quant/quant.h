// Quant layer: symmetric integer quantizers (the NPU baselines of seed 001 §2.3 / Table 4 and
// the K-quant-like per-group schemes of seed 001 Fig. 3).
//
// Rules, identical on every path and documented for users:
//   scale  = max|x| over the tensor / output channel / group, divided by qmax
//            (qmax = 2^(bits-1) - 1: 127 for 8 bits, 7 for 4 bits; 2..8 bits); an all-zero
//            block gets scale 0 and q = 0.
//   q      = saturate(round_half_to_even(x / scale)) into [-qmax - 1, qmax]
//            (true division, as numpy's np.round(x / scale); saturation matters for static
//            activation scales calibrated on other data).
//   x_hat  = q * scale.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace socllm::quant {

enum class Granularity { PerTensor, PerChannel, PerGroup };

Granularity granularity_from_name(const std::string& name);  // per-tensor|per-channel|per-group
std::string granularity_name(Granularity g);

struct QuantSpec {
  int bits = 8;  // 2..8 (8 and 4 are the presets' formats; bitwidth.h adds 1-bit rows)
  Granularity granularity = Granularity::PerChannel;
  int64_t group_size = 32;  // per-group only; must divide the row length
  void validate(int64_t cols) const;
  int32_t qmax() const { return (1 << (bits - 1)) - 1; }
};

// Weights W[rows, cols] (rows = output channels). q is one int8 per element (B-bit values
// stored unpacked in [-2^(B-1), 2^(B-1) - 1]); scales has 1 (per-tensor), rows (per-channel) or
// rows * cols / group_size (per-group, row-major) entries.
struct QuantizedWeights {
  int64_t rows = 0, cols = 0;
  QuantSpec spec;
  std::vector<int8_t> q;
  std::vector<float> scales;
};

QuantizedWeights quantize_weights(const float* W, int64_t rows, int64_t cols,
                                  const QuantSpec& spec);
void dequantize_weights(const QuantizedWeights& w, float* out);  // out[rows * cols]
// x <- dequantize(quantize(x)) in place, bit-identical to the two calls above without the int8
// copy: how the float path applies dynamic activation quantization (one parallel pass).
void fake_quantize(float* x, int64_t rows, int64_t cols, const QuantSpec& spec);

// Activations with a static (calibrated) scale: out[i] = saturate(rne(x[i] / scale)).
void quantize_static(const float* x, int64_t n, float scale, int bits, int8_t* out);

}  // namespace socllm::quant
