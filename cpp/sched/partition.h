// Scheduling layer: HeteroLLM's tensor partitions of a linear between the NPU and a partner
// processor (the GPU in seed 002; the CPU for INT8 linears, which no GPU path runs) and the
// partition solver (seed 002 §4.1, §4.3). Shapes only: which rows and output columns each
// processor computes; a plan names the partition (plan.h), the engine computes its parts and the
// block's graph times them (one task per part).
//
// A linear [rows, k] x [k, cols] is cut into parts. NPU parts run one after another on the NPU,
// each on a static graph of `graph_rows` rows (its rows padded); partner parts run at their real
// size (dynamic shapes). The cut kinds of §4.1.1 are the shapes this takes:
//   gpu-all / npu-all   one processor computes everything (the NPU on padded graphs)
//   row                 the NPU computes all rows of the first npu_cols output columns (aligned
//                       to 256, §4.3), the partner the remaining columns (prefill and decode)
//   seq                 the NPU computes the first rows of one static shape, the partner the margin
//   multi-seq           several static shapes one after another on the NPU, the margin on the
//                       partner
//   hybrid              seq or multi-seq on the NPU's rows, and the partner also takes output
//                       columns of those rows (row cutting within them)
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "soc/soc.h"

namespace socllm::sched {

struct MatmulPart {
  soc::Processor processor = soc::Processor::Gpu;
  int64_t row_begin = 0, row_end = 0;  // sequence rows [row_begin, row_end)
  int64_t col_begin = 0, col_end = 0;  // output columns (weight rows) [col_begin, col_end)
  // Rows the processor computes: an NPU static graph's length (>= the part's rows, padded);
  // the part's rows on the GPU.
  int64_t graph_rows = 0;
  int64_t rows() const { return row_end - row_begin; }
  int64_t cols() const { return col_end - col_begin; }
};

enum class CutKind : int { GpuAll = 0, NpuAll, Row, Seq, MultiSeq, Hybrid };
const char* cut_kind_name(CutKind k);

struct MatmulPartition {
  int64_t rows = 0, cols = 0;
  std::vector<MatmulPart> parts;
  CutKind kind() const;
  double npu_share() const;  // share of the output elements computed on the NPU
  nlohmann::json to_json() const;
  static MatmulPartition from_json(const nlohmann::json& j);
};

// What the NPU accepts (seed 002 §4.3: "row partitions aligned to 256 and sequence length
// partitions to 32"; §5.2.2: static graphs of powers of two from 32 to 1024).
struct PartitionRules {
  int64_t npu_col_align = 256;
  int64_t npu_row_align = 32;
  // Rows of the pre-built static graphs; empty: any multiple of npu_row_align (graphs prepared
  // online for the exact shape, "Online-prepare").
  std::vector<int64_t> npu_graph_rows = {32, 64, 128, 256, 512, 1024};
  // The processor the NPU shares a linear with (GPU or CPU): what non-NPU parts run on.
  soc::Processor partner = soc::Processor::Gpu;
  // From the profile (/processors/npu/tile/n, tile/m, static_graph_seq_lengths).
  static PartitionRules from_profile(const soc::DeviceProfile& p);
  // Decode: one pre-built graph of the decoding shape (seed 002 §4.1.2).
  PartitionRules for_rows(int64_t decode_rows) const;
  // No NPU constraints (any alignment and graph length): checks a partition's structure only.
  static PartitionRules structural() { return {1, 1, {}, soc::Processor::Gpu}; }
};

// InvalidArgument naming the part and the value: parts outside the tensor, empty, overlapping or
// not covering it; an NPU part whose columns are not aligned (except at the tensor's end), whose
// graph is shorter than its rows, or whose graph is not a pre-built shape (or not aligned when
// graphs are prepared online); a partner part computing padding, on another processor than the
// rules' partner (structural rules accept the GPU or the CPU, one of them), or on io/cpu-aux.
void validate(const MatmulPartition& p, const PartitionRules& rules);

// The cuts, all with NPU rows from row 0: the NPU runs graphs of `npu_graphs` rows one after
// another over rows [0, covered) (the last padded when the graphs exceed the rows) and columns
// [0, npu_cols); the rules' partner everything else. Validated against `rules`.
MatmulPartition make_partition(int64_t rows, int64_t cols, const std::vector<int64_t>& npu_graphs,
                               int64_t npu_cols, const PartitionRules& rules);
MatmulPartition gpu_all(int64_t rows, int64_t cols);
// The whole linear on the partner processor (no NPU part).
MatmulPartition partner_all(int64_t rows, int64_t cols, soc::Processor partner);
MatmulPartition row_cut(int64_t rows, int64_t cols, int64_t npu_cols, const PartitionRules& rules);
// A row cut giving the NPU `npu_share` of the output columns, rounded to the column alignment
// (0: partner-all, 1: npu-all on padded graphs); InvalidArgument naming a share outside [0, 1].
MatmulPartition row_cut_share(int64_t rows, int64_t cols, double npu_share,
                              const PartitionRules& rules);
// Static graphs covering `rows`: "padding" the smallest one holding them (beyond the largest:
// as many largest as needed, the rest padded); "pipe" the multi-sequence-length cover: rows
// rounded up to the row alignment and split into the static shapes largest first (§5.2.2).
std::vector<int64_t> padded_graphs(int64_t rows, const PartitionRules& rules);
std::vector<int64_t> pipe_graphs(int64_t rows, const PartitionRules& rules);

// The op one part computes: the linear's op with m = graph_rows, n = the part's columns, weight
// bytes for those columns and activation bytes for its rows.
soc::OpDesc part_op(const soc::OpDesc& linear, const MatmulPart& part);

// Times the solver uses: the profiler's real-execution mode (a cost model) or its prediction
// mode (any time function, e.g. a trained regressor).
struct PartitionCosts {
  std::function<double(const soc::OpDesc&, soc::Processor)> time_us;  // alone
  std::function<double(soc::Processor, soc::Processor)> sync_us;
  // Bandwidth the partner and the NPU reach together (GB/s; 0: no contention): parallel parts
  // share it max-min fair by their DRAM bytes per µs, as the simulator does.
  double shared_gbps = 0;
  // Where the linear's neighbours run: the NPU's sync partner when every part is on the NPU.
  soc::Processor partner = soc::Processor::Gpu;
  // The cost model's times; `cost` must outlive the result.
  static PartitionCosts of(const soc::CostModel& cost,
                           soc::Processor partner = soc::Processor::Gpu);
};

struct PartitionTime {
  double total_us = 0;            // T_total of §4.3
  double gpu_us = 0, npu_us = 0;  // each side alone (gpu_us: the partner's, GPU or CPU)
  double overlap_us = 0;          // the parallel part with contention
  double sync_us = 0;             // T_sync + T_copy: into and out of the NPU
};

// T_total of one partition of `linear` whose neighbours run on the partner: max(T_partner,
// T_NPU) under contention when both compute, T_NPU alone plus the synchronization into and out
// of the NPU (T_sync + T_copy; the profile's GPU-NPU sync includes the buffer copy), T_partner
// alone without. The partner is the processor of the non-NPU parts (costs.partner when none).
PartitionTime partition_time(const soc::OpDesc& linear, const MatmulPartition& p,
                             const PartitionCosts& costs);

// Which partitions a solver considers.
enum class PartitionSpace : int {
  GpuOnly = 0,  // gpu-all
  NpuPadding,   // npu-all on the smallest static graph holding the rows
  NpuPipe,      // npu-all on the pipe cover
  NpuOnline,    // npu-all on a graph of the exact (aligned) rows, prepared online
  Layer,        // the better of gpu-all and npu-all (pipe): Hetero-layer
  Tensor,       // every cut on the aligned grid: Hetero-tensor
  Row,          // row cuts only: the NPU all rows (pipe or padded cover), some output columns
  Seq,          // sequence cuts only: the NPU all columns of a prefix of the rows
  Hybrid        // hybrid cuts only: the NPU some columns of a prefix of the rows
};
const char* partition_space_name(PartitionSpace s);
PartitionSpace partition_space_from_name(const std::string& s);

struct PartitionChoice {
  MatmulPartition partition;
  PartitionTime time;
  int64_t candidates = 0;  // partitions evaluated
};

// The solver (§4.3): the partition of the space minimizing T_total. Tensor enumerates the NPU's
// row cover (none, the pipe cover of every aligned row count up to the rows, the padded cover)
// times its output columns (every multiple of npu_col_align, and all); Row, Seq and Hybrid the
// cuts of that kind among them (when a shape has none, e.g. seq on one decoding row, the linear
// runs whole on the NPU's padded cover). col_step > 0 replaces the column alignment (an
// exhaustive search on a finer grid, for the solver's regret).
PartitionChoice solve_partition(const soc::OpDesc& linear, const PartitionRules& rules,
                                const PartitionCosts& costs, PartitionSpace space,
                                int64_t col_step = 0);

}  // namespace socllm::sched
