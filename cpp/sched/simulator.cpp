#include "sched/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

namespace socllm::sched {

namespace {
// The policies, defined once: canonical name, the earlier short name (still accepted), and what
// each does (listed by policies(), shown by `socllm simulate --help` and socllm.policies()).
constexpr std::array<PolicyInfo, 7> kPolicies = {{
    {Policy::InOrder, "in-order", "inorder",
     "each processor runs its tasks in program order, chunk after chunk (llm.npu's baseline, "
     "seed 001 Fig. 13a)"},
    {Policy::Fifo, "first-ready", "fifo", "each processor runs the task that became ready first"},
    {Policy::OutOfOrder, "npu-stall-first", "ooe",
     "llm.npu's out-of-order subgraph scheduling (seed 001 §3.4, Eq. 6): the NPU runs its "
     "shortest ready task, CPU/GPU the task whose completion readies the most NPU time"},
    {Policy::PositionFirst, "position-first", "position",
     "EdgeFlow's position-guided priority (seed 004 §4.3): the ready task of the earliest prompt "
     "chunk first"},
    {Policy::PositionSteal, "position-steal", "steal",
     "position-first plus EdgeFlow's CPU task stealing (seed 004 §4.3): an idle CPU takes the "
     "NPU's top ready task when more than steal_threshold wait there (unset: the ratio of the "
     "NPU tasks' CPU time to their NPU time, the paper's rule)"},
    {Policy::Optimal, "optimal", "optimal",
     "exact minimum makespan by branch and bound over non-idling schedules (small graphs only)"},
    {Policy::MllmExecutor, "mllm-executor", "mllm",
     "the executor llm.npu released (mllm QNNPipelineExecutor::run): a thread per chunk from a "
     "pool of 4, subgraphs in order, one lock per subgraph index taken in chunk order, "
     "processors first come first served"},
}};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kProcs = static_cast<size_t>(soc::kNumProcessors);

size_t proc_index(soc::Processor p) { return static_cast<size_t>(p); }

// Everything a simulation needs besides the policy: durations, per-edge sync costs, powers.
struct Problem {
  const TaskGraph& g;
  std::vector<double> dur;
  std::function<double(soc::Processor, soc::Processor)> sync;
  std::array<double, kProcs> power_w{};
  std::vector<std::vector<int64_t>> succ;
  std::vector<double> cpu_dur;  // durations on the CPU (position-steal), empty otherwise
  // Memory contention (seed 002 §3.3): each task's DRAM bytes, and the bandwidth (bytes/µs)
  // processors running at once share; null: none.
  std::vector<double> bytes;
  std::function<double(const std::vector<soc::Processor>&)> shared_bytes_per_us;
  // Synchronizations into a decoding step's tasks (SimOptions::first_decode_chunk; null: sync).
  std::function<double(soc::Processor, soc::Processor)> decode_sync = {};
  int64_t first_decode_chunk = -1;
  soc::EnergyModel energy = {};  // static floor and DRAM energy (none with explicit durations)
  double task_dram_bytes(int64_t t) const {
    return bytes.empty() ? 0.0 : bytes[static_cast<size_t>(t)];
  }
  // ready time of task t given the end times of its dependencies and where each ran (null:
  // where the graph places it)
  double ready_time(int64_t t, const std::vector<double>& end,
                    const std::vector<soc::Processor>* ran_on = nullptr) const {
    double r = 0;
    const auto& task = g.tasks()[static_cast<size_t>(t)];
    const bool decoding =
        decode_sync && first_decode_chunk >= 0 && task.chunk >= first_decode_chunk;
    const auto& edge = decoding ? decode_sync : sync;
    for (int64_t d : task.deps) {
      const auto from =
          ran_on ? (*ran_on)[static_cast<size_t>(d)] : g.tasks()[static_cast<size_t>(d)].processor;
      r = std::max(r, end[static_cast<size_t>(d)] + edge(from, task.processor));
    }
    return r;
  }
};

// Fills usage, energy, peak memory from spans.
void finish_timeline(const Problem& pb, Timeline& tl) {
  const auto& tasks = pb.g.tasks();
  tl.makespan_us = 0;
  for (auto& u : tl.usage) u = ProcessorUsage{};
  std::array<bool, kProcs> seen{};
  for (const auto& s : tl.spans) {
    auto& u = tl.usage[proc_index(s.processor)];
    const size_t pi = proc_index(s.processor);
    u.busy_us += s.end_us - s.start_us;
    u.tasks += 1;
    const size_t ti = static_cast<size_t>(s.task);
    const double alone = s.processor == tasks[ti].processor ? pb.dur[ti] : pb.cpu_dur[ti];
    u.contention_us += std::max(0.0, s.end_us - s.start_us - alone);
    u.first_start_us = seen[pi] ? std::min(u.first_start_us, s.start_us) : s.start_us;
    u.last_end_us = seen[pi] ? std::max(u.last_end_us, s.end_us) : s.end_us;
    seen[pi] = true;
    tl.makespan_us = std::max(tl.makespan_us, s.end_us);
  }
  // Component energy (soc.h EnergyModel): each processor's active power over its busy time,
  // the SoC's static floor over the makespan, and DRAM energy per byte moved.
  tl.energy_mj = 0;
  for (size_t p = 0; p < kProcs; ++p) {
    auto& u = tl.usage[p];
    const double window = u.last_end_us - u.first_start_us;
    u.bubble_rate = window > 0 ? 1.0 - u.busy_us / window : 0.0;
    u.energy_mj = u.busy_us * pb.power_w[p] * 1e-3;  // µs x W = µJ
    tl.energy_mj += u.energy_mj;
  }
  tl.static_energy_mj = tl.makespan_us * pb.energy.static_w * 1e-3;
  double moved = 0;
  for (const auto& s : tl.spans) moved += pb.task_dram_bytes(s.task);
  tl.dram_energy_mj = moved * pb.energy.dram_pj_per_byte * 1e-9;  // pJ -> mJ
  tl.energy_mj += tl.static_energy_mj + tl.dram_energy_mj;
  // Peak of the running tasks' working bytes: sweep start (+) and end (-) events.
  std::vector<std::pair<double, int64_t>> ev;
  for (const auto& s : tl.spans) {
    const int64_t b = tasks[static_cast<size_t>(s.task)].working_bytes;
    ev.push_back({s.start_us, b});
    ev.push_back({s.end_us, -b});
  }
  std::sort(ev.begin(), ev.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;  // ends first
  });
  int64_t cur = 0;
  tl.peak_working_bytes = 0;
  for (const auto& [_, b] : ev) {
    cur += b;
    tl.peak_working_bytes = std::max(tl.peak_working_bytes, cur);
  }
}

}  // namespace

std::vector<double> max_min_share(const std::vector<double>& demand, double capacity) {
  std::vector<size_t> order(demand.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return demand[a] < demand[b]; });
  std::vector<double> got(demand.size());
  double left = capacity;
  for (size_t i = 0; i < order.size(); ++i) {
    const double fair = left / static_cast<double>(order.size() - i);
    got[order[i]] = std::min(demand[order[i]], fair);
    left -= got[order[i]];
  }
  return got;
}

namespace {

// Max-min fair sharing of the bandwidth the running processors reach together (a DRAM
// controller arbitrating its masters): tasks demanding less than an equal share get their
// demand, the rest split what is left. A task's progress rate is its share / its demand (its
// duration alone already holds its own processor's bandwidth limit, so one task alone runs at
// rate 1). When a rate changes, the task's end moves so its remaining work is done at the new
// rate.
void share_bandwidth(const Problem& pb, const std::array<int64_t, kProcs>& running,
                     const std::array<double, kProcs>& demand, std::array<double, kProcs>& rate,
                     std::vector<double>& end, double now) {
  std::vector<size_t> active;
  std::vector<soc::Processor> procs;
  for (size_t p = 0; p < kProcs; ++p)
    if (running[p] >= 0 && static_cast<soc::Processor>(p) != soc::Processor::Io) {
      active.push_back(p);
      procs.push_back(static_cast<soc::Processor>(p));
    }
  std::array<double, kProcs> next;
  next.fill(1.0);
  if (active.size() >= 2) {
    std::vector<double> want;
    for (size_t p : active) want.push_back(demand[p]);
    const std::vector<double> got = max_min_share(want, pb.shared_bytes_per_us(procs));
    for (size_t i = 0; i < active.size(); ++i)
      next[active[i]] = want[i] > 0 ? got[i] / want[i] : 1.0;
  }
  for (size_t p = 0; p < kProcs; ++p) {
    if (running[p] < 0 || next[p] == rate[p]) continue;
    double& e = end[static_cast<size_t>(running[p])];
    e = now + (e - now) * rate[p] / next[p];
    rate[p] = next[p];
  }
}

// Seed 004 §4.3's stealing threshold: "according to the ratio between the execution time of
// CPU and NPU matmul operators" (5 on its phone). Here: the NPU tasks' total CPU time over
// their total NPU time (0 when nothing runs on the NPU); the threshold is that ratio rounded.
double cpu_over_npu_time_ratio(const Problem& pb) {
  double cpu = 0, npu = 0;
  for (size_t i = 0; i < pb.cpu_dur.size(); ++i)
    if (pb.g.tasks()[i].processor == soc::Processor::Npu) {
      cpu += pb.cpu_dur[i];
      npu += pb.dur[i];
    }
  return npu > 0 ? cpu / npu : 0.0;
}

// Event-driven list scheduling: whenever a processor is idle, the policy picks one of its
// ready tasks (dependencies finished and synchronized by now). `steal_threshold`:
// position-steal's (the other policies never steal).
Timeline list_schedule(const Problem& pb, Policy policy, int64_t steal_threshold = -1) {
  const auto& tasks = pb.g.tasks();
  const size_t n = tasks.size();
  Timeline tl;
  tl.policy = policy_name(policy);
  tl.spans.assign(n, {});
  std::vector<int64_t> missing(n);
  std::vector<double> end(n, kInf), ready_at(n, kInf);
  std::array<std::vector<int64_t>, kProcs> ready;    // deps finished, per processor
  std::array<std::vector<int64_t>, kProcs> program;  // in-order queues (task id order)
  std::array<size_t, kProcs> head{};
  std::array<int64_t, kProcs> running;
  running.fill(-1);
  // Progress rate of each processor's running task (1 = as fast as alone) and its bandwidth
  // demand (bytes/µs alone).
  std::array<double, kProcs> rate, demand{};
  rate.fill(1.0);
  std::vector<soc::Processor> ran_on(n);
  for (size_t i = 0; i < n; ++i) ran_on[i] = tasks[i].processor;
  const bool by_position = policy == Policy::PositionFirst || policy == Policy::PositionSteal;
  // Position-guided priority: earlier chunks first, tasks bound to no chunk before them all.
  auto position = [&](int64_t t) {
    return -static_cast<double>(std::max<int64_t>(tasks[static_cast<size_t>(t)].chunk, -1));
  };
  // Program order: a topological order, so in-order issue never deadlocks across processors.
  for (int64_t t : pb.g.topological_order())
    program[proc_index(tasks[static_cast<size_t>(t)].processor)].push_back(t);
  for (size_t i = 0; i < n; ++i) {
    missing[i] = static_cast<int64_t>(tasks[i].deps.size());
    if (missing[i] == 0) {
      ready_at[i] = 0;
      ready[proc_index(tasks[i].processor)].push_back(static_cast<int64_t>(i));
    }
  }
  // Eq. 6 contribution of running `t` now.
  auto contribution = [&](int64_t t) {
    const auto& task = tasks[static_cast<size_t>(t)];
    if (task.processor == soc::Processor::Npu) return -pb.dur[static_cast<size_t>(t)];
    double c = 0;
    for (int64_t s : pb.succ[static_cast<size_t>(t)])
      if (missing[static_cast<size_t>(s)] == 1 &&
          tasks[static_cast<size_t>(s)].processor == soc::Processor::Npu)
        c += pb.dur[static_cast<size_t>(s)];
    return c;
  };
  double now = 0;
  size_t done = 0;
  while (done < n) {
    // Start tasks on idle processors.
    for (size_t p = 0; p < kProcs; ++p) {
      if (running[p] >= 0) continue;
      const auto t0 = std::chrono::steady_clock::now();
      int64_t pick = -1;
      auto& rq = ready[p];
      if (policy == Policy::InOrder) {
        if (head[p] < program[p].size()) {
          const int64_t h = program[p][head[p]];
          if (missing[static_cast<size_t>(h)] == 0 && ready_at[static_cast<size_t>(h)] <= now)
            pick = h;
        }
      } else {
        auto best_of = [&](const std::vector<int64_t>& q, int64_t& count) {
          int64_t b = -1;
          double best = -kInf;
          count = 0;
          for (int64_t t : q) {
            if (ready_at[static_cast<size_t>(t)] > now) continue;
            ++count;
            const double score = policy == Policy::Fifo ? -ready_at[static_cast<size_t>(t)]
                                 : by_position          ? position(t)
                                                        : contribution(t);
            if (b < 0 || score > best || (score == best && t < b)) {
              b = t;
              best = score;
            }
          }
          return b;
        };
        int64_t count = 0;
        pick = best_of(rq, count);
        // CPU task stealing (seed 004 §4.3): an idle CPU takes the NPU's top ready task when
        // more than the threshold wait there.
        if (pick < 0 && policy == Policy::PositionSteal && p == proc_index(soc::Processor::Cpu) &&
            !pb.cpu_dur.empty()) {
          auto& npu_q = ready[proc_index(soc::Processor::Npu)];
          const int64_t stolen = best_of(npu_q, count);
          if (stolen >= 0 && count > steal_threshold) {
            npu_q.erase(std::find(npu_q.begin(), npu_q.end(), stolen));
            rq.push_back(stolen);
            ran_on[static_cast<size_t>(stolen)] = soc::Processor::Cpu;
            pick = stolen;
          }
        }
      }
      if (pick < 0) continue;
      tl.decision_ns_total +=
          static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - t0)
                                  .count());
      tl.decisions += 1;
      if (policy == Policy::InOrder) ++head[p];
      rq.erase(std::find(rq.begin(), rq.end(), pick));
      running[p] = pick;
      const double d =
          ran_on[static_cast<size_t>(pick)] == tasks[static_cast<size_t>(pick)].processor
              ? pb.dur[static_cast<size_t>(pick)]
              : pb.cpu_dur[static_cast<size_t>(pick)];
      tl.spans[static_cast<size_t>(pick)] = {pick, now, now + d, ran_on[static_cast<size_t>(pick)]};
      end[static_cast<size_t>(pick)] = now + d;
      rate[p] = 1.0;
      demand[p] = pb.shared_bytes_per_us && d > 0 ? pb.bytes[static_cast<size_t>(pick)] / d : 0.0;
    }
    if (pb.shared_bytes_per_us) share_bandwidth(pb, running, demand, rate, end, now);
    // Next event: the earliest completion, or a ready task whose sync delay ends.
    double next = kInf;
    for (size_t p = 0; p < kProcs; ++p) {
      if (running[p] >= 0) next = std::min(next, end[static_cast<size_t>(running[p])]);
      else
        for (int64_t t : ready[p])
          if (ready_at[static_cast<size_t>(t)] > now)
            next = std::min(next, ready_at[static_cast<size_t>(t)]);
    }
    if (next == kInf) throw Error("[simulate] no runnable task (internal error: graph validated)");
    now = next;
    for (size_t p = 0; p < kProcs; ++p) {
      const int64_t r = running[p];
      if (r < 0 || end[static_cast<size_t>(r)] > now) continue;
      tl.spans[static_cast<size_t>(r)].end_us = end[static_cast<size_t>(r)];
      running[p] = -1;
      ++done;
      for (int64_t s : pb.succ[static_cast<size_t>(r)]) {
        if (--missing[static_cast<size_t>(s)] == 0) {
          ready_at[static_cast<size_t>(s)] = pb.ready_time(s, end, &ran_on);
          ready[proc_index(tasks[static_cast<size_t>(s)].processor)].push_back(s);
        }
      }
    }
  }
  finish_timeline(pb, tl);
  return tl;
}

// Exact minimum makespan: Giffler-Thompson enumeration of active schedules (which contain an
// optimal one) with a lower bound from each processor's remaining work and tail lengths.
Timeline optimal_schedule(const Problem& pb, const SimOptions& opts, double upper_bound,
                          const Timeline& incumbent) {
  const auto& tasks = pb.g.tasks();
  const size_t n = tasks.size();
  // tail[t] = longest path from t's start to the end of the graph (durations only).
  std::vector<double> tail(n, 0);
  const auto order = pb.g.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const size_t t = static_cast<size_t>(*it);
    double best = 0;
    for (int64_t s : pb.succ[t]) best = std::max(best, tail[static_cast<size_t>(s)]);
    tail[t] = pb.dur[t] + best;
  }
  std::vector<double> start(n, kInf), end(n, kInf);
  std::vector<int64_t> missing(n);
  for (size_t i = 0; i < n; ++i) missing[i] = static_cast<int64_t>(tasks[i].deps.size());
  std::array<double, kProcs> avail{};
  std::array<double, kProcs> remaining{};
  for (size_t i = 0; i < n; ++i) remaining[proc_index(tasks[i].processor)] += pb.dur[i];
  double best = upper_bound;
  std::vector<double> best_start;
  int64_t nodes = 0;
  size_t scheduled = 0;

  std::function<void()> dfs = [&]() {
    if (++nodes > opts.optimal_max_nodes)
      throw Unsupported("[simulate] optimal: search exceeded " +
                        std::to_string(opts.optimal_max_nodes) + " nodes on " + std::to_string(n) +
                        " tasks; use a smaller graph");
    if (scheduled == n) {
      double ms = 0;
      for (size_t i = 0; i < n; ++i) ms = std::max(ms, end[i]);
      if (ms < best - 1e-9) {
        best = ms;
        best_start = start;
      }
      return;
    }
    // eligible: unscheduled with all deps scheduled; earliest start / completion.
    double min_ect = kInf;
    int64_t argmin = -1;
    std::vector<std::pair<int64_t, double>> elig;
    double lb = 0;
    for (size_t p = 0; p < kProcs; ++p) lb = std::max(lb, avail[p] + remaining[p]);
    for (size_t i = 0; i < n; ++i) {
      if (start[i] != kInf || missing[i] != 0) continue;
      const double est = std::max(avail[proc_index(tasks[i].processor)],
                                  pb.ready_time(static_cast<int64_t>(i), end));
      elig.push_back({static_cast<int64_t>(i), est});
      lb = std::max(lb, est + tail[i]);
      if (est + pb.dur[i] < min_ect) {
        min_ect = est + pb.dur[i];
        argmin = static_cast<int64_t>(i);
      }
    }
    if (lb >= best - 1e-9) return;
    const auto pstar = tasks[static_cast<size_t>(argmin)].processor;
    // branch on the conflict set: eligible tasks on p* that could start before min_ect,
    // most promising (longest tail) first.
    std::vector<std::pair<int64_t, double>> branch;
    for (const auto& e : elig)
      if (tasks[static_cast<size_t>(e.first)].processor == pstar && e.second < min_ect - 1e-12)
        branch.push_back(e);
    std::sort(branch.begin(), branch.end(), [&](const auto& a, const auto& b) {
      return tail[static_cast<size_t>(a.first)] > tail[static_cast<size_t>(b.first)];
    });
    const size_t p = proc_index(pstar);
    for (const auto& [t, est] : branch) {
      const size_t ti = static_cast<size_t>(t);
      const double old_avail = avail[p];
      start[ti] = est;
      end[ti] = est + pb.dur[ti];
      avail[p] = end[ti];
      remaining[p] -= pb.dur[ti];
      ++scheduled;
      for (int64_t s : pb.succ[ti]) --missing[static_cast<size_t>(s)];
      dfs();
      for (int64_t s : pb.succ[ti]) ++missing[static_cast<size_t>(s)];
      --scheduled;
      remaining[p] += pb.dur[ti];
      avail[p] = old_avail;
      start[ti] = kInf;
      end[ti] = kInf;
    }
  };
  dfs();
  Timeline tl = incumbent;  // the heuristic's schedule if nothing beat it
  tl.policy = policy_name(Policy::Optimal);
  if (!best_start.empty()) {
    for (size_t i = 0; i < n; ++i)
      tl.spans[i] = {static_cast<int64_t>(i), best_start[i], best_start[i] + pb.dur[i],
                     tasks[i].processor};
  }
  tl.search_nodes = nodes;
  tl.decisions = 0;
  tl.decision_ns_total = 0;
  finish_timeline(pb, tl);
  return tl;
}

Timeline optimal(const Problem& pb, const SimOptions& opts);

Timeline run(const Problem& pb, const SimOptions& opts) {
  if (opts.policy == Policy::MllmExecutor) {
    // The released executor's locks as dependencies, then first come first served.
    const TaskGraph exec = executor_graph(pb.g, opts.executor_threads);
    const Problem locked{exec,
                         pb.dur,
                         pb.sync,
                         pb.power_w,
                         exec.successors(),
                         pb.cpu_dur,
                         pb.bytes,
                         pb.shared_bytes_per_us,
                         pb.decode_sync,
                         pb.first_decode_chunk,
                         pb.energy};
    SimOptions fifo = opts;
    fifo.policy = Policy::Fifo;
    Timeline tl = run(locked, fifo);
    tl.policy = policy_name(Policy::MllmExecutor);
    return tl;
  }
  pb.g.validate();
  if (pb.dur.size() != pb.g.tasks().size())
    throw ShapeError("[simulate] " + std::to_string(pb.dur.size()) + " durations for " +
                     std::to_string(pb.g.size()) + " tasks");
  for (size_t i = 0; i < pb.dur.size(); ++i)
    if (!std::isfinite(pb.dur[i]) || pb.dur[i] < 0)
      throw InvalidArgument("[simulate] task " + std::to_string(i) + " '" + pb.g.tasks()[i].name +
                            "' has duration " + std::to_string(pb.dur[i]) + " µs");
  if (pb.g.empty()) {
    Timeline tl;
    tl.policy = policy_name(opts.policy);
    return tl;
  }
  if (opts.steal_threshold && *opts.steal_threshold < 0)
    throw InvalidArgument("[simulate] steal_threshold must be >= 0, got " +
                          std::to_string(*opts.steal_threshold));
  if (opts.policy == Policy::PositionSteal) {
    const double ratio = cpu_over_npu_time_ratio(pb);
    const int64_t threshold =
        opts.steal_threshold ? *opts.steal_threshold : static_cast<int64_t>(std::lround(ratio));
    Timeline tl = list_schedule(pb, opts.policy, threshold);
    tl.steal_threshold = threshold;
    tl.steal_cpu_over_npu_time_ratio = ratio;
    return tl;
  }
  if (opts.policy != Policy::Optimal) return list_schedule(pb, opts.policy);
  // Branch and bound works on fixed durations: the optimum ignores memory contention.
  Problem fixed = pb;
  fixed.shared_bytes_per_us = nullptr;
  return optimal(fixed, opts);
}

Timeline optimal(const Problem& pb, const SimOptions& opts) {
  if (pb.g.size() > opts.optimal_max_tasks)
    throw InvalidArgument("[simulate] optimal policy on " + std::to_string(pb.g.size()) +
                          " tasks: at most " + std::to_string(opts.optimal_max_tasks) +
                          " (branch and bound is exponential); use ooe, fifo or inorder");
  // Incumbent: the best heuristic schedule.
  Timeline inc = list_schedule(pb, Policy::OutOfOrder);
  for (Policy p : {Policy::Fifo, Policy::InOrder}) {
    Timeline t = list_schedule(pb, p);
    if (t.makespan_us < inc.makespan_us) inc = t;
  }
  return optimal_schedule(pb, opts, inc.makespan_us, inc);
}
}  // namespace

std::span<const PolicyInfo> policies() { return kPolicies; }

const char* policy_name(Policy p) {
  for (const auto& i : kPolicies)
    if (i.policy == p) return i.name;
  return "?";
}

Policy policy_from_name(const std::string& s) {
  std::string known;
  for (const auto& i : kPolicies) {
    if (s == i.name || s == i.alias) return i.policy;
    known += (known.empty() ? "" : ", ") + std::string(i.name);
  }
  throw InvalidArgument("[simulate] unknown policy '" + s + "' (known: " + known +
                        "; aliases inorder, fifo, ooe, position, steal)");
}

nlohmann::json Timeline::summary() const {
  nlohmann::json procs = nlohmann::json::object();
  for (int p = 0; p < soc::kNumProcessors; ++p) {
    const auto& u = usage[static_cast<size_t>(p)];
    if (u.tasks == 0) continue;
    procs[soc::processor_name(static_cast<soc::Processor>(p))] = {
        {"busy_ms", u.busy_us / 1e3},
        {"bubble_rate", u.bubble_rate},
        {"contention_ms", u.contention_us / 1e3},
        {"tasks", u.tasks},
        {"energy_mj", u.energy_mj}};
  }
  nlohmann::json s = {{"policy", policy},
                      {"device", device},
                      {"makespan_ms", makespan_us / 1e3},
                      {"energy_mj", energy_mj},
                      {"static_energy_mj", static_energy_mj},
                      {"dram_energy_mj", dram_energy_mj},
                      {"peak_working_bytes", peak_working_bytes},
                      {"decisions", decisions},
                      {"decision_us_mean",
                       decisions ? decision_ns_total / 1e3 / static_cast<double>(decisions) : 0.0},
                      {"processors", procs}};
  if (steal_threshold >= 0) {
    s["steal_threshold"] = steal_threshold;
    s["steal_cpu_over_npu_time_ratio"] = steal_cpu_over_npu_time_ratio;
  }
  return s;
}

std::vector<double> task_durations_us(const TaskGraph& g, const soc::CostModel& cost) {
  std::vector<double> d;
  d.reserve(g.tasks().size());
  for (const auto& t : g.tasks()) d.push_back(cost.latency_us(t.ops, t.processor));
  return d;
}

TaskGraph executor_graph(const TaskGraph& g, int64_t threads) {
  if (threads < 1)
    throw InvalidArgument("[simulate] executor_threads must be >= 1, got " +
                          std::to_string(threads));
  TaskGraph out = g;
  std::map<int64_t, std::vector<int64_t>> by_chunk;  // chunk -> its tasks in program order
  for (const auto& t : g.tasks())
    if (t.chunk >= 0) by_chunk[t.chunk].push_back(t.id);
  std::vector<const std::vector<int64_t>*> chunks;
  for (const auto& [_, ids] : by_chunk) chunks.push_back(&ids);
  for (size_t c = 1; c < chunks.size(); ++c) {
    const auto &cur = *chunks[c], &prev = *chunks[c - 1];
    for (size_t i = 0; i < std::min(cur.size(), prev.size()); ++i) out.add_dep(cur[i], prev[i]);
    if (c >= static_cast<size_t>(threads))
      out.add_dep(cur.front(), chunks[c - static_cast<size_t>(threads)]->back());
  }
  return out;
}

Timeline simulate(const TaskGraph& g, const soc::CostModel& cost, const SimOptions& opts) {
  g.validate();
  Problem pb{g,
             task_durations_us(g, cost),
             [&cost](soc::Processor a, soc::Processor b) { return cost.sync_us(a, b); },
             {},
             g.successors(),
             {},
             {},
             {}};
  if (opts.first_decode_chunk >= 0) {
    if (!opts.decode_cost)
      throw InvalidArgument("[simulate] first_decode_chunk " +
                            std::to_string(opts.first_decode_chunk) +
                            " needs the decoding steps' cost model (SimOptions::decode_cost)");
    const soc::CostModel* dc = opts.decode_cost;
    pb.decode_sync = [dc](soc::Processor a, soc::Processor b) { return dc->sync_us(a, b); };
    pb.first_decode_chunk = opts.first_decode_chunk;
  }
  const bool steal = opts.policy == Policy::PositionSteal;
  if (steal)  // what each task would take on the CPU, should it be stolen
    for (const auto& t : g.tasks())
      pb.cpu_dur.push_back(
          t.processor == soc::Processor::Npu ? cost.latency_us(t.ops, soc::Processor::Cpu) : 0.0);
  pb.energy = cost.energy_model();
  if ((opts.memory_contention && cost.has_memory_model()) || pb.energy.dram_pj_per_byte > 0)
    for (const auto& t : g.tasks()) {
      double b = 0;
      for (const auto& o : t.ops) b += soc::dram_bytes(o);
      pb.bytes.push_back(b);
    }
  if (opts.memory_contention && cost.has_memory_model()) {
    pb.shared_bytes_per_us = [&cost](const std::vector<soc::Processor>& procs) {
      return cost.shared_bandwidth_gbps(procs) * 1e3;  // GB/s = 1e3 bytes/µs
    };
  }
  for (int p = 0; p < soc::kNumProcessors; ++p) {
    const auto proc = static_cast<soc::Processor>(p);
    const bool used = (steal && proc == soc::Processor::Cpu) ||
                      std::any_of(g.tasks().begin(), g.tasks().end(),
                                  [&](const Task& t) { return t.processor == proc; });
    pb.power_w[static_cast<size_t>(p)] = used ? cost.active_power_w(proc) : 0.0;
  }
  Timeline tl = run(pb, opts);
  tl.device = cost.profile().name();
  return tl;
}

Timeline simulate(const TaskGraph& g, const std::vector<double>& duration_us, double sync_us,
                  const SimOptions& opts) {
  Problem pb{g,
             duration_us,
             [sync_us](soc::Processor a, soc::Processor b) { return a == b ? 0.0 : sync_us; },
             {},
             g.successors(),
             {},
             {},
             {}};
  if (opts.policy == Policy::PositionSteal && duration_us.size() == g.tasks().size()) {
    if (!opts.steal_cpu_time_ratio || !(*opts.steal_cpu_time_ratio > 0) ||
        !std::isfinite(*opts.steal_cpu_time_ratio))
      throw InvalidArgument(
          "[simulate] position-steal with given durations needs steal_cpu_time_ratio > 0 (how "
          "much longer a stolen NPU task runs on the CPU), got " +
          (opts.steal_cpu_time_ratio ? std::to_string(*opts.steal_cpu_time_ratio) : "none"));
    for (double d : duration_us) pb.cpu_dur.push_back(d * *opts.steal_cpu_time_ratio);
  }
  return run(pb, opts);
}

nlohmann::json to_trace_json(const TaskGraph& g, const Timeline& t) {
  auto events = nlohmann::json::array();
  for (int p = 0; p < soc::kNumProcessors; ++p) {
    // The cold-start lanes (io, cpu-aux) only when something ran there.
    const auto proc = static_cast<soc::Processor>(p);
    if ((proc == soc::Processor::Io || proc == soc::Processor::CpuAux) &&
        std::none_of(t.spans.begin(), t.spans.end(),
                     [&](const TaskSpan& s) { return s.processor == proc; }))
      continue;
    events.push_back({{"ph", "M"},
                      {"pid", 1},
                      {"tid", p},
                      {"name", "thread_name"},
                      {"args", {{"name", soc::processor_name(static_cast<soc::Processor>(p))}}}});
  }
  events.push_back({{"ph", "M"},
                    {"pid", 1},
                    {"name", "process_name"},
                    {"args", {{"name", "socllm " + t.device + " (" + t.policy + ")"}}}});
  for (const auto& s : t.spans) {
    const auto& task = g.at(s.task);
    events.push_back({{"ph", "X"},
                      {"pid", 1},
                      {"tid", static_cast<int>(s.processor)},
                      {"name", task.name},
                      {"cat", task_kind_name(task.kind)},
                      {"ts", s.start_us},
                      {"dur", s.end_us - s.start_us},
                      {"args", {{"task", task.id}, {"chunk", task.chunk}, {"layer", task.layer}}}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", t.summary()}};
}

}  // namespace socllm::sched
