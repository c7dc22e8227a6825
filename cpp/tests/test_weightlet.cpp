// EdgeFlow's weightlet packing (weightlet.h, seed 004 §4.2): the layout on a hand-computed
// group, fuzzed round trips through every unpacking path and bit-width mix, the counted SIMD
// operations, and bad input.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/core.h"
#include "kernels/weightlet.h"

namespace k = socllm::kernels;

namespace {
int8_t random_code(std::mt19937& rng, int b) {
  if (b == 1) return std::uniform_int_distribution<int>(0, 1)(rng) ? 1 : -1;
  return static_cast<int8_t>(
      std::uniform_int_distribution<int>(-(1 << (b - 1)), (1 << (b - 1)) - 1)(rng));
}
}  // namespace

TEST(Weightlet, HandComputedThreeBitGroup) {
  // One group of 16 weights (2-byte blocks, stripes of 2), 3 bits = a 1-bit part (MSB) and a
  // 2-bit part. Codes u_t = t mod 8, i.e. q = u - 4.
  std::vector<int8_t> q(16);
  for (int t = 0; t < 16; ++t) q[t] = static_cast<int8_t>(t % 8 - 4);
  const std::vector<uint8_t> bits{3};
  const auto p = k::WeightletTensor::pack(q.data(), 1, 16, bits, 16);
  ASSERT_EQ(p.data().size(), 6u);  // 16 * 3 / 8
  // 1-bit block: byte k holds the MSB of weight 2s + k for stripes s = 0..7 at bits 7..0.
  // Byte 0: u = 0,2,4,6,0,2,4,6 -> MSBs 0,0,1,1,0,0,1,1; byte 1: u = 1,3,5,7,... -> same.
  EXPECT_EQ(p.data()[0], 0x33);
  EXPECT_EQ(p.data()[1], 0x33);
  // 2-bit block 0 (stripes 0-3), byte 0: low bits of u = 0,2,4,6 -> 0,2,0,2 at bits 7-6 .. 1-0.
  EXPECT_EQ(p.data()[2], 0x22);
  EXPECT_EQ(p.data()[3], 0x77);  // u = 1,3,5,7 -> 1,3,1,3
  EXPECT_EQ(p.data()[4], 0x22);  // block 1: stripes 4-7, same codes again
  EXPECT_EQ(p.data()[5], 0x77);
  EXPECT_EQ(p.bits(0), 3);
  for (auto isa : k::supported_unpack_isas()) {
    std::vector<int8_t> out(16);
    p.unpack(out.data(), isa);
    EXPECT_EQ(out, q) << k::unpack_isa_name(isa);
  }
  EXPECT_EQ(k::weightlet_parts(7), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(k::weightlet_parts(8), (std::vector<int>{4, 4}));
}

TEST(Weightlet, FuzzedRoundTripsEveryPathAndMix) {
  std::mt19937 rng(42);
  const int64_t shapes[][2] = {{1, 8},    {3, 16},  {5, 64},   {9, 128}, {7, 136},
                               {17, 576}, {4, 264}, {6, 1536}, {2, 200}};
  const int64_t groups[] = {128, 64, 256, 32, 24, 8};
  for (int trial = 0; trial < 60; ++trial) {
    const auto& sh = shapes[trial % std::size(shapes)];
    const int64_t rows = sh[0], cols = sh[1], group = groups[trial % std::size(groups)];
    std::vector<uint8_t> bits(rows);
    for (auto& b : bits) b = static_cast<uint8_t>(std::uniform_int_distribution<int>(1, 8)(rng));
    if (trial < 8)  // every bit-width on every row once
      for (auto& b : bits) b = static_cast<uint8_t>(trial + 1);
    std::vector<int8_t> q(rows * cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        q[i * cols + j] = random_code(rng, bits[i]);
        if (j < 2)
          q[i * cols + j] = bits[i] == 1 ? (j ? 1 : -1)  // the range's extremes
                                         : (j ? (1 << (bits[i] - 1)) - 1 : -(1 << (bits[i] - 1)));
      }
    const auto p = k::WeightletTensor::pack(q.data(), rows, cols, bits, group);
    int64_t expect_bytes = 0;
    for (auto b : bits) expect_bytes += cols * b / 8;
    EXPECT_EQ(static_cast<int64_t>(p.data().size()), expect_bytes);
    EXPECT_EQ(p.bit_widths(), bits);
    for (auto isa : k::supported_unpack_isas()) {
      std::vector<int8_t> out(rows * cols, 99);
      p.unpack(out.data(), isa);
      ASSERT_EQ(out, q) << k::unpack_isa_name(isa) << " trial " << trial << " group " << group;
      if (rows > 2) {  // a row range lands at the start of out
        std::vector<int8_t> part((rows - 2) * cols);
        p.unpack_rows(1, rows - 1, part.data(), isa);
        ASSERT_TRUE(std::equal(part.begin(), part.end(), q.begin() + cols));
      }
    }
    std::vector<int8_t> counted(rows * cols);
    const auto n = p.unpack_counted(counted.data());
    EXPECT_EQ(counted, q);
    EXPECT_EQ(n.weights, rows * cols);
    // Rebuilt from its stored parts it is the same tensor.
    const k::WeightletTensor again(rows, cols, group, p.bit_metadata(), p.data());
    std::vector<int8_t> out(rows * cols);
    again.unpack(out.data(), k::UnpackIsa::Scalar);
    EXPECT_EQ(out, q);
  }
}

TEST(Weightlet, CountedOperationsPerWeight) {
  // 5 bits = 1 + 4, one 128-weight group: per 16-byte chunk 5 loads; per stripe the 1-bit part
  // moves by 3 - p (no shift at p = 3: 7 shifts), the 4-bit part by 4 or 0 (4 shifts); 2 ands,
  // 1 or, 1 subtract and 1 store per stripe: 5 + 11 + 24 + 8 + 8 = 56 for 128 weights.
  std::vector<int8_t> q(128, 0);
  const std::vector<uint8_t> bits{5};
  const auto p = k::WeightletTensor::pack(q.data(), 1, 128, bits, 128);
  std::vector<int8_t> out(128);
  const auto n = p.unpack_counted(out.data());
  EXPECT_EQ(n.loads, 5);
  EXPECT_EQ(n.shifts, 11);
  EXPECT_EQ(n.logic, 24);
  EXPECT_EQ(n.arith, 8);
  EXPECT_EQ(n.stores, 8);
  EXPECT_EQ(n.total(), 56);
  EXPECT_EQ(n.weights, 128);
}

TEST(Weightlet, BadInput) {
  std::vector<int8_t> q(16, 0);
  EXPECT_THROW(k::WeightletTensor::pack(q.data(), 1, 16, std::vector<uint8_t>{9}, 128),
               socllm::InvalidArgument);
  EXPECT_THROW(k::WeightletTensor::pack(q.data(), 1, 16, std::vector<uint8_t>{0}, 128),
               socllm::InvalidArgument);
  EXPECT_THROW(k::WeightletTensor::pack(q.data(), 1, 12, std::vector<uint8_t>{4}, 128),
               socllm::ShapeError);
  EXPECT_THROW(k::WeightletTensor::pack(q.data(), 2, 8, std::vector<uint8_t>{4}, 128),
               socllm::ShapeError);
  EXPECT_THROW(k::WeightletTensor::pack(q.data(), 1, 16, std::vector<uint8_t>{4}, 12),
               socllm::InvalidArgument);
  q[5] = 8;  // outside 4 bits' [-8, 7]
  try {
    k::WeightletTensor::pack(q.data(), 1, 16, std::vector<uint8_t>{4}, 16);
    FAIL();
  } catch (const socllm::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("column 5"), std::string::npos) << e.what();
  }
  q[5] = 0;  // 1 bit has no zero code
  EXPECT_THROW(k::WeightletTensor::pack(q.data(), 1, 16, std::vector<uint8_t>{1}, 16),
               socllm::InvalidArgument);
  const auto p = k::WeightletTensor::pack(q.data(), 1, 16, std::vector<uint8_t>{4}, 16);
  auto short_data = p.data();
  short_data.pop_back();
  try {
    k::WeightletTensor(1, 16, 16, p.bit_metadata(), short_data);
    FAIL();
  } catch (const socllm::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("implies 8 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(k::WeightletTensor(2, 16, 16, p.bit_metadata(), p.data()), socllm::FormatError);
  std::vector<int8_t> out(16);
  EXPECT_THROW(p.unpack_rows(0, 2, out.data(), k::UnpackIsa::Scalar), socllm::InvalidArgument);
  EXPECT_THROW(k::unpack_isa_from_name("neon"), socllm::InvalidArgument);
#if defined(__aarch64__)
  EXPECT_THROW(p.unpack(out.data(), k::UnpackIsa::Sse128), socllm::InvalidArgument);
#else
  EXPECT_THROW(p.unpack(out.data(), k::UnpackIsa::Neon128), socllm::InvalidArgument);
#endif
}
