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

}  // namespace socllm::kernels::simd
