#include "kernels/weightlet.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <cstring>

#include "core/core.h"
#include "weightlet_simd.h"

namespace socllm::kernels {

namespace wd = weightlet_detail;

#if defined(__x86_64__)
// weightlet_avx2.cpp (compiled for AVX2): one group of a B-bit row; false if the group's byte
// width has no AVX2 form.
bool unpack_group_avx2(int bits, const uint8_t* blocks, int64_t bb, int8_t* out);
#endif

namespace {

inline uint8_t code_of(int8_t q, int bits) {
  return bits == 1 ? static_cast<uint8_t>((q + 1) / 2)
                   : static_cast<uint8_t>(q + (1 << (bits - 1)));
}

// The scalar reference: every weight's parts read from their bytes as the format defines them.
void unpack_group_scalar(int bits, const uint8_t* blocks, int64_t G, int8_t* out) {
  const int64_t bb = G / 8;
  const auto parts = weightlet_parts(bits);
  for (int64_t t = 0; t < G; ++t) {
    const int64_t s = t / bb, k = t % bb;
    int u = 0, first_block = 0, shift = bits;
    for (int w : parts) {
      shift -= w;
      const int64_t block = first_block + s / (8 / w), p = s % (8 / w);
      const int byte = blocks[block * bb + k];
      u |= ((byte >> (8 - w * (p + 1))) & ((1 << w) - 1)) << shift;
      first_block += w;
    }
    out[t] = static_cast<int8_t>(bits == 1 ? 2 * u - 1 : u - (1 << (bits - 1)));
  }
}

#if defined(__x86_64__)
// 128-bit (and 64-bit, for 8-byte blocks) vector operations on SSE2; Counting also counts them.
template <int Bytes, bool Counting>
struct Sse {
  static constexpr int64_t kBytes = Bytes;
  using Reg = __m128i;
  UnpackOpCounts* n = nullptr;
  void tick(int64_t UnpackOpCounts::*f) {
    if constexpr (Counting) ++(n->*f);
  }
  Reg load(const uint8_t* p) {
    tick(&UnpackOpCounts::loads);
    if constexpr (Bytes == 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    else return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  }
  void store(int8_t* p, Reg x) {
    tick(&UnpackOpCounts::stores);
    if constexpr (Bytes == 16) _mm_storeu_si128(reinterpret_cast<__m128i*>(p), x);
    else _mm_storel_epi64(reinterpret_cast<__m128i*>(p), x);
  }
  template <int N>
  Reg srl16(Reg x) {
    tick(&UnpackOpCounts::shifts);
    return _mm_srli_epi16(x, N);
  }
  template <int N>
  Reg sll16(Reg x) {
    tick(&UnpackOpCounts::shifts);
    return _mm_slli_epi16(x, N);
  }
  Reg and_(Reg a, Reg b) {
    tick(&UnpackOpCounts::logic);
    return _mm_and_si128(a, b);
  }
  Reg or_(Reg a, Reg b) {
    tick(&UnpackOpCounts::logic);
    return _mm_or_si128(a, b);
  }
  Reg add(Reg a, Reg b) {
    tick(&UnpackOpCounts::arith);
    return _mm_add_epi8(a, b);
  }
  Reg sub(Reg a, Reg b) {
    tick(&UnpackOpCounts::arith);
    return _mm_sub_epi8(a, b);
  }
  Reg splat(uint8_t c) { return _mm_set1_epi8(static_cast<char>(c)); }
};
template <int Bytes, bool Counting>
using Vec128 = Sse<Bytes, Counting>;
#elif defined(__aarch64__)
// The same operations on Advanced SIMD (part of every AArch64 core): 8-byte blocks use the low
// half of a register.
template <int Bytes, bool Counting>
struct Neon {
  static constexpr int64_t kBytes = Bytes;
  using Reg = uint8x16_t;
  UnpackOpCounts* n = nullptr;
  void tick(int64_t UnpackOpCounts::*f) {
    if constexpr (Counting) ++(n->*f);
  }
  Reg load(const uint8_t* p) {
    tick(&UnpackOpCounts::loads);
    if constexpr (Bytes == 16) return vld1q_u8(p);
    else return vcombine_u8(vld1_u8(p), vdup_n_u8(0));
  }
  void store(int8_t* p, Reg x) {
    tick(&UnpackOpCounts::stores);
    if constexpr (Bytes == 16) vst1q_s8(p, vreinterpretq_s8_u8(x));
    else vst1_s8(p, vreinterpret_s8_u8(vget_low_u8(x)));
  }
  template <int N>
  Reg srl16(Reg x) {
    tick(&UnpackOpCounts::shifts);
    return vreinterpretq_u8_u16(vshrq_n_u16(vreinterpretq_u16_u8(x), N));
  }
  template <int N>
  Reg sll16(Reg x) {
    tick(&UnpackOpCounts::shifts);
    return vreinterpretq_u8_u16(vshlq_n_u16(vreinterpretq_u16_u8(x), N));
  }
  Reg and_(Reg a, Reg b) {
    tick(&UnpackOpCounts::logic);
    return vandq_u8(a, b);
  }
  Reg or_(Reg a, Reg b) {
    tick(&UnpackOpCounts::logic);
    return vorrq_u8(a, b);
  }
  Reg add(Reg a, Reg b) {
    tick(&UnpackOpCounts::arith);
    return vaddq_u8(a, b);
  }
  Reg sub(Reg a, Reg b) {
    tick(&UnpackOpCounts::arith);
    return vsubq_u8(a, b);
  }
  Reg splat(uint8_t c) { return vdupq_n_u8(c); }
};
template <int Bytes, bool Counting>
using Vec128 = Neon<Bytes, Counting>;
#endif

// One group on the 128-bit path (SSE2 or Neon); false where it has no form (or no such path).
template <bool Counting>
bool unpack_group_128(int bits, const uint8_t* blocks, int64_t bb, int8_t* out,
                      UnpackOpCounts* counts) {
#if defined(__x86_64__) || defined(__aarch64__)
  auto run = [&](auto vec) {
    using V = decltype(vec);
    V v{counts};
    switch (bits) {
      case 1: wd::unpack_group<V, 1>(blocks, bb, out, v); break;
      case 2: wd::unpack_group<V, 2>(blocks, bb, out, v); break;
      case 3: wd::unpack_group<V, 3>(blocks, bb, out, v); break;
      case 4: wd::unpack_group<V, 4>(blocks, bb, out, v); break;
      case 5: wd::unpack_group<V, 5>(blocks, bb, out, v); break;
      case 6: wd::unpack_group<V, 6>(blocks, bb, out, v); break;
      case 7: wd::unpack_group<V, 7>(blocks, bb, out, v); break;
      case 8: wd::unpack_group<V, 8>(blocks, bb, out, v); break;
    }
  };
  if (bb % 16 == 0) run(Vec128<16, Counting>{});
  else if (bb == 8) run(Vec128<8, Counting>{});
  else return false;
  return true;
#else
  return false;
#endif
}

// Row i's bit-width from the 3-bit metadata stream.
int metadata_bits(std::span<const uint8_t> meta, int64_t row) {
  const int64_t bit = 3 * row;
  const size_t at = static_cast<size_t>(bit / 8);
  const int lo = meta[at], hi = at + 1 < meta.size() ? meta[at + 1] : 0;
  return (((lo | (hi << 8)) >> (bit % 8)) & 7) + 1;
}

bool cpu_has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

}  // namespace

std::string unpack_isa_name(UnpackIsa isa) {
  switch (isa) {
    case UnpackIsa::Scalar: return "scalar";
    case UnpackIsa::Sse128: return "sse128";
    case UnpackIsa::Avx2: return "avx2";
    case UnpackIsa::Neon128: return "neon128";
  }
  return "?";
}

UnpackIsa unpack_isa_from_name(const std::string& s) {
  for (auto i : {UnpackIsa::Scalar, UnpackIsa::Sse128, UnpackIsa::Avx2, UnpackIsa::Neon128})
    if (unpack_isa_name(i) == s) return i;
  throw InvalidArgument("[unpack] unknown ISA '" + s + "' (known: scalar, sse128, avx2, neon128)");
}

std::vector<UnpackIsa> supported_unpack_isas() {
#if defined(__x86_64__)
  std::vector<UnpackIsa> out{UnpackIsa::Scalar, UnpackIsa::Sse128};  // SSE2 is x86-64's base
  if (cpu_has_avx2()) out.push_back(UnpackIsa::Avx2);
#elif defined(__aarch64__)
  std::vector<UnpackIsa> out{UnpackIsa::Scalar, UnpackIsa::Neon128};  // Neon is AArch64's base
#else
  std::vector<UnpackIsa> out{UnpackIsa::Scalar};
#endif
  return out;
}

UnpackIsa best_unpack_isa() { return supported_unpack_isas().back(); }

std::vector<int> weightlet_parts(int bits) {
  if (bits < 1 || bits > 8)
    throw InvalidArgument("[weightlet] bits must be in 1..8, got " + std::to_string(bits));
  std::vector<int> p;
  for (int j = 0; j < wd::n_parts(bits); ++j) p.push_back(wd::part_width(bits, j));
  return p;
}

int64_t weightlet_metadata_bytes(int64_t rows) { return (3 * rows + 7) / 8; }

int64_t weightlet_data_bytes(std::span<const uint8_t> meta, int64_t rows, int64_t cols) {
  if (static_cast<int64_t>(meta.size()) != weightlet_metadata_bytes(rows))
    throw FormatError("[weightlet] bit-width metadata has " + std::to_string(meta.size()) +
                      " bytes, " + std::to_string(rows) + " rows need " +
                      std::to_string(weightlet_metadata_bytes(rows)));
  int64_t total = 0;
  for (int64_t i = 0; i < rows; ++i) total += cols * metadata_bits(meta, i) / 8;
  return total;
}

int WeightletTensor::bits(int64_t row) const {
  if (row < 0 || row >= rows_)
    throw InvalidArgument("[weightlet] row " + std::to_string(row) + " outside [0, " +
                          std::to_string(rows_) + ")");
  return metadata_bits(meta_, row);
}

std::vector<uint8_t> WeightletTensor::bit_widths() const {
  std::vector<uint8_t> b(static_cast<size_t>(rows_));
  for (int64_t i = 0; i < rows_; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(bits(i));
  return b;
}

void WeightletTensor::index_rows() {
  offsets_.assign(static_cast<size_t>(rows_ + 1), 0);
  for (int64_t i = 0; i < rows_; ++i)
    offsets_[static_cast<size_t>(i + 1)] = offsets_[static_cast<size_t>(i)] + cols_ * bits(i) / 8;
}

WeightletTensor WeightletTensor::pack(const int8_t* q, int64_t rows, int64_t cols,
                                      std::span<const uint8_t> bits, int64_t group) {
  if (rows < 0 || cols <= 0 || cols % 8 != 0)
    throw ShapeError("[weightlet] pack needs cols a positive multiple of 8, got [" +
                     std::to_string(rows) + ", " + std::to_string(cols) + "]");
  if (static_cast<int64_t>(bits.size()) != rows)
    throw ShapeError("[weightlet] " + std::to_string(bits.size()) + " bit-widths for " +
                     std::to_string(rows) + " rows");
  if (group <= 0 || group % 8 != 0)
    throw InvalidArgument("[weightlet] group must be a positive multiple of 8, got " +
                          std::to_string(group));
  WeightletTensor t;
  t.rows_ = rows;
  t.cols_ = cols;
  t.group_ = group;
  t.meta_.assign(static_cast<size_t>(weightlet_metadata_bytes(rows)), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const int b = bits[static_cast<size_t>(i)];
    if (b < 1 || b > 8)
      throw InvalidArgument("[weightlet] row " + std::to_string(i) + " has bit-width " +
                            std::to_string(b) + ", outside 1..8");
    const int64_t bit = 3 * i;
    const int v = (b - 1) << (bit % 8);
    t.meta_[static_cast<size_t>(bit / 8)] |= static_cast<uint8_t>(v & 0xff);
    if (v >> 8) t.meta_[static_cast<size_t>(bit / 8 + 1)] |= static_cast<uint8_t>(v >> 8);
  }
  t.index_rows();
  t.data_.assign(static_cast<size_t>(t.offsets_.back()), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const int b = bits[static_cast<size_t>(i)];
    const int lo = b == 1 ? -1 : -(1 << (b - 1)), hi = b == 1 ? 1 : (1 << (b - 1)) - 1;
    const auto parts = weightlet_parts(b);
    uint8_t* row = t.data_.data() + t.offsets_[static_cast<size_t>(i)];
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      const int64_t G = std::min(group, cols - g0), bb = G / 8;
      uint8_t* blocks = row + g0 * b / 8;
      for (int64_t t2 = 0; t2 < G; ++t2) {
        const int8_t v = q[i * cols + g0 + t2];
        if (v < lo || v > hi || (b == 1 && v == 0))
          throw InvalidArgument("[weightlet] code " + std::to_string(v) + " at row " +
                                std::to_string(i) + ", column " + std::to_string(g0 + t2) +
                                " is outside the range of " + std::to_string(b) + " bits");
        const int u = code_of(v, b);
        const int64_t s = t2 / bb, k = t2 % bb;
        int first_block = 0, shift = b;
        for (int w : parts) {
          shift -= w;
          const int64_t block = first_block + s / (8 / w), p = s % (8 / w);
          blocks[block * bb + k] |=
              static_cast<uint8_t>(((u >> shift) & ((1 << w) - 1)) << (8 - w * (p + 1)));
          first_block += w;
        }
      }
    }
  }
  return t;
}

WeightletTensor::WeightletTensor(int64_t rows, int64_t cols, int64_t group,
                                 std::vector<uint8_t> bit_metadata, std::vector<uint8_t> data)
    : rows_(rows),
      cols_(cols),
      group_(group),
      meta_(std::move(bit_metadata)),
      data_(std::move(data)) {
  if (rows < 0 || cols <= 0 || cols % 8 != 0 || group <= 0 || group % 8 != 0)
    throw FormatError("[weightlet] bad packed shape [" + std::to_string(rows) + ", " +
                      std::to_string(cols) + "] or group " + std::to_string(group));
  if (static_cast<int64_t>(meta_.size()) != weightlet_metadata_bytes(rows))
    throw FormatError("[weightlet] bit-width metadata has " + std::to_string(meta_.size()) +
                      " bytes, " + std::to_string(rows) + " rows need " +
                      std::to_string(weightlet_metadata_bytes(rows)));
  index_rows();
  if (offsets_.back() != static_cast<int64_t>(data_.size()))
    throw FormatError("[weightlet] bit-width metadata implies " + std::to_string(offsets_.back()) +
                      " bytes of weights, data has " + std::to_string(data_.size()));
}

void WeightletTensor::unpack_rows(int64_t r0, int64_t r1, int8_t* out, UnpackIsa isa) const {
  if (r0 < 0 || r1 > rows_ || r0 > r1)
    throw InvalidArgument("[weightlet] rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                          ") outside [0, " + std::to_string(rows_) + ")");
  if (isa == UnpackIsa::Avx2 && !cpu_has_avx2())
    throw InvalidArgument("[weightlet] this CPU has no AVX2 (ISA 'avx2')");
#if defined(__x86_64__)
  constexpr UnpackIsa kOtherArch = UnpackIsa::Neon128;
#else
  constexpr UnpackIsa kOtherArch = UnpackIsa::Sse128;
#endif
  if (isa == kOtherArch)
    throw InvalidArgument("[weightlet] this CPU has no '" + unpack_isa_name(isa) + "' path");
  for (int64_t i = r0; i < r1; ++i) {
    const int b = bits(i);
    const uint8_t* row = data_.data() + offsets_[static_cast<size_t>(i)];
    int8_t* dst = out + (i - r0) * cols_;
    for (int64_t g0 = 0; g0 < cols_; g0 += group_) {
      const int64_t G = std::min(group_, cols_ - g0);
      const uint8_t* blocks = row + g0 * b / 8;
      bool done = false;
#if defined(__x86_64__)
      if (isa == UnpackIsa::Avx2) done = unpack_group_avx2(b, blocks, G / 8, dst + g0);
#endif
      if (!done && isa != UnpackIsa::Scalar)
        done = unpack_group_128<false>(b, blocks, G / 8, dst + g0, nullptr);
      if (!done) unpack_group_scalar(b, blocks, G, dst + g0);
    }
  }
}

UnpackOpCounts WeightletTensor::unpack_counted(int8_t* out) const {
  UnpackOpCounts n;
  for (int64_t i = 0; i < rows_; ++i) {
    const int b = bits(i);
    const uint8_t* row = data_.data() + offsets_[static_cast<size_t>(i)];
    for (int64_t g0 = 0; g0 < cols_; g0 += group_) {
      const int64_t G = std::min(group_, cols_ - g0);
      if (!unpack_group_128<true>(b, row + g0 * b / 8, G / 8, out + i * cols_ + g0, &n))
        unpack_group_scalar(b, row + g0 * b / 8, G, out + i * cols_ + g0);
      n.weights += G;
    }
  }
  return n;
}

}  // namespace socllm::kernels
