// The AVX2 path of the weightlet kernels (weightlet.h); this file is compiled for AVX2 and only
// entered after a CPU check (weightlet.cpp).
#include <immintrin.h>

#include <cstdint>

#include "weightlet_simd.h"

namespace socllm::kernels {

namespace wd = weightlet_detail;

namespace {

// Whole stripes of >= 32 bytes (R >= 256): the generic group template, 256 bits wide.
struct Avx2Ops {
  static constexpr int64_t kBytes = 32;
  using Reg = __m256i;
  Reg load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  void store(int8_t* p, Reg x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x); }
  template <int N>
  Reg srl16(Reg x) {
    return _mm256_srli_epi16(x, N);
  }
  template <int N>
  Reg sll16(Reg x) {
    return _mm256_slli_epi16(x, N);
  }
  Reg and_(Reg a, Reg b) { return _mm256_and_si256(a, b); }
  Reg or_(Reg a, Reg b) { return _mm256_or_si256(a, b); }
  Reg add(Reg a, Reg b) { return _mm256_add_epi8(a, b); }
  Reg sub(Reg a, Reg b) { return _mm256_sub_epi8(a, b); }
  Reg splat(uint8_t c) { return _mm256_set1_epi8(static_cast<char>(c)); }
};

// 16-byte blocks (R = 128): stripes s and s + 1 (s even) share every block, so one 256-bit
// register holds the block twice and each 128-bit lane shifts by its own stripe's amount
// (vpsrlvd / vpsllvd; bits crossing into a neighbouring byte are masked off after).
template <int B>
inline void unpack_group_pairs(const uint8_t* blocks, int8_t* out) {
  __m256i blk[B];
  for (int k = 0; k < B; ++k)
    blk[k] = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 16 * k)));
  wd::unroll<4>([&](auto pair) {
    constexpr int s = 2 * pair;
    __m256i acc{};
    wd::unroll<wd::n_parts(B)>([&](auto j) {
      constexpr int n0 = wd::net_shift(B, j, s), n1 = wd::net_shift(B, j, s + 1);
      static_assert(wd::block_of(B, j, s) == wd::block_of(B, j, s + 1));
      const __m256i x = blk[wd::block_of(B, j, s)];
      __m256i d;
      if constexpr (n0 >= 0 && n1 >= 0) {
        d = _mm256_srlv_epi32(x, _mm256_setr_epi32(n0, n0, n0, n0, n1, n1, n1, n1));
      } else if constexpr (n0 <= 0 && n1 <= 0) {
        d = _mm256_sllv_epi32(x, _mm256_setr_epi32(-n0, -n0, -n0, -n0, -n1, -n1, -n1, -n1));
      } else {  // shift counts of 32 or more give 0: each lane takes one of the two shifts
        constexpr int r0 = n0 > 0 ? n0 : 32, r1 = n1 > 0 ? n1 : 32;
        constexpr int l0 = n0 < 0 ? -n0 : 32, l1 = n1 < 0 ? -n1 : 32;
        d = _mm256_or_si256(
            _mm256_srlv_epi32(x, _mm256_setr_epi32(r0, r0, r0, r0, r1, r1, r1, r1)),
            _mm256_sllv_epi32(x, _mm256_setr_epi32(l0, l0, l0, l0, l1, l1, l1, l1)));
      }
      d = _mm256_and_si256(d, _mm256_set1_epi8(static_cast<char>(wd::part_mask(B, j))));
      if constexpr (j == 0) acc = d;
      else acc = _mm256_or_si256(acc, d);
    });
    if constexpr (B == 1) acc = _mm256_sub_epi8(_mm256_add_epi8(acc, acc), _mm256_set1_epi8(1));
    else acc = _mm256_sub_epi8(acc, _mm256_set1_epi8(static_cast<char>(1 << (B - 1))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * s), acc);
  });
}

template <int B>
bool unpack_group_b(const uint8_t* blocks, int64_t bb, int8_t* out) {
  if (bb == 16) {
    unpack_group_pairs<B>(blocks, out);
    return true;
  }
  if (bb % 32 == 0) {
    Avx2Ops v;
    wd::unpack_group<Avx2Ops, B>(blocks, bb, out, v);
    return true;
  }
  return false;
}

}  // namespace

bool unpack_group_avx2(int bits, const uint8_t* blocks, int64_t bb, int8_t* out) {
  switch (bits) {
    case 1: return unpack_group_b<1>(blocks, bb, out);
    case 2: return unpack_group_b<2>(blocks, bb, out);
    case 3: return unpack_group_b<3>(blocks, bb, out);
    case 4: return unpack_group_b<4>(blocks, bb, out);
    case 5: return unpack_group_b<5>(blocks, bb, out);
    case 6: return unpack_group_b<6>(blocks, bb, out);
    case 7: return unpack_group_b<7>(blocks, bb, out);
    case 8: return unpack_group_b<8>(blocks, bb, out);
  }
  return false;
}

}  // namespace socllm::kernels
