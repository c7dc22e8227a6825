// Quant layer: EdgeFlow's NPU-aware adaptive quantization of weights (seed 004 §4.1): every
// output channel (row) of a weight tensor is quantized symmetrically at its own bit-width in
// 1..8, the relative-error metric ranks what a bit is worth to each channel, and an allocation
// spends an average bit budget over the channels (Algorithm 1 and the baselines of §5.4.1).
//
// The B-bit row quantizer (the same rule as quant.h for 2..8 bits, so 8 and 4 bits equal the
// per-channel int8/int4 weights of the other plans):
//   B >= 2: scale = max|w| / (2^(B-1) - 1), q = round_half_even(w / scale) in +-(2^(B-1) - 1);
//   B  = 1: q = sign(w) (+1 for w >= 0), scale = mean|w|. A symmetric 1-bit grid has no nonzero
//           level, so one bit means a binary channel; mean|w| is the scale minimising the squared
//           error of sign(w) * scale (XNOR-Net's α). Our choice: the paper allows 1 bit without
//           saying what it represents.
// An all-zero row has scale 0 and q = 0 (B = 1: q = +1).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace socllm::quant {

constexpr int kMinChannelBits = 1;
constexpr int kMaxChannelBits = 8;
constexpr int kChannelBitLevels = kMaxChannelBits - kMinChannelBits + 1;

// q[n] of one row at `bits`; returns its scale. InvalidArgument for bits outside 1..8 or a
// non-finite weight (naming its index).
float quantize_row_bits(const float* w, int64_t n, int bits, int8_t* q);

// RE(W_i, B) of §4.1. Closed form: 2^-2B · max|W_i|^2 / E[W_i^2] (uniform rounding errors,
// Appendix A); exact: the cosine distance 1 - W_i·Ŵ_i / (|W_i| |Ŵ_i|) after B-bit quantization.
// Both 0 for an all-zero row.
double relative_error_closed(const float* w, int64_t n, int bits);
double relative_error_exact(const float* w, int64_t n, int bits);

enum class ErrorMetric { ClosedForm, Exact };
std::string error_metric_name(ErrorMetric m);  // "closed-form" | "exact"
ErrorMetric error_metric_from_name(const std::string& s);

// RE of every row of W[rows, cols] at every bit-width: table[i * 8 + (B - 1)].
std::vector<double> channel_error_table(const float* W, int64_t rows, int64_t cols,
                                        ErrorMetric metric);

// The bits an average budget buys: floor(rows * avg_bits), Algorithm 1's `remain` counted in
// whole bits. InvalidArgument for avg_bits outside [1, 8] or not finite.
int64_t total_channel_bits(int64_t rows, double avg_bits);

// Algorithm 1 (greedy max-heap): every channel starts at 1 bit; one bit at a time goes to the
// channel whose error drops most (RE(B) - RE(B + 1)), ties to the lower channel index, until
// total_bits are spent. Optimal for the sum of errors whenever each channel's drops shrink as
// B grows (the closed form's shrink 4x per bit); the exact metric can break that.
// InvalidArgument if total_bits is outside [rows, 8 * rows] or the table is not [rows, 8].
std::vector<uint8_t> allocate_bits_greedy(std::span<const double> table, int64_t rows,
                                          int64_t total_bits);
// The exact minimum of the summed error over integer bit-widths summing to total_bits, by
// dynamic programming over channels and bits spent (O(rows * total_bits * 8) time): the
// reference Algorithm 1 is tested against.
std::vector<uint8_t> allocate_bits_dp(std::span<const double> table, int64_t rows,
                                      int64_t total_bits);
// The continuous optimum the closed form implies (water-filling): minimising
// sum c_i 4^-B_i with c_i = max|W_i|^2 / E[W_i^2] under sum B_i = total_bits, 1 <= B_i <= 8,
// gives B_i = clamp(log4 c_i + λ, 1, 8) with λ found by bisection; rounded to integers by
// largest remainder so the total is kept. Rows with c_i = 0 stay at 1 bit.
std::vector<uint8_t> allocate_bits_waterfill(const float* W, int64_t rows, int64_t cols,
                                             int64_t total_bits);

// A cost budget instead of a bit budget, over any set of channels (beyond the paper, issue 14
// item 6: one heap over every output channel of a model, the cost being modelled cold-start
// time). error and cost are [rows, 8] (column B - 1); the allocation minimises the summed error
// with the summed cost at most `budget`. Costs need not grow by the same step per bit (unpacking
// 3 bits takes two weightlets, 4 bits one), so every channel walks the lower convex hull of its
// (cost, error) points, dominated bit-widths skipped, and one max-heap over all channels takes
// the hull step with the largest error drop per unit cost that still fits; a step that does not
// fit retires its channel (Lagrangian bit allocation, Shoham & Gersho 1988: optimal for the
// budget it spends when no channel is retired; with cost = bits and convex errors it is
// Algorithm 1). Every channel starts at its cheapest bit-width. InvalidArgument if the budget
// cannot pay for that, or a cost or error is not finite; ShapeError for mismatched tables.
std::vector<uint8_t> allocate_bits_budgeted(std::span<const double> error,
                                            std::span<const double> cost, int64_t rows,
                                            double budget);
// Summed cost of an allocation (cost table as above).
double allocation_cost(std::span<const double> cost, std::span<const uint8_t> bits);

// How bits are spread over the channels of one tensor (plan option `allocation`).
enum class BitAllocation {
  Greedy,    // Algorithm 1 on the chosen metric (EdgeFlow)
  Uniform,   // every channel at the same bits (the average must be an integer)
  Int4Int8,  // channels at 4 or 8 bits (the INT4/INT8 mix of §3.2): the channels gaining most
             // from 8 bits (RE(4) - RE(8)) get them while the budget lasts
  Cmpq,      // CMPQ moved to output channels with the same metric (§5.4.1): rank by RE at the
             // average; the top quarter gets B + 1, the bottom quarter B - 1 (CMPQ's 2/3/4 bits
             // around an average of 3, seed 004 §3.2); a fractional average uses its two
             // neighbouring integers, the ones ranked highest taking the upper
};
std::string bit_allocation_name(BitAllocation a);  // greedy|uniform|int4-int8|cmpq
BitAllocation bit_allocation_from_name(const std::string& s);
// Bit-width metadata each channel carries in storage under an allocation: 3 bits (1..8),
// 1 bit (4 or 8), 0 (uniform).
int bit_allocation_metadata_bits(BitAllocation a);

// Bit-widths of the rows of one tensor under `method` at an average of avg_bits (errors from
// `table`, [rows, 8]). InvalidArgument if the method cannot meet the average (a fractional
// uniform average; int4-int8 below 4).
std::vector<uint8_t> allocate_bits(BitAllocation method, std::span<const double> table,
                                   int64_t rows, double avg_bits);

// Summed error of an allocation.
double allocation_error(std::span<const double> table, std::span<const uint8_t> bits);

}  // namespace socllm::quant
