// Quant layer: llm.npu's shadow outlier execution (seed 001 §3.3, Eq. 1).
//
//   x·W ≈ s·Q(clip(x, ±t)/s)·W_q   (NPU: static per-tensor scale s = t/127, INT8 GEMM)
//        + Ext(x − clip(x, ±t))·W   (CPU: the values beyond the threshold t, gathered into a
//                                    compact dense tensor of only the channels that have one)
//
// The threshold t of each linear input is fixed offline from calibration statistics. Offline
// profiling also decides which float weights stay resident ("hot channels": the smallest
// channel set covering a share of the outlier occurrences, Fig. 11) and on which linears the
// CPU part is pruned altogether (the least important ones by largest outlier / scale, Fig. 12);
// both are pure functions here so that calibration, the engine and the tests share them.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace socllm::quant {

struct RowSegment;

// Options of the shadow-outlier scheme (plan "shadow-outlier").
struct ShadowOptions {
  double pruning_rate = 0.85;  // share of linear inputs whose CPU part is pruned (seed 001 §3.3)
  double hot_share = 0.8;      // share of outlier occurrences the resident channels cover
};

// What offline profiling fixed for one linear input (built into its static graph).
struct ShadowLinearConfig {
  float threshold = 0.0f;             // t: the NPU's scale is t / 127
  std::vector<int64_t> hot_channels;  // input channels whose float weights stay resident
  bool pruned = false;                // the CPU part is skipped: outliers are clipped to ±t
};

// Hot channels: the channels with the most outlier occurrences, in descending count (ties by
// index), until they cover at least `share` of all occurrences; none if there were none.
std::vector<int64_t> select_hot_channels(std::span<const int64_t> outlier_counts, double share);

// Outlier importance of a linear input (seed 001 Fig. 12): largest |x| over its quantization
// scale t/127. Values <= 127 mean nothing exceeded the threshold.
double outlier_importance(double max_abs, double threshold);

// pruned[i] for each linear input: the round(rate * n) least important ones (ties by index).
std::vector<bool> select_pruned(std::span<const double> importance, double rate);

// The values of x beyond ±t in one row segment, as a compact dense tensor.
struct OutlierResidual {
  int64_t row_begin = 0, rows = 0;
  std::vector<int64_t> cols;  // channels with at least one outlier in the segment, ascending
  std::vector<float> values;  // [rows, cols.size()]: x − clip(x, ±t)
};

// ShadowOutlierSplit: clips x[N, in] to ±t in place (the NPU's operand) and returns, per
// segment, the residual beyond the threshold (the CPU's operand). Rows outside every segment
// (padding) are clipped but contribute no residual.
std::vector<OutlierResidual> shadow_outlier_split(float* x, int64_t N, int64_t in, float t,
                                                  std::span<const RowSegment> segments);

// Run-time counters of one shadow linear, for accuracy/latency trade-offs and the timeline.
struct ShadowStats {
  int64_t segments = 0;          // row segments (sequences or chunks) processed
  int64_t syncs = 0;             // segments whose CPU part ran (a CPU-NPU synchronization)
  int64_t outlier_values = 0;    // elements beyond the threshold
  int64_t outlier_channels = 0;  // sum over segments of channels gathered
  int64_t hot_hits = 0;          // of those, channels whose weights were resident
  int64_t cold_fetches = 0;      // channels whose weights were fetched on demand
  int64_t cold_fetch_bytes = 0;  // bytes of those fetches (fp32 weight column)
  int64_t pruned_values = 0;     // outlier values clipped away on a pruned linear
  ShadowStats& operator+=(const ShadowStats& o);
};

// Thread-safe accumulation (linears run from several engine calls at once).
class ShadowCounters {
 public:
  void add(const ShadowStats& s);
  ShadowStats snapshot() const;
  void reset();

 private:
  mutable std::mutex mu_;
  ShadowStats total_;
};

}  // namespace socllm::quant
