// SoC cost models, task graphs and the discrete-event simulator on hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "sched/simulator.h"

using namespace socllm;
using sched::Policy;
using sched::TaskGraph;
using soc::Processor;

namespace {

int64_t add(TaskGraph& g, const std::string& name, Processor p, std::vector<int64_t> deps) {
  sched::Task t;
  t.name = name;
  t.processor = p;
  t.deps = std::move(deps);
  return g.add(std::move(t));
}

sched::Timeline run(const TaskGraph& g, const std::vector<double>& d, Policy p, double sync = 0) {
  sched::SimOptions o;
  o.policy = p;
  return sched::simulate(g, d, sync, o);
}

// A(npu 3) -> B(cpu 2) -> C(npu 3), and D(npu 4) independent.
TaskGraph abcd() {
  TaskGraph g;
  add(g, "A", Processor::Npu, {});
  add(g, "B", Processor::Cpu, {0});
  add(g, "C", Processor::Npu, {1});
  add(g, "D", Processor::Npu, {});
  return g;
}

// Every schedule must respect Eq. 4 (one task per processor at a time) and the dependencies
// plus their cross-processor sync.
void check_feasible(const TaskGraph& g, const std::vector<double>& d, const sched::Timeline& t,
                    double sync) {
  for (const auto& task : g.tasks()) {
    const auto& s = t.spans[static_cast<size_t>(task.id)];
    EXPECT_NEAR(s.end_us - s.start_us, d[static_cast<size_t>(task.id)], 1e-9);
    for (int64_t dep : task.deps) {
      const double need = t.spans[static_cast<size_t>(dep)].end_us +
                          (g.at(dep).processor == task.processor ? 0.0 : sync);
      EXPECT_GE(s.start_us + 1e-9, need) << task.name << " starts before " << g.at(dep).name;
    }
    for (const auto& other : g.tasks()) {
      if (other.id == task.id || other.processor != task.processor) continue;
      const auto& o = t.spans[static_cast<size_t>(other.id)];
      EXPECT_TRUE(s.end_us <= o.start_us + 1e-9 || o.end_us <= s.start_us + 1e-9)
          << task.name << " overlaps " << other.name;
    }
  }
}

// The true optimum by brute force: every per-processor order of the tasks, each timed as its
// semi-active schedule (earliest starts); orders that deadlock are skipped.
double brute_force_makespan(const TaskGraph& g, const std::vector<double>& d, double sync) {
  std::array<std::vector<int64_t>, soc::kNumProcessors> per;
  for (const auto& t : g.tasks()) per[static_cast<size_t>(t.processor)].push_back(t.id);
  for (auto& v : per) std::sort(v.begin(), v.end());
  double best = 1e300;
  std::function<void(size_t)> rec = [&](size_t p) {
    if (p == per.size()) {
      std::vector<double> end(d.size(), -1);
      std::array<size_t, soc::kNumProcessors> pos{};
      std::array<double, soc::kNumProcessors> avail{};
      size_t done = 0;
      bool progress = true;
      while (done < d.size() && progress) {
        progress = false;
        for (size_t q = 0; q < per.size(); ++q) {
          if (pos[q] >= per[q].size()) continue;
          const auto& t = g.at(per[q][pos[q]]);
          double ready = avail[q];
          bool ok = true;
          for (int64_t dep : t.deps) {
            if (end[static_cast<size_t>(dep)] < 0) {
              ok = false;
              break;
            }
            ready = std::max(ready, end[static_cast<size_t>(dep)] +
                                        (g.at(dep).processor == t.processor ? 0 : sync));
          }
          if (!ok) continue;
          end[static_cast<size_t>(t.id)] = ready + d[static_cast<size_t>(t.id)];
          avail[q] = end[static_cast<size_t>(t.id)];
          ++pos[q];
          ++done;
          progress = true;
        }
      }
      if (done == d.size()) best = std::min(best, *std::max_element(end.begin(), end.end()));
      return;
    }
    do {
      rec(p + 1);
    } while (std::next_permutation(per[p].begin(), per[p].end()));
  };
  rec(0);
  return best;
}

TaskGraph random_dag(std::mt19937& rng, int n, std::vector<double>& d) {
  TaskGraph g;
  std::uniform_int_distribution<int> proc(0, 2), dur(1, 9);
  std::bernoulli_distribution edge(0.3);
  d.clear();
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t> deps;
    for (int j = 0; j < i; ++j)
      if (edge(rng)) deps.push_back(j);
    add(g, "t" + std::to_string(i), static_cast<Processor>(proc(rng)), deps);
    d.push_back(dur(rng));
  }
  return g;
}

nlohmann::json tiny_profile() {
  auto n = [](double v) { return nlohmann::json{{"value", v}, {"unit", "-"}, {"source", "test"}}; };
  nlohmann::json cm;
  cm["npu"] = {{"tile_m", n(32)},
               {"tile_k", n(32)},
               {"tile_n", n(64)},
               {"int8_overhead_us", n(10)},
               {"int8_compute_gops", n(1000)},
               {"int8_weight_gbps", n(1)},
               {"elementwise_gelems", n(2)}};
  cm["cpu"] = {{"fp32_compute_gops", n(50)},
               {"fp16_compute_gops", n(100)},
               {"int8_overhead_us", n(0)},
               {"int8_compute_gops", n(200)},
               {"int8_weight_gbps", n(4)}};
  cm["memory"] = {{"dram_gbps", n(40)}, {"flash_gbps", n(2)}};
  cm["sync"] = {{"cpu_npu_us", n(7)}};
  cm["power"] = {{"npu_w", n(2)}, {"cpu_w", n(3)}};
  return {{"name", "tiny"}, {"cost_model", cm}};
}

}  // namespace

TEST(Simulator, HandComputedMakespans) {
  const auto g = abcd();
  const std::vector<double> d = {3, 2, 3, 4};
  // in-order: the NPU runs A, C, D in program order and waits for B before C.
  EXPECT_DOUBLE_EQ(run(g, d, Policy::InOrder).makespan_us, 12);
  // out-of-order (Eq. 6): at t=3 the NPU cannot run C, so it runs D in the bubble.
  EXPECT_DOUBLE_EQ(run(g, d, Policy::OutOfOrder).makespan_us, 10);
  EXPECT_DOUBLE_EQ(run(g, d, Policy::Fifo).makespan_us, 10);
  EXPECT_DOUBLE_EQ(run(g, d, Policy::Optimal).makespan_us, 10);
  // with a sync of 1 µs on each NPU<->CPU edge: B 4-6, C 7-10 in both heuristics
  const auto ooe = run(g, d, Policy::OutOfOrder, 1.0);
  EXPECT_DOUBLE_EQ(ooe.makespan_us, 10);
  EXPECT_DOUBLE_EQ(ooe.spans[1].start_us, 4);
  EXPECT_DOUBLE_EQ(ooe.spans[2].start_us, 7);
  EXPECT_DOUBLE_EQ(run(g, d, Policy::InOrder, 1.0).makespan_us, 14);
  // bubbles: in-order NPU busy 10 of its 12 µs window
  EXPECT_NEAR(run(g, d, Policy::InOrder).usage[0].bubble_rate, 2.0 / 12.0, 1e-12);
}

TEST(Simulator, Eq6PicksTheCpuTaskThatFeedsTheNpuMost) {
  // Two CPU tasks ready at 0: X unlocks an NPU task of 5, Y one of 1. llm.npu runs X first;
  // FIFO (equal ready times, lowest id) runs Y first.
  TaskGraph g;
  add(g, "Y", Processor::Cpu, {});
  add(g, "X", Processor::Cpu, {});
  add(g, "ny", Processor::Npu, {0});
  add(g, "nx", Processor::Npu, {1});
  const std::vector<double> d = {2, 2, 1, 5};
  const auto ooe = run(g, d, Policy::OutOfOrder);
  EXPECT_DOUBLE_EQ(ooe.spans[1].start_us, 0);  // X first
  EXPECT_DOUBLE_EQ(ooe.makespan_us, 8);        // X 0-2, nx 2-7, Y 2-4, ny 7-8
  const auto fifo = run(g, d, Policy::Fifo);
  EXPECT_DOUBLE_EQ(fifo.spans[0].start_us, 0);  // Y first
  EXPECT_DOUBLE_EQ(fifo.makespan_us, 9);        // Y 0-2, X 2-4, ny 2-3, nx 4-9
  EXPECT_DOUBLE_EQ(run(g, d, Policy::Optimal).makespan_us, 8);
  // On the NPU the shortest task goes first (C = -t).
  TaskGraph h;
  add(h, "long", Processor::Npu, {});
  add(h, "short", Processor::Npu, {});
  EXPECT_DOUBLE_EQ(run(h, {5, 1}, Policy::OutOfOrder).spans[1].start_us, 0);
}

TEST(Simulator, OptimalIsExactAndNoPolicyBeatsIt) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<double> d;
    const auto g = random_dag(rng, 7, d);
    const double sync = trial % 2 ? 0.5 : 0.0;
    const double opt = run(g, d, Policy::Optimal, sync).makespan_us;
    EXPECT_NEAR(opt, brute_force_makespan(g, d, sync), 1e-9) << "trial " << trial;
    for (Policy p : {Policy::InOrder, Policy::Fifo, Policy::OutOfOrder, Policy::PositionFirst,
                     Policy::Optimal}) {
      const auto t = run(g, d, p, sync);
      EXPECT_GE(t.makespan_us + 1e-9, opt);
      check_feasible(g, d, t, sync);
      // every policy's busy time is the same work
      double busy = 0;
      for (const auto& u : t.usage) busy += u.busy_us;
      EXPECT_NEAR(busy, std::accumulate(d.begin(), d.end(), 0.0), 1e-9);
    }
  }
}

TEST(Simulator, PositionGuidedPriorityRunsEarlierChunksFirst) {
  // Three NPU tasks ready at once, of chunks 2, 0, 1 (seed 004 §4.3): position-first runs them
  // by chunk, first-ready by id.
  TaskGraph g;
  for (int64_t chunk : {2, 0, 1}) {
    sched::Task t;
    t.name = "c" + std::to_string(chunk);
    t.processor = Processor::Npu;
    t.chunk = chunk;
    g.add(std::move(t));
  }
  const std::vector<double> d{1, 1, 1};
  const auto pos = run(g, d, Policy::PositionFirst);
  EXPECT_DOUBLE_EQ(pos.spans[1].start_us, 0);  // chunk 0
  EXPECT_DOUBLE_EQ(pos.spans[2].start_us, 1);  // chunk 1
  EXPECT_DOUBLE_EQ(pos.spans[0].start_us, 2);  // chunk 2
  EXPECT_DOUBLE_EQ(run(g, d, Policy::Fifo).spans[0].start_us, 0);
  EXPECT_EQ(sched::policy_from_name("position"), Policy::PositionFirst);
  EXPECT_EQ(sched::policy_from_name("steal"), Policy::PositionSteal);
}

// `n` independent NPU tasks n0..n(n-1), ready at 0, and `after` on the NPU after n1: the
// stealing tests' graph.
static TaskGraph npu_tasks_then_after_n1(int n) {
  TaskGraph g;
  for (int i = 0; i < n; ++i) add(g, "n" + std::to_string(i), Processor::Npu, {});
  add(g, "after", Processor::Npu, {1});
  return g;
}

TEST(Simulator, CpuStealsWhenMoreThanTheThresholdWait) {
  // Seven 1 µs NPU tasks ready at 0 and an idle CPU, threshold 5, CPU 5x slower: when the NPU
  // takes the first, six wait (> 5): the CPU steals one (5 µs); then five wait, which is not
  // more than 5. A task on the NPU depending on the stolen one waits for the CPU and the sync.
  const TaskGraph g = npu_tasks_then_after_n1(7);
  const std::vector<double> d(8, 1.0);
  sched::SimOptions o;
  o.policy = Policy::PositionSteal;
  // given durations carry no CPU time: the ratio must be given, and is refused when missing
  try {
    sched::simulate(g, d, 0.5, o);
    ADD_FAILURE() << "position-steal ran on given durations without steal_cpu_time_ratio";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("steal_cpu_time_ratio > 0"), std::string::npos)
        << e.what();
  }
  o.steal_cpu_time_ratio = 5.0;
  const auto t = sched::simulate(g, d, 0.5, o);
  int64_t on_cpu = 0;
  for (const auto& sp : t.spans) on_cpu += sp.processor == Processor::Cpu;
  EXPECT_EQ(on_cpu, 1);
  EXPECT_EQ(t.spans[1].processor, Processor::Cpu);  // the NPU's top ready task after n0
  EXPECT_DOUBLE_EQ(t.spans[1].end_us, 5.0);
  EXPECT_GE(t.spans[7].start_us, 5.5);  // after the stolen task plus the CPU->NPU sync
  EXPECT_DOUBLE_EQ(t.usage[static_cast<size_t>(Processor::Cpu)].busy_us, 5.0);
  EXPECT_DOUBLE_EQ(t.makespan_us, 7.0);  // NPU: n0, n2..n6 until 6, then `after` 6-7
  EXPECT_EQ(t.steal_threshold, 5);       // unset: the CPU/NPU time ratio (5), the paper's rule
  EXPECT_EQ(t.summary()["steal_threshold"], 5);
  o.steal_threshold = 7;  // never more than 7 waiting: no stealing
  const auto none = sched::simulate(g, d, 0.5, o);
  for (const auto& sp : none.spans) EXPECT_EQ(sp.processor, Processor::Npu);
  EXPECT_DOUBLE_EQ(none.makespan_us, 8.0);
  EXPECT_FALSE(run(g, d, Policy::PositionFirst).summary().contains("steal_threshold"));
}

TEST(Simulator, StealThresholdFollowsTheCpuOverNpuTimeRatio) {
  // Seed 004 §4.3 sets the threshold "according to the ratio between the execution time of CPU
  // and NPU matmul operators". Ten 1 µs NPU tasks and `after` (on n1), CPU 3.4x slower, so the
  // rule gives 3. At 0 the NPU takes n0 and nine wait: the CPU steals n1 (0-3.4). At 3.4 the
  // NPU runs n4 and n5..n9 wait (5 > 3): the CPU steals n5 (3.4-6.8); at 6.8 only n9 waits.
  // The NPU runs n0, n2-n4, n6-n9 until 8, then `after` (ready at 3.4 + 0.5 sync): 9 µs.
  const TaskGraph g = npu_tasks_then_after_n1(10);
  const std::vector<double> d(11, 1.0);
  sched::SimOptions o;
  o.policy = Policy::PositionSteal;
  o.steal_cpu_time_ratio = 3.4;
  const auto t = sched::simulate(g, d, 0.5, o);
  EXPECT_DOUBLE_EQ(t.steal_cpu_over_npu_time_ratio, 3.4);  // 11 tasks: 11 x 3.4 / 11 x 1
  EXPECT_DOUBLE_EQ(t.summary()["steal_cpu_over_npu_time_ratio"].get<double>(), 3.4);
  EXPECT_EQ(t.steal_threshold, 3);
  std::vector<int64_t> stolen;
  for (size_t i = 0; i < t.spans.size(); ++i)
    if (t.spans[i].processor == Processor::Cpu) stolen.push_back(static_cast<int64_t>(i));
  EXPECT_EQ(stolen, (std::vector<int64_t>{1, 5}));
  EXPECT_DOUBLE_EQ(t.spans[5].start_us, 3.4);
  EXPECT_DOUBLE_EQ(t.spans[5].end_us, 6.8);
  EXPECT_DOUBLE_EQ(t.makespan_us, 9.0);
  // the paper's own 5 at the same costs: at 3.4 five wait, not more than 5: one steal, 10 µs
  o.steal_threshold = 5;
  const auto five = sched::simulate(g, d, 0.5, o);
  EXPECT_EQ(five.steal_threshold, 5);
  EXPECT_DOUBLE_EQ(five.makespan_us, 10.0);
  // a negative threshold is refused with its value
  o.steal_threshold = -1;
  try {
    sched::simulate(g, d, 0.5, o);
    ADD_FAILURE() << "a negative steal_threshold was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("steal_threshold must be >= 0, got -1"), std::string::npos)
        << e.what();
  }
}

TEST(Simulator, BadGraphsAndInputs) {
  TaskGraph cyc;
  add(cyc, "a", Processor::Npu, {1});
  add(cyc, "b", Processor::Cpu, {0});
  EXPECT_THROW(cyc.validate(), InvalidArgument);
  try {
    cyc.validate();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos);
  }
  TaskGraph bad;
  add(bad, "a", Processor::Npu, {5});
  EXPECT_THROW(run(bad, {1}, Policy::Fifo), InvalidArgument);
  TaskGraph self;
  add(self, "a", Processor::Npu, {0});
  EXPECT_THROW(self.validate(), InvalidArgument);
  TaskGraph dup;
  add(dup, "a", Processor::Npu, {});
  add(dup, "b", Processor::Npu, {0, 0});
  EXPECT_THROW(dup.validate(), InvalidArgument);
  const auto g = abcd();
  EXPECT_THROW(run(g, {1, 2}, Policy::Fifo), ShapeError);              // too few durations
  EXPECT_THROW(run(g, {1, 2, -1, 1}, Policy::Fifo), InvalidArgument);  // negative
  EXPECT_THROW(sched::policy_from_name("random"), InvalidArgument);
  EXPECT_THROW(TaskGraph::from_json(nlohmann::json{{"tasks", {{{"processor", "tpu"}}}}}),
               InvalidArgument);
  EXPECT_THROW(TaskGraph::from_json(nlohmann::json::array()), FormatError);
  sched::SimOptions o;
  o.policy = Policy::Optimal;
  o.optimal_max_tasks = 3;
  EXPECT_THROW(sched::simulate(g, {1, 1, 1, 1}, 0.0, o), InvalidArgument);
}

TEST(Simulator, TaskGraphJsonRoundTrip) {
  auto g = abcd();
  const auto back = TaskGraph::from_json(g.to_json());
  ASSERT_EQ(back.size(), g.size());
  for (int64_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(back.at(i).name, g.at(i).name);
    EXPECT_EQ(back.at(i).deps, g.at(i).deps);
    EXPECT_EQ(back.at(i).processor, g.at(i).processor);
  }
}

TEST(CostModel, NpuMatmulPaddingRooflineAndGroups) {
  const soc::CostModel cm(soc::DeviceProfile::from_json(tiny_profile(), "test"));
  soc::OpDesc mm;
  mm.kind = soc::OpKind::MatMul;
  mm.dtype = soc::DType::Int8;
  mm.m = 1;
  mm.k = 32;
  mm.n = 64;
  // padded to 32 x 32 x 64: 131072 flops at 1000 Gop/s = 0.131072 µs; weights 2048 B at
  // 1 GB/s = 2.048 µs (the larger); + 10 µs overhead
  EXPECT_NEAR(cm.latency_us(mm, Processor::Npu), 10 + 2.048, 1e-9);
  mm.m = 4096;
  mm.k = 1024;
  mm.n = 1024;  // compute: 2*4096*1024*1024 / 1e6 = 8589.93 µs vs weights 1048.6 µs
  EXPECT_NEAR(cm.latency_us(mm, Processor::Npu), 10 + 2.0 * 4096 * 1024 * 1024 / 1e6, 1e-6);
  mm.m = 33;  // stage performance: 33 rows cost as 64
  mm.k = 32;
  mm.n = 64;
  soc::OpDesc mm64 = mm;
  mm64.m = 64;
  EXPECT_DOUBLE_EQ(cm.latency_us(mm, Processor::Npu), cm.latency_us(mm64, Processor::Npu));
  // per-group: 2 groups of 16 -> two sub-matmuls each padded to k = 32, + a float reduction of
  // m*n*g elements at 2 Gelem/s
  soc::OpDesc grp = mm64;
  grp.groups = 2;
  const double sub = std::max(2.0 * 64 * 32 * 64 / 1e6, 16.0 * 64 / 1e3);
  EXPECT_NEAR(cm.latency_us(grp, Processor::Npu), 10 + 2 * sub + 64.0 * 64 * 2 / 2e3, 1e-9);
  // CPU int8: no tiles
  soc::OpDesc c = mm64;
  EXPECT_NEAR(cm.latency_us(c, Processor::Cpu), std::max(2.0 * 64 * 32 * 64 / 2e5, 2048.0 / 4e3),
              1e-9);
  // a CPU kernel fuses the group scales: per-group costs what per-tensor does there
  c.groups = 2;
  EXPECT_DOUBLE_EQ(cm.latency_us(c, Processor::Cpu), cm.latency_us(mm64, Processor::Cpu));
  EXPECT_DOUBLE_EQ(cm.sync_us(Processor::Npu, Processor::Cpu), 7);
  EXPECT_DOUBLE_EQ(cm.sync_us(Processor::Cpu, Processor::Cpu), 0);
}

TEST(CostModel, MissingNumbersNameThePointer) {
  const soc::CostModel cm(soc::DeviceProfile::from_json(tiny_profile(), "test"));
  soc::OpDesc mm;
  mm.kind = soc::OpKind::MatMul;
  mm.dtype = soc::DType::Fp16;
  mm.m = mm.k = mm.n = 8;
  try {
    cm.latency_us(mm, Processor::Gpu);
    FAIL() << "no GPU numbers in the profile";
  } catch (const soc::MissingData& e) {
    EXPECT_NE(std::string(e.what()).find("/cost_model/gpu/fp16_overhead_us"), std::string::npos);
  }
  EXPECT_THROW(cm.sync_us(Processor::Gpu, Processor::Npu), soc::MissingData);
  EXPECT_THROW(cm.active_power_w(Processor::Gpu), soc::MissingData);
  EXPECT_THROW(soc::DeviceProfile::from_json(nlohmann::json::array(), "x"), FormatError);
}

TEST(Trace, OneTrackPerProcessorAndOneEventPerTask) {
  const auto g = abcd();
  const auto t = run(g, {3, 2, 3, 4}, Policy::OutOfOrder);
  const auto j = sched::to_trace_json(g, t);
  int complete = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++complete;
    const int64_t id = e["args"]["task"];
    EXPECT_EQ(e["tid"].get<int>(), static_cast<int>(g.at(id).processor));
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), t.spans[static_cast<size_t>(id)].start_us);
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(),
                     3.0 * (id == 0 || id == 2) + 2.0 * (id == 1) + 4.0 * (id == 3));
  }
  EXPECT_EQ(complete, 4);
}

namespace {
// A GPU + NPU profile with the memory model (seed 002 §3.3 shape, round numbers) and a
// HeteroLLM-like characterization.
nlohmann::json hetero_profile() {
  auto n = [](double v) { return nlohmann::json{{"value", v}, {"unit", "-"}, {"source", "test"}}; };
  nlohmann::json j = tiny_profile();
  auto& cm = j["cost_model"];
  for (const char* p : {"npu", "gpu"}) {
    cm[p]["fp16_overhead_us"] = n(0);
    cm[p]["fp16_compute_gops"] = n(1e9);  // memory-bound tasks
    cm[p]["fp16_weight_gbps"] = n(40);
    cm[p]["fp16_weights_as_stored"] = n(1);
  }
  cm["memory"]["npu_gbps"] = n(40);
  cm["memory"]["gpu_gbps"] = n(40);
  cm["memory"]["cpu_gbps"] = n(40);
  cm["memory"]["two_processors_gbps"] = n(60);
  cm["memory"]["peak_gbps"] = n(68);
  cm["sync"]["gpu_npu_us"] = n(400);
  cm["sync"]["gpu_resubmit_us"] = n(75);
  cm["sync"]["fast_gpu_npu_us"] = n(5);
  cm["sync"]["fast_gpu_resubmit_us"] = n(30);
  cm["power"]["gpu_w"] = n(4);
  j["characterizations"]["shapes"]["cost_model"]["npu"] = {{"fp16_compute_gops", n(1000)},
                                                           {"fp16_shape_ratio_half", n(1)},
                                                           {"fp16_shape_efficiency_min", n(0.1)},
                                                           {"fp16_order_penalty", n(6)}};
  return j;
}

// One fp16 matmul op streaming `bytes` of weights (1 row: memory-bound).
sched::Task stream_task(const std::string& name, Processor p, int64_t bytes,
                        std::vector<int64_t> deps = {}) {
  sched::Task t;
  t.name = name;
  t.processor = p;
  t.deps = std::move(deps);
  soc::OpDesc o;
  o.kind = soc::OpKind::MatMul;
  o.dtype = soc::DType::Fp16;
  o.m = 1;
  o.k = 1000;
  o.n = 1000;
  o.weight_bytes = bytes;
  t.ops = {o};
  return t;
}
}  // namespace

TEST(Simulator, MemoryContentionSharesBandwidthMaxMinFair) {
  const soc::CostModel cm(soc::DeviceProfile::from_json(hetero_profile(), "test"));
  ASSERT_TRUE(cm.has_memory_model());
  // Each alone: 4 MB at 40 GB/s = 100 µs. Together they share 60 GB/s: 30 each, rate 0.75.
  TaskGraph g;
  g.add(stream_task("gpu", Processor::Gpu, 4'000'000));
  g.add(stream_task("npu", Processor::Npu, 4'000'000));
  auto t = sched::simulate(g, cm);
  EXPECT_NEAR(t.spans[0].end_us, 100 / 0.75, 1e-9);
  EXPECT_NEAR(t.spans[1].end_us, 100 / 0.75, 1e-9);
  EXPECT_NEAR(t.usage[static_cast<size_t>(Processor::Gpu)].contention_us, 100 / 0.75 - 100, 1e-9);
  // Off: each runs as alone.
  sched::SimOptions off;
  off.memory_contention = false;
  EXPECT_DOUBLE_EQ(sched::simulate(g, cm, off).makespan_us, 100);
  // Unequal lengths: the NPU's 50 µs task ends at 50 / 0.75; the GPU then has 50 µs of its own
  // work left at rate 1.
  TaskGraph h;
  h.add(stream_task("gpu", Processor::Gpu, 4'000'000));
  h.add(stream_task("npu", Processor::Npu, 2'000'000));
  t = sched::simulate(h, cm);
  EXPECT_NEAR(t.spans[1].end_us, 50 / 0.75, 1e-9);
  EXPECT_NEAR(t.spans[0].end_us, 50 / 0.75 + 50, 1e-9);
  // Max-min: a task demanding 10 GB/s (a 10x longer compute-bound op) keeps its demand; the
  // other gets the 50 GB/s left, more than its 40: neither slows.
  TaskGraph k;
  k.add(stream_task("gpu", Processor::Gpu, 4'000'000));
  auto slow = stream_task("npu", Processor::Npu, 4'000'000);
  slow.ops[0].m = 500'000'000;  // 1e15 flops at 1e12 per µs: 1000 µs
  k.add(slow);
  sched::Timeline tk = sched::simulate(k, cm);
  const double npu_alone = cm.latency_us(k.at(1).ops, Processor::Npu);
  ASSERT_GT(npu_alone, 100.0);
  // the NPU's demand 4e6 / npu_alone bytes/µs is below half of 60 GB/s
  EXPECT_NEAR(tk.spans[0].end_us, 100, 1e-9);
  EXPECT_NEAR(tk.spans[1].end_us, npu_alone, 1e-9);
}

TEST(CostModel, GpuNpuSynchronizationConventionalAndFast) {
  const auto prof = soc::DeviceProfile::from_json(hetero_profile(), "test");
  const soc::CostModel conv(prof);
  EXPECT_DOUBLE_EQ(conv.sync_us(Processor::Gpu, Processor::Npu), 400);
  EXPECT_DOUBLE_EQ(conv.sync_us(Processor::Npu, Processor::Gpu), 475);  // + emptied queue
  const soc::CostModel prefill(prof, {.fast = true, .gpu_queue_kept = false});
  EXPECT_DOUBLE_EQ(prefill.sync_us(Processor::Gpu, Processor::Npu), 5);
  EXPECT_DOUBLE_EQ(prefill.sync_us(Processor::Npu, Processor::Gpu), 35);
  const soc::CostModel decode(prof, {.fast = true, .gpu_queue_kept = true});
  EXPECT_DOUBLE_EQ(decode.sync_us(Processor::Npu, Processor::Gpu), 5);
  EXPECT_DOUBLE_EQ(decode.sync_us(Processor::Npu, Processor::Cpu), 7);  // not GPU-NPU
}

TEST(CostModel, CharacterizationPatchesAndNpuShapeSensitivity) {
  const auto prof = soc::DeviceProfile::from_json(hetero_profile(), "test");
  EXPECT_EQ(prof.characterizations(), std::vector<std::string>{"shapes"});
  try {
    (void)prof.with_characterization("qnn-magic");
    FAIL() << "unknown characterization";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'qnn-magic'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("shapes"), std::string::npos);
  }
  const auto shaped = prof.with_characterization("shapes");
  EXPECT_EQ(shaped.characterization(), "shapes");
  EXPECT_DOUBLE_EQ(shaped.number("/cost_model/npu/fp16_compute_gops", "t"), 1000);
  EXPECT_DOUBLE_EQ(shaped.number("/cost_model/npu/fp16_weight_gbps", "t"), 40);  // kept
  const soc::CostModel cm(shaped);
  soc::OpDesc mm;
  mm.kind = soc::OpKind::MatMul;
  mm.dtype = soc::DType::Fp16;
  mm.m = 256;
  mm.k = 4096;
  mm.n = 4096;  // r = 1: efficiency 0.1 + 0.9 * 1/2 = 0.55
  const double flops = 2.0 * 256 * 4096 * 4096;
  EXPECT_NEAR(cm.latency_us(mm, Processor::Npu), flops / (1000 * 0.55 * 1e3), 1e-6);
  mm.n = 1024;  // FFN-down-like r = 1/4: 0.1 + 0.9 * 0.2 = 0.28
  EXPECT_NEAR(cm.latency_us(mm, Processor::Npu), flops / 4 / (1000 * 0.28 * 1e3), 1e-6);
  mm.m = 2048;  // stationary activations larger than the streamed weights: 6x order penalty
  EXPECT_NEAR(cm.latency_us(mm, Processor::Npu), 8 * flops / 4 / (1000 * 0.28 / 6 * 1e3), 1e-6);
}

TEST(Simulator, MllmExecutorLocksSubgraphIndicesInChunkOrder) {
  // Three chunks of two tasks (NPU then CPU), chunks independent in the graph. The released
  // executor runs a chunk's i-th subgraph after the previous chunk's i-th, and with one thread
  // chunk after chunk.
  TaskGraph g;
  for (int64_t c = 0; c < 3; ++c) {
    sched::Task a;
    a.name = "c" + std::to_string(c) + ".npu";
    a.processor = Processor::Npu;
    a.chunk = c;
    const int64_t ia = g.add(a);
    sched::Task b;
    b.name = "c" + std::to_string(c) + ".cpu";
    b.processor = Processor::Cpu;
    b.chunk = c;
    b.deps = {ia};
    g.add(b);
  }
  const std::vector<double> d = {1, 5, 1, 5, 1, 5};
  sched::SimOptions o;
  o.policy = Policy::MllmExecutor;
  auto t = sched::simulate(g, d, 0, o);
  EXPECT_EQ(t.policy, "mllm-executor");
  // 4 threads: NPU tasks at 0, 1, 2; CPU tasks serialized 1-6, 6-11, 11-16
  EXPECT_DOUBLE_EQ(t.makespan_us, 16);
  o.executor_threads = 1;  // chunk after chunk: (1 + 5) x 3
  EXPECT_DOUBLE_EQ(sched::simulate(g, d, 0, o).makespan_us, 18);
  const auto eg = sched::executor_graph(g, 1);
  EXPECT_EQ(eg.at(2).deps, (std::vector<int64_t>{0, 1}));  // index lock, then the pool
  EXPECT_EQ(eg.at(3).deps, (std::vector<int64_t>{2, 1}));
  o.executor_threads = 0;
  EXPECT_THROW(sched::simulate(g, d, 0, o), InvalidArgument);
}
