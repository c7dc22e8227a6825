#include "socllm/task_graph.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <set>

namespace socllm::sched {

namespace {
constexpr std::array<const char*, kNumTaskKinds> kTaskKindNames = {
    "attn_in", "attention", "o_proj", "mlp_in", "mlp_act", "down",
    "shadow",  "graph_build", "embed", "lm_head"};
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
                              "' depends on task " + std::to_string(d) + ", which does not exist (" +
                              std::to_string(size()) + " tasks)");
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
  for (const auto& t : tasks_) indeg[static_cast<size_t>(t.id)] = static_cast<int64_t>(t.deps.size());
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
  }
  return {{"format", "socllm-task-graph"}, {"tasks", arr}};
}

TaskGraph TaskGraph::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("tasks") || !j["tasks"].is_array())
    throw FormatError("[TaskGraph] JSON needs an object with a 'tasks' array");
  TaskGraph g;
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
      for (const auto& jo : jt.value("ops", nlohmann::json::array())) t.ops.push_back(soc::OpDesc::from_json(jo));
      if (jt.contains("id") && jt["id"].get<int64_t>() != i)
        throw FormatError("id " + jt["id"].dump() + " out of order (expected " + std::to_string(i) + ")");
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

// ---------------------------------------------------------------------------------------------

ShapeConfig ShapeConfig::from_json(const nlohmann::json& j) {
  ShapeConfig s;
  auto get = [&](const char* key) -> int64_t {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0)
      throw InvalidArgument(std::string("[ShapeConfig] model config needs a positive integer '") +
                            key + "'" + (j.contains(key) ? ", got " + j[key].dump() : ""));
    return j[key].get<int64_t>();
  };
  s.name = j.value("name", std::string("model"));
  s.d_model = get("d_model");
  s.n_layers = get("n_layers");
  s.n_heads = get("n_heads");
  s.n_kv_heads = get("n_kv_heads");
  s.head_dim = get("head_dim");
  s.d_ff = get("d_ff");
  s.vocab_size = get("vocab_size");
  const std::string mlp = j.value("mlp", std::string("gated"));
  if (mlp != "gated" && mlp != "plain")
    throw InvalidArgument("[ShapeConfig] unknown mlp '" + mlp + "' (gated, plain)");
  s.gated_mlp = mlp == "gated";
  return s;
}

Placement Placement::llm_npu() {
  // llm.npu runs linears on the NPU and implements RMSNorm, SiLU, RoPE as QNN ops (seed 001
  // §4 "Implementation"); attention and the shadow outlier part run on the CPU (§3.4).
  Placement p;
  p.processor.fill(soc::Processor::Npu);
  p.processor[static_cast<size_t>(TaskKind::Attention)] = soc::Processor::Cpu;
  return p;
}

Placement Placement::all_on(soc::Processor proc, soc::DType linear, soc::DType flt) {
  Placement p;
  p.processor.fill(proc);
  p.linear_dtype = linear;
  p.float_dtype = flt;
  return p;
}

PrefillGraphBuilder::PrefillGraphBuilder(ShapeConfig shapes, Placement placement)
    : s_(std::move(shapes)), p_(placement),
      prev_attention_(static_cast<size_t>(s_.n_layers), -1),
      builds_(static_cast<size_t>(s_.n_layers), -1) {}

void PrefillGraphBuilder::add_graph_builds(int64_t rows, double build_ms, double optimize_ms) {
  for (int64_t l = 0; l < s_.n_layers; ++l) {
    Task t;
    t.name = "build.L" + std::to_string(l) + ".r" + std::to_string(rows);
    t.kind = TaskKind::GraphBuild;
    t.processor = soc::Processor::Npu;
    t.layer = l;
    soc::OpDesc op;
    op.kind = soc::OpKind::Fixed;
    op.fixed_us = 1000.0 * (build_ms + optimize_ms) / static_cast<double>(s_.n_layers);
    t.ops.push_back(op);
    if (l > 0) t.deps.push_back(builds_[static_cast<size_t>(l - 1)]);
    builds_[static_cast<size_t>(l)] = graph_.add(std::move(t));
  }
}

namespace {
soc::OpDesc matmul(soc::DType dt, int64_t m, int64_t k, int64_t n, int64_t group_size) {
  soc::OpDesc o;
  o.kind = soc::OpKind::MatMul;
  o.dtype = dt;
  o.m = m;
  o.k = k;
  o.n = n;
  o.groups = group_size > 0 ? std::max<int64_t>(1, (k + group_size - 1) / group_size) : 1;
  return o;
}
soc::OpDesc elementwise(soc::DType dt, int64_t elements) {
  soc::OpDesc o;
  o.kind = soc::OpKind::Elementwise;
  o.dtype = dt;
  o.elements = elements;
  return o;
}
}  // namespace

void PrefillGraphBuilder::add_chunk(int64_t chunk, int64_t rows, int64_t kv_len,
                                    const std::vector<ShadowLoad>& shadow) {
  if (rows <= 0 || kv_len < rows)
    throw InvalidArgument("[PrefillGraphBuilder] chunk " + std::to_string(chunk) + ": rows " +
                          std::to_string(rows) + ", kv_len " + std::to_string(kv_len));
  if (!shadow.empty() && static_cast<int64_t>(shadow.size()) != s_.n_layers * 4)
    throw ShapeError("[PrefillGraphBuilder] shadow loads: " + std::to_string(shadow.size()) +
                     " given, " + std::to_string(s_.n_layers * 4) + " (n_layers x 4) expected");
  const auto ld = p_.linear_dtype, fd = p_.float_dtype;
  const int64_t g = p_.linear_group_size;
  const std::string cp = "c" + std::to_string(chunk) + ".";
  int64_t prev = -1;
  int64_t pending_shadow = -1;  // shadow task the next subgraph also waits for (Eq. 1 merge)
  // The four linear inputs in shadow order: which subgraph, its matmul's k and n.
  struct Lin { TaskKind kind; int64_t k, n; };
  const std::array<Lin, 4> lins = {{{TaskKind::AttnIn, s_.d_model, s_.qkv_out()},
                                    {TaskKind::OProj, s_.n_heads * s_.head_dim, s_.d_model},
                                    {TaskKind::MlpIn, s_.d_model, s_.mlp_in_out()},
                                    {TaskKind::Down, s_.d_ff, s_.d_model}}};
  for (int64_t l = 0; l < s_.n_layers; ++l) {
    const std::string lp = cp + "L" + std::to_string(l) + ".";
    for (int k = 0; k < 6; ++k) {
      const auto kind = static_cast<TaskKind>(k);
      Task t;
      t.kind = kind;
      t.name = lp + task_kind_name(kind);
      t.processor = p_.processor[static_cast<size_t>(k)];
      t.chunk = chunk;
      t.layer = l;
      switch (kind) {
        case TaskKind::AttnIn:
          t.ops = {elementwise(fd, rows * s_.d_model), matmul(ld, rows, s_.d_model, s_.qkv_out(), g)};
          break;
        case TaskKind::Attention: {
          soc::OpDesc a;
          a.kind = soc::OpKind::Attention;
          a.dtype = fd;
          a.m = rows;
          a.k = s_.head_dim;
          a.n = s_.n_heads;
          a.elements = kv_len;
          t.ops = {elementwise(fd, rows * s_.qkv_out()), a};  // RoPE, then attention
          break;
        }
        case TaskKind::OProj:
          t.ops = {matmul(ld, rows, s_.n_heads * s_.head_dim, s_.d_model, g),
                   elementwise(fd, rows * s_.d_model)};  // + residual
          break;
        case TaskKind::MlpIn:
          t.ops = {elementwise(fd, rows * s_.d_model), matmul(ld, rows, s_.d_model, s_.mlp_in_out(), g)};
          break;
        case TaskKind::MlpAct:
          t.ops = {elementwise(fd, rows * s_.d_ff * (s_.gated_mlp ? 2 : 1))};
          break;
        default:  // Down
          t.ops = {matmul(ld, rows, s_.d_ff, s_.d_model, g), elementwise(fd, rows * s_.d_model)};
          break;
      }
      int64_t act_in = 0, act_out = 0;
      for (const auto& o : t.ops) {
        if (o.kind == soc::OpKind::MatMul) { act_in = o.m * o.k; act_out = o.m * o.n; }
      }
      t.working_bytes = 2 * (act_in + act_out + rows * s_.d_model);
      if (prev >= 0) t.deps.push_back(prev);  // Eq. 3: intra-chunk order
      if (pending_shadow >= 0) t.deps.push_back(pending_shadow);
      if (kind == TaskKind::Attention && prev_attention_[static_cast<size_t>(l)] >= 0)
        t.deps.push_back(prev_attention_[static_cast<size_t>(l)]);  // Eq. 2: KV of earlier chunks
      if (builds_[static_cast<size_t>(l)] >= 0 && t.processor == soc::Processor::Npu &&
          std::find(t.deps.begin(), t.deps.end(), builds_[static_cast<size_t>(l)]) == t.deps.end())
        t.deps.push_back(builds_[static_cast<size_t>(l)]);
      const int64_t prev_before = prev;
      prev = graph_.add(std::move(t));
      pending_shadow = -1;
      if (kind == TaskKind::Attention) prev_attention_[static_cast<size_t>(l)] = prev;
      // The shadow part of this subgraph's linear reads the same input and runs beside it;
      // the next subgraph adds its result (Eq. 1).
      for (int s = 0; s < 4 && !shadow.empty(); ++s) {
        if (lins[static_cast<size_t>(s)].kind != kind) continue;
        const auto& sl = shadow[static_cast<size_t>(l * 4 + s)];
        if (sl.pruned || sl.outlier_channels <= 0) continue;
        Task sh;
        sh.kind = TaskKind::Shadow;
        sh.name = lp + "shadow." + task_kind_name(kind);
        sh.processor = soc::Processor::Cpu;
        sh.chunk = chunk;
        sh.layer = l;
        soc::OpDesc o;
        o.kind = soc::OpKind::OutlierMatMul;
        o.dtype = soc::DType::Fp32;
        o.m = rows;
        o.k = static_cast<int64_t>(std::ceil(sl.outlier_channels));
        o.n = lins[static_cast<size_t>(s)].n;
        o.bytes = static_cast<int64_t>(sl.cold_fetch_bytes);
        sh.ops = {o};
        sh.working_bytes = 4 * (o.m * o.k + o.m * o.n) + o.bytes;
        if (prev_before >= 0) sh.deps.push_back(prev_before);
        pending_shadow = graph_.add(std::move(sh));
      }
    }
  }
}

void PrefillGraphBuilder::add_lm_head(int64_t rows) {
  Task t;
  t.kind = TaskKind::LmHead;
  t.name = "lm_head";
  t.processor = soc::Processor::Cpu;
  // Final norm, then the LM head for the last position(s): a GEMV that streams its fp16
  // weights at the DRAM rate (memory-bound, unlike the batched matmuls of Table 3).
  soc::OpDesc head;
  head.kind = soc::OpKind::MemoryCopy;
  head.bytes = s_.vocab_size * s_.d_model * 2;
  t.ops = {elementwise(p_.float_dtype, rows * s_.d_model), head};
  // after the last subgraph of every chunk: the last task added so far
  for (int64_t i = graph_.size() - 1; i >= 0; --i) {
    if (graph_.at(i).kind == TaskKind::Down) { t.deps.push_back(i); break; }
  }
  graph_.add(std::move(t));
}

TaskGraph build_prefill_graph(const ShapeConfig& shapes, const Placement& placement,
                              int64_t prompt_len, int64_t chunk_len,
                              const std::vector<ShadowLoad>& shadow) {
  if (prompt_len <= 0)
    throw InvalidArgument("[build_prefill_graph] prompt_len must be positive, got " +
                          std::to_string(prompt_len));
  if (chunk_len <= 0) chunk_len = prompt_len;
  PrefillGraphBuilder b(shapes, placement);
  const int64_t chunks = (prompt_len + chunk_len - 1) / chunk_len;
  for (int64_t c = 0; c < chunks; ++c) b.add_chunk(c, chunk_len, (c + 1) * chunk_len, shadow);
  b.add_lm_head(1);
  return b.take();
}

}  // namespace socllm::sched
