// Private to the weightlet kernels: the format's layout as compile-time constants and the
// group unpacking template shared by the 64/128-bit (weightlet.cpp, SSE2) and 256-bit
// (weightlet_avx2.cpp, compiled for AVX2) instances. Format: weightlet.h.
#pragma once

#include <cstdint>
#include <utility>

namespace socllm::kernels::weightlet_detail {

// Parts of a B-bit code, most significant first (weightlet.h): widths and the bit position of
// each part's lowest bit in the code.
constexpr int kParts[9][3] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {1, 2, 0}, {4, 0, 0},
                              {1, 4, 0}, {2, 4, 0}, {1, 2, 4}, {4, 4, 0}};
constexpr int n_parts(int B) {
  int n = 0;
  for (int j = 0; j < 3; ++j) n += kParts[B][j] > 0;
  return n;
}
constexpr int part_width(int B, int j) { return kParts[B][j]; }
constexpr int part_shift(int B, int j) {
  int s = 0;
  for (int k = j + 1; k < n_parts(B); ++k) s += kParts[B][k];
  return s;
}
// First block of part j within a group (blocks of earlier parts come before it).
constexpr int part_first_block(int B, int j) {
  int b = 0;
  for (int k = 0; k < j; ++k) b += kParts[B][k];
  return b;
}
// Right shift that moves stripe s's bits of part j (width w, at byte bits [8 - w(p+1), 8 - w p))
// to their code position; negative: a left shift.
constexpr int net_shift(int B, int j, int s) {
  const int w = part_width(B, j), p = s % (8 / w);
  return 8 - w * (p + 1) - part_shift(B, j);
}
constexpr int block_of(int B, int j, int s) {
  return part_first_block(B, j) + s / (8 / part_width(B, j));
}
constexpr uint8_t part_mask(int B, int j) {
  return static_cast<uint8_t>(((1 << part_width(B, j)) - 1) << part_shift(B, j));
}

template <typename F, int... I>
inline void unroll(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
inline void unroll(F&& f) {
  unroll(std::forward<F>(f), std::make_integer_sequence<int, N>{});
}

// One group of a B-bit row: `blocks` holds its B blocks of `bb` bytes; the 8 stripes of bb
// bytes go to out. V: the vector operations (V::kBytes wide: chunks of each block).
template <class V, int B>
inline void unpack_group(const uint8_t* blocks, int64_t bb, int8_t* out, V& v) {
  for (int64_t c = 0; c < bb; c += V::kBytes) {
    typename V::Reg blk[B];
    for (int k = 0; k < B; ++k) blk[k] = v.load(blocks + k * bb + c);
    unroll<8>([&](auto s) {
      typename V::Reg acc{};
      unroll<n_parts(B)>([&](auto j) {
        constexpr int net = net_shift(B, j, s);
        typename V::Reg d = blk[block_of(B, j, s)];
        if constexpr (net > 0) d = v.template srl16<net>(d);
        if constexpr (net < 0) d = v.template sll16<-net>(d);
        d = v.and_(d, v.splat(part_mask(B, j)));
        if constexpr (j == 0) acc = d;
        else acc = v.or_(acc, d);
      });
      if constexpr (B == 1) acc = v.sub(v.add(acc, acc), v.splat(1));
      else acc = v.sub(acc, v.splat(static_cast<uint8_t>(1 << (B - 1))));
      v.store(out + s * bb + c, acc);
    });
  }
}

}  // namespace socllm::kernels::weightlet_detail
