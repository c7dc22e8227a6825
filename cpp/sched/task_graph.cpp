#include "sched/task_graph.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <set>

namespace socllm::sched {

namespace {
constexpr std::array<const char*, kNumTaskKinds> kTaskKindNames = {
    "attn_in",  "attention", "o_proj",           "mlp_in", "mlp_act",
    "down",     "shadow",    "graph_build",      "embed",  "lm_head",
    "estimate", "topk",      "sparse_attention", "load",   "unpack"};
}  // namespace

const char* task_kind_name(TaskKind k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < kNumTaskKinds ? kTaskKindNames[static_cast<size_t>(i)] : "other";
}

TaskKind task_kind_from_name(const std::string& s) {
  for (int i = 0; i < kNumTaskKinds; ++i)
    if (s == kTaskKindNames[static_cast<size_t>(i)]) return static_cast<TaskKind>(i);
  if (s == "other") return TaskKind::Other;
  throw InvalidArgument("[TaskGraph] unknown task kind '" + s + "'");
}

int64_t TaskGraph::add(Task t) {
  t.id = size();
  tasks_.push_back(std::move(t));
  return tasks_.back().id;
}

const Task& TaskGraph::at(int64_t id) const {
  if (id < 0 || id >= size())
    throw InvalidArgument("[TaskGraph] task id " + std::to_string(id) + " out of range (" +
                          std::to_string(size()) + " tasks)");
  return tasks_[static_cast<size_t>(id)];
}

void TaskGraph::add_dep(int64_t task, int64_t dep) {
  at(task);
  at(dep);
  if (task == dep)
    throw InvalidArgument("[TaskGraph] task " + std::to_string(task) + " cannot depend on itself");
  auto& d = tasks_[static_cast<size_t>(task)].deps;
  if (std::find(d.begin(), d.end(), dep) == d.end()) d.push_back(dep);
}

std::vector<std::vector<int64_t>> TaskGraph::successors() const {
  std::vector<std::vector<int64_t>> out(tasks_.size());
  for (const auto& t : tasks_)
    for (int64_t d : t.deps)
      if (d >= 0 && d < size()) out[static_cast<size_t>(d)].push_back(t.id);
  return out;
}

void TaskGraph::validate() const {
  for (const auto& t : tasks_) {
    std::set<int64_t> seen;
    for (int64_t d : t.deps) {
      if (d < 0 || d >= size())
        throw InvalidArgument("[TaskGraph] task " + std::to_string(t.id) + " '" + t.name +
                              "' depends on task " + std::to_string(d) +
                              ", which does not exist (" + std::to_string(size()) + " tasks)");
      if (d == t.id)
        throw InvalidArgument("[TaskGraph] task " + std::to_string(t.id) + " '" + t.name +
                              "' depends on itself");
      if (!seen.insert(d).second)
        throw InvalidArgument("[TaskGraph] task " + std::to_string(t.id) + " '" + t.name +
                              "' lists dependency " + std::to_string(d) + " twice");
    }
  }
  // Cycle check by depth-first search, reporting one cycle.
  enum : char { kNew, kOpen, kDone };
  std::vector<char> state(tasks_.size(), kNew);
  for (int64_t root = 0; root < size(); ++root) {
    if (state[static_cast<size_t>(root)] != kNew) continue;
    // iterative DFS over dependencies: (task, next dep index)
    std::vector<std::pair<int64_t, size_t>> st{{root, 0}};
    state[static_cast<size_t>(root)] = kOpen;
    while (!st.empty()) {
      auto& [u, i] = st.back();
      const auto& deps = tasks_[static_cast<size_t>(u)].deps;
      if (i == deps.size()) {
        state[static_cast<size_t>(u)] = kDone;
        st.pop_back();
        continue;
      }
      const int64_t v = deps[i++];
      if (state[static_cast<size_t>(v)] == kOpen) {
        std::string cyc = tasks_[static_cast<size_t>(v)].name;
        bool in = false;
        for (const auto& [w, _] : st) {
          if (w == v) in = true;
          if (in && w != v) cyc += " <- " + tasks_[static_cast<size_t>(w)].name;
        }
        throw InvalidArgument("[TaskGraph] dependency cycle: " + cyc + " <- " +
                              tasks_[static_cast<size_t>(v)].name);
      }
      if (state[static_cast<size_t>(v)] == kNew) {
        state[static_cast<size_t>(v)] = kOpen;
        st.push_back({v, 0});
      }
    }
  }
}

std::vector<int64_t> TaskGraph::topological_order() const {
  validate();
  std::vector<int64_t> indeg(tasks_.size());
  for (const auto& t : tasks_)
    indeg[static_cast<size_t>(t.id)] = static_cast<int64_t>(t.deps.size());
  const auto succ = successors();
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> ready;
  for (int64_t i = 0; i < size(); ++i)
    if (indeg[static_cast<size_t>(i)] == 0) ready.push(i);
  std::vector<int64_t> order;
  order.reserve(tasks_.size());
  while (!ready.empty()) {
    const int64_t u = ready.top();
    ready.pop();
    order.push_back(u);
    for (int64_t v : succ[static_cast<size_t>(u)])
      if (--indeg[static_cast<size_t>(v)] == 0) ready.push(v);
  }
  return order;
}

nlohmann::json TaskGraph::to_json() const {
  auto arr = nlohmann::json::array();
  for (const auto& t : tasks_) {
    auto ops = nlohmann::json::array();
    for (const auto& o : t.ops) ops.push_back(o.to_json());
    arr.push_back({{"id", t.id},
                   {"name", t.name},
                   {"kind", task_kind_name(t.kind)},
                   {"processor", soc::processor_name(t.processor)},
                   {"chunk", t.chunk},
                   {"layer", t.layer},
                   {"deps", t.deps},
                   {"working_bytes", t.working_bytes},
                   {"ops", ops}});
    if (!t.heads.empty()) arr.back()["heads"] = t.heads;
  }
  return {
      {"format", "socllm-task-graph"}, {"version", kJsonVersion}, {"meta", meta}, {"tasks", arr}};
}

TaskGraph TaskGraph::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("tasks") || !j["tasks"].is_array())
    throw FormatError("[TaskGraph] JSON needs an object with a 'tasks' array");
  if (j.contains("version") && j["version"] != kJsonVersion)
    throw FormatError("[TaskGraph] JSON version " + json_text(j["version"]) +
                      " (this socllm reads " + std::to_string(kJsonVersion) + ")");
  TaskGraph g;
  if (j.contains("meta")) g.meta = j["meta"];
  int64_t i = 0;
  for (const auto& jt : j["tasks"]) {
    try {
      Task t;
      t.name = jt.value("name", "task" + std::to_string(i));
      t.kind = task_kind_from_name(jt.value("kind", std::string("other")));
      t.processor = soc::processor_from_name(jt.at("processor").get<std::string>());
      t.chunk = jt.value("chunk", int64_t{-1});
      t.layer = jt.value("layer", int64_t{-1});
      t.deps = jt.value("deps", std::vector<int64_t>{});
      t.working_bytes = jt.value("working_bytes", int64_t{0});
      t.heads = jt.value("heads", std::vector<int64_t>{});
      for (const auto& jo : jt.value("ops", nlohmann::json::array()))
        t.ops.push_back(soc::OpDesc::from_json(jo));
      if (jt.contains("id") && jt["id"].get<int64_t>() != i)
        throw FormatError("id " + json_text(jt["id"]) + " out of order (expected " +
                          std::to_string(i) + ")");
      g.add(std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw FormatError("[TaskGraph] task " + std::to_string(i) + ": " + e.what());
    } catch (const FormatError& e) {
      throw FormatError("[TaskGraph] task " + std::to_string(i) + ": " + e.what());
    }
    ++i;
  }
  g.validate();
  return g;
}

}  // namespace socllm::sched
