#include "kernels/sparse_attention.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/core.h"
#include "kernels/aligned_vector.h"
#include "kernels/float_simd.h"
#include "kernels/kernels.h"

namespace socllm::kernels {

namespace {

// Order-preserving map to uint32: a < b (as T) iff key(a) < key(b). Floats: flip all bits of
// negatives, set the sign bit of the rest (NaNs land beyond the infinities, deterministically).
inline uint32_t order_key(int32_t x) { return static_cast<uint32_t>(x) ^ 0x80000000u; }
inline uint32_t order_key(float x) {
  const auto b = std::bit_cast<uint32_t>(x == 0.0f ? 0.0f : x);  // -0 ties with +0, as == says
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Rows shorter than this take nth_element on their values (a histogram's passes would dominate);
// with a hint from the previous row, its band pays already from 64 values (7% less top-k time at
// 2,048 tokens on Zen 4 than from 256).
constexpr int64_t kHistogramMinN = 256;
constexpr int64_t kHintedMinN = 64;

// The need-th largest of m order keys, all in [lo, hi] (1 <= need <= m), and how many of them lie
// above it and equal it. Rounds of a 64-bin histogram over the remaining range narrow the keys
// to one bin (kept in place, the array is reordered) until few remain, then nth_element: a few
// cheap passes where a partition sort of hundreds of keys was most of a row's top-k.
uint32_t kth_largest_key(uint32_t* keys, int64_t m, int64_t need, uint32_t lo, uint32_t hi,
                         int64_t& above, int64_t& equal) {
  constexpr int kBins = 64;
  constexpr int64_t kDirect = 48;  // at most this many: nth_element
  above = 0;
  while (m > kDirect && hi > lo) {
    const int bits = 32 - std::countl_zero(hi - lo);
    const int shift = std::max(0, bits - 6);
    std::array<int64_t, kBins> hist{};
    for (int64_t t = 0; t < m; ++t) ++hist[static_cast<size_t>((keys[t] - lo) >> shift)];
    int b = kBins - 1;
    int64_t over = 0;
    while (over + hist[static_cast<size_t>(b)] < need) over += hist[static_cast<size_t>(b--)];
    need -= over, above += over;
    const uint32_t bin_lo = lo + (static_cast<uint32_t>(b) << shift);
    const auto bin_hi = static_cast<uint32_t>(
        std::min<uint64_t>(hi, uint64_t{bin_lo} + (uint64_t{1} << shift) - 1));
    int64_t kept = 0;
    for (int64_t t = 0; t < m; ++t) {
      keys[kept] = keys[t];
      kept += keys[t] >= bin_lo && keys[t] <= bin_hi;
    }
    m = kept, lo = bin_lo, hi = bin_hi;
  }
  std::nth_element(keys, keys + (need - 1), keys + m, std::greater<uint32_t>());
  const uint32_t thr = keys[need - 1];
  equal = 0;
  for (int64_t t = 0; t < m; ++t) above += keys[t] > thr, equal += keys[t] == thr;
  return thr;
}

// The first k of n candidates, in their order, whose key is above thr or, while equal_left
// lasts, equal to it: idx[m] = index_of(t) for those t. Branch-free on the common path (a kept
// key is a coin flip at keep ratios like 0.2). Returns how many.
template <class KeyOf, class IndexOf>
int64_t take_in_order(int64_t n, int64_t k, KeyOf key_of, IndexOf index_of, uint32_t thr,
                      int64_t equal_left, int32_t* idx) {
  int64_t m = 0;
  for (int64_t t = 0; t < n && m < k; ++t) {
    const uint32_t key = key_of(t);
    idx[m] = index_of(t);
    bool take = key > thr;
    if (key == thr) {
      take = equal_left > 0;
      equal_left -= take;
    }
    m += take;
  }
  return m;
}

// The top k of n values, ascending indices; ties go to earlier keys. O(n): nth_element on a
// copy for short rows, histogram selection on order keys for long ones, then one pass in index
// order taking every value above the k-th and the first (k - above) equal to it.
template <class T>
int64_t topk_impl(const T* s, int64_t n, int64_t k, int32_t* idx, std::vector<T>& buf) {
  k = std::clamp<int64_t>(k, 0, n);
  if (k == 0) return 0;
  if (k == n) {
    for (int64_t j = 0; j < n; ++j) idx[j] = static_cast<int32_t>(j);
    return n;
  }
  if (n < kHistogramMinN) {
    buf.assign(s, s + n);
    std::nth_element(buf.begin(), buf.begin() + (k - 1), buf.end(), std::greater<T>());
    const T thr = buf[static_cast<size_t>(k - 1)];
    int64_t above = 0;
    for (int64_t j = 0; j < n; ++j) above += s[j] > thr;
    int64_t equal_left = k - above, m = 0;
    for (int64_t j = 0; j < n && m < k; ++j) {
      if (s[j] > thr) {
        idx[m++] = static_cast<int32_t>(j);
      } else if (s[j] == thr && equal_left > 0) {
        idx[m++] = static_cast<int32_t>(j);
        --equal_left;
      }
    }
    return m;
  }
  thread_local std::vector<uint32_t> keys;
  keys.resize(static_cast<size_t>(n));
  uint32_t lo = ~0u, hi = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t key = order_key(s[j]);
    keys[static_cast<size_t>(j)] = key;
    lo = std::min(lo, key), hi = std::max(hi, key);
  }
  int64_t above = 0, equal = 0;
  const uint32_t thr = kth_largest_key(keys.data(), n, k, lo, hi, above, equal);
  return take_in_order(
      n, k, [&](int64_t j) { return order_key(s[j]); },
      [](int64_t j) { return static_cast<int32_t>(j); }, thr, k - above, idx);
}

// ---- top-k from the previous row's threshold ------------------------------------------------

// Half-width of a row's band in running-mean prediction errors: on WikiText-2 Q/K of
// SmolLM2-135M (keep 0.2, 4,096 tokens) 2 missed 15% of rows, 3 about 4% with bands of ~110
// keys, 4 under 2% with ~150.
constexpr double kBandErrors = 3;
constexpr int kBandAttempts = 3;  // misses before the whole-row selection takes over

inline uint32_t sat_add(uint32_t a, uint64_t b) {
  return static_cast<uint32_t>(std::min<uint64_t>(uint64_t{a} + b, 0xffffffffu));
}
inline uint32_t sat_sub(uint32_t a, uint64_t b) {
  return b >= a ? 0u : a - static_cast<uint32_t>(b);
}

// The value of an order key (order_key's inverse).
inline int32_t key_value(uint32_t key, int32_t) { return static_cast<int32_t>(key ^ 0x80000000u); }
inline float key_value(uint32_t key, float) {
  return std::bit_cast<float>((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}
// The order key of the T nearest x (x finite; clamped to T's range).
inline uint32_t key_near(double x, int32_t) {
  constexpr double lo = std::numeric_limits<int32_t>::min(),
                   hi = std::numeric_limits<int32_t>::max();
  return order_key(static_cast<int32_t>(std::clamp(std::nearbyint(x), lo, hi)));
}
inline uint32_t key_near(double x, float) { return order_key(static_cast<float>(x)); }

// Mean and standard deviation of s[0, n), summed in float lanes (a guess needs no more), in four
// sets of accumulators: one set made the pass wait on the add latency.
template <class T>
std::pair<double, double> row_moments(const T* s, int64_t n) {
  using simd::kLanes;
  using simd::VecF;
  const auto vec = [&](int64_t j) {
    if constexpr (std::is_same_v<T, float>) {
      return simd::load(s + j);
    } else {
      simd::VecI xi;
      std::memcpy(&xi, s + j, sizeof xi);
      return __builtin_convertvector(xi, VecF);
    }
  };
  constexpr int kSets = 4;
  VecF sum[kSets] = {}, sq[kSets] = {};
  int64_t j = 0;
  for (; j + kSets * kLanes <= n; j += kSets * kLanes)
    for (int u = 0; u < kSets; ++u) {
      const VecF x = vec(j + u * kLanes);
      sum[u] += x, sq[u] += x * x;
    }
  for (; j + kLanes <= n; j += kLanes) {
    const VecF x = vec(j);
    sum[0] += x, sq[0] += x * x;
  }
  double su = simd::hsum((sum[0] + sum[1]) + (sum[2] + sum[3]));
  double sq_sum = simd::hsum((sq[0] + sq[1]) + (sq[2] + sq[3]));
  for (; j < n; ++j) su += static_cast<double>(s[j]), sq_sum += static_cast<double>(s[j]) * s[j];
  const double mean = su / static_cast<double>(n);
  return {mean, std::sqrt(std::max(0.0, sq_sum / static_cast<double>(n) - mean * mean))};
}

// A band of order keys, (lo, hi].
struct KeyBand {
  uint32_t lo = 0, hi = 0;
};

// A band from 128 evenly spaced values: their k/n quantile and the sample values 10 places
// above and below it (about 2 standard deviations of the quantile's position).
template <class T>
KeyBand sample_band(const T* s, int64_t n, int64_t k) {
  constexpr int64_t kSamples = 128, kSpread = 10;
  std::array<uint32_t, kSamples> smp{};
  const int64_t ns = std::min(n, kSamples);
  for (int64_t i = 0; i < ns; ++i) smp[static_cast<size_t>(i)] = order_key(s[i * n / ns]);
  const auto nth = [&](int64_t from, int64_t at, int64_t to) {  // at-th largest, within [from, to)
    std::nth_element(smp.begin() + from, smp.begin() + at, smp.begin() + to,
                     std::greater<uint32_t>());
    return smp[static_cast<size_t>(at)];
  };
  const int64_t at = std::clamp<int64_t>(k * ns / n, 0, ns - 1);
  const uint32_t key = nth(0, at, ns);
  const uint32_t up = at > 0 ? nth(0, std::max<int64_t>(at - kSpread, 0), at) : key;
  const uint32_t down = at + 1 < ns ? nth(at + 1, std::min(at + kSpread, ns - 1), ns) : key;
  const uint64_t half = uint64_t{std::max(up - key, key - down)} + 1;
  return {sat_sub(key, half), sat_add(key, half)};
}

// The order keys of 16 values in a register (`valid` masks a row's tail): AVX-512 builds;
// others take the same passes one key at a time.
#if defined(__AVX512F__)
constexpr int64_t kKeyLanes = 16;
// Masked loads with an explicit zero source: GCC 12's maskz forms warn of an uninitialized
// source once inlined deeply enough (-Wmaybe-uninitialized).
inline __m512i load_lanes(const void* p, __mmask16 valid) {
  return _mm512_mask_loadu_epi32(_mm512_setzero_si512(), valid, p);
}
inline __m512i order_keys(const int32_t* s, __mmask16 valid) {
  return _mm512_xor_si512(load_lanes(s, valid), _mm512_set1_epi32(INT32_MIN));
}
inline __m512i order_keys(const float* s, __mmask16 valid) {
  const __m512i sign = _mm512_set1_epi32(INT32_MIN);
  __m512i b = load_lanes(s, valid);
  const __m512i zero = _mm512_setzero_si512();
  b = _mm512_mask_mov_epi32(b, _mm512_cmpeq_epi32_mask(b, sign), zero);  // -0 ties with +0
  // negatives: all bits flipped; the rest: the sign bit set
  const __m512i flip =
      _mm512_mask_mov_epi32(sign, _mm512_cmplt_epi32_mask(b, zero), _mm512_set1_epi32(-1));
  return _mm512_xor_si512(b, flip);
}
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}
#endif

// The sum and the sum of squares of a row's scores, gathered while they pass (the fused top-k's
// hint for the next rows).
struct ScoreSums {
  double sum = 0, sq = 0;
};

// One pass: how many keys lie above hi, and the indices (from base) and keys of those above lo,
// in index order (cidx, ckey hold n + 16: whole registers are stored; compressing in a register,
// then storing, is fast on every AVX-512 core, where a compressing store is microcoded on Zen 4).
// With sums, also adds the values and their squares. Returns {above_hi, above_lo}.
template <class T>
std::pair<int64_t, int64_t> keys_above(const T* s, int64_t n, uint32_t lo, uint32_t hi,
                                       int32_t* cidx, uint32_t* ckey, int32_t base = 0,
                                       ScoreSums* sums = nullptr) {
  int64_t above_hi = 0, m = 0;
#if defined(__AVX512F__)
  const __m512i lov = _mm512_set1_epi32(static_cast<int32_t>(lo)),
                hiv = _mm512_set1_epi32(static_cast<int32_t>(hi)), step = _mm512_set1_epi32(16),
                step2 = _mm512_set1_epi32(32);
  __m512i j =
      _mm512_add_epi32(_mm512_set1_epi32(base),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  simd::VecF sum = {}, sq = {};
  const auto add_sums = [&](const T* p, __mmask16 valid) {
    const __m512i raw = load_lanes(p, valid);
    simd::VecF x;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(&x, &raw, sizeof x);
    } else {
      simd::VecI xi;
      std::memcpy(&xi, &raw, sizeof xi);
      x = __builtin_convertvector(xi, simd::VecF);
    }
    sum += x, sq += x * x;
  };
  // the keys above lo of one register (valid: a row's tail) and their indices, stored at `at`
  const auto put = [&](__m512i key, __mmask16 take, __m512i jv, int64_t at) {
    above_hi += std::popcount(static_cast<unsigned>(_mm512_mask_cmpgt_epu32_mask(take, key, hiv)));
    _mm512_storeu_si512(cidx + at, _mm512_maskz_compress_epi32(take, jv));
    _mm512_storeu_si512(ckey + at, _mm512_maskz_compress_epi32(take, key));
  };
  int64_t j0 = 0;
  // two registers per step: the running count is the loop's only chain, and counting both
  // registers before storing either shortens it (424 to 236 ns for a row of 2,176 int32 scores
  // on Zen 4)
  for (; j0 + 2 * kKeyLanes <= n; j0 += 2 * kKeyLanes, j = _mm512_add_epi32(j, step2)) {
    const __m512i key0 = order_keys(s + j0, 0xffff), key1 = order_keys(s + j0 + kKeyLanes, 0xffff);
    const __mmask16 take0 = _mm512_cmpgt_epu32_mask(key0, lov),
                    take1 = _mm512_cmpgt_epu32_mask(key1, lov);
    const int64_t m1 = m + std::popcount(static_cast<unsigned>(take0));
    put(key0, take0, j, m);
    put(key1, take1, _mm512_add_epi32(j, step), m1);
    m = m1 + std::popcount(static_cast<unsigned>(take1));
    if (sums) add_sums(s + j0, 0xffff), add_sums(s + j0 + kKeyLanes, 0xffff);
  }
  for (; j0 < n; j0 += kKeyLanes, j = _mm512_add_epi32(j, step)) {
    const __mmask16 valid = tail_mask(n - j0);
    const __m512i key = order_keys(s + j0, valid);
    const __mmask16 take = _mm512_mask_cmpgt_epu32_mask(valid, key, lov);
    put(key, take, j, m);
    m += std::popcount(static_cast<unsigned>(take));
    if (sums) add_sums(s + j0, valid);
  }
  if (sums) sums->sum += simd::hsum(sum), sums->sq += simd::hsum(sq);
#else
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t x = order_key(s[j]);
    cidx[m] = base + static_cast<int32_t>(j);
    ckey[m] = x;
    m += x > lo;
    above_hi += x > hi;
    if (sums) {
      const double v = static_cast<double>(s[j]);
      sums->sum += v;
      sums->sq += v * v;
    }
  }
#endif
  return {above_hi, m};
}

// How many of keys[0, c) lie above hi, and those in (lo, hi] compressed to out (c + 16 room).
// Returns {above_hi, in_band}.
std::pair<int64_t, int64_t> keys_in_band(const uint32_t* keys, int64_t c, uint32_t lo, uint32_t hi,
                                         uint32_t* out) {
  int64_t above_hi = 0, m = 0;
#if defined(__AVX512F__)
  const __m512i lov = _mm512_set1_epi32(static_cast<int32_t>(lo)),
                hiv = _mm512_set1_epi32(static_cast<int32_t>(hi));
  for (int64_t t = 0; t < c; t += kKeyLanes) {
    const __mmask16 valid = tail_mask(c - t);
    const __m512i key = load_lanes(keys + t, valid);
    const __mmask16 over = _mm512_mask_cmpgt_epu32_mask(valid, key, hiv);
    const __mmask16 take = _mm512_mask_cmpgt_epu32_mask(valid & ~over, key, lov);
    above_hi += std::popcount(static_cast<unsigned>(over));
    _mm512_storeu_si512(out + m, _mm512_maskz_compress_epi32(take, key));
    m += std::popcount(static_cast<unsigned>(take));
  }
#else
  for (int64_t t = 0; t < c; ++t) {
    out[m] = keys[t];
    above_hi += keys[t] > hi;
    m += keys[t] > lo && keys[t] <= hi;
  }
#endif
  return {above_hi, m};
}

// idx = the first k candidates whose key is >= thr (all_equal: no tie to break) or > thr or,
// while equal_left lasts, equal to it: in index order. Returns how many.
int64_t take_candidates(const int32_t* cidx, const uint32_t* ckey, int64_t c, int64_t k,
                        uint32_t thr, bool all_equal, int64_t equal_left, int32_t* idx) {
  int64_t m = 0;
  if (all_equal) {  // exactly k candidates pass
#if defined(__AVX512F__)
    const __m512i thr_v = _mm512_set1_epi32(static_cast<int32_t>(thr));
    for (int64_t t = 0; t < c; t += kKeyLanes) {
      const __mmask16 valid = tail_mask(c - t);
      const __mmask16 take =
          _mm512_mask_cmpge_epu32_mask(valid, load_lanes(ckey + t, valid), thr_v);
      const int got = std::popcount(static_cast<unsigned>(take));
      // a masked store of the compressed lanes: never past idx[k - 1]
      _mm512_mask_storeu_epi32(idx + m, tail_mask(got),
                               _mm512_maskz_compress_epi32(take, _mm512_loadu_si512(cidx + t)));
      m += got;
    }
#else
    for (int64_t t = 0; t < c && m < k; ++t) {
      idx[m] = cidx[t];
      m += ckey[t] >= thr;
    }
#endif
    return m;
  }
  return take_in_order(
      c, k, [&](int64_t t) { return ckey[t]; }, [&](int64_t t) { return cidx[t]; }, thr, equal_left,
      idx);
}

// The top k of a row from its candidates: every key above lo, in index order (c >= k of them),
// above_hi of them above hi. Sets thr to the k-th key. Returns how many (k).
int64_t select_candidates(const int32_t* cidx, const uint32_t* ckey, int64_t c, int64_t above_hi,
                          int64_t k, uint32_t lo, uint32_t hi, int32_t* idx, uint32_t& thr) {
  thread_local std::vector<uint32_t> band_keys;
  // the k-th lies in (lo, hi] when fewer than k keys are above hi, else above hi
  const bool in_band = above_hi < k;
  const int64_t m = in_band ? c - above_hi : above_hi;
  band_keys.resize(static_cast<size_t>(m + 16));
  // every candidate is above lo: the band's keys are those in (lo, hi], else those above hi
  if (in_band) {
    keys_in_band(ckey, c, lo, hi, band_keys.data());
  } else {
    keys_in_band(ckey, c, hi, ~0u, band_keys.data());
  }
  const int64_t need = in_band ? k - above_hi : k;  // 1 <= need <= m
  int64_t above = 0, equal = 0;
  thr = in_band ? kth_largest_key(band_keys.data(), m, need, lo + 1, hi, above, equal)
                : kth_largest_key(band_keys.data(), m, need, hi + 1, ~0u, above, equal);
  const int64_t equal_left = need - above;
  return take_candidates(cidx, ckey, c, k, thr, equal == equal_left, equal_left, idx);
}

// The hint after a row whose k-th value is `value` (err: how far its prediction missed).
void update_hint(TopkHint& hint, double value, double mean, double sd, double err) {
  hint.moved = hint.valid && std::isfinite(hint.moved) ? 0.75 * hint.moved + 0.25 * err : err;
  hint.valid = true, hint.value = value, hint.mean = mean, hint.sd = sd;
}

template <class T>
int64_t topk_hinted_impl(const T* s, int64_t n, int64_t k, int32_t* idx, TopkHint& hint) {
  k = std::clamp<int64_t>(k, 0, n);
  if (k == 0 || k == n || n < kHintedMinN) {
    thread_local std::vector<T> buf;
    return topk_impl(s, n, k, idx, buf);
  }
  // The k-th value keeps its standardised position from row to row: the rows cover nearly the
  // same keys, and a new query mostly shifts and scales their scores. Predicting it from the
  // previous row's position and this row's mean and deviation cut the band's error about 10x
  // against the previous k-th value alone (WikiText-2 Q/K of SmolLM2-135M).
  const auto [mean, sd] = row_moments(s, n);
  double pred = std::numeric_limits<double>::quiet_NaN();
  if (hint.valid)
    pred = hint.sd > 0 ? mean + (hint.value - hint.mean) / hint.sd * sd
                       : hint.value + (mean - hint.mean);
  const double half = kBandErrors * hint.moved;
  const bool predicted = std::isfinite(pred) && std::isfinite(half);
  KeyBand band = predicted ? KeyBand{key_near(pred - half, T{}), key_near(pred + half, T{})}
                           : sample_band(s, n, k);
  bool sampled = !predicted;
  for (int attempt = 0; attempt < kBandAttempts; ++attempt) {
    const auto [lo, hi] = band;
    // the k-th is in (lo, hi] iff above_hi < k <= above_lo
    thread_local std::vector<int32_t> cidx;
    thread_local std::vector<uint32_t> ckey, band_keys;
    cidx.resize(static_cast<size_t>(n + 16)), ckey.resize(static_cast<size_t>(n + 16));
    const auto [above_hi, above_lo] = keys_above(s, n, lo, hi, cidx.data(), ckey.data());
    if (above_hi >= k || above_lo < k) {
      if (!sampled) {  // the prediction missed: a band from this row's own sample
        band = sample_band(s, n, k);
        sampled = true;
      } else {  // the k-th lies beyond the band: recentre, widen
        const uint64_t w = std::max<uint64_t>((uint64_t{hi} - lo) / 2, 1);
        const uint32_t key = above_hi >= k ? sat_add(hi, w) : sat_sub(lo, w);
        band = {sat_sub(key, 4 * w), sat_add(key, 4 * w)};
      }
      continue;
    }
    uint32_t thr = 0;
    const int64_t taken =
        select_candidates(cidx.data(), ckey.data(), above_lo, above_hi, k, lo, hi, idx, thr);
    // the next row's band: kBandErrors running-mean errors of the prediction each side (a
    // band from a sample starts the mean at its own half-width)
    const double value = key_value(thr, T{});
    const double err =
        std::isfinite(pred)
            ? std::abs(value - pred)
            : (static_cast<double>(key_value(hi, T{})) - static_cast<double>(key_value(lo, T{}))) /
                  (2 * kBandErrors);
    update_hint(hint, value, mean, sd, err);
    return taken;
  }
  hint.valid = false;
  thread_local std::vector<T> buf;
  return topk_impl(s, n, k, idx, buf);
}

// ---- top-k fused into the estimate ----------------------------------------------------------

template <class T>
void fused_topk_rows_impl(const FusedTopkRow* rows, int64_t n_rows, const ScoreTileFn<T>& tile,
                          const RowScoresFn<T>& row_scores, TopkHint& hint, int32_t* idx,
                          int64_t* offs, FusedTopkStats* stats) {
  struct RowBand {
    double pred = std::numeric_limits<double>::quiet_NaN();
    uint32_t lo = 0, hi = ~0u;
    bool fused = false;
    int64_t above_hi = 0, above_lo = 0;
    ScoreSums sums;
  };
  thread_local std::vector<RowBand> band_of;
  thread_local std::vector<int32_t> cidx;
  thread_local std::vector<uint32_t> ckey;
  thread_local std::vector<int64_t> cand_at;
  thread_local std::vector<uint32_t> band_keys;
  thread_local std::vector<T> tile_buf, row_buf;
  offs[0] = 0;
  // a row without a band, or whose band missed: its scores, then the row-after-row selection
  const auto by_scores = [&](int64_t r, bool missed) {
    const FusedTopkRow& row = rows[r];
    row_buf.resize(static_cast<size_t>(row.n));
    row_scores(r, row_buf.data());
    offs[r + 1] = offs[r] + topk_hinted_impl(row_buf.data(), row.n, row.k, idx + offs[r], hint);
    hint.q_norm = row.q_norm;
    if (stats) ++(missed ? stats->missed_rows : stats->rescored_rows);
  };
  const auto usable = [&] { return hint.valid && std::isfinite(hint.moved) && hint.q_norm > 0; };
  int64_t r_begin = 0;
  for (; r_begin < n_rows && !usable(); ++r_begin) by_scores(r_begin, false);
  if (r_begin == n_rows) return;
  // the other rows' bands from the hint, before any of their scores exist: the mean is the row's
  // own, the deviation the hint row's scaled by the query norms, the k-th at the hint's
  // standardised position
  const int64_t n_fused = n_rows - r_begin;
  band_of.assign(static_cast<size_t>(n_fused), RowBand{});
  // the error of this prediction starts at the row-after-row one's
  if (!(hint.moved_fused >= 0)) hint.moved_fused = hint.moved;
  const double z = hint.sd > 0 ? (hint.value - hint.mean) / hint.sd : 0,
               half = kBandErrors * hint.moved_fused;
  int64_t key_begin = std::numeric_limits<int64_t>::max(), key_end = 0;
  cand_at.assign(static_cast<size_t>(n_fused + 1), 0);
  for (int64_t r = r_begin; r < n_rows; ++r) {
    const FusedTopkRow& row = rows[r];
    RowBand& b = band_of[static_cast<size_t>(r - r_begin)];
    b.pred = hint.sd > 0 ? row.mean + z * hint.sd * row.q_norm / hint.q_norm
                         : hint.value + (row.mean - hint.mean);
    b.fused = row.n >= kHintedMinN && row.k > 0 && row.k < row.n && std::isfinite(b.pred) &&
              std::isfinite(half);
    // candidates of row r from cand_at: room for all its keys and one register
    cand_at[static_cast<size_t>(r - r_begin + 1)] =
        cand_at[static_cast<size_t>(r - r_begin)] + (b.fused ? row.n + 16 : 0);
    if (!b.fused) continue;
    b.lo = key_near(b.pred - half, T{}), b.hi = key_near(b.pred + half, T{});
    key_begin = std::min(key_begin, row.lo), key_end = std::max(key_end, row.lo + row.n);
  }
  cidx.resize(static_cast<size_t>(cand_at.back() + 16));
  ckey.resize(static_cast<size_t>(cand_at.back() + 16));
  if (key_end > key_begin) {
    tile_buf.resize(static_cast<size_t>(n_fused * kFusedTileKeys));
    for (int64_t c0 = key_begin / kFusedTileKeys * kFusedTileKeys; c0 < key_end;
         c0 += kFusedTileKeys) {
      const int64_t cols = std::min(kFusedTileKeys, key_end - c0);
      tile(r_begin, n_rows, c0, cols, tile_buf.data(), kFusedTileKeys);
      for (int64_t r = r_begin; r < n_rows; ++r) {
        const size_t i = static_cast<size_t>(r - r_begin);
        RowBand& b = band_of[i];
        const int64_t a = std::max(rows[r].lo, c0), e = std::min(rows[r].lo + rows[r].n, c0 + cols);
        if (!b.fused || a >= e) continue;
        const int64_t at = cand_at[i] + b.above_lo;
        const auto [ahi, alo] =
            keys_above(tile_buf.data() + static_cast<int64_t>(i) * kFusedTileKeys + (a - c0), e - a,
                       b.lo, b.hi, cidx.data() + at, ckey.data() + at,
                       static_cast<int32_t>(a - rows[r].lo), &b.sums);
        b.above_hi += ahi, b.above_lo += alo;
      }
    }
  }
  for (int64_t r = r_begin; r < n_rows; ++r) {
    const FusedTopkRow& row = rows[r];
    const size_t i = static_cast<size_t>(r - r_begin);
    const RowBand& b = band_of[i];
    if (!b.fused || b.above_lo < row.k) {  // without a band, or the k-th lies below it
      by_scores(r, b.fused);
      continue;
    }
    // Every key of the top k is a candidate. The row's moments are known now: a narrow band from
    // them and the previous row (topk_indices' own prediction) usually holds the k-th, and only
    // its keys are ranked; else the whole band of the fused pass is.
    const int32_t* ci = cidx.data() + cand_at[i];
    const uint32_t* ck = ckey.data() + cand_at[i];
    const double n = static_cast<double>(row.n), mean = b.sums.sum / n,
                 sd = std::sqrt(std::max(0.0, b.sums.sq / n - mean * mean));
    const double pred = hint.sd > 0 ? mean + (hint.value - hint.mean) / hint.sd * sd
                                    : hint.value + (mean - hint.mean),
                 half_row = kBandErrors * hint.moved;
    uint32_t thr = 0;
    int64_t taken = -1;
    if (std::isfinite(pred) && std::isfinite(half_row)) {
      const uint32_t lo = std::max(key_near(pred - half_row, T{}), b.lo),
                     hi = key_near(pred + half_row, T{});
      band_keys.resize(static_cast<size_t>(b.above_lo + 16));
      const auto [above_hi, m] = hi > lo ? keys_in_band(ck, b.above_lo, lo, hi, band_keys.data())
                                         : std::pair<int64_t, int64_t>{0, 0};
      if (above_hi < row.k && row.k <= above_hi + m) {
        int64_t above = 0, equal = 0;
        const int64_t need = row.k - above_hi;
        thr = kth_largest_key(band_keys.data(), m, need, lo + 1, hi, above, equal);
        const int64_t equal_left = need - above;
        taken = take_candidates(ci, ck, b.above_lo, row.k, thr, equal == equal_left, equal_left,
                                idx + offs[r]);
      }
    }
    if (taken < 0)
      taken =
          select_candidates(ci, ck, b.above_lo, b.above_hi, row.k, b.lo, b.hi, idx + offs[r], thr);
    offs[r + 1] = offs[r] + taken;
    const double value = key_value(thr, T{});
    update_hint(hint, value, mean, sd, std::abs(value - (std::isfinite(pred) ? pred : b.pred)));
    hint.moved_fused = 0.75 * hint.moved_fused + 0.25 * std::abs(value - b.pred);
    hint.q_norm = row.q_norm;
    if (stats) ++stats->fused_rows;
  }
}

using simd::hsum;
using simd::hsum4;
using simd::hsum_lanes;
using simd::kLanes;
using simd::load;
using simd::splat;
using simd::store;
using simd::VecF;

// out[j] = q·k[idx_j], head_dim = NV vectors (q's held in registers; one horizontal sum per
// key), or any head_dim (NV = 0: the vectors, then a scalar tail).
template <int NV>
void score_rows(const float* q, const float* k, int64_t ldkv, int64_t head_dim, const int32_t* idx,
                int64_t n, float* out) {
  const int64_t nv = NV ? NV : head_dim / kLanes;
  VecF qv[NV ? NV : 1];
  if constexpr (NV > 0)
    for (int u = 0; u < NV; ++u) qv[u] = load(q + u * kLanes);
  const auto dot_vec = [&](const float* kr) {  // two chains: half the FMA latency per key
    VecF acc[2] = {};
    for (int64_t u = 0; u < nv; ++u)
      acc[u & 1] += (NV ? qv[u] : load(q + u * kLanes)) * load(kr + u * kLanes);
    return acc[0] + acc[1];
  };
  const auto tail = [&](const float* kr) {
    float t = 0.0f;
    for (int64_t c = nv * kLanes; c < head_dim; ++c) t += q[c] * kr[c];
    return t;
  };
  const auto row = [&](int64_t j) { return k + static_cast<int64_t>(idx[j]) * ldkv; };
  int64_t j = 0;
  if constexpr (NV > 0 && NV <= 8)  // kLanes keys' sums reduced together (q and them in registers)
    for (; j + kLanes <= n; j += kLanes) {
      VecF acc[kLanes];
#pragma GCC unroll 16
      for (int64_t t = 0; t < kLanes; ++t) {
        const float* kr = row(j + t);
        acc[t] = qv[0] * load(kr);
#pragma GCC unroll 8
        for (int u = 1; u < NV; ++u) acc[t] += qv[u] * load(kr + u * kLanes);
      }
      store(out + j, hsum_lanes(acc));
    }
  for (; j + 4 <= n; j += 4) {  // four keys' sums reduced together
    hsum4(dot_vec(row(j)), dot_vec(row(j + 1)), dot_vec(row(j + 2)), dot_vec(row(j + 3)), out + j);
    if constexpr (NV == 0)
      for (int64_t i = j; i < j + 4; ++i) out[i] += tail(row(i));
  }
  for (; j < n; ++j) out[j] = hsum(dot_vec(row(j))) + tail(row(j));
}

// O = alpha * O + sum_j p_j v[idx_j], head_dim = NV vectors of accumulators in registers (or
// any head_dim, NV = 0).
template <int NV>
void gather_v_rows(const float* p, const float* v, int64_t ldkv, int64_t head_dim,
                   const int32_t* idx, int64_t n, float alpha, float* O) {
  if constexpr (NV > 0) {
    // even and odd keys in two sets of accumulators (two keys' FMAs in flight) while both
    // sets fit the registers
    constexpr int kSets = NV <= 8 ? 2 : 1;
    VecF acc[2][NV] = {};
    for (int u = 0; u < NV; ++u) acc[0][u] = load(O + u * kLanes) * alpha;
    int64_t j = 0;
    for (; j + kSets <= n; j += kSets)
      for (int64_t e = 0; e < kSets; ++e) {
        const float* vr = v + static_cast<int64_t>(idx[j + e]) * ldkv;
        const VecF w = splat(p[j + e]);
        for (int u = 0; u < NV; ++u) acc[e][u] += w * load(vr + u * kLanes);
      }
    if (j < n) {
      const float* vr = v + static_cast<int64_t>(idx[j]) * ldkv;
      const VecF w = splat(p[j]);
      for (int u = 0; u < NV; ++u) acc[0][u] += w * load(vr + u * kLanes);
    }
    for (int u = 0; u < NV; ++u) store(O + u * kLanes, acc[0][u] + acc[1][u]);
  } else {
    for (int64_t c = 0; c < head_dim; ++c) O[c] *= alpha;
    for (int64_t j = 0; j < n; ++j) {
      const float* vr = v + static_cast<int64_t>(idx[j]) * ldkv;
      const float w = p[j];
#pragma omp simd
      for (int64_t c = 0; c < head_dim; ++c) O[c] += w * vr[c];
    }
  }
}

// f(std::integral_constant<int, NV>) with NV = head_dim / kLanes for the head sizes of our
// models (32 .. 256 dims), 0 for any other.
template <typename F>
void with_head_vectors(int64_t head_dim, F&& f) {
  if (head_dim % kLanes == 0) switch (head_dim / kLanes) {
      case 2: return f(std::integral_constant<int, 2>{});
      case 4: return f(std::integral_constant<int, 4>{});
      case 8: return f(std::integral_constant<int, 8>{});
      case 16: return f(std::integral_constant<int, 16>{});
      case 32: return f(std::integral_constant<int, 32>{});
      default: break;
    }
  f(std::integral_constant<int, 0>{});
}

// The max of scale * p[j], j < n.
float scaled_max(const float* p, int64_t n, float scale) {
  const int64_t nvec = n / kLanes * kLanes;
  VecF vmax = splat(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < nvec; j += kLanes) {
    const VecF x = load(p + j) * scale;
    vmax = vmax > x ? vmax : x;
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < kLanes; ++i) mx = std::max(mx, vmax[i]);
  for (int64_t j = nvec; j < n; ++j) mx = std::max(mx, p[j] * scale);
  return mx;
}

// p[j] = exp(scale * p[j] - mx); returns their sum.
float exp_shifted(float* p, int64_t n, float scale, float mx) {
  const int64_t nvec = n / kLanes * kLanes;
  VecF vsum = VecF{};
  for (int64_t j = 0; j < nvec; j += kLanes) {
    const VecF e = exp_nonpositive(load(p + j) * scale - mx);
    store(p + j, e);
    vsum += e;
  }
  float sum = hsum(vsum);
  for (int64_t j = nvec; j < n; ++j) {
    p[j] = exp_nonpositive(p[j] * scale - mx);
    sum += p[j];
  }
  return sum;
}

// out = sum_j p_j v[idx_j] / sum_j p_j with p_j = exp(scale * s_j - max) (s_j in p on entry).
void softmax_gather_v(float* p, const float* v, int64_t ldkv, int64_t head_dim, const int32_t* idx,
                      int64_t n, float scale, float* out) {
  const float sum = exp_shifted(p, n, scale, scaled_max(p, n, scale));
  std::fill(out, out + head_dim, 0.0f);
  with_head_vectors(head_dim, [&](auto nv) {
    gather_v_rows<decltype(nv)::value>(p, v, ldkv, head_dim, idx, n, 0.0f, out);
  });
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < head_dim; ++c) out[c] *= inv;
}

// Keys per tile of attend_selected_rows: a tile's K and V rows (512 KB at head_dim 64) stay in
// L2 while every row of the block attends over its keys in the tile. Measured on Zen 4 at 4,096
// tokens with aligned rows: 64 keys 1.27x slower (the per-tile softmax bookkeeping of a row's
// ~13 keys), 256 1.05x, 1,024 to 4,096 alike.
constexpr int64_t kGatherKeyTile = 1024;

}  // namespace

int64_t topk_indices(const float* s, int64_t n, int64_t k, int32_t* idx, std::vector<float>& buf) {
  return topk_impl(s, n, k, idx, buf);
}

int64_t topk_indices(const int32_t* s, int64_t n, int64_t k, int32_t* idx,
                     std::vector<int32_t>& buf) {
  return topk_impl(s, n, k, idx, buf);
}

int64_t topk_indices(const float* s, int64_t n, int64_t k, int32_t* idx, TopkHint& hint) {
  return topk_hinted_impl(s, n, k, idx, hint);
}

int64_t topk_indices(const int32_t* s, int64_t n, int64_t k, int32_t* idx, TopkHint& hint) {
  return topk_hinted_impl(s, n, k, idx, hint);
}

void fused_topk_rows(const FusedTopkRow* rows, int64_t n_rows, const ScoreTileFn<int32_t>& tile,
                     const RowScoresFn<int32_t>& row_scores, TopkHint& hint, int32_t* idx,
                     int64_t* offs, FusedTopkStats* stats) {
  fused_topk_rows_impl<int32_t>(rows, n_rows, tile, row_scores, hint, idx, offs, stats);
}
void fused_topk_rows(const FusedTopkRow* rows, int64_t n_rows, const ScoreTileFn<float>& tile,
                     const RowScoresFn<float>& row_scores, TopkHint& hint, int32_t* idx,
                     int64_t* offs, FusedTopkStats* stats) {
  fused_topk_rows_impl<float>(rows, n_rows, tile, row_scores, hint, idx, offs, stats);
}

KeyPrefixSums::KeyPrefixSums(const int8_t* k8, int64_t ldk, int64_t L, int64_t head_dim)
    : L_(L), hd_(head_dim) {
  if (L < 0 || head_dim < 0 || ldk < head_dim)
    throw ShapeError("[KeyPrefixSums] keys [" + std::to_string(L) + ", " +
                     std::to_string(head_dim) + "] with row stride " + std::to_string(ldk));
  if (L > kMaxPrefixKeys)
    throw ShapeError("[KeyPrefixSums] " + std::to_string(L) + " keys, at most " +
                     std::to_string(kMaxPrefixKeys) + " fit int32 sums");
  sums_.assign(static_cast<size_t>((L + 1) * head_dim), 0);
  for (int64_t j = 0; j < L; ++j)
    for (int64_t d = 0; d < head_dim; ++d)
      sums_[static_cast<size_t>((j + 1) * head_dim + d)] =
          sums_[static_cast<size_t>(j * head_dim + d)] + k8[j * ldk + d];
}

double KeyPrefixSums::mean_score(const int8_t* q8, int64_t lo, int64_t hi) const {
  if (lo < 0 || hi <= lo || hi > keys())
    throw ShapeError("[KeyPrefixSums] keys [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     ") of " + std::to_string(keys()));
  const int32_t *a = sums_.data() + lo * hd_, *b = sums_.data() + hi * hd_;
  int64_t dot = 0;
  for (int64_t d = 0; d < hd_; ++d) dot += int64_t{q8[d]} * (b[d] - a[d]);
  return static_cast<double>(dot) / static_cast<double>(hi - lo);
}

void score_selected(const float* q, const float* k, int64_t ldkv, int64_t head_dim,
                    const int32_t* idx, int64_t n, float* out) {
  with_head_vectors(head_dim, [&](auto nv) {
    score_rows<decltype(nv)::value>(q, k, ldkv, head_dim, idx, n, out);
  });
}

void attend_selected(const float* q, const float* k, const float* v, int64_t ldkv, int64_t head_dim,
                     const int32_t* idx, int64_t n, float scale, float* out, float* p) {
  score_selected(q, k, ldkv, head_dim, idx, n, p);
  softmax_gather_v(p, v, ldkv, head_dim, idx, n, scale, out);
}

void attend_selected_scored(const float* s, const float* v, int64_t ldkv, int64_t head_dim,
                            const int32_t* idx, int64_t n, float scale, float* out, float* p) {
  for (int64_t j = 0; j < n; ++j) p[j] = s[idx[j]];
  softmax_gather_v(p, v, ldkv, head_dim, idx, n, scale, out);
}

void attend_selected_rows(const float* q, int64_t ldq, const float* k, const float* v, int64_t ldkv,
                          int64_t head_dim, const int32_t* idx, const int64_t* offs, int64_t rows,
                          float scale, const float* scores, int64_t lds, float* out, int64_t ldo,
                          bool scores_by_pair) {
  if (rows <= 0) return;
  thread_local AlignedVector<float> O_buf;  // rows of whole registers
  thread_local std::vector<float> p_buf, m_buf, l_buf;
  thread_local std::vector<int64_t> at_buf;
  O_buf.assign(static_cast<size_t>(rows * head_dim), 0.0f);
  m_buf.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
  l_buf.assign(static_cast<size_t>(rows), 0.0f);
  at_buf.assign(offs, offs + rows);
  p_buf.resize(static_cast<size_t>(kGatherKeyTile));
  float* p = p_buf.data();
  int64_t end_key = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (offs[r + 1] > offs[r]) end_key = std::max<int64_t>(end_key, idx[offs[r + 1] - 1] + 1);
  with_head_vectors(head_dim, [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    for (int64_t t1 = kGatherKeyTile; t1 - kGatherKeyTile < end_key; t1 += kGatherKeyTile)
      for (int64_t r = 0; r < rows; ++r) {
        // row r's keys below t1 not yet attended (at most a tile of them: keys are distinct)
        const int64_t b = at_buf[static_cast<size_t>(r)];
        const int64_t e = std::lower_bound(idx + b, idx + offs[r + 1], t1) - idx;
        if (e == b) continue;
        const int64_t n = e - b;
        at_buf[static_cast<size_t>(r)] = e;
        if (scores_by_pair) {
          std::copy_n(scores + b, n, p);
        } else if (scores) {
          for (int64_t j = 0; j < n; ++j) p[j] = scores[r * lds + idx[b + j]];
        } else {
          score_rows<NV>(q + r * ldq, k, ldkv, head_dim, idx + b, n, p);
        }
        // online softmax (Dao et al. 2022, Alg. 1): rescale the row's sum and output when the
        // running max grows
        float& m = m_buf[static_cast<size_t>(r)];
        const float m_new = std::max(m, scaled_max(p, n, scale));
        const float alpha = std::isinf(m) ? 0.0f : exp_nonpositive(m - m_new);
        const float sum = exp_shifted(p, n, scale, m_new);
        float& l = l_buf[static_cast<size_t>(r)];
        l = l * alpha + sum;
        m = m_new;
        gather_v_rows<NV>(p, v, ldkv, head_dim, idx + b, n, alpha, O_buf.data() + r * head_dim);
      }
  });
  for (int64_t r = 0; r < rows; ++r) {
    const float* O = O_buf.data() + r * head_dim;
    const float inv = 1.0f / l_buf[static_cast<size_t>(r)];
    for (int64_t c = 0; c < head_dim; ++c) out[r * ldo + c] = O[c] * inv;
  }
}

void quantize_rows_s8(const float* x, int64_t rows, int64_t cols, int64_t ldx, float scale,
                      int8_t* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      // x / scale as np.round(x / scale) computes it; nearbyint rounds half to even
      const float q = std::nearbyint(x[r * ldx + c] / scale);
      y[r * ldy + c] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
}

float absmax_rows(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  // in vectors, with std::max's rule (a NaN never replaces the running max)
  VecF vm{};
  float m = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
    int64_t c = 0;
    for (; c + kLanes <= cols; c += kLanes) {
      VecF a = load(row + c);
      a = a < 0 ? -a : a;
      vm = a > vm ? a : vm;
    }
    for (; c < cols; ++c) m = std::max(m, std::abs(row[c]));
  }
  for (int64_t i = 0; i < kLanes; ++i) m = std::max(m, vm[i]);
  return m;
}

}  // namespace socllm::kernels
