// GGUF parsing on hand-built files and dequantization of hand-made blocks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_error.h"
#include "io/gguf.h"

using socllm::GgufFile;

namespace {
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
};

// GGUF v3: 2 kv (u32, string array), 2 tensors: "a" F32 [2,3] and "b" Q8_0 [32] (its data at
// b_offset in the data section).
std::vector<uint8_t> tiny_gguf(uint64_t b_offset = 32) {
  Bytes f;
  f.b = {'G', 'G', 'U', 'F'};
  f.put<uint32_t>(3).put<uint64_t>(2).put<uint64_t>(2);
  f.str("llama.block_count").put<uint32_t>(4).put<uint32_t>(7);
  f.str("tokenizer.ggml.tokens")
      .put<uint32_t>(9)
      .put<uint32_t>(8)
      .put<uint64_t>(2)
      .str("hi")
      .str("yo");
  f.str("a").put<uint32_t>(2).put<uint64_t>(3).put<uint64_t>(2).put<uint32_t>(0).put<uint64_t>(0);
  f.str("b").put<uint32_t>(1).put<uint64_t>(32).put<uint32_t>(8).put<uint64_t>(b_offset);
  while (f.b.size() % 32) f.b.push_back(0);
  for (int i = 0; i < 6; ++i) f.put<float>(static_cast<float>(i) + 0.5f);
  while (f.b.size() % 32) f.b.push_back(0);
  f.put<uint16_t>(0x3800);  // d = 0.5 in fp16
  for (int i = 0; i < 32; ++i) f.put<int8_t>(static_cast<int8_t>(i - 16));
  return f.b;
}

std::string write_tmp(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return p.string();
}
}  // namespace

TEST(Gguf, ParsesHeaderMetadataTensors) {
  auto path = write_tmp(tiny_gguf(), "socllm_tiny.gguf");
  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata()["llama.block_count"].get<uint32_t>(), 7u);
  EXPECT_EQ(f.metadata()["tokenizer.ggml.tokens"][1].get<std::string>(), "yo");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensor("a").shape, (std::vector<int64_t>{2, 3}));  // numpy order
  auto a = f.dequantize("a");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.data[i], i + 0.5f);
  auto b = f.dequantize("b");
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b.data[i], 0.5f * (i - 16));
  EXPECT_THROW(f.tensor("nope"), socllm::InvalidArgument);
}

TEST(Gguf, RejectsBadFiles) {
  EXPECT_THROW(GgufFile("/nonexistent/x.gguf"), socllm::MissingFile);
  auto bytes = tiny_gguf();
  auto bad = bytes;
  bad[0] = 'X';
  EXPECT_THROW(GgufFile(write_tmp(bad, "socllm_magic.gguf")), socllm::FormatError);
  // Truncated anywhere: in the metadata, in the tensor index, or in the data.
  for (size_t cut : {size_t{10}, size_t{60}, size_t{150}, bytes.size() - 1}) {
    std::vector<uint8_t> t(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    EXPECT_THROW(GgufFile(write_tmp(t, "socllm_trunc.gguf")), socllm::FormatError) << cut;
  }
  auto v9 = bytes;
  v9[4] = 9;
  EXPECT_THROW(GgufFile(write_tmp(v9, "socllm_v9.gguf")), socllm::Unsupported);
}

// Issue 12: tensor offsets that overlap, are misaligned or wrap around 2^64 would read another
// tensor's bytes or garbage; each is a FormatError naming the tensor.
TEST(Gguf, RejectsBadTensorOffsets) {
  const auto expect_format_error = [](const std::vector<uint8_t>& bytes, const char* name,
                                      const std::string& needle) {
    expect_error<socllm::FormatError>([&] { GgufFile f(write_tmp(bytes, name)); }, needle);
  };
  expect_format_error(tiny_gguf(0), "socllm_overlap.gguf", "overlap");
  expect_format_error(tiny_gguf(16), "socllm_misaligned.gguf", "not a multiple of the alignment");
  expect_format_error(tiny_gguf(~uint64_t{0} - 31), "socllm_wrap.gguf", "past the end");
  expect_format_error(tiny_gguf(uint64_t{1} << 40), "socllm_far.gguf", "past the end");
}

// Counts read from the header are checked against the bytes left before anything is reserved.
TEST(Gguf, RejectsCountsBeyondTheFile) {
  const auto bytes = tiny_gguf();
  const auto with_u64_at = [&](size_t at, uint64_t v) {
    auto b = bytes;
    std::memcpy(b.data() + at, &v, sizeof v);
    return b;
  };
  // Header: magic, version (u32), n_tensors (u64) at 8, n_kv (u64) at 16.
  for (uint64_t n : {uint64_t{1} << 62, uint64_t{bytes.size()}, ~uint64_t{0}}) {
    EXPECT_THROW(GgufFile(write_tmp(with_u64_at(8, n), "socllm_ntensors.gguf")),
                 socllm::FormatError);
    EXPECT_THROW(GgufFile(write_tmp(with_u64_at(16, n), "socllm_nkv.gguf")), socllm::FormatError);
  }
  // The string array's count: after the first kv (8 + 17 key bytes, type, u32 value) and the
  // second key (8 + 21 bytes), its type (u32) and element type (u32).
  const size_t count_at = 24 + (8 + 17) + 4 + 4 + (8 + 21) + 4 + 4;
  expect_error<socllm::FormatError>(
      [&] { GgufFile f(write_tmp(with_u64_at(count_at, uint64_t{1} << 62), "socllm_array.gguf")); },
      "tokenizer.ggml.tokens");
}

TEST(Dequant, HandMadeLegacyBlocks) {
  // Q4_0: d = 1.0 (0x3c00); nibble q -> q - 8; low nibbles are elements 0..15.
  std::vector<uint8_t> q40(18, 0);
  q40[0] = 0x00;
  q40[1] = 0x3c;
  for (int j = 0; j < 16; ++j) q40[2 + j] = static_cast<uint8_t>((j & 0xF) | ((15 - j) << 4));
  std::vector<float> y(32);
  socllm::dequantize_row(2, q40.data(), y.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j - 8.0f);
    EXPECT_EQ(y[j + 16], 15 - j - 8.0f);
  }
  // Q4_1: d = 2, m = -1 -> x = 2q - 1.
  std::vector<uint8_t> q41(20, 0);
  q41[1] = 0x40;
  q41[2] = 0x00;
  q41[3] = 0xbc;
  for (int j = 0; j < 16; ++j) q41[4 + j] = static_cast<uint8_t>(j | (j << 4));
  socllm::dequantize_row(3, q41.data(), y.data(), 32);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(y[j], 2.0f * j - 1.0f);
}

TEST(Dequant, HalfPrecisionSpecials) {
  // F16: 1.0, -2.0, smallest subnormal 2^-24, +inf; BF16: 1.0.
  std::vector<uint16_t> h{0x3c00, 0xc000, 0x0001, 0x7c00};
  std::vector<float> y(4);
  socllm::dequantize_row(1, reinterpret_cast<uint8_t*>(h.data()), y.data(), 4);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(y[3]));
  uint16_t bf = 0x3f80;
  socllm::dequantize_row(30, reinterpret_cast<uint8_t*>(&bf), y.data(), 1);
  EXPECT_EQ(y[0], 1.0f);
}

TEST(Dequant, ErrorsAreTyped) {
  std::vector<uint8_t> buf(64);
  std::vector<float> y(64);
  EXPECT_THROW(socllm::dequantize_row(16, buf.data(), y.data(), 32), socllm::Unsupported);
  EXPECT_THROW(socllm::dequantize_row(8, buf.data(), y.data(), 31), socllm::ShapeError);
  EXPECT_EQ(socllm::ggml_type_name(16), "IQ2_XXS");
}
