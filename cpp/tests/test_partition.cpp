// HeteroLLM's partitions and solver (partition.h) on hand-computed cases, and the contention of
// parallel parts against the simulator's.
#include <gtest/gtest.h>

#include "expect_error.h"
#include "sched/partition.h"
#include "sched/simulator.h"

using namespace socllm;
using sched::CutKind;
using sched::PartitionRules;
using soc::Processor;

namespace {

soc::OpDesc linear(int64_t m, int64_t k, int64_t n) {
  soc::OpDesc o;
  o.kind = soc::OpKind::MatMul;
  o.dtype = soc::DType::Fp16;
  o.op_class = "linear";
  o.m = m;
  o.k = k;
  o.n = n;
  o.weight_bytes = k * n / 2;
  o.activation_bytes = 2 * m * (k + n);
  return o;
}

// Times proportional to output elements: the GPU at 1 per µs, the NPU 3x faster on whole 32-row
// graphs; a fixed sync both ways.
sched::PartitionCosts proportional(double sync_each_way) {
  sched::PartitionCosts c;
  c.time_us = [](const soc::OpDesc& o, Processor p) {
    const double elems = static_cast<double>(o.m * o.n) / 1024.0;
    return p == Processor::Npu ? elems / 3.0 : elems;
  };
  c.sync_us = [sync_each_way](Processor, Processor) { return sync_each_way; };
  return c;
}

}  // namespace

TEST(Partition, CutKindsCoverTheTensor) {
  const PartitionRules r;
  EXPECT_EQ(sched::pipe_graphs(525, r), (std::vector<int64_t>{512, 32}));  // seed 002 §5.2.2
  EXPECT_EQ(sched::padded_graphs(525, r), (std::vector<int64_t>{1024}));
  EXPECT_EQ(sched::pipe_graphs(600, r), (std::vector<int64_t>{512, 64, 32}));
  EXPECT_EQ(sched::padded_graphs(2000, r), (std::vector<int64_t>{1024, 1024}));
  EXPECT_EQ(sched::make_partition(300, 4096, {256}, 4096, r).kind(), CutKind::Seq);  // §4.1.1
  const auto multi = sched::make_partition(600, 4096, {512, 32}, 4096, r);  // 512 + 32 + 56 GPU
  EXPECT_EQ(multi.kind(), CutKind::MultiSeq);
  ASSERT_EQ(multi.parts.size(), 3u);
  EXPECT_EQ(multi.parts[2].processor, Processor::Gpu);
  EXPECT_EQ(multi.parts[2].rows(), 56);
  const auto row = sched::row_cut(256, 4096, 3072, r);
  EXPECT_EQ(row.kind(), CutKind::Row);
  EXPECT_DOUBLE_EQ(row.npu_share(), 0.75);
  const auto hybrid = sched::make_partition(300, 4096, {256}, 2048, r);
  EXPECT_EQ(hybrid.kind(), CutKind::Hybrid);
  EXPECT_DOUBLE_EQ(hybrid.npu_share(), 256.0 * 2048 / (300.0 * 4096));
  const auto padded = sched::make_partition(300, 4096, {512}, 4096, r);
  EXPECT_EQ(padded.kind(), CutKind::NpuAll);
  EXPECT_EQ(padded.parts[0].graph_rows, 512);
  EXPECT_EQ(sched::gpu_all(300, 4096).kind(), CutKind::GpuAll);
  // a part's op: its graph rows, its columns, its share of the weights
  const auto op = sched::part_op(linear(300, 1024, 4096), hybrid.parts[0]);
  EXPECT_EQ(op.m, 256);
  EXPECT_EQ(op.n, 2048);
  EXPECT_EQ(op.weight_bytes, 1024 * 4096 / 4);
  EXPECT_EQ(op.activation_bytes, 2 * 256 * (1024 + 2048));
}

TEST(Partition, ProfileTilesAndGraphShapesMustBeWholeCounts) {
  auto profile = [](double tile_n, nlohmann::json rows) {
    auto n = [](double v) { return nlohmann::json{{"value", v}, {"source", "test"}}; };
    nlohmann::json npu = {{"tile", {{"m", n(32)}, {"n", n(tile_n)}}},
                          {"static_graph_seq_lengths", {{"value", rows}}}};
    return soc::DeviceProfile::from_json({{"name", "t"}, {"processors", {{"npu", npu}}}}, "t");
  };
  EXPECT_EQ(PartitionRules::from_profile(profile(256, {64, 32})).npu_graph_rows,
            (std::vector<int64_t>{32, 64}));
  // a tile of 0 would never advance the tile loops; a fraction would silently truncate
  expect_error<InvalidArgument>([&] { PartitionRules::from_profile(profile(0, {32})); },
                                "/processors/npu/tile/n = 0");
  expect_error<InvalidArgument>([&] { PartitionRules::from_profile(profile(25.6, {32})); },
                                "whole count");
  expect_error<InvalidArgument>([&] { PartitionRules::from_profile(profile(256, {32, 0})); },
                                "static_graph_seq_lengths = [32,0]");
  expect_error<InvalidArgument>(
      [&] { PartitionRules::from_profile(profile(256, nlohmann::json::array())); }, "non-empty");
}

TEST(Partition, BadPartitionsAreTypedErrorsNamingTheValue) {
  const PartitionRules r;
  auto base = sched::make_partition(256, 1024, {256}, 512, r);
  auto bad = base;
  bad.parts[1].col_begin = 256;  // overlaps the NPU's columns
  expect_error<InvalidArgument>([&] { sched::validate(bad, r); }, "overlaps");
  bad = base;
  bad.parts[1].col_end = 1000;  // leaves columns out
  expect_error<InvalidArgument>([&] { sched::validate(bad, r); }, "cover");
  expect_error<InvalidArgument>([&] { (void)sched::make_partition(256, 1024, {256}, 300, r); },
                                "aligned to 256");
  expect_error<InvalidArgument>([&] { (void)sched::make_partition(256, 1024, {48}, 1024, r); },
                                "48 rows is not a pre-built NPU graph shape");
  expect_error<InvalidArgument>([&] { (void)sched::make_partition(256, 1024, {256}, 2048, r); },
                                "2048");
  expect_error<InvalidArgument>([&] { (void)sched::make_partition(64, 1024, {64, 32}, 1024, r); },
                                "starts beyond");
  bad = base;
  bad.parts[1].graph_rows = 512;  // a GPU part computing padding
  expect_error<InvalidArgument>([&] { sched::validate(bad, r); }, "dynamic shapes");
  bad = base;
  bad.parts[0].processor = Processor::Cpu;  // the rules' partner is the GPU
  expect_error<InvalidArgument>([&] { sched::validate(bad, r); }, "here the gpu");
  bad.parts[0].processor = Processor::Io;
  expect_error<InvalidArgument>([&] { sched::validate(bad, r); }, "one partner (gpu or cpu)");
  // with the CPU as partner (INT8 linears), the same cut runs its non-NPU part on the CPU
  sched::PartitionRules cpu = r;
  cpu.partner = Processor::Cpu;
  const auto on_cpu = sched::row_cut(256, 1024, 512, cpu);
  ASSERT_EQ(on_cpu.parts.size(), 2u);
  EXPECT_EQ(on_cpu.parts[1].processor, Processor::Cpu);
  EXPECT_EQ(on_cpu.kind(), sched::CutKind::Row);
  expect_error<InvalidArgument>([&] { (void)sched::MatmulPartition::from_json({{"rows", 4}}); },
                                "partition");
  expect_error<InvalidArgument>([&] { (void)sched::row_cut_share(256, 1024, 1.5, r); }, "1.5");
  expect_error<InvalidArgument>([&] { (void)sched::row_cut_share(256, 1024, -0.1, r); }, "-0.1");
  EXPECT_EQ(sched::row_cut_share(256, 1024, 0.7, r).parts[0].col_end, 768);  // 716.8 -> 768
  EXPECT_EQ(sched::row_cut_share(256, 1024, 0.0, r).kind(), CutKind::GpuAll);
  EXPECT_EQ(sched::row_cut_share(256, 1024, 1.0, r).kind(), CutKind::NpuAll);
  expect_error<InvalidArgument>([&] { (void)sched::partition_space_from_name("tensr"); }, "tensr");
}

TEST(Partition, SolverBalancesRowCutsAndFollowsEquation) {
  const PartitionRules r;
  const auto op = linear(256, 1024, 1024);
  // The NPU 3x faster: the GPU takes a quarter of the output (a row cut of 768 NPU columns, or
  // equally a 64-row margin), balancing 64 µs on each; + 2 x 5 µs sync.
  auto c = sched::solve_partition(op, r, proportional(5), sched::PartitionSpace::Tensor);
  EXPECT_DOUBLE_EQ(c.partition.npu_share(), 0.75);
  EXPECT_DOUBLE_EQ(c.time.total_us, 64 + 10);
  EXPECT_DOUBLE_EQ(c.time.gpu_us, 64);
  const auto row = sched::row_cut(256, 1024, 768, r);
  EXPECT_DOUBLE_EQ(sched::partition_time(op, row, proportional(5)).total_us, 74);
  // A GPU 100x slower than that helps nowhere: the NPU alone, with the sync into and out of it.
  auto slow_gpu = proportional(5);
  slow_gpu.time_us = [](const soc::OpDesc& o, Processor p) {
    const double elems = static_cast<double>(o.m * o.n) / 1024.0;
    return p == Processor::Npu ? elems / 3.0 : 100 * elems;
  };
  c = sched::solve_partition(op, r, slow_gpu, sched::PartitionSpace::Tensor);
  EXPECT_EQ(c.partition.kind(), CutKind::NpuAll);
  EXPECT_DOUBLE_EQ(c.time.total_us, 256.0 / 3 + 10);
  // Sync dearer than the NPU saves: the GPU alone, no sync (T_GPU(all) in the equation).
  c = sched::solve_partition(op, r, proportional(200), sched::PartitionSpace::Tensor);
  EXPECT_EQ(c.partition.kind(), CutKind::GpuAll);
  EXPECT_DOUBLE_EQ(c.time.total_us, 256);
  // Every space's optimum is no better than the tensor space's, which contains it.
  const auto costs = proportional(5);
  const double tensor =
      sched::solve_partition(op, r, costs, sched::PartitionSpace::Tensor).time.total_us;
  for (auto s : {sched::PartitionSpace::GpuOnly, sched::PartitionSpace::NpuPadding,
                 sched::PartitionSpace::NpuPipe, sched::PartitionSpace::Layer})
    EXPECT_GE(sched::solve_partition(op, r, costs, s).time.total_us, tensor);
  // A misaligned length: 300 rows = 256 on the NPU + a 44-row margin on the GPU (§4.1.1) beats
  // padding to 512 when the margin's GPU time hides under the NPU's.
  const auto op300 = linear(300, 1024, 1024);
  c = sched::solve_partition(op300, r, proportional(5), sched::PartitionSpace::Tensor);
  EXPECT_LT(c.time.total_us,
            sched::solve_partition(op300, r, proportional(5), sched::PartitionSpace::NpuPadding)
                .time.total_us);
}

TEST(Partition, AllNpuPartitionsSyncWithTheCostsPartner) {
  // GPU-NPU sync 100 µs each way, CPU-NPU 10: with no partner part in the partition, the sync
  // is the one with the processor the neighbours run on (an INT8 plan's CPU), not the GPU.
  auto costs = proportional(0);
  costs.sync_us = [](Processor a, Processor b) {
    return a == Processor::Gpu || b == Processor::Gpu ? 100.0 : 10.0;
  };
  const PartitionRules r;
  const auto op = linear(256, 1024, 1024);
  const auto all_npu = sched::make_partition(256, 1024, {256}, 1024, r);
  ASSERT_EQ(all_npu.kind(), CutKind::NpuAll);
  EXPECT_DOUBLE_EQ(sched::partition_time(op, all_npu, costs).sync_us, 200);
  costs.partner = Processor::Cpu;
  EXPECT_DOUBLE_EQ(sched::partition_time(op, all_npu, costs).sync_us, 20);
  EXPECT_DOUBLE_EQ(sched::partition_time(op, all_npu, costs).total_us, 256.0 / 3 + 20);
}
TEST(Partition, ParallelPartsShareBandwidthAsTheSimulatorDoes) {
  // Memory-bound parts on a profile whose processors reach 40 GB/s alone and 60 together.
  auto n = [](double v) { return nlohmann::json{{"value", v}, {"unit", "-"}, {"source", "test"}}; };
  nlohmann::json cm;
  for (const char* p : {"npu", "gpu"}) {
    cm[p] = {{"fp16_overhead_us", n(0)},
             {"fp16_compute_gops", n(1e9)},
             {"fp16_weight_gbps", n(40)},
             {"fp16_weights_as_stored", n(1)}};
    cm["memory"][std::string(p) + "_gbps"] = n(40);
  }
  cm["npu"]["tile_m"] = n(1);
  cm["npu"]["tile_n"] = n(1);
  cm["npu"]["tile_k"] = n(1);
  cm["memory"]["two_processors_gbps"] = n(60);
  cm["memory"]["peak_gbps"] = n(68);
  cm["sync"] = {{"gpu_npu_us", n(0)}, {"gpu_resubmit_us", n(0)}};
  cm["power"] = {{"npu_w", n(1)}, {"gpu_w", n(1)}};
  const soc::CostModel cost(
      soc::DeviceProfile::from_json({{"name", "t"}, {"cost_model", cm}}, "t"));
  const PartitionRules r = PartitionRules{}.for_rows(1);
  const auto op = linear(1, 4096, 8192);
  const auto p = sched::make_partition(1, 8192, {1}, 2048, r);  // NPU a quarter, GPU the rest
  const auto t = sched::partition_time(op, p, sched::PartitionCosts::of(cost));
  sched::TaskGraph g;
  for (const auto& part : p.parts) {
    sched::Task task;
    task.name = soc::processor_name(part.processor);
    task.processor = part.processor;
    task.ops = {sched::part_op(op, part)};
    g.add(task);
  }
  const auto tl = sched::simulate(g, cost);
  EXPECT_NEAR(t.overlap_us, tl.makespan_us, 1e-9);
  EXPECT_GT(t.overlap_us, std::max(t.gpu_us, t.npu_us));  // contention costs something
  EXPECT_LT(t.overlap_us, t.gpu_us + t.npu_us);           // and parallelism still pays
}
