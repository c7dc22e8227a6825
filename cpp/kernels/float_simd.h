// Private to the fp32 kernels: one register of the widest float SIMD this build targets
// (-march=native). GCC's vector extensions lower the same code to AVX-512, AVX2 or NEON.
#pragma once

#include <cstdint>
#include <cstring>

namespace socllm::kernels::simd {

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float VecF __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t VecI __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, VecF v) { std::memcpy(p, &v, sizeof v); }
// x - (+0) is x for every x (x + 0 is not, for x = -0), so this folds to one broadcast.
inline VecF splat(float x) { return x - VecF{}; }

// The sum of the lanes, by halving: log2(kLanes) shuffles and adds (a lane loop compiles to
// one extract per lane).
inline float hsum(VecF v) {
#if defined(__AVX512F__)
  v += __builtin_shuffle(v, VecI{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  v += __builtin_shuffle(v, VecI{4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3});
  v += __builtin_shuffle(v, VecI{2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1});
  v += __builtin_shuffle(v, VecI{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0});
#else
  v += __builtin_shuffle(v, VecI{4, 5, 6, 7, 0, 1, 2, 3});
  v += __builtin_shuffle(v, VecI{2, 3, 0, 1, 2, 3, 0, 1});
  v += __builtin_shuffle(v, VecI{1, 0, 1, 0, 1, 0, 1, 0});
#endif
  return v[0];
}

// The lane sums of four vectors at once (out[i] = hsum(a_i)): two rounds fold pairs of vectors
// into one (a transpose by halves), then two rounds within groups of lanes; 10 shuffles and adds
// for four sums where hsum takes 8 for one.
inline void hsum4(VecF a0, VecF a1, VecF a2, VecF a3, float* out) {
#if defined(__AVX512F__)
  // lanes 0-7: a0's (or a2's) halves added, 8-15: a1's (a3's)
  const VecI lo = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const VecI hi = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const VecF b01 = __builtin_shuffle(a0, a1, lo) + __builtin_shuffle(a0, a1, hi);
  const VecF b23 = __builtin_shuffle(a2, a3, lo) + __builtin_shuffle(a2, a3, hi);
  // groups of 4 lanes: a0, a2, a1, a3
  const VecI lo2 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
  const VecI hi2 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
  VecF c = __builtin_shuffle(b01, b23, lo2) + __builtin_shuffle(b01, b23, hi2);
  c += __builtin_shuffle(c, VecI{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  c += __builtin_shuffle(c, VecI{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  out[0] = c[0], out[1] = c[8], out[2] = c[4], out[3] = c[12];
#else
  // lanes 0-3: a0's (a2's) halves added, 4-7: a1's (a3's)
  const VecI lo = {0, 1, 2, 3, 8, 9, 10, 11}, hi = {4, 5, 6, 7, 12, 13, 14, 15};
  const VecF b01 = __builtin_shuffle(a0, a1, lo) + __builtin_shuffle(a0, a1, hi);
  const VecF b23 = __builtin_shuffle(a2, a3, lo) + __builtin_shuffle(a2, a3, hi);
  // pairs of lanes: a0, a2, a1, a3
  const VecI lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
  VecF c = __builtin_shuffle(b01, b23, lo2) + __builtin_shuffle(b01, b23, hi2);
  c += __builtin_shuffle(c, VecI{1, 0, 3, 2, 5, 4, 7, 6});
  out[0] = c[0], out[1] = c[4], out[2] = c[2], out[3] = c[6];
#endif
}

// The lane sums of kLanes vectors as one vector (lane i = hsum(v[i])): log2(kLanes) rounds, each
// folding pairs of vectors into one (two shuffles and an add per pair), kLanes - 1 pairs in all:
// under 3 operations per sum where hsum takes 8 and hsum4 2.5 plus an extract.
inline VecF hsum_lanes(VecF (&v)[kLanes]) {
#if defined(__AVX512F__)
  const VecI a1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
             b1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
             a2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
             b2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31},
             a3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
             b3 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31},
             a4 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
             b4 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const VecI a[] = {a1, a2, a3, a4}, b[] = {b1, b2, b3, b4};
#else
  const VecI a1 = {0, 1, 2, 3, 8, 9, 10, 11}, b1 = {4, 5, 6, 7, 12, 13, 14, 15},
             a2 = {0, 1, 4, 5, 8, 9, 12, 13}, b2 = {2, 3, 6, 7, 10, 11, 14, 15},
             a3 = {0, 2, 4, 6, 8, 10, 12, 14}, b3 = {1, 3, 5, 7, 9, 11, 13, 15};
  const VecI a[] = {a1, a2, a3}, b[] = {b1, b2, b3};
#endif
  // round r: v[i] holds 2^r sums of width kLanes / 2^r, in order; pairs fold into v[i / 2]
  int64_t n = kLanes;
#pragma GCC unroll 4
  for (int r = 0; n > 1; ++r, n /= 2)
#pragma GCC unroll 8
    for (int64_t i = 0; i < n; i += 2)
      v[i / 2] = __builtin_shuffle(v[i], v[i + 1], a[r]) + __builtin_shuffle(v[i], v[i + 1], b[r]);
  return v[0];
}

}  // namespace socllm::kernels::simd
