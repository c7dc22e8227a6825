// Scheduling layer: discrete-event simulation of a task DAG (task_graph.h) on a modelled SoC.
// Each processor runs one task at a time (seed 001 Eq. 4); a task starts when all its
// dependencies have finished, plus the cross-processor synchronization cost of each edge that
// crosses processors. When a processor falls idle the policy picks its next task among the
// ready ones (names as policies() lists them; the earlier short names are aliases):
//   in-order         (inorder) the program order (task id): a processor runs its tasks in the
//                    order the engine issued them, chunk after chunk (llm.npu's baseline,
//                    Fig. 13a);
//   first-ready      (fifo) the task that became ready first;
//   npu-stall-first  (ooe) llm.npu's out-of-order policy (seed 001 §3.4, Eq. 6): the largest
//                    contribution to reducing NPU stalls: on the NPU the shortest task
//                    (C = -t), on CPU/GPU the task whose completion makes ready the most NPU time;
//   position-first   EdgeFlow's position-guided priority (seed 004 §4.3): the ready task of the
//                    earliest prompt chunk first (tasks bound to no chunk before all), ties in
//                    program order;
//   position-steal   position-first plus EdgeFlow's CPU task stealing (§4.3): a CPU with nothing
//                    ready takes the NPU's top ready task when more than `steal_threshold` wait
//                    there, and runs it at its CPU cost. The paper sets the threshold "according
//                    to the ratio between the execution time of CPU and NPU matmul operators"
//                    (5 on its phone); unless given, it is that ratio under the simulated costs:
//                    the NPU tasks' CPU time over their NPU time, rounded;
//   mllm-executor    the executor llm.npu released (UbiquitousLearning/mllm,
//                    QNNPipelineExecutor::run): one thread per chunk from a pool of
//                    `executor_threads` (4), each running its chunk's subgraphs in order; one lock
//                    per subgraph index, taken in chunk order (a chunk's i-th subgraph after the
//                    previous chunk's i-th); the processors serve whoever is ready first (FIFO);
//   optimal          exact minimum makespan by branch and bound over all non-idling schedules
//                    (small graphs only: InvalidArgument above `optimal_max_tasks`; on fixed
//                    durations, without memory contention).
// Memory contention (seed 002 §3.3; soc.h): with a cost model whose profile has the memory
// model, tasks running at once on different processors share the bandwidth those processors
// reach together, max-min fair by each task's DRAM bytes per µs; a task whose share is below its
// demand progresses proportionally slower (ProcessorUsage::contention_us is the time it adds).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sched/task_graph.h"
#include "soc/soc.h"

namespace socllm::sched {

enum class Policy : int {
  InOrder = 0,
  Fifo,
  OutOfOrder,
  PositionFirst,
  PositionSteal,
  Optimal,
  MllmExecutor
};
struct PolicyInfo {
  Policy policy;
  const char* name;   // canonical
  const char* alias;  // earlier short name, still accepted
  const char* description;
};
std::span<const PolicyInfo> policies();
const char* policy_name(Policy p);  // canonical name
// Canonical name or alias; InvalidArgument naming the value and listing the policies.
Policy policy_from_name(const std::string& s);

struct SimOptions {
  Policy policy = Policy::OutOfOrder;
  int64_t optimal_max_tasks = 24;          // branch and bound is exponential
  int64_t optimal_max_nodes = 20'000'000;  // search nodes before giving up (Unsupported)
  // position-steal: NPU tasks that must be waiting before an idle CPU steals one (unset: seed
  // 004 §4.3's rule, the ratio of the NPU tasks' CPU time to their NPU time, rounded), and,
  // when durations are given rather than a cost model, how much longer a stolen task runs on
  // the CPU than on the NPU (required then: no device fact stands in for it).
  std::optional<int64_t> steal_threshold;
  std::optional<double> steal_cpu_time_ratio;
  // Share DRAM bandwidth between processors running at once (when the profile models it).
  bool memory_contention = true;
  // mllm-executor: chunks in flight at once (the released executor's ThreadPool(4)).
  int64_t executor_threads = 4;
  // A session's graph (prompt, then decoding steps): tasks of chunks from this one on are
  // decoding steps, whose synchronizations `decode_cost` charges (soc::timing_cost_model with
  // decode: with fast sync the GPU's queue stays filled, no resubmission, seed 002 §4.2); -1:
  // none. `decode_cost` must outlive the call.
  int64_t first_decode_chunk = -1;
  const soc::CostModel* decode_cost = nullptr;
};

// The released llm.npu executor's order as dependencies (policy mllm-executor): the i-th task of
// a chunk (program order) after the i-th of the previous chunk, and a chunk's first task after
// the last task of the chunk `threads` before it (a pool thread frees when its chunk ends).
TaskGraph executor_graph(const TaskGraph& g, int64_t threads);

// Max-min fair shares of `capacity` among `demand`s (water filling): a demand below an equal
// share of what is left gets all of it, the rest split the remainder. The simulator's memory
// contention and the partition solver's parallel parts both share bandwidth this way.
std::vector<double> max_min_share(const std::vector<double>& demand, double capacity);

struct TaskSpan {
  int64_t task = -1;
  double start_us = 0, end_us = 0;
  // Where it ran: the task's processor, or the CPU for a task position-steal stole.
  soc::Processor processor = soc::Processor::Cpu;
};

struct ProcessorUsage {
  double busy_us = 0;
  double energy_mj = 0;
  int64_t tasks = 0;
  // Idle share of the processor's own active window (first start to last end): the
  // "bubbles" of seed 001 §3.4 (37% on the critical path for in-order execution).
  double bubble_rate = 0;
  double first_start_us = 0, last_end_us = 0;
  double contention_us = 0;  // time its tasks waited for DRAM bandwidth shared with others
};

struct Timeline {
  std::string policy;
  std::string device;
  std::vector<TaskSpan> spans;  // indexed by task id
  std::array<ProcessorUsage, soc::kNumProcessors> usage{};
  double makespan_us = 0;
  // All energy: the processors' active energy (usage[p].energy_mj), the SoC's static floor over
  // the makespan and DRAM traffic (soc::EnergyModel; both 0 under a whole-system power model).
  double energy_mj = 0;
  double static_energy_mj = 0;
  double dram_energy_mj = 0;
  int64_t peak_working_bytes = 0;  // max over time of the running tasks' working bytes
  int64_t decisions = 0;           // policy decisions taken
  double decision_ns_total = 0;    // host time the policy spent deciding (bench_scheduler)
  int64_t search_nodes = 0;        // optimal: nodes explored
  int64_t steal_threshold = -1;    // position-steal: the threshold it used (given or derived)
  double steal_cpu_over_npu_time_ratio = 0;  // position-steal: the NPU tasks' CPU / NPU time
  nlohmann::json summary() const;            // makespan, energy, per-processor busy / bubble
};

// Durations of every task on its processor under `cost`, in µs.
std::vector<double> task_durations_us(const TaskGraph& g, const soc::CostModel& cost);

// Simulates `g` with per-task durations (µs) and per-edge sync costs from `cost`. The graph is
// validated first (cycles, bad ids: InvalidArgument).
Timeline simulate(const TaskGraph& g, const soc::CostModel& cost, const SimOptions& opts = {});
// Same with explicit durations and a uniform cross-processor sync cost (tests, hand examples).
Timeline simulate(const TaskGraph& g, const std::vector<double>& duration_us, double sync_us,
                  const SimOptions& opts = {});

// Chrome / Perfetto trace JSON: one track (tid) per processor, one complete event per task.
nlohmann::json to_trace_json(const TaskGraph& g, const Timeline& t);

}  // namespace socllm::sched
