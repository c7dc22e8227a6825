// EdgeFlow's per-channel bit-widths (bitwidth.h, seed 004 §4.1): the B-bit row quantizer on
// hand-computed cases, the relative-error metric against its definition, Algorithm 1 against
// exact dynamic programming, and the allocation baselines.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/core.h"
#include "quant/bitwidth.h"
#include "quant/quant.h"

namespace q = socllm::quant;

namespace {
// Rows with a heavy-tailed spread of ranges, as weight rows have.
std::vector<float> random_rows(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::student_t_distribution<float> t(2.0f);
  std::vector<float> W(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const float row_scale = std::exp(n(rng));
    for (int64_t j = 0; j < cols; ++j) W[i * cols + j] = row_scale * t(rng);
  }
  return W;
}
}  // namespace

TEST(Bitwidth, RowQuantizerHandComputed) {
  // 3 bits: qmax 3, scale 6 / 3 = 2; 2.9 / 2 = 1.45 -> 1, -3 / 2 = -1.5 -> -2 (half to even).
  std::vector<float> w{6.0f, 2.9f, -3.0f, 1.0f};
  std::vector<int8_t> qv(4);
  EXPECT_EQ(q::quantize_row_bits(w.data(), 4, 3, qv.data()), 2.0f);
  EXPECT_EQ(qv, (std::vector<int8_t>{3, 1, -2, 0}));  // 1 / 2 = 0.5 -> 0
  // 1 bit: signs, scale mean |w| = 12.9 / 4.
  EXPECT_FLOAT_EQ(q::quantize_row_bits(w.data(), 4, 1, qv.data()), 12.9f / 4.0f);
  EXPECT_EQ(qv, (std::vector<int8_t>{1, 1, -1, 1}));
  // 2 bits: ternary {-1, 0, 1} * max.
  EXPECT_EQ(q::quantize_row_bits(w.data(), 4, 2, qv.data()), 6.0f);
  EXPECT_EQ(qv, (std::vector<int8_t>{1, 0, -0, 0}));
  // 8 and 4 bits: the per-channel int8/int4 rule of quant.h.
  const auto W = random_rows(3, 40, 1);
  for (int bits : {4, 8}) {
    const auto ref = q::quantize_weights(W.data(), 3, 40, {bits, q::Granularity::PerChannel, 0});
    for (int64_t i = 0; i < 3; ++i) {
      std::vector<int8_t> row(40);
      EXPECT_EQ(q::quantize_row_bits(W.data() + i * 40, 40, bits, row.data()), ref.scales[i]);
      EXPECT_TRUE(std::equal(row.begin(), row.end(), ref.q.begin() + i * 40));
    }
  }
  std::vector<float> zero(5, 0.0f);
  std::vector<int8_t> qz(5, 7);
  EXPECT_EQ(q::quantize_row_bits(zero.data(), 5, 5, qz.data()), 0.0f);
  EXPECT_EQ(qz, std::vector<int8_t>(5, 0));
  EXPECT_THROW(q::quantize_row_bits(w.data(), 4, 0, qv.data()), socllm::InvalidArgument);
  EXPECT_THROW(q::quantize_row_bits(w.data(), 4, 9, qv.data()), socllm::InvalidArgument);
  w[2] = NAN;
  EXPECT_THROW(q::quantize_row_bits(w.data(), 4, 5, qv.data()), socllm::InvalidArgument);
}

TEST(Bitwidth, RelativeErrorMetric) {
  // Closed form: 2^-2B max^2 / E[w^2]; max 2, E[w^2] = (1 + 4 + 0.25 + 0) / 4.
  std::vector<float> w{1.0f, -2.0f, 0.5f, 0.0f};
  for (int b = 1; b <= 8; ++b)
    EXPECT_NEAR(q::relative_error_closed(w.data(), 4, b), std::pow(4.0, -b) * 4.0 / (5.25 / 4.0),
                1e-15);
  // Exact: the cosine distance to the dequantized row, computed here independently.
  const auto W = random_rows(4, 64, 2);
  for (int64_t i = 0; i < 4; ++i)
    for (int b = 1; b <= 8; ++b) {
      std::vector<int8_t> qv(64);
      const double s = q::quantize_row_bits(W.data() + i * 64, 64, b, qv.data());
      double dot = 0, aa = 0, bb = 0;
      for (int j = 0; j < 64; ++j) {
        const double a = W[i * 64 + j], d = qv[j] * s;
        dot += a * d, aa += a * a, bb += d * d;
      }
      EXPECT_NEAR(q::relative_error_exact(W.data() + i * 64, 64, b), 1 - dot / std::sqrt(aa * bb),
                  1e-12);
    }
  // More bits, less error (exact, on these rows), and the table lays rows out by 8 levels.
  const auto t = q::channel_error_table(W.data(), 4, 64, q::ErrorMetric::Exact);
  ASSERT_EQ(t.size(), 32u);
  for (int64_t i = 0; i < 4; ++i)
    for (int b = 2; b <= 8; ++b) EXPECT_LT(t[i * 8 + b - 1], t[i * 8 + b - 2]);
  EXPECT_EQ(q::relative_error_closed(std::vector<float>(3, 0.0f).data(), 3, 4), 0.0);
}

TEST(Bitwidth, GreedyIsOptimalOnTheClosedForm) {
  // Algorithm 1 against the exact DP optimum, many small tensors and every budget.
  for (uint32_t seed = 0; seed < 12; ++seed) {
    const int64_t rows = 3 + seed % 9, cols = 48;
    const auto W = random_rows(rows, cols, 100 + seed);
    const auto t = q::channel_error_table(W.data(), rows, cols, q::ErrorMetric::ClosedForm);
    for (int64_t total = rows; total <= 8 * rows; ++total) {
      const auto g = q::allocate_bits_greedy(t, rows, total);
      const auto d = q::allocate_bits_dp(t, rows, total);
      EXPECT_EQ(std::accumulate(g.begin(), g.end(), int64_t{0}), total);
      EXPECT_EQ(std::accumulate(d.begin(), d.end(), int64_t{0}), total);
      const double eg = q::allocation_error(t, g), ed = q::allocation_error(t, d);
      EXPECT_NEAR(eg, ed, 1e-12 * std::max(1.0, ed)) << "seed " << seed << " total " << total;
      // The continuous water-filling optimum, rounded, is never better than the integer optimum.
      const auto wf = q::allocate_bits_waterfill(W.data(), rows, cols, total);
      EXPECT_EQ(std::accumulate(wf.begin(), wf.end(), int64_t{0}), total);
      EXPECT_GE(q::allocation_error(t, wf), eg * (1 - 1e-12));
    }
  }
}

TEST(Bitwidth, GreedyCanMissOnANonConvexMetric) {
  // Channel 0 gains nothing from its 2nd bit and everything from its 3rd; channel 1 gains a
  // little per bit. Two extra bits: the heap gives both to channel 1 (0.3 + 0.2 = 0.5 less
  // error), the optimum both to channel 0 (1.0 less). The DP finds it; Algorithm 1 cannot.
  std::vector<double> t(16, 0.0);
  const double c0[8] = {1.0, 0.99, 0.0, 0, 0, 0, 0, 0},
               c1[8] = {1.0, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0};
  std::copy(c0, c0 + 8, t.begin());
  std::copy(c1, c1 + 8, t.begin() + 8);
  const auto g = q::allocate_bits_greedy(t, 2, 4), d = q::allocate_bits_dp(t, 2, 4);
  EXPECT_EQ(g, (std::vector<uint8_t>{1, 3}));
  EXPECT_EQ(d, (std::vector<uint8_t>{3, 1}));
  EXPECT_NEAR(q::allocation_error(t, d), 1.0, 1e-15);
  EXPECT_NEAR(q::allocation_error(t, g), 1.5, 1e-15);
}

TEST(Bitwidth, AllocationBaselinesAndBudgets) {
  const int64_t rows = 40, cols = 64;
  const auto W = random_rows(rows, cols, 7);
  const auto t = q::channel_error_table(W.data(), rows, cols, q::ErrorMetric::ClosedForm);
  auto sum = [](const std::vector<uint8_t>& b) {
    return std::accumulate(b.begin(), b.end(), int64_t{0});
  };
  EXPECT_EQ(q::total_channel_bits(5, 4.6), 23);
  EXPECT_EQ(q::allocate_bits(q::BitAllocation::Uniform, t, rows, 5.0),
            std::vector<uint8_t>(rows, 5));
  EXPECT_THROW(q::allocate_bits(q::BitAllocation::Uniform, t, rows, 5.5), socllm::InvalidArgument);
  // int4-int8: a quarter of the rows at 8 bits buys an average of 5; the ones gaining most.
  const auto mix = q::allocate_bits(q::BitAllocation::Int4Int8, t, rows, 5.0);
  EXPECT_EQ(sum(mix), 5 * rows);
  EXPECT_EQ(std::count(mix.begin(), mix.end(), 8), rows / 4);
  double min8 = 1e300, max4 = 0;
  for (int64_t i = 0; i < rows; ++i)
    (mix[i] == 8 ? min8 : max4) = mix[i] == 8 ? std::min(min8, t[i * 8 + 3] - t[i * 8 + 7])
                                              : std::max(max4, t[i * 8 + 3] - t[i * 8 + 7]);
  EXPECT_GE(min8, max4);
  EXPECT_THROW(q::allocate_bits(q::BitAllocation::Int4Int8, t, rows, 3.0), socllm::InvalidArgument);
  // cmpq: B - 1, B, B + 1 in quarters, the highest-error rows up.
  const auto cm = q::allocate_bits(q::BitAllocation::Cmpq, t, rows, 5.0);
  EXPECT_EQ(sum(cm), 5 * rows);
  EXPECT_EQ(std::count(cm.begin(), cm.end(), 6), 10);
  EXPECT_EQ(std::count(cm.begin(), cm.end(), 4), 10);
  const auto cf = q::allocate_bits(q::BitAllocation::Cmpq, t, rows, 5.25);
  EXPECT_EQ(sum(cf), 210);
  EXPECT_EQ(std::count(cf.begin(), cf.end(), 6), 10);
  // greedy at the same budget has less summed error than every baseline (it is optimal).
  const auto g = q::allocate_bits(q::BitAllocation::Greedy, t, rows, 5.0);
  EXPECT_EQ(sum(g), 5 * rows);
  for (const auto& other : {mix, cm, q::allocate_bits(q::BitAllocation::Uniform, t, rows, 5.0)})
    EXPECT_LE(q::allocation_error(t, g), q::allocation_error(t, other));
  for (double bad : {0.5, 8.5, std::nan("")})
    EXPECT_THROW(q::allocate_bits(q::BitAllocation::Greedy, t, rows, bad), socllm::InvalidArgument);
  EXPECT_THROW(q::allocate_bits_greedy(t, rows, rows - 1), socllm::InvalidArgument);
  EXPECT_THROW(q::allocate_bits_greedy(t, rows + 1, 5 * rows), socllm::ShapeError);
  EXPECT_THROW(q::bit_allocation_from_name("fancy"), socllm::InvalidArgument);
}

namespace {
// Calls f on every allocation of `rows` channels (8^rows of them).
template <class F>
void each_allocation(int64_t rows, F&& f) {
  std::vector<uint8_t> b(static_cast<size_t>(rows), 1);
  while (true) {
    f(b);
    int64_t k = 0;
    while (k < rows && b[static_cast<size_t>(k)] == 8) b[static_cast<size_t>(k++)] = 1;
    if (k == rows) return;
    ++b[static_cast<size_t>(k)];
  }
}
}  // namespace

TEST(Bitwidth, BudgetedWithCostBitsIsAlgorithm1) {
  // Cost = bits and the closed form's convex drops: the cost-budgeted heap is Algorithm 1.
  for (uint32_t seed = 0; seed < 6; ++seed) {
    const int64_t rows = 4 + seed, cols = 32;
    const auto W = random_rows(rows, cols, 300 + seed);
    const auto t = q::channel_error_table(W.data(), rows, cols, q::ErrorMetric::ClosedForm);
    std::vector<double> cost(t.size());
    for (size_t k = 0; k < cost.size(); ++k) cost[k] = static_cast<double>(k % 8 + 1);
    for (int64_t total = rows; total <= 8 * rows; ++total) {
      const auto b = q::allocate_bits_budgeted(t, cost, rows, static_cast<double>(total));
      EXPECT_EQ(b, q::allocate_bits_greedy(t, rows, total)) << "seed " << seed << " " << total;
      EXPECT_EQ(q::allocation_cost(cost, b), static_cast<double>(total));
    }
  }
}

TEST(Bitwidth, BudgetedSkipsBitWidthsOffTheHull) {
  // One channel; 2 bits costs almost as much as 3 (an extra weightlet), so the hull goes
  // 1 -> 3 (slope 0.8 / 2 = 0.4 beats 1 -> 2's 0.5 / 1.9 = 0.26) and 2 bits is never taken.
  std::vector<double> e = {1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0};
  std::vector<double> c = {1.0, 2.9, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0};
  EXPECT_EQ(q::allocate_bits_budgeted(e, c, 1, 2.95), (std::vector<uint8_t>{1}));
  EXPECT_EQ(q::allocate_bits_budgeted(e, c, 1, 3.0), (std::vector<uint8_t>{3}));
  EXPECT_EQ(q::allocate_bits_budgeted(e, c, 1, 5.0), (std::vector<uint8_t>{4}));
  // A bit-width cheaper and better than another is where a channel starts.
  std::vector<double> c2 = {2.0, 1.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};
  EXPECT_EQ(q::allocate_bits_budgeted(e, c2, 1, 1.5), (std::vector<uint8_t>{2}));
  EXPECT_THROW(q::allocate_bits_budgeted(e, c2, 1, 1.4), socllm::InvalidArgument);
  std::vector<double> bad = e;
  bad[3] = std::nan("");
  EXPECT_THROW(q::allocate_bits_budgeted(bad, c, 1, 5.0), socllm::InvalidArgument);
  EXPECT_THROW(q::allocate_bits_budgeted(e, c, 2, 5.0), socllm::ShapeError);
  EXPECT_THROW(q::allocate_bits_budgeted(e, c, 1, std::nan("")), socllm::InvalidArgument);
}

TEST(Bitwidth, BudgetedIsOptimalWhereItIsLagrangian) {
  // Costs like the cold-start model's: bytes plus an unpack cost per weightlet part (1, 2 and
  // 4 bits one part; 3, 5, 6 two; 7 three; 8 one). Whenever the heap's result minimises
  // e + λ·c channel by channel for some λ (no channel was retired), it is the exact minimum
  // error among all allocations costing no more (Everett's theorem); brute force checks that.
  const int parts[8] = {1, 1, 2, 1, 2, 2, 3, 1};
  int checked = 0;
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const int64_t rows = 3, cols = 24;
    const auto W = random_rows(rows, cols, 500 + seed);
    const auto t = q::channel_error_table(W.data(), rows, cols, q::ErrorMetric::ClosedForm);
    std::vector<double> cost(t.size());
    for (size_t k = 0; k < cost.size(); ++k)
      cost[k] = static_cast<double>(k % 8 + 1) + 0.7 * parts[k % 8];
    for (double budget = 5.2; budget <= 3 * 13.0; budget += 0.37) {
      const auto b = q::allocate_bits_budgeted(t, cost, rows, budget);
      const double spent = q::allocation_cost(cost, b), eb = q::allocation_error(t, b);
      ASSERT_LE(spent, budget + 1e-12);
      double best = 1e300;
      each_allocation(rows, [&](const std::vector<uint8_t>& a) {
        if (q::allocation_cost(cost, a) <= spent + 1e-12)
          best = std::min(best, q::allocation_error(t, a));
      });
      ASSERT_GE(eb, best * (1 - 1e-12));  // nothing beats the brute-force optimum
      bool lagrangian = false;
      for (double lg = -12; lg <= 6 && !lagrangian; lg += 0.01) {
        const double lambda = std::pow(10.0, lg);
        bool all = true;
        for (int64_t i = 0; i < rows && all; ++i)
          for (int bb = 1; bb <= 8; ++bb)
            if (t[i * 8 + bb - 1] + lambda * cost[i * 8 + bb - 1] <
                t[i * 8 + b[i] - 1] + lambda * cost[i * 8 + b[i] - 1] - 1e-15)
              all = false;
        lagrangian = all;
      }
      if (!lagrangian) continue;
      ++checked;
      EXPECT_NEAR(eb, best, 1e-12 * best) << "seed " << seed << " budget " << budget;
    }
  }
  EXPECT_GT(checked, 40);
}
