#include "quant/bitwidth.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

#include "core/core.h"

namespace socllm::quant {

namespace {

void check_bits(int bits, const char* fn) {
  if (bits < kMinChannelBits || bits > kMaxChannelBits)
    throw InvalidArgument(std::string("[") + fn + "] bits must be in 1..8, got " +
                          std::to_string(bits));
}

void check_table(std::span<const double> table, int64_t rows, const char* fn) {
  if (rows < 0 || static_cast<int64_t>(table.size()) != rows * kChannelBitLevels)
    throw ShapeError(std::string("[") + fn + "] error table has " + std::to_string(table.size()) +
                     " entries, expected rows * 8 = " + std::to_string(rows * kChannelBitLevels));
}

void check_total(int64_t rows, int64_t total_bits, const char* fn) {
  if (total_bits < rows * kMinChannelBits || total_bits > rows * kMaxChannelBits)
    throw InvalidArgument(std::string("[") + fn + "] total bits " + std::to_string(total_bits) +
                          " outside [" + std::to_string(rows) + ", " + std::to_string(8 * rows) +
                          "] for " + std::to_string(rows) + " channels");
}

inline double err(std::span<const double> t, int64_t row, int bits) {
  return t[static_cast<size_t>(row * kChannelBitLevels + bits - 1)];
}

// sum w^2 and max |w| in double.
void row_stats(const float* w, int64_t n, double& sumsq, double& amax) {
  sumsq = 0.0;
  amax = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = w[i];
    sumsq += v * v;
    amax = std::max(amax, std::abs(v));
  }
}

}  // namespace

float quantize_row_bits(const float* w, int64_t n, int bits, int8_t* q) {
  check_bits(bits, "quantize_row_bits");
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(w[i]))
      throw InvalidArgument("[quantize_row_bits] non-finite weight at index " + std::to_string(i));
  if (bits == 1) {
    double sum_abs = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      sum_abs += std::abs(static_cast<double>(w[i]));
      q[i] = w[i] >= 0.0f ? 1 : -1;
    }
    return n > 0 ? static_cast<float>(sum_abs / static_cast<double>(n)) : 0.0f;
  }
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(w[i]));
  const int32_t qmax = (1 << (bits - 1)) - 1;
  const float scale = amax / static_cast<float>(qmax);
  for (int64_t i = 0; i < n; ++i) {
    if (scale == 0.0f) {
      q[i] = 0;
      continue;
    }
    // The rule of quant.h (true division, round half to even, saturate).
    const float r = std::nearbyint(w[i] / scale);
    q[i] =
        static_cast<int8_t>(std::clamp(r, static_cast<float>(-qmax - 1), static_cast<float>(qmax)));
  }
  return scale;
}

namespace {
// The closed form from a row's statistics, which do not depend on the bit-width.
double closed_form_error(double sumsq, double amax, int64_t n, int bits) {
  if (sumsq == 0.0) return 0.0;
  const double mean_sq = sumsq / static_cast<double>(n);
  return std::ldexp(amax * amax / mean_sq, -2 * bits);
}
}  // namespace

double relative_error_closed(const float* w, int64_t n, int bits) {
  check_bits(bits, "relative_error_closed");
  double sumsq, amax;
  row_stats(w, n, sumsq, amax);
  return closed_form_error(sumsq, amax, n, bits);
}

double relative_error_exact(const float* w, int64_t n, int bits) {
  std::vector<int8_t> q(static_cast<size_t>(n));
  const double scale = quantize_row_bits(w, n, bits, q.data());
  double dot = 0.0, ww = 0.0, qq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = w[i], b = q[static_cast<size_t>(i)] * scale;
    dot += a * b;
    ww += a * a;
    qq += b * b;
  }
  if (ww == 0.0) return 0.0;
  if (qq == 0.0) return 1.0;
  return std::max(0.0, 1.0 - dot / std::sqrt(ww * qq));
}

std::string error_metric_name(ErrorMetric m) {
  return m == ErrorMetric::ClosedForm ? "closed-form" : "exact";
}

ErrorMetric error_metric_from_name(const std::string& s) {
  if (s == "closed-form") return ErrorMetric::ClosedForm;
  if (s == "exact") return ErrorMetric::Exact;
  throw InvalidArgument("[bitwidths] unknown error metric '" + s + "' (known: closed-form, exact)");
}

std::vector<double> channel_error_table(const float* W, int64_t rows, int64_t cols,
                                        ErrorMetric metric) {
  if (rows < 0 || cols <= 0)
    throw ShapeError("[channel_error_table] bad shape [" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "]");
  std::vector<double> t(static_cast<size_t>(rows * kChannelBitLevels));
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 16) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t i = 0; i < rows; ++i) {
    try {
      double* row = t.data() + i * kChannelBitLevels;
      if (metric == ErrorMetric::ClosedForm) {  // one pass over the row for all bit-widths
        double sumsq, amax;
        row_stats(W + i * cols, cols, sumsq, amax);
        for (int b = kMinChannelBits; b <= kMaxChannelBits; ++b)
          row[b - 1] = closed_form_error(sumsq, amax, cols, b);
      } else {
        for (int b = kMinChannelBits; b <= kMaxChannelBits; ++b)
          row[b - 1] = relative_error_exact(W + i * cols, cols, b);
      }
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return t;
}

int64_t total_channel_bits(int64_t rows, double avg_bits) {
  if (!std::isfinite(avg_bits) || avg_bits < kMinChannelBits || avg_bits > kMaxChannelBits)
    throw InvalidArgument("[bitwidths] average bit budget must be in [1, 8], got " +
                          std::to_string(avg_bits));
  // A tolerance so that e.g. 4.6 * 5 channels buys 23 bits, not 22 after rounding 22.999...
  return std::min<int64_t>(rows * kMaxChannelBits,
                           static_cast<int64_t>(std::floor(rows * avg_bits + 1e-9)));
}

std::vector<uint8_t> allocate_bits_greedy(std::span<const double> table, int64_t rows,
                                          int64_t total_bits) {
  check_table(table, rows, "allocate_bits_greedy");
  check_total(rows, total_bits, "allocate_bits_greedy");
  std::vector<uint8_t> bits(static_cast<size_t>(rows), kMinChannelBits);
  // Max-heap of (gain, -row): equal gains pop the lower row first.
  using Entry = std::pair<double, int64_t>;
  std::vector<Entry> init;
  init.reserve(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) init.emplace_back(err(table, i, 1) - err(table, i, 2), -i);
  std::priority_queue<Entry> heap(std::less<Entry>(), std::move(init));
  for (int64_t remain = total_bits - rows; remain > 0 && !heap.empty(); --remain) {
    const int64_t i = -heap.top().second;
    heap.pop();
    const int b = ++bits[static_cast<size_t>(i)];
    if (b < kMaxChannelBits) heap.emplace(err(table, i, b) - err(table, i, b + 1), -i);
  }
  return bits;
}

namespace {

// The next bit-width on the lower convex hull of row i's (cost, error) points after `from`:
// the one with the largest error drop per unit of extra cost (ties: the cheaper); 0 if none
// lowers the error.
int next_hull_bits(std::span<const double> error, std::span<const double> cost, int64_t i, int from,
                   double& slope) {
  int best = 0;
  slope = 0.0;
  const double c0 = err(cost, i, from), e0 = err(error, i, from);
  for (int b = kMinChannelBits; b <= kMaxChannelBits; ++b) {
    const double dc = err(cost, i, b) - c0, de = e0 - err(error, i, b);
    if (de <= 0.0) continue;
    // A bit-width that lowers the error at no extra cost is an infinitely steep step.
    const double s = dc <= 0.0 ? std::numeric_limits<double>::infinity() : de / dc;
    if (best == 0 || s > slope || (s == slope && err(cost, i, b) < err(cost, i, best))) {
      best = b;
      slope = s;
    }
  }
  return best;
}

}  // namespace

std::vector<uint8_t> allocate_bits_budgeted(std::span<const double> error,
                                            std::span<const double> cost, int64_t rows,
                                            double budget) {
  check_table(error, rows, "allocate_bits_budgeted");
  check_table(cost, rows, "allocate_bits_budgeted");
  for (size_t k = 0; k < error.size(); ++k)
    if (!std::isfinite(error[k]) || !std::isfinite(cost[k]))
      throw InvalidArgument("[allocate_bits_budgeted] non-finite error or cost at channel " +
                            std::to_string(k / kChannelBitLevels) + ", bits " +
                            std::to_string(k % kChannelBitLevels + 1));
  if (!std::isfinite(budget))
    throw InvalidArgument("[allocate_bits_budgeted] budget must be finite, got " +
                          std::to_string(budget));
  std::vector<uint8_t> bits(static_cast<size_t>(rows));
  double spent = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    int cheapest = kMinChannelBits;
    for (int b = kMinChannelBits + 1; b <= kMaxChannelBits; ++b) {
      const double c = err(cost, i, b), cc = err(cost, i, cheapest);
      if (c < cc || (c == cc && err(error, i, b) < err(error, i, cheapest))) cheapest = b;
    }
    bits[static_cast<size_t>(i)] = static_cast<uint8_t>(cheapest);
    spent += err(cost, i, cheapest);
  }
  if (spent > budget)
    throw InvalidArgument("[allocate_bits_budgeted] budget " + std::to_string(budget) +
                          " is below the cheapest allocation's cost " + std::to_string(spent));
  // Max-heap of (slope, -row): equal slopes pop the lower row first.
  using Entry = std::pair<double, int64_t>;
  std::priority_queue<Entry> heap;
  std::vector<uint8_t> next(static_cast<size_t>(rows), 0);
  auto push = [&](int64_t i) {
    double slope = 0.0;
    const int b = next_hull_bits(error, cost, i, bits[static_cast<size_t>(i)], slope);
    next[static_cast<size_t>(i)] = static_cast<uint8_t>(b);
    if (b != 0) heap.emplace(slope, -i);
  };
  for (int64_t i = 0; i < rows; ++i) push(i);
  while (!heap.empty()) {
    const int64_t i = -heap.top().second;
    heap.pop();
    const int from = bits[static_cast<size_t>(i)], to = next[static_cast<size_t>(i)];
    const double dc = err(cost, i, to) - err(cost, i, from);
    if (spent + dc > budget) continue;  // retired: its later hull steps start from this one
    spent += dc;
    bits[static_cast<size_t>(i)] = static_cast<uint8_t>(to);
    push(i);
  }
  return bits;
}

double allocation_cost(std::span<const double> cost, std::span<const uint8_t> bits) {
  return allocation_error(cost, bits);
}

std::vector<uint8_t> allocate_bits_dp(std::span<const double> table, int64_t rows,
                                      int64_t total_bits) {
  check_table(table, rows, "allocate_bits_dp");
  check_total(rows, total_bits, "allocate_bits_dp");
  const int64_t extra = total_bits - rows;  // bits beyond the first of every channel
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[e]: minimum error of the channels so far spending e extra bits; choice per channel.
  std::vector<double> best(static_cast<size_t>(extra + 1), kInf), next(best.size());
  best[0] = 0.0;
  std::vector<uint8_t> choice(static_cast<size_t>(rows * (extra + 1)), 0);
  for (int64_t i = 0; i < rows; ++i) {
    std::fill(next.begin(), next.end(), kInf);
    for (int64_t e = 0; e <= extra; ++e) {
      if (best[static_cast<size_t>(e)] == kInf) continue;
      for (int b = kMinChannelBits; b <= kMaxChannelBits && e + b - 1 <= extra; ++b) {
        const double v = best[static_cast<size_t>(e)] + err(table, i, b);
        double& slot = next[static_cast<size_t>(e + b - 1)];
        if (v < slot) {
          slot = v;
          choice[static_cast<size_t>(i * (extra + 1) + e + b - 1)] = static_cast<uint8_t>(b);
        }
      }
    }
    best.swap(next);
  }
  int64_t e = extra;  // the whole budget spent, as Algorithm 1 spends it
  std::vector<uint8_t> bits(static_cast<size_t>(rows));
  for (int64_t i = rows - 1; i >= 0; --i) {
    const uint8_t b = choice[static_cast<size_t>(i * (extra + 1) + e)];
    bits[static_cast<size_t>(i)] = b;
    e -= b - 1;
  }
  return bits;
}

std::vector<uint8_t> allocate_bits_waterfill(const float* W, int64_t rows, int64_t cols,
                                             int64_t total_bits) {
  check_total(rows, total_bits, "allocate_bits_waterfill");
  std::vector<double> log4c(static_cast<size_t>(rows), 0.0);
  std::vector<bool> zero(static_cast<size_t>(rows), false);
  for (int64_t i = 0; i < rows; ++i) {
    double sumsq, amax;
    row_stats(W + i * cols, cols, sumsq, amax);
    zero[static_cast<size_t>(i)] = sumsq == 0.0;
    if (sumsq > 0.0)
      log4c[static_cast<size_t>(i)] = std::log(amax * amax * cols / sumsq) / std::log(4.0);
  }
  auto level = [&](int64_t i, double lambda) {
    if (zero[static_cast<size_t>(i)]) return double{kMinChannelBits};
    return std::clamp(log4c[static_cast<size_t>(i)] + lambda, double{kMinChannelBits},
                      double{kMaxChannelBits});
  };
  auto spent = [&](double lambda) {
    double s = 0.0;
    for (int64_t i = 0; i < rows; ++i) s += level(i, lambda);
    return s;
  };
  double lo = -64.0, hi = 64.0;  // spent(lo) = rows, spent(hi) = 8 rows (log4 c is in [0, ~20])
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (spent(mid) < static_cast<double>(total_bits) ? lo : hi) = mid;
  }
  std::vector<uint8_t> bits(static_cast<size_t>(rows));
  std::vector<std::pair<double, int64_t>> rem;
  int64_t used = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double x = level(i, hi);
    const double f = std::floor(x + 1e-12);
    bits[static_cast<size_t>(i)] = static_cast<uint8_t>(f);
    used += static_cast<int64_t>(f);
    if (f < kMaxChannelBits && !zero[static_cast<size_t>(i)]) rem.emplace_back(x - f, i);
  }
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; k < rem.size() && used < total_bits; ++k, ++used)
    ++bits[static_cast<size_t>(rem[k].second)];
  return bits;
}

std::string bit_allocation_name(BitAllocation a) {
  switch (a) {
    case BitAllocation::Greedy: return "greedy";
    case BitAllocation::Uniform: return "uniform";
    case BitAllocation::Int4Int8: return "int4-int8";
    case BitAllocation::Cmpq: return "cmpq";
  }
  return "?";
}

BitAllocation bit_allocation_from_name(const std::string& s) {
  for (auto a : {BitAllocation::Greedy, BitAllocation::Uniform, BitAllocation::Int4Int8,
                 BitAllocation::Cmpq})
    if (bit_allocation_name(a) == s) return a;
  throw InvalidArgument("[bitwidths] unknown allocation '" + s +
                        "' (known: greedy, uniform, int4-int8, cmpq)");
}

int bit_allocation_metadata_bits(BitAllocation a) {
  switch (a) {
    case BitAllocation::Greedy:
    case BitAllocation::Cmpq: return 3;
    case BitAllocation::Int4Int8: return 1;
    case BitAllocation::Uniform: return 0;
  }
  return 3;
}

std::vector<uint8_t> allocate_bits(BitAllocation method, std::span<const double> table,
                                   int64_t rows, double avg_bits) {
  check_table(table, rows, "allocate_bits");
  const int64_t total = total_channel_bits(rows, avg_bits);
  // Rows in decreasing order of a key (stable: ties keep the lower row first).
  auto ranked = [&](auto key) {
    std::vector<int64_t> order(static_cast<size_t>(rows));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return key(a) > key(b); });
    return order;
  };
  switch (method) {
    case BitAllocation::Greedy: return allocate_bits_greedy(table, rows, total);
    case BitAllocation::Uniform: {
      if (avg_bits != std::floor(avg_bits))
        throw InvalidArgument("[bitwidths] uniform allocation needs an integer average, got " +
                              std::to_string(avg_bits));
      return std::vector<uint8_t>(static_cast<size_t>(rows), static_cast<uint8_t>(avg_bits));
    }
    case BitAllocation::Int4Int8: {
      if (avg_bits < 4.0)
        throw InvalidArgument(
            "[bitwidths] the int4-int8 mix needs an average of at least 4 bits, "
            "got " +
            std::to_string(avg_bits));
      std::vector<uint8_t> bits(static_cast<size_t>(rows), 4);
      const int64_t n8 = (total - 4 * rows) / 4;
      const auto order = ranked([&](int64_t i) { return err(table, i, 4) - err(table, i, 8); });
      for (int64_t k = 0; k < n8; ++k) bits[static_cast<size_t>(order[static_cast<size_t>(k)])] = 8;
      return bits;
    }
    case BitAllocation::Cmpq: {
      const int lo = static_cast<int>(total / std::max<int64_t>(rows, 1));
      std::vector<uint8_t> bits(static_cast<size_t>(rows), static_cast<uint8_t>(lo));
      if (rows == 0) return bits;
      const auto order = ranked([&](int64_t i) { return err(table, i, lo); });
      const int64_t n_up = total - int64_t{lo} * rows;  // a fractional average
      if (n_up > 0) {
        for (int64_t k = 0; k < n_up; ++k)
          bits[static_cast<size_t>(order[static_cast<size_t>(k)])]++;
      } else if (lo > kMinChannelBits && lo < kMaxChannelBits) {
        const int64_t q = rows / 4;  // CMPQ's three levels around the average
        for (int64_t k = 0; k < q; ++k) {
          bits[static_cast<size_t>(order[static_cast<size_t>(k)])]++;
          bits[static_cast<size_t>(order[static_cast<size_t>(rows - 1 - k)])]--;
        }
      }
      return bits;
    }
  }
  return {};
}

double allocation_error(std::span<const double> table, std::span<const uint8_t> bits) {
  const int64_t rows = static_cast<int64_t>(bits.size());
  check_table(table, rows, "allocation_error");
  double s = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const int b = bits[static_cast<size_t>(i)];
    check_bits(b, "allocation_error");
    s += err(table, i, b);
  }
  return s;
}

}  // namespace socllm::quant
