// Quantizer rules on hand-computed cases (quant.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/core.h"
#include "quant/quant.h"

namespace q = socllm::quant;

TEST(Quant, PerChannelHandComputed) {
  // Row 0: max 127 -> scale 1, exact halves; row 1 all zero -> scale 0, q 0.
  std::vector<float> W{127.0f, -63.5f, 0.5f, 1.5f, 0, 0, 0, 0};
  auto w = q::quantize_weights(W.data(), 2, 4, {8, q::Granularity::PerChannel, 0});
  ASSERT_EQ(w.scales.size(), 2u);
  EXPECT_EQ(w.scales[0], 1.0f);
  EXPECT_EQ(w.scales[1], 0.0f);
  EXPECT_EQ(w.q[0], 127);
  EXPECT_EQ(w.q[1], -64);  // -63.5 rounds half to even
  EXPECT_EQ(w.q[2], 0);    // 0.5 -> 0 (even)
  EXPECT_EQ(w.q[3], 2);    // 1.5 -> 2 (even)
  for (int i = 4; i < 8; ++i) EXPECT_EQ(w.q[i], 0);
}

TEST(Quant, Int4GroupsAndSaturation) {
  std::vector<float> W{7, 1, -7, 3.5f, 14, -2, 0, 1};
  auto w = q::quantize_weights(W.data(), 1, 8, {4, q::Granularity::PerGroup, 4});
  ASSERT_EQ(w.scales.size(), 2u);
  EXPECT_EQ(w.scales[0], 1.0f);
  EXPECT_EQ(w.scales[1], 2.0f);
  EXPECT_EQ(std::vector<int8_t>(w.q.begin(), w.q.begin() + 4), (std::vector<int8_t>{7, 1, -7, 4}));
  std::vector<float> x{100, -100, 2.5f};
  std::vector<int8_t> out(3);
  q::quantize_static(x.data(), 3, 1.0f, 4, out.data());
  EXPECT_EQ(out, (std::vector<int8_t>{7, -8, 2}));
  EXPECT_THROW(q::quantize_static(x.data(), 3, -1.0f, 8, out.data()), socllm::InvalidArgument);
  EXPECT_THROW(q::quantize_weights(W.data(), 1, 8, {4, q::Granularity::PerGroup, 3}),
               socllm::InvalidArgument);
}

TEST(Quant, FakeQuantizeEqualsQuantizeThenDequantize) {
  // The float path's one-pass activation quantization must be bit-identical to the two-step
  // reference, at every granularity and past the size where it runs in parallel.
  const int64_t rows = 300, cols = 256;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 97));
  for (q::QuantSpec spec : {q::QuantSpec{8, q::Granularity::PerGroup, 32},
                            q::QuantSpec{8, q::Granularity::PerChannel, 0},
                            q::QuantSpec{4, q::Granularity::PerTensor, 0}}) {
    std::vector<float> ref(x.size()), got = x;
    q::dequantize_weights(q::quantize_weights(x.data(), rows, cols, spec), ref.data());
    q::fake_quantize(got.data(), rows, cols, spec);
    ASSERT_EQ(got, ref) << q::granularity_name(spec.granularity);
  }
  std::vector<float> bad{1.0f, NAN, 2.0f, 3.0f};
  EXPECT_THROW(q::fake_quantize(bad.data(), 1, 4, {8, q::Granularity::PerGroup, 2}),
               socllm::InvalidArgument);
  EXPECT_THROW(q::fake_quantize(x.data(), 1, 30, {8, q::Granularity::PerGroup, 32}),
               socllm::InvalidArgument);
}

TEST(Quant, NanIsReportedAtItsIndexOnTheParallelPath) {
  std::vector<float> x(100000, 0.5f);
  std::vector<int8_t> out(x.size());
  x[70001] = NAN;
  try {
    q::quantize_static(x.data(), static_cast<int64_t>(x.size()), 1.0f, 8, out.data());
    FAIL() << "no error";
  } catch (const socllm::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("NaN at index 70001"), std::string::npos) << e.what();
  }
  x[70001] = INFINITY;  // saturates in a static quantizer, is an error in a dynamic one
  q::quantize_static(x.data(), static_cast<int64_t>(x.size()), 1.0f, 8, out.data());
  EXPECT_EQ(out[70001], 127);
  EXPECT_EQ(out[0], 0);  // 0.5 rounds half to even
  EXPECT_THROW(q::fake_quantize(x.data(), 1000, 100, {8, q::Granularity::PerChannel, 0}),
               socllm::InvalidArgument);
}
