#include "sched/head_pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

namespace socllm::sched {

namespace {

constexpr std::array<HeadPolicyInfo, 4> kHeadPolicies = {{
    {HeadPolicy::Sequential, "sequential",
     "each launch, then its heads' top-k and sparse attention, then the next launch (seed 000 "
     "Fig. 9(1))"},
    {HeadPolicy::Pipelined, "pipelined",
     "launches and heads in head order, NPU and CPU overlapping (seed 000 Fig. 9(2)/(3))"},
    {HeadPolicy::Greedy, "greedy",
     "seed 000 Algorithm 1: at each step the launch, and within it the head, that minimizes the "
     "pipeline latency"},
    {HeadPolicy::Optimal, "optimal",
     "exact minimum over all launch orders and head orders within launches (branch and bound)"},
}};
constexpr double kInf = std::numeric_limits<double>::infinity();

// Pipeline state of Algorithm 1: when the NPU, the top-k stage and the attention stage are free.
struct State {
  double npu = 0, topk = 0, qkv = 0;
};

// One head after its launch finished at s.npu (Algorithm 1 lines 7-8 / 11-12).
State place_head(const HeadPipelineProblem& p, State s, int64_t h) {
  const auto i = static_cast<size_t>(h);
  double start = std::max(s.npu + p.sync_us, s.topk);
  if (p.shared_cpu) start = std::max(start, s.qkv);
  s.topk = start + p.topk_us[i];
  s.qkv = std::max(s.qkv, s.topk) + p.qkv_us[i];
  return s;
}

// Algorithm 1, C/GPUPlan: the heads of one launch (finished at s.npu), each step the head whose
// attention ends first; ties keep the earlier head.
std::pair<std::vector<int64_t>, State> cgpu_plan(const HeadPipelineProblem& p, State s,
                                                 const std::vector<int64_t>& heads) {
  std::vector<int64_t> res;
  std::vector<bool> used(heads.size(), false);
  for (size_t step = 0; step < heads.size(); ++step) {
    double t_min = kInf;
    size_t sel = heads.size();
    for (size_t j = 0; j < heads.size(); ++j) {
      if (used[j]) continue;
      const double t = place_head(p, s, heads[j]).qkv;
      if (t < t_min) {
        t_min = t;
        sel = j;
      }
    }
    used[sel] = true;
    res.push_back(heads[sel]);
    s = place_head(p, s, heads[sel]);
  }
  return {res, s};
}

bool same_times(const HeadPipelineProblem& p, int64_t a, int64_t b) {
  return p.topk_us[static_cast<size_t>(a)] == p.topk_us[static_cast<size_t>(b)] &&
         p.qkv_us[static_cast<size_t>(a)] == p.qkv_us[static_cast<size_t>(b)];
}

// Launches with equal NPU time and equal multisets of head times are interchangeable.
bool same_launch(const HeadPipelineProblem& p, size_t a, size_t b) {
  if (p.launch_us[a] != p.launch_us[b] || p.launches[a].size() != p.launches[b].size())
    return false;
  auto key = [&](size_t l) {
    std::vector<std::pair<double, double>> v;
    for (int64_t h : p.launches[l])
      v.emplace_back(p.topk_us[static_cast<size_t>(h)], p.qkv_us[static_cast<size_t>(h)]);
    std::sort(v.begin(), v.end());
    return v;
  };
  return key(a) == key(b);
}

// Depth-first branch and bound over launch orders and head orders within launches.
struct Search {
  Search(const HeadPipelineProblem& prob, int64_t max) : p(prob), max_nodes(max) {}
  const HeadPipelineProblem& p;
  int64_t max_nodes;
  int64_t nodes = 0;
  double best = kInf;
  std::vector<int64_t> launch_order, head_order, best_launch, best_head;
  std::vector<bool> launch_used, head_used;
  double rest_cpu = 0;  // work the CPU stage that finishes last still has to do

  void heads_of(size_t launch, State s, size_t placed) {
    const auto& hs = p.launches[launch];
    if (placed == hs.size()) {
      next_launch(s);
      return;
    }
    for (size_t j = 0; j < hs.size(); ++j) {
      const int64_t h = hs[j];
      if (head_used[static_cast<size_t>(h)]) continue;
      bool dup = false;  // an interchangeable head earlier in the launch is tried instead
      for (size_t i = 0; i < j && !dup; ++i)
        dup = !head_used[static_cast<size_t>(hs[i])] && same_times(p, hs[i], h);
      if (dup) continue;
      if (++nodes > max_nodes)
        throw Unsupported("[HeadPipelinePlanner] optimal: more than " + std::to_string(max_nodes) +
                          " search nodes for " + std::to_string(p.n_heads()) + " heads in " +
                          std::to_string(p.launches.size()) + " launches");
      const State t = place_head(p, s, h);
      const double w = p.qkv_us[static_cast<size_t>(h)] +
                       (p.shared_cpu ? p.topk_us[static_cast<size_t>(h)] : 0.0);
      rest_cpu -= w;
      if (t.qkv + rest_cpu < best) {
        head_used[static_cast<size_t>(h)] = true;
        head_order.push_back(h);
        heads_of(launch, t, placed + 1);
        head_order.pop_back();
        head_used[static_cast<size_t>(h)] = false;
      }
      rest_cpu += w;
    }
  }

  void next_launch(State s) {
    if (launch_order.size() == p.launches.size()) {
      if (s.qkv < best) {
        best = s.qkv;
        best_launch = launch_order;
        best_head = head_order;
      }
      return;
    }
    for (size_t l = 0; l < p.launches.size(); ++l) {
      if (launch_used[l]) continue;
      bool dup = false;
      for (size_t i = 0; i < l && !dup; ++i) dup = !launch_used[i] && same_launch(p, i, l);
      if (dup) continue;
      State t = s;
      t.npu += p.launch_us[l];
      launch_used[l] = true;
      launch_order.push_back(static_cast<int64_t>(l));
      heads_of(l, t, 0);
      launch_order.pop_back();
      launch_used[l] = false;
    }
  }
};

std::string id_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::span<const HeadPolicyInfo> head_policies() { return kHeadPolicies; }

const char* head_policy_name(HeadPolicy p) { return kHeadPolicies.at(static_cast<size_t>(p)).name; }

HeadPolicy head_policy_from_name(const std::string& s) {
  std::string known;
  for (const auto& p : kHeadPolicies) {
    if (s == p.name) return p.policy;
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  throw InvalidArgument("[HeadPipelinePlanner] unknown head policy '" + s + "' (" + known + ")");
}

void HeadPipelineProblem::validate() const {
  const std::string f = "[HeadPipelineProblem] ";
  const size_t n = topk_us.size();
  if (qkv_us.size() != n)
    throw InvalidArgument(f + "qkv_us has " + std::to_string(qkv_us.size()) + " heads, topk_us " +
                          std::to_string(n));
  if (launch_us.size() != launches.size())
    throw InvalidArgument(f + "launch_us has " + std::to_string(launch_us.size()) +
                          " entries for " + std::to_string(launches.size()) + " launches");
  auto check = [&](const std::vector<double>& v, const char* name) {
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]) || v[i] < 0)
        throw InvalidArgument(f + name + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) +
                              " (needs a finite time >= 0)");
  };
  check(topk_us, "topk_us");
  check(qkv_us, "qkv_us");
  check(launch_us, "launch_us");
  if (!std::isfinite(sync_us) || sync_us < 0)
    throw InvalidArgument(f + "sync_us = " + std::to_string(sync_us));
  std::vector<int> seen(n, 0);
  for (size_t l = 0; l < launches.size(); ++l) {
    if (launches[l].empty()) throw InvalidArgument(f + "launch " + std::to_string(l) + " is empty");
    for (int64_t h : launches[l]) {
      if (h < 0 || static_cast<size_t>(h) >= n)
        throw InvalidArgument(f + "launch " + std::to_string(l) + " names head " +
                              std::to_string(h) + " of " + std::to_string(n));
      if (seen[static_cast<size_t>(h)]++)
        throw InvalidArgument(f + "head " + std::to_string(h) + " is in two launches");
    }
  }
  for (size_t h = 0; h < n; ++h)
    if (!seen[h]) throw InvalidArgument(f + "head " + std::to_string(h) + " is in no launch");
}

nlohmann::json HeadPipelineProblem::to_json() const {
  return {{"topk_us", topk_us},     {"qkv_us", qkv_us},   {"launches", launches},
          {"launch_us", launch_us}, {"sync_us", sync_us}, {"shared_cpu", shared_cpu}};
}

HeadPipelineProblem HeadPipelineProblem::from_json(const nlohmann::json& j) {
  HeadPipelineProblem p;
  try {
    p.topk_us = j.at("topk_us").get<std::vector<double>>();
    p.qkv_us = j.at("qkv_us").get<std::vector<double>>();
    p.launches = j.at("launches").get<std::vector<std::vector<int64_t>>>();
    p.launch_us = j.at("launch_us").get<std::vector<double>>();
    p.sync_us = j.value("sync_us", 0.0);
    p.shared_cpu = j.value("shared_cpu", true);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("[HeadPipelineProblem] ") + e.what());
  }
  p.validate();
  return p;
}

nlohmann::json HeadPipelinePlan::to_json() const {
  return {{"policy", policy},
          {"launch_order", launch_order},
          {"head_order", head_order},
          {"latency_us", latency_us},
          {"orders_evaluated", orders_evaluated},
          {"planner_ns", planner_ns}};
}

double pipeline_latency_us(const HeadPipelineProblem& p, std::span<const int64_t> launch_order,
                           std::span<const int64_t> head_order, bool sequential) {
  p.validate();
  const size_t nl = p.launches.size(), nh = p.topk_us.size();
  if (launch_order.size() != nl || head_order.size() != nh)
    throw InvalidArgument("[pipeline_latency_us] orders of " + std::to_string(launch_order.size()) +
                          " launches and " + std::to_string(head_order.size()) + " heads for " +
                          std::to_string(nl) + " and " + std::to_string(nh));
  std::vector<bool> seen(nl, false);
  State s;
  size_t k = 0;
  for (int64_t l : launch_order) {
    if (l < 0 || static_cast<size_t>(l) >= nl || seen[static_cast<size_t>(l)])
      throw InvalidArgument("[pipeline_latency_us] launch order is not a permutation: " +
                            std::to_string(l));
    seen[static_cast<size_t>(l)] = true;
    if (sequential && k > 0) s.npu = std::max(s.npu, s.qkv + p.sync_us);
    s.npu += p.launch_us[static_cast<size_t>(l)];
    // Heads of this launch come next in the head order (the CPU follows the launches).
    const auto& hs = p.launches[static_cast<size_t>(l)];
    for (size_t j = 0; j < hs.size(); ++j, ++k) {
      const int64_t h = head_order[k];
      if (std::find(hs.begin(), hs.end(), h) == hs.end())
        throw InvalidArgument("[pipeline_latency_us] head order " +
                              id_list({head_order.begin(), head_order.end()}) +
                              " does not follow launch " + std::to_string(l) + " " + id_list(hs));
      s = place_head(p, s, h);
    }
  }
  return s.qkv;
}

std::vector<std::vector<int64_t>> fuse_launches(std::span<const int64_t> bucket_of_head,
                                                int64_t max_fused_heads) {
  if (max_fused_heads < 0)
    throw InvalidArgument("[fuse_launches] max_fused_heads must be >= 0, got " +
                          std::to_string(max_fused_heads));
  std::vector<std::vector<int64_t>> out;
  std::map<int64_t, size_t> open;  // bucket -> its launch still taking heads
  for (size_t h = 0; h < bucket_of_head.size(); ++h) {
    const int64_t b = bucket_of_head[h];
    if (b < 0)
      throw InvalidArgument("[fuse_launches] head " + std::to_string(h) + " has bucket " +
                            std::to_string(b) + " (needs >= 0)");
    auto it = open.find(b);
    if (it == open.end() ||
        (max_fused_heads > 0 && static_cast<int64_t>(out[it->second].size()) >= max_fused_heads)) {
      out.push_back({});
      open[b] = out.size() - 1;
      it = open.find(b);
    }
    out[it->second].push_back(static_cast<int64_t>(h));
  }
  return out;
}

HeadPipelinePlan HeadPipelinePlanner::plan(const HeadPipelineProblem& p, HeadPolicy policy) const {
  p.validate();
  const auto t0 = std::chrono::steady_clock::now();
  HeadPipelinePlan r;
  r.policy = head_policy_name(policy);
  const size_t nl = p.launches.size();
  switch (policy) {
    case HeadPolicy::Sequential:
    case HeadPolicy::Pipelined: {
      // Head order: launches by their first head (fuse_launches lists them so).
      std::vector<int64_t> order(nl);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return *std::min_element(p.launches[static_cast<size_t>(a)].begin(),
                                 p.launches[static_cast<size_t>(a)].end()) <
               *std::min_element(p.launches[static_cast<size_t>(b)].begin(),
                                 p.launches[static_cast<size_t>(b)].end());
      });
      r.launch_order = order;
      for (int64_t l : order) {
        auto hs = p.launches[static_cast<size_t>(l)];
        std::sort(hs.begin(), hs.end());
        r.head_order.insert(r.head_order.end(), hs.begin(), hs.end());
      }
      r.orders_evaluated = 1;
      r.latency_us =
          pipeline_latency_us(p, r.launch_order, r.head_order, policy == HeadPolicy::Sequential);
      break;
    }
    case HeadPolicy::Greedy: {
      // Algorithm 1, Plan(): launches fused beforehand (line 15); each planning step tries
      // every remaining launch with its heads placed by C/GPUPlan and keeps the one whose last
      // attention ends first (ties: the earlier launch).
      State s;
      std::vector<bool> used(nl, false);
      for (size_t step = 0; step < nl; ++step) {
        double t_min = kInf;
        size_t sel = nl;
        for (size_t l = 0; l < nl; ++l) {
          if (used[l]) continue;
          State t = s;
          t.npu += p.launch_us[l];
          const auto [res, after] = cgpu_plan(p, t, p.launches[l]);
          r.orders_evaluated += 1;
          if (after.qkv < t_min) {
            t_min = after.qkv;
            sel = l;
          }
        }
        used[sel] = true;
        r.launch_order.push_back(static_cast<int64_t>(sel));
        s.npu += p.launch_us[sel];
        // Line 27 recomputes the selected launch's C/GPUPlan; its head order is the one the
        // step chose (line 25 appends `res`, which in the pseudo-code holds the last candidate's
        // order: we append the selected launch's, the evident intent).
        const auto [res, after] = cgpu_plan(p, s, p.launches[sel]);
        r.head_order.insert(r.head_order.end(), res.begin(), res.end());
        s = after;
      }
      r.latency_us = s.qkv;
      break;
    }
    case HeadPolicy::Optimal: {
      Search search(p, o_.optimal_max_nodes);
      search.launch_used.assign(nl, false);
      search.head_used.assign(p.topk_us.size(), false);
      for (size_t h = 0; h < p.topk_us.size(); ++h)
        search.rest_cpu += p.qkv_us[h] + (p.shared_cpu ? p.topk_us[h] : 0.0);
      // Algorithm 1's plan bounds the search from the start.
      const HeadPipelinePlan g = plan(p, HeadPolicy::Greedy);
      search.best = g.latency_us;
      search.best_launch = g.launch_order;
      search.best_head = g.head_order;
      search.next_launch(State{});
      r.launch_order = search.best_launch;
      r.head_order = search.best_head;
      r.latency_us = search.best;
      r.orders_evaluated = search.nodes;
      break;
    }
  }
  r.planner_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

nlohmann::json apply_head_pipeline(TaskGraph& g, const soc::CostModel& cost, HeadPolicy policy,
                                   const HeadPipelineOptions& o) {
  struct Group {
    std::vector<int64_t> estimates;
    std::map<int64_t, int64_t> topk, attn;  // head -> task
  };
  std::map<std::pair<int64_t, int64_t>, Group> groups;  // (chunk, layer)
  for (const Task& t : g.tasks()) {
    if (t.heads.empty()) continue;
    Group& gr = groups[{t.chunk, t.layer}];
    if (t.kind == TaskKind::Estimate) gr.estimates.push_back(t.id);
    if (t.kind == TaskKind::TopK) gr.topk[t.heads.at(0)] = t.id;
    if (t.kind == TaskKind::SparseAttention) gr.attn[t.heads.at(0)] = t.id;
  }
  const HeadPipelinePlanner planner(o);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, gr] : groups) {
    if (gr.estimates.empty() || gr.topk.empty()) continue;
    const Task& e0 = g.at(gr.estimates.front());
    const Task& k0 = g.at(gr.topk.begin()->second);
    if (e0.processor == k0.processor) continue;  // one processor: the builder's order stands
    const auto n = static_cast<int64_t>(gr.topk.size());
    if (static_cast<int64_t>(gr.attn.size()) != n || gr.topk.rbegin()->first != n - 1 ||
        gr.attn.rbegin()->first != n - 1)
      throw InvalidArgument("[apply_head_pipeline] chunk " + std::to_string(key.first) + " layer " +
                            std::to_string(key.second) +
                            ": top-k and attention tasks do not cover heads 0.." +
                            std::to_string(n - 1) + " once each");
    HeadPipelineProblem p;
    for (int64_t h = 0; h < n; ++h) {
      const Task& tk = g.at(gr.topk.at(h));
      const Task& ta = g.at(gr.attn.at(h));
      p.topk_us.push_back(cost.latency_us(tk.ops, tk.processor));
      p.qkv_us.push_back(cost.latency_us(ta.ops, ta.processor));
      p.shared_cpu = tk.processor == ta.processor;
    }
    for (int64_t e : gr.estimates) {
      p.launches.push_back(g.at(e).heads);
      p.launch_us.push_back(cost.latency_us(g.at(e).ops, g.at(e).processor));
    }
    p.sync_us = cost.sync_us(e0.processor, k0.processor);
    const HeadPipelinePlan plan = planner.plan(p, policy);
    // Write the plan as edges: NPU launches in order, CPU tasks in order.
    for (size_t i = 1; i < plan.launch_order.size(); ++i)
      g.add_dep(gr.estimates[static_cast<size_t>(plan.launch_order[i])],
                gr.estimates[static_cast<size_t>(plan.launch_order[i - 1])]);
    int64_t prev = -1;
    size_t k = 0;
    for (size_t i = 0; i < plan.launch_order.size(); ++i) {
      const auto l = static_cast<size_t>(plan.launch_order[i]);
      if (policy == HeadPolicy::Sequential && prev >= 0) g.add_dep(gr.estimates[l], prev);
      for (size_t j = 0; j < p.launches[l].size(); ++j, ++k) {
        const int64_t h = plan.head_order[k];
        if (prev >= 0) g.add_dep(gr.topk.at(h), prev);
        prev = gr.attn.at(h);
      }
    }
    out.push_back({{"chunk", key.first},
                   {"layer", key.second},
                   {"plan", plan.to_json()},
                   {"problem", p.to_json()}});
  }
  g.validate();
  return out;
}

}  // namespace socllm::sched
