// Quantizer rules on hand-computed cases (quant.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "socllm/core.h"
#include "socllm/quant.h"

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
