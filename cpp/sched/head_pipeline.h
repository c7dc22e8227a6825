// Scheduling layer: shadowAttn's head-wise NPU-CPU/GPU pipeline (seed 000 §3.4).
//
// Each query head of an attention layer is three pieces of work with Eq. 4's dependencies:
//   ζnpu(i)  the INT8 Q·Kᵀ estimation on the NPU; heads whose inputs fall in the same scale
//            bucket share the graph's constants and run as one fused launch (2 / 3 / 4 ms for
//            1 / 2 / 4 heads of Q 128x64 · K 2048x64 on an 8 Gen 3: the launch dominates);
//   ζtopk(i) the top-k of its scores on the CPU/GPU, after ζnpu(i);
//   ζqkv(i)  the sparse attention over the selected keys, after ζnpu(i) and ζtopk(i).
// A plan of the pipeline is an order of the NPU launches and an order of the heads on the
// CPU/GPU. Its latency follows Algorithm 1's recurrence (the "model" below):
//   t_npu  += npu time of the launch                          (launches back to back)
//   t_topk  = max(t_npu + sync, t_topk [, t_qkv if shared]) + topk time of the head
//   t_qkv   = max(t_qkv, t_topk) + qkv time of the head
// where `shared` means top-k and sparse attention run on one core (our default CPU budget of one
// mid core, §4), so a top-k cannot overlap the previous head's attention; the paper's
// three-stage picture (Fig. 9) lets them overlap (shared_cpu = false). `sync_us` is the hand-over
// of an NPU result to the CPU (the simulator's cross-processor edge cost), so the model's latency
// equals what the simulator times for the same order.
//
// Policies (head_policies() lists them):
//   sequential  each launch, then its heads' top-k and attention, then the next launch (Fig. 9(1))
//   pipelined   launches in head order, heads in head order, NPU and CPU overlapping (Fig. 9(2/3))
//   greedy      Algorithm 1 exactly: at each step the launch whose heads, placed by the inner
//               C/GPUPlan greedy, give the smallest t_qkv (ties: the earlier launch / head)
//   optimal     the exact minimum of the model over every launch order and every head order
//               within launches (the space Algorithm 1 searches), by depth-first branch and
//               bound; Unsupported beyond `optimal_max_nodes`.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "sched/task_graph.h"
#include "soc/soc.h"

namespace socllm::sched {

enum class HeadPolicy : int { Sequential = 0, Pipelined, Greedy, Optimal };
struct HeadPolicyInfo {
  HeadPolicy policy;
  const char* name;
  const char* description;
};
std::span<const HeadPolicyInfo> head_policies();
const char* head_policy_name(HeadPolicy p);
// InvalidArgument naming the value and listing the policies.
HeadPolicy head_policy_from_name(const std::string& s);

// One layer's (or one chunk-layer's) heads, in µs.
struct HeadPipelineProblem {
  std::vector<double> topk_us;                 // [n_heads] ζtopk
  std::vector<double> qkv_us;                  // [n_heads] ζqkv
  std::vector<std::vector<int64_t>> launches;  // heads of each NPU launch (a partition of heads)
  std::vector<double> launch_us;               // [launches] ζnpu of the fused launch
  double sync_us = 0;                          // NPU -> CPU hand-over (and back, sequential)
  bool shared_cpu = true;                      // top-k and attention on one core
  int64_t n_heads() const { return static_cast<int64_t>(topk_us.size()); }
  // InvalidArgument naming the field: sizes differ, a time negative or not finite, launches not
  // a partition of 0..n_heads-1.
  void validate() const;
  nlohmann::json to_json() const;
  static HeadPipelineProblem from_json(const nlohmann::json& j);
};

struct HeadPipelinePlan {
  std::string policy;
  std::vector<int64_t> launch_order;  // indices into problem.launches
  std::vector<int64_t> head_order;    // the CPU's order of heads
  double latency_us = 0;              // the model's t_qkv of the last head
  int64_t orders_evaluated = 0;       // greedy: candidate steps; optimal: search nodes
  double planner_ns = 0;              // host time spent planning
  nlohmann::json to_json() const;
};

// Latency (µs) of one plan under the model above; `sequential` makes each launch wait for the
// previous launch's heads (plus sync). InvalidArgument if the orders are not permutations or
// the head order does not follow the launch order.
double pipeline_latency_us(const HeadPipelineProblem& p, std::span<const int64_t> launch_order,
                           std::span<const int64_t> head_order, bool sequential = false);

// The fused launches of heads by scale bucket (seed 000 §3.4): heads sharing a bucket id, in
// head order, at most `max_fused_heads` per launch (0: no limit; 1: no fusion). Launches are
// listed by their first head.
std::vector<std::vector<int64_t>> fuse_launches(std::span<const int64_t> bucket_of_head,
                                                int64_t max_fused_heads);

struct HeadPipelineOptions {
  int64_t optimal_max_nodes = 50'000'000;  // branch-and-bound nodes before Unsupported
};

class HeadPipelinePlanner {
 public:
  explicit HeadPipelinePlanner(HeadPipelineOptions o = {}) : o_(o) {}
  // The plan of `p` under `policy` (validates p).
  HeadPipelinePlan plan(const HeadPipelineProblem& p, HeadPolicy policy) const;

 private:
  HeadPipelineOptions o_;
};

// The head-wise attention groups of a task graph (one per chunk and layer with Estimate tasks on
// another processor than their top-k: the NPU-CPU pipelines), each planned under `policy` with
// durations from `cost`; the plan is written into the graph as dependency edges (the NPU's
// launches chained in plan order, the CPU's tasks chained in plan order, for `sequential` each
// launch after the previous launch's heads), so that every simulator policy replays it. Returns
// one entry per group: {"chunk", "layer", "plan", "problem"}.
nlohmann::json apply_head_pipeline(TaskGraph& g, const soc::CostModel& cost, HeadPolicy policy,
                                   const HeadPipelineOptions& o = {});

}  // namespace socllm::sched
