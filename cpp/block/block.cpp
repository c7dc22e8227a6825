#include "block/block.h"

#include <algorithm>
#include <cmath>

#include "core/core.h"
#include "kernels/kernels.h"

namespace socllm {

namespace {

sched::TaskKind task_kind_of(SubgraphKind k) {
  return static_cast<sched::TaskKind>(static_cast<int>(k));
}

bool contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

void add_unique(std::vector<int64_t>& v, int64_t x) {
  if (x >= 0 && !contains(v, x)) v.push_back(x);
}

}  // namespace

// ---- records ----

nlohmann::json OpRecord::to_json() const {
  nlohmann::json parts_j = nlohmann::json::array();
  for (const auto& p : parts)
    parts_j.push_back({{"processor", soc::processor_name(p.processor)},
                       {"rows", {p.row_begin, p.row_end}},
                       {"cols", {p.col_begin, p.col_end}}});
  return {{"chunk", chunk},
          {"layer", layer},
          {"op", op},
          {"decode", decode},
          {"processor", soc::processor_name(processor)},
          {"format", format},
          {"rows", rows},
          {"real_rows", real_rows},
          {"in_width", in_width},
          {"out_width", out_width},
          {"elements", elements},
          {"weight_bytes", weight_bytes},
          {"kv_len", kv_len},
          {"kept", kept},
          {"parts", parts_j},
          {"shadow_channels", shadow_channels}};
}

void ChunkObservation::reset(const ModelConfig& c) {
  shadow.assign(static_cast<size_t>(c.n_layers * kNumLinearSites), {});
  buckets.assign(static_cast<size_t>(c.n_layers * c.n_heads), -1);
  rescore_share.assign(static_cast<size_t>(c.n_layers), -1.0);
}

const char* LayerRun::store(OpClass c, float* y, int64_t n) const {
  const soc::DType f = plan->at(c).format;
  // binary16 overflows to infinity beyond 65504 (Gemma 3's residual stream does): a typed error
  // naming where, not NaN logits.
  if (f == soc::DType::Fp16 && !kernels::round_to_fp16(y, n))
    throw Unsupported(
        "[Engine] plan '" + plan->name + "' stores op class '" + op_class_name(c) +
        "' in fp16, which overflows in layer " + std::to_string(layer) + " of " + config->name +
        " (|x| > 65504); place it in fp32" +
        (c == OpClass::Residual ? ", or scale the stream (plan option residual_scale=auto)" : ""));
  return soc::dtype_name(f);
}

void LayerRun::record(OpRecord r) const {
  if (!records) return;
  r.chunk = chunk;
  r.layer = layer;
  r.decode = decode;
  int64_t real = 0;
  for (const auto& s : *seqs) real += s.T;
  r.real_rows = real;
  records->push_back(std::move(r));
}

// ---- the loop ----

void BlockOpKind::tasks(const BlockOpInfo& op, GraphRecorder& g) const {
  g.add_op(op, g.plan().at(op.op_class).processor,
           describe(op, g.config(), g.plan(), g.layer(), g.rows(), g.kv_len()));
}

bool run_layer(std::span<const BlockOpInfo> ops, LayerRun* run, GraphRecorder* rec,
               OpHooks* hooks) {
  if (rec) rec->begin_layer(run ? run->layer : rec->layer());
  for (const BlockOpInfo& op : ops) {
    const BlockOpKind& kind = block_op_kind(op.op);
    if (run) {
      check_interrupt();  // Ctrl-C stops a long call within one op's time
      if (hooks) hooks->before(op, *run);
      kind.run(op, *run);
    }
    if (rec) kind.tasks(op, *rec);
    if (run && hooks && !hooks->after(op, *run)) return false;
  }
  return true;
}

// ---- the recorder ----

struct GraphRecorder::Open {
  sched::Task task;
  SubgraphKind subgraph;
  size_t first_op = 0, last_op = 0;  // indices in the config's op list
  bool has_attention = false;
  int64_t act_in = 0, act_out = 0;  // the linear's activations (working bytes)
};

GraphRecorder::GraphRecorder(ModelConfig config, Plan plan, AttentionTimingOptions attention)
    : c_(std::move(config)), plan_(std::move(plan)), attn_(std::move(attention)) {
  c_.validate();
  plan_.validate_placement();
  decode_plan_ = plan_.for_decode();
  attn_.validate(c_);
  prev_attention_.resize(static_cast<size_t>(c_.n_layers));
  builds_.assign(static_cast<size_t>(c_.n_layers), -1);
}

GraphRecorder::~GraphRecorder() = default;
GraphRecorder::GraphRecorder(GraphRecorder&&) noexcept = default;
GraphRecorder& GraphRecorder::operator=(GraphRecorder&&) noexcept = default;

std::string GraphRecorder::prefix() const {
  // prompt chunks "c<i>.", decoding steps "d<i>."
  return (decode_ ? "d" + std::to_string(decode_steps_ - 1) : "c" + std::to_string(chunk_)) + ".L" +
         std::to_string(layer_) + ".";
}

std::string GraphRecorder::attention_core() const { return attn_.resolved_core(plan()); }

void GraphRecorder::add_graph_builds(int64_t rows, double build_ms, double optimize_ms) {
  for (int64_t l = 0; l < c_.n_layers; ++l) {
    sched::Task t;
    t.name = "build.L" + std::to_string(l) + ".r" + std::to_string(rows);
    t.kind = sched::TaskKind::GraphBuild;
    t.processor = soc::Processor::Npu;
    t.layer = l;
    soc::OpDesc op;
    op.kind = soc::OpKind::Fixed;
    op.name = "graph_build";
    op.fixed_us = 1000.0 * (build_ms + optimize_ms) / static_cast<double>(c_.n_layers);
    t.ops.push_back(op);
    if (l > 0) t.deps.push_back(builds_[static_cast<size_t>(l - 1)]);
    builds_[static_cast<size_t>(l)] = graph_.add(std::move(t));
  }
}

void GraphRecorder::begin_chunk(int64_t chunk, int64_t rows, int64_t kv_len, bool decode,
                                std::span<const ShadowLoad> shadow) {
  if (rows <= 0 || kv_len < rows)
    throw InvalidArgument("[GraphRecorder] chunk " + std::to_string(chunk) + ": rows " +
                          std::to_string(rows) + ", kv_len " + std::to_string(kv_len));
  decode_ = decode;
  phase_plan_ = decode ? &decode_plan_ : &plan_;
  if (decode) ++decode_steps_;
  chunk_ = chunk;
  rows_ = rows;
  kv_len_ = kv_len;
  layer_ = 0;
  seen_ = nullptr;
  const bool shadowed = plan().linear.shadow.has_value();
  if (shadowed && static_cast<int64_t>(shadow.size()) != c_.n_layers * kNumLinearSites)
    throw ShapeError("[GraphRecorder] shadow loads: " + std::to_string(shadow.size()) + " given, " +
                     std::to_string(c_.n_layers * kNumLinearSites) +
                     " (n_layers x 4) expected for plan '" + plan().name + "'");
  shadow_.assign(shadow.begin(), shadow.end());
  // Chunks depend on each other through attention only (Eq. 2); a decoding step waits for the
  // LM head that sampled its token.
  if (!decode) frontier_.clear();
}

void GraphRecorder::begin_layer(int64_t layer) {
  if (layer != layer_) close_open();  // a task holds ops of one layer
  layer_ = layer;
}

ShadowLoad GraphRecorder::shadow_load(LinearSite site) const {
  const size_t i = static_cast<size_t>(layer_ * kNumLinearSites + static_cast<int>(site));
  ShadowLoad sl = i < shadow_.size() ? shadow_[i] : ShadowLoad{};
  if (seen_ && i < seen_->shadow.size()) {
    sl.outlier_channels = static_cast<double>(seen_->shadow[i].outlier_channels);
    sl.cold_fetch_bytes = static_cast<double>(seen_->shadow[i].cold_fetch_bytes);
  }
  return sl;
}

std::span<const int64_t> GraphRecorder::head_buckets() const {
  const int64_t H = c_.n_heads;
  if (seen_ && !seen_->buckets.empty()) {
    const std::span<const int64_t> b(seen_->buckets.data() + layer_ * H, static_cast<size_t>(H));
    if (std::all_of(b.begin(), b.end(), [](int64_t x) { return x >= 0; })) return b;
  }
  if (attn_.head_buckets.empty()) return {};
  return {attn_.head_buckets.data() + layer_ * H, static_cast<size_t>(H)};
}

double GraphRecorder::rescore_share() const {
  if (seen_ && static_cast<int64_t>(seen_->rescore_share.size()) > layer_ &&
      seen_->rescore_share[static_cast<size_t>(layer_)] >= 0)
    return seen_->rescore_share[static_cast<size_t>(layer_)];
  return attn_.rescore_share;
}

int64_t GraphRecorder::add_task(sched::Task t, bool reads_kv) {
  t.chunk = chunk_;
  t.layer = layer_;
  for (int64_t d : frontier_) add_unique(t.deps, d);
  if (reads_kv)  // Eq. 2: the KV of earlier chunks of this layer
    for (int64_t p : prev_attention_[static_cast<size_t>(layer_)]) add_unique(t.deps, p);
  const int64_t build = builds_[static_cast<size_t>(layer_)];
  if (t.processor == soc::Processor::Npu) add_unique(t.deps, build);
  return graph_.add(std::move(t));
}

void GraphRecorder::close_open() {
  if (!open_) return;
  std::unique_ptr<Open> o = std::move(open_);
  const auto ops = decoder_block(c_, plan_.rotation.online_down);
  // Named by the subgraph when it holds all of it, else by its first op.
  const bool whole = (o->first_op == 0 || ops[o->first_op - 1].subgraph != o->subgraph) &&
                     (o->last_op + 1 == ops.size() || ops[o->last_op + 1].subgraph != o->subgraph);
  o->task.name = prefix() + subgraph_kind_name(o->subgraph) +
                 (whole ? "" : std::string(".") + o->task.ops.front().name);
  o->task.kind = task_kind_of(o->subgraph);
  // Activations alive while the task runs, at fp16 (the NPU/CPU buffers of seed 001 §3.4).
  o->task.working_bytes = 2 * (o->act_in + o->act_out + rows_ * c_.d_model);
  const std::vector<int64_t> inputs = frontier_;
  const int64_t id = add_task(std::move(o->task), o->has_attention);
  if (o->has_attention) prev_attention_[static_cast<size_t>(layer_)] = {id};
  frontier_ = {id};
  if (pending_shadow_) {
    // The shadow part reads the linear's input and runs beside it; the next task adds its
    // result (Eq. 1).
    sched::Task sh;
    sh.kind = sched::TaskKind::Shadow;
    sh.name = prefix() + "shadow." + pending_shadow_name_;
    sh.processor = plan().at(OpClass::Shadow).processor;
    sh.chunk = chunk_;
    sh.layer = layer_;
    const soc::OpDesc& so = *pending_shadow_;
    sh.working_bytes = 4 * (so.m * so.k + so.m * so.n) + so.bytes;
    sh.ops = {so};
    sh.deps = inputs;
    frontier_.push_back(graph_.add(std::move(sh)));
    pending_shadow_.reset();
  }
}

void GraphRecorder::add_op(const BlockOpInfo& op, soc::Processor processor,
                           std::vector<soc::OpDesc> ops) {
  const auto block = decoder_block(c_, plan_.rotation.online_down);
  const auto it =
      std::find_if(block.begin(), block.end(), [&](const BlockOpInfo& b) { return b.op == op.op; });
  const size_t index = static_cast<size_t>(it - block.begin());
  // An open task takes the op if it is the next op of the same subgraph on the same processor
  // (a shadow part beside its linear merges into the task after it).
  if (open_ && (open_->subgraph != op.subgraph || open_->task.processor != processor ||
                open_->last_op + 1 != index))
    close_open();
  if (!open_) {
    open_ = std::make_unique<Open>();
    open_->task.processor = processor;
    open_->subgraph = op.subgraph;
    open_->first_op = index;
  }
  open_->last_op = index;
  open_->has_attention = open_->has_attention || op.op == BlockOp::Attention;
  if (op.site && !ops.empty()) {
    open_->act_in = ops.front().m * ops.front().k;
    open_->act_out = ops.front().m * ops.front().n;
  }
  for (auto& d : ops) open_->task.ops.push_back(std::move(d));
}

void GraphRecorder::add_parts(const BlockOpInfo& op, const soc::OpDesc& whole,
                              const sched::MatmulPartition& partition) {
  close_open();
  const std::string name = prefix() + subgraph_kind_name(op.subgraph) + "." + op.name;
  int64_t prepare = -1;
  if (plan().partition.space == sched::PartitionSpace::NpuOnline && !decode_) {
    // Graphs prepared for this length before the NPU's first part (seed 002 §5.2.2 times them
    // with the prefill: 408.4 ms of 1180 ms at 135 tokens); once per request.
    if (!online_prepare_added_) {
      sched::Task t;
      t.name = "online_prepare";
      t.kind = sched::TaskKind::GraphBuild;
      t.processor = soc::Processor::Npu;
      soc::OpDesc f;
      f.kind = soc::OpKind::Fixed;
      f.name = "online_prepare";
      const auto dev = plan().device_profile()->with_characterization(plan().characterization);
      f.fixed_us = online_prepare_ms(c_, dev, rows_) * 1e3;
      t.ops = {f};
      graph_.add(std::move(t));
      online_prepare_added_ = true;
    }
    for (const auto& t : graph_.tasks())
      if (t.name == "online_prepare") prepare = t.id;
  }
  std::vector<int64_t> parts;
  for (size_t i = 0; i < partition.parts.size(); ++i) {
    const auto& q = partition.parts[i];
    sched::Task t;
    t.kind = task_kind_of(op.subgraph);
    t.processor = q.processor;
    t.name = name + "." + soc::processor_name(q.processor) + std::to_string(i);
    t.ops = {sched::part_op(whole, q)};
    t.working_bytes = t.ops[0].activation_bytes;
    if (q.processor == soc::Processor::Npu && prepare >= 0) t.deps.push_back(prepare);
    parts.push_back(add_task(std::move(t), false));
  }
  frontier_ = parts;
}

void GraphRecorder::add_shadow(const BlockOpInfo& op, const soc::OpDesc& shadow) {
  pending_shadow_ = shadow;
  pending_shadow_name_ = op.name;
}

namespace {
// Adds an attention scheme's tasks under the layer's prefix, with the recorder's dependencies.
class RecorderSink final : public attention::TaskSink {
 public:
  RecorderSink(sched::TaskGraph& g, std::string prefix, int64_t chunk, int64_t layer, int64_t build)
      : g_(g), prefix_(std::move(prefix)), chunk_(chunk), layer_(layer), build_(build) {}
  int64_t add(const std::string& name, sched::TaskKind kind, soc::Processor processor,
              std::vector<soc::OpDesc> ops, std::vector<int64_t> heads, int64_t working_bytes,
              std::vector<int64_t> deps) override {
    sched::Task t;
    t.name = prefix_ + name;
    t.kind = kind;
    t.processor = processor;
    t.chunk = chunk_;
    t.layer = layer_;
    t.ops = std::move(ops);
    t.heads = std::move(heads);
    t.working_bytes = working_bytes;
    t.deps = std::move(deps);
    if (processor == soc::Processor::Npu) add_unique(t.deps, build_);
    return g_.add(std::move(t));
  }

 private:
  sched::TaskGraph& g_;
  std::string prefix_;
  int64_t chunk_, layer_, build_;
};
}  // namespace

void GraphRecorder::add_attention(const attention::AttentionScheme& scheme,
                                  const attention::TaskShape& shape) {
  close_open();
  std::vector<int64_t> deps = frontier_;
  for (int64_t p : prev_attention_[static_cast<size_t>(layer_)]) add_unique(deps, p);
  RecorderSink sink(graph_, prefix() + "attention.", chunk_, layer_,
                    builds_[static_cast<size_t>(layer_)]);
  frontier_ = scheme.kind->tasks(scheme, shape, sink, deps);
  prev_attention_[static_cast<size_t>(layer_)] = frontier_;
}

void GraphRecorder::end_chunk() { close_open(); }

void GraphRecorder::add_lm_head(int64_t rows) {
  close_open();
  sched::Task t;
  t.kind = sched::TaskKind::LmHead;
  t.name = decode_ ? "d" + std::to_string(decode_steps_ - 1) + ".lm_head" : "lm_head";
  const OpPlacement& p = plan().at(OpClass::LmHead);
  t.processor = p.processor;
  t.chunk = decode_ ? chunk_ : -1;
  // Final norm, then the LM head for the last position(s): a GEMV that streams its weights at
  // the DRAM rate (memory-bound, unlike the batched matmuls of Table 3).
  soc::OpDesc norm;
  norm.kind = soc::OpKind::Elementwise;
  norm.dtype = p.format;
  norm.elements = rows * c_.d_model;
  norm.name = "final_norm";
  norm.op_class = op_class_name(OpClass::LmHead);
  norm.weight_bytes = c_.d_model * static_cast<int64_t>(sizeof(float));
  soc::OpDesc head;
  head.kind = soc::OpKind::MemoryCopy;
  head.name = "lm_head";
  head.op_class = op_class_name(OpClass::LmHead);
  head.dtype = p.format;
  // W4A16 quantizes the LM head too (seed 002 §5.1): its stored bytes; else fp32 weights read
  // at the head's format.
  head.bytes = plan().lm_head_linear
                   ? quant::stored_weight_bytes(plan().linear, c_.vocab_size, c_.d_model)
                   : c_.vocab_size * c_.d_model * soc::dtype_bytes(p.format);
  head.weight_bytes = head.bytes;
  t.ops = {norm, head};
  t.working_bytes = 4 * rows * (c_.d_model + c_.vocab_size);
  t.deps = frontier_;
  frontier_ = {graph_.add(std::move(t))};
}

sched::TaskGraph GraphRecorder::take() {
  close_open();
  return std::move(graph_);
}

// ---- timing options ----

std::string AttentionTimingOptions::resolved_core(const Plan& plan) const {
  if (cpu_core != "auto") return cpu_core;
  return plan.attention.is_fp32() ? std::string() : std::string("mid");
}

void AttentionTimingOptions::validate(const ModelConfig& c) const {
  const std::string f = "[AttentionTimingOptions] ";
  const int64_t n = c.n_layers * c.n_heads;
  if (max_fused_heads < 0)
    throw InvalidArgument(f + "max_fused_heads must be >= 0, got " +
                          std::to_string(max_fused_heads));
  if (!head_ratios.empty() && static_cast<int64_t>(head_ratios.size()) != n)
    throw InvalidArgument(f + "head_ratios has " + std::to_string(head_ratios.size()) +
                          " entries, n_layers x n_heads = " + std::to_string(n));
  for (size_t i = 0; i < head_ratios.size(); ++i)
    if (!(head_ratios[i] > 0 && head_ratios[i] <= 1))
      throw InvalidArgument(f + "head_ratios[" + std::to_string(i) +
                            "] = " + std::to_string(head_ratios[i]) + " (needs (0, 1])");
  if (!head_buckets.empty() && static_cast<int64_t>(head_buckets.size()) != n)
    throw InvalidArgument(f + "head_buckets has " + std::to_string(head_buckets.size()) +
                          " entries, n_layers x n_heads = " + std::to_string(n));
  for (size_t i = 0; i < head_buckets.size(); ++i)
    if (head_buckets[i] < 0)
      throw InvalidArgument(f + "head_buckets[" + std::to_string(i) +
                            "] = " + std::to_string(head_buckets[i]) + " (needs >= 0)");
  if (!(rescore_share >= 0 && rescore_share <= 1))
    throw InvalidArgument(f + "rescore_share must be in [0, 1], got " +
                          std::to_string(rescore_share));
  if (cpu_core != "auto" && !cpu_core.empty() && cpu_core != "mid" && cpu_core != "prime" &&
      cpu_core != "small")
    throw InvalidArgument(f + "cpu_core '" + cpu_core + "' (auto, mid, prime, small or '')");
}

// ---- config-only graphs ----

int64_t prefill_graph_rows(int64_t prompt_len, int64_t chunk_len) {
  if (prompt_len <= 0)
    throw InvalidArgument("[prefill] prompt length must be positive, got " +
                          std::to_string(prompt_len));
  if (chunk_len < 0)
    throw InvalidArgument("[prefill] chunk length must be >= 0, got " + std::to_string(chunk_len));
  if (chunk_len == 0) return prompt_len;
  if (prompt_len >= chunk_len) return chunk_len;
  int64_t rows = kMinGraphRows;
  while (rows < prompt_len) rows *= 2;
  return std::min(rows, chunk_len);
}

int64_t prefill_chunks(int64_t prompt_len, int64_t chunk_len) {
  const int64_t rows = prefill_graph_rows(prompt_len, chunk_len);
  return (prompt_len + rows - 1) / rows;
}

double cold_fetch_bytes(const ModelConfig& c, LinearSite site, double channels, double hot_share) {
  return channels * (1.0 - hot_share) * static_cast<double>(linear_out_width(c, site)) *
         sizeof(float);
}

std::vector<ShadowLoad> expected_shadow_loads(const ModelConfig& c, const quant::ShadowOptions& o,
                                              double channels) {
  const int64_t L = c.n_layers, n = kNumLinearSites * L;
  const int64_t keep =
      n - static_cast<int64_t>(std::llround(o.pruning_rate * static_cast<double>(n)));
  // kept first: down inputs of evenly spaced layers, then the other inputs layer by layer
  std::vector<int64_t> order;  // input indices in keep order
  const int64_t downs = std::clamp<int64_t>(keep, 1, L);
  std::vector<bool> is_down(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < downs; ++i) {
    const int64_t layer =
        downs == 1 ? 0 : std::llround(static_cast<double>(i) * (L - 1) / (downs - 1));
    const int64_t idx = layer * kNumLinearSites + static_cast<int>(LinearSite::MlpAct);
    if (!is_down[static_cast<size_t>(idx)]) order.push_back(idx);
    is_down[static_cast<size_t>(idx)] = true;
  }
  for (int64_t i = 0; i < n; ++i)
    if (!is_down[static_cast<size_t>(i)]) order.push_back(i);
  std::vector<ShadowLoad> loads(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto& s = loads[static_cast<size_t>(i)];
    s.pruned = true;
    s.outlier_channels = channels;
    s.cold_fetch_bytes =
        cold_fetch_bytes(c, static_cast<LinearSite>(i % kNumLinearSites), channels, o.hot_share);
  }
  for (int64_t i = 0; i < std::max<int64_t>(keep, 0); ++i)
    loads[static_cast<size_t>(order[static_cast<size_t>(i)])].pruned = false;
  return loads;
}

double online_prepare_ms(const ModelConfig& c, const soc::DeviceProfile& device,
                         int64_t prompt_len) {
  const std::string g = "/cost_model/graph/", why = "online graph preparation (partition=online)";
  const double base = device.number(g + "online_prepare_base_ms", why);
  const double per_token = device.number(g + "online_prepare_ms_per_token", why);
  const double ref = device.rate(g + "online_prepare_reference_linear_params", why);
  const double scale = static_cast<double>(linear_params_per_block(c) * c.n_layers) / ref;
  return (base + per_token * static_cast<double>(prompt_len)) * scale;
}

int64_t resident_bytes(const ModelConfig& c, const Plan& plan, int64_t kv_len) {
  int64_t linears = 0;
  for (int s = 0; s < kNumLinearSites; ++s)
    linears += plan.linear_desc(c, static_cast<LinearSite>(s), 1).weight_bytes;
  const int64_t kv = 2 * c.n_layers * kv_len * c.kv_dim() * 2;
  const int64_t head = plan.lm_head_linear && !c.tie_embeddings
                           ? quant::stored_weight_bytes(plan.linear, c.vocab_size, c.d_model)
                           : 0;
  return c.n_layers * linears + c.vocab_size * c.d_model * 2 + head + kv;
}

nlohmann::json partitions_meta(const ModelConfig& c, const Plan& plan, int64_t prefill_rows,
                               bool decode) {
  nlohmann::json out = nlohmann::json::array();
  auto add = [&](const Plan& p, int64_t rows, bool dec) {
    const soc::CostModel cost =
        soc::timing_cost_model(*p.device_profile(), p.characterization, p.fast_sync, dec);
    const auto costs = sched::PartitionCosts::of(cost, p.partition_partner());
    for (int s = 0; s < kNumLinearSites; ++s) {
      const auto site = static_cast<LinearSite>(s);
      const auto part = p.partition_for(c, site, rows, dec);
      if (!part) continue;
      const soc::OpDesc lin = p.linear_desc(c, site, rows);
      out.push_back({{"site", lin.name},
                     {"phase", dec ? "decode" : "prefill"},
                     {"m", lin.m},
                     {"k", lin.k},
                     {"n", lin.n},
                     {"partition", part->to_json()},
                     {"predicted_us", sched::partition_time(lin, *part, costs).total_us}});
    }
  };
  if (prefill_rows > 0) add(plan, prefill_rows, false);
  if (decode) add(plan.for_decode(), 1, true);
  return out;
}

nlohmann::json graph_meta(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                          int64_t chunk_len, const std::string& phase, int64_t decode_tokens) {
  Plan as_run = plan;  // the plan as the prefill ran it: with this chunk length
  as_run.chunk_len = chunk_len;
  const bool decode = phase == "decode";
  nlohmann::json m = {
      {"config", c.name.empty() ? c.arch : c.name},
      {"plan", as_run.to_json()},
      {"prompt_len", prompt_len},
      {"chunk_len", chunk_len},
      {"graph_rows", decode ? 1 : prefill_graph_rows(prompt_len, chunk_len)},
      {"phase", phase},
      {"resident_bytes", resident_bytes(c, plan, prompt_len + decode_tokens + (decode ? 1 : 0))},
      {"characterization", plan.characterization},
      {"fast_sync", plan.fast_sync}};
  if (decode_tokens > 0) m["decode_tokens"] = decode_tokens;
  if (!decode) m["prompt_chunks"] = prefill_chunks(prompt_len, chunk_len);
  const nlohmann::json parts = partitions_meta(
      c, plan, decode ? 0 : prefill_graph_rows(prompt_len, chunk_len), phase != "prefill");
  if (!parts.empty()) m["partitions"] = parts;
  return m;
}

namespace {
void check_request(const ModelConfig& c, int64_t prompt_len, int64_t chunk_len,
                   int64_t decode_tokens, const char* who) {
  if (prompt_len > c.context_length)
    throw ContextOverflow(std::string("[") + who + "] prompt of " + std::to_string(prompt_len) +
                          " tokens exceeds the model's context length " +
                          std::to_string(c.context_length));
  if (chunk_len > c.context_length)
    throw InvalidArgument(std::string("[") + who + "] chunk length " + std::to_string(chunk_len) +
                          " exceeds the model's context length " +
                          std::to_string(c.context_length));
  if (decode_tokens < 0)
    throw InvalidArgument(std::string("[") + who + "] decode tokens must be >= 0, got " +
                          std::to_string(decode_tokens));
  if (decode_tokens > c.context_length - prompt_len)
    throw ContextOverflow(std::string("[") + who + "] " + std::to_string(prompt_len) +
                          " prompt tokens + " + std::to_string(decode_tokens) +
                          " decoded exceed the model's context length " +
                          std::to_string(c.context_length));
}

// Bounds a config-only graph's size before anything is recorded: a config or request from any
// input (n_layers 10^6, a session of 10^6 decoding steps) must not take the machine's memory.
// Per layer and chunk, a graph holds at most kTasksPerLayerBound tasks, plus
// kTasksPerHeadBound per head for a head-wise attention scheme (measured: 6 and 2.3 per head on
// Qwen2-0.5B); kMaxGraphTasks tasks take a few GB.
constexpr int64_t kTasksPerLayerBound = 8, kTasksPerHeadBound = 3;
constexpr int64_t kMaxGraphTasks = int64_t{1} << 22;
void check_graph_size(const ModelConfig& c, const Plan& plan, int64_t steps, const char* who) {
  const int64_t per_layer =
      kTasksPerLayerBound + (plan.attention.kind->head_wise() ? kTasksPerHeadBound : 0) * c.n_heads;
  // Products in double: each factor may be up to 2^31.
  const double tasks =
      static_cast<double>(c.n_layers) * static_cast<double>(steps) * static_cast<double>(per_layer);
  if (tasks > static_cast<double>(kMaxGraphTasks))
    throw InvalidArgument(
        std::string("[") + who + "] the task graph of " + std::to_string(c.n_layers) +
        " layers x " + std::to_string(steps) + " chunks/decoding steps would hold up to " +
        std::to_string(static_cast<int64_t>(tasks)) + " tasks, over the limit " + "of " +
        std::to_string(kMaxGraphTasks) + " (fewer layers, decoding steps, or longer chunks)");
}

// The shadow loads a config-only chunk records (expected ones).
std::vector<ShadowLoad> expected_loads(const ModelConfig& c, const Plan& plan,
                                       const GraphOptions& opts) {
  if (!plan.linear.shadow) return {};
  return opts.expected.empty() ? expected_shadow_loads(c, *plan.linear.shadow) : opts.expected;
}

// Records one chunk (or decoding step) of every layer from the config alone.
void record_chunk(GraphRecorder& rec, const ModelConfig& c, int64_t chunk, int64_t rows,
                  int64_t kv_len, bool decode, std::span<const ShadowLoad> loads) {
  rec.begin_chunk(chunk, rows, kv_len, decode, loads);
  const auto ops = decoder_block(c, rec.plan().rotation.online_down);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    rec.begin_layer(l);
    run_layer(ops, nullptr, &rec);
  }
  rec.end_chunk();
}
}  // namespace

sched::TaskGraph prefill_task_graph(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                    int64_t chunk_len, const GraphOptions& opts,
                                    int64_t decode_tokens) {
  const int64_t rows = prefill_graph_rows(prompt_len, chunk_len);
  check_request(c, prompt_len, chunk_len, decode_tokens, "prefill_task_graph");
  const int64_t chunks = prefill_chunks(prompt_len, chunk_len);
  check_graph_size(c, plan, chunks + decode_tokens, "prefill_task_graph");
  GraphRecorder rec(c, plan, opts.attention);
  if (opts.build_ms > 0 || opts.optimize_ms > 0)
    rec.add_graph_builds(rows, opts.build_ms, opts.optimize_ms);
  const auto loads = expected_loads(c, plan, opts);
  for (int64_t ch = 0; ch < chunks; ++ch)
    record_chunk(rec, c, ch, rows, (ch + 1) * rows, false, loads);
  rec.add_lm_head(1);
  if (decode_tokens > 0) {
    const auto dloads = expected_loads(c, plan.for_decode(), opts);
    for (int64_t s = 0; s < decode_tokens; ++s) {
      record_chunk(rec, c, chunks + s, 1, prompt_len + s + 1, true, dloads);
      rec.add_lm_head(1);
    }
  }
  sched::TaskGraph g = rec.take();
  g.meta = graph_meta(c, plan, prompt_len, chunk_len, decode_tokens > 0 ? "session" : "prefill",
                      decode_tokens);
  return g;
}

sched::TaskGraph decode_task_graph(const ModelConfig& c, const Plan& plan, int64_t kv_len,
                                   const GraphOptions& opts) {
  if (kv_len < 2)
    throw InvalidArgument(
        "[decode_task_graph] a decoding step needs a cache of at least one "
        "position (kv_len >= 2), got " +
        std::to_string(kv_len));
  check_request(c, kv_len - 1, 0, 1, "decode_task_graph");
  check_graph_size(c, plan.for_decode(), 1, "decode_task_graph");
  GraphRecorder rec(c, plan, opts.attention);
  record_chunk(rec, c, 0, 1, kv_len, true, expected_loads(c, plan.for_decode(), opts));
  rec.add_lm_head(1);
  sched::TaskGraph g = rec.take();
  g.meta = graph_meta(c, plan, kv_len - 1, 0, "decode");
  return g;
}

npu::StaticGraph describe_subgraph(const ModelConfig& c, const Plan& plan, SubgraphKind kind,
                                   int64_t layer, int64_t rows, int64_t chunk_index) {
  if (rows <= 0)
    throw InvalidArgument("[StaticGraph] rows must be > 0, got " + std::to_string(rows));
  if (layer < 0 || layer >= c.n_layers)
    throw InvalidArgument("[StaticGraph] layer " + std::to_string(layer) + " outside [0, " +
                          std::to_string(c.n_layers) + ")");
  npu::StaticGraph g;
  g.key = {kind, layer, rows, chunk_index};
  const int64_t kv_len = (std::max<int64_t>(chunk_index, 0) + 1) * rows;
  bool first = true;
  for (const BlockOpInfo& info : decoder_block(c, plan.rotation.online_down)) {
    if (info.subgraph != kind) continue;
    if (first) g.in_cols = op_in_width(c, info.op);
    first = false;
    g.out_cols = op_out_width(c, info.op);
    for (const auto& o : block_op_kind(info.op).describe(info, c, plan, layer, rows, kv_len)) {
      g.weight_bytes += o.weight_bytes;
      g.activation_bytes += o.activation_bytes;
    }
  }
  return g;
}

npu::GraphCacheStats graph_census(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                  int64_t chunk_len, bool sharing) {
  if (chunk_len <= 0)
    throw InvalidArgument("[graph_census] chunk_len must be > 0, got " + std::to_string(chunk_len));
  const int64_t rows = prefill_graph_rows(prompt_len, chunk_len);
  npu::GraphCache cache(sharing);
  const int64_t chunks = prefill_chunks(prompt_len, chunk_len);
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int k = 0; k < kSubgraphsPerLayer; ++k)
        cache.acquire(describe_subgraph(c, plan, static_cast<SubgraphKind>(k), l, rows, ch));
  return cache.stats();
}

}  // namespace socllm
