// Block layer: the decoder block's ops, each owning both interpretations (DESIGN.md, "one task
// graph, two interpretations"): `run` computes its numerics on a batch of rows, `tasks` records
// what it computes for the timing graph. One loop (run_layer) calls both, op by op, so what ran
// and what is timed cannot disagree; a config-only graph is the same loop without `run`.
//
// The op list and its facts (classes, subgraphs, widths, linear sites, fused tensors) are
// model/decoder_block.h's; the op kinds (ops/*.cpp, one file each: norm, linear, rope,
// attention, activation, residual) implement them, and attention dispatches to the plan's
// attention scheme (attention/), which owns its numerics and its tasks the same way.
//
// The graph (GraphRecorder) follows llm.npu (seed 001 §3.2, §3.4): a task is a run of
// consecutive ops of one subgraph placed on one processor (move the norms to the CPU and
// attn_in becomes two tasks); within a chunk each task waits for the previous one (Eq. 3); the
// task holding a chunk's attention waits for the same layer's attention of the previous chunk,
// whose KV it reads (Eq. 2); a shadow-outlier linear adds a CPU task beside its task, which the
// next task waits for (Eq. 1's merge); a partitioned linear is one task per part (seed 002
// §4.1) on the NPU and its partner; a head-wise attention scheme adds its own tasks (seed 000
// Eq. 4). Decoding steps are the same block on one row (the plan's decode placement), each
// ending with the LM head that samples the next token.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attention/attention_scheme.h"
#include "block/kv_cache.h"
#include "calibration/calibration.h"
#include "model/decoder_block.h"
#include "model/model.h"
#include "npu/static_graph.h"
#include "plan/plan.h"
#include "quant/linear_scheme.h"
#include "sched/task_graph.h"

namespace socllm {

// ---- What a run did (the op-by-op harness compares it with the recorded tasks) ----

struct OpRecord {
  int64_t chunk = -1;  // chunk (or decoding step, counted after the prompt's chunks)
  int64_t layer = 0;
  std::string op;  // the block op's name
  bool decode = false;
  soc::Processor processor = soc::Processor::Cpu;  // whose numerics it computed
  std::string format;  // what it stored (fp16 rounding done or not) / a linear's compute format
  int64_t rows = 0;    // rows it computed (a static graph's padding included)
  int64_t in_width = 0, out_width = 0;  // values per row read and written
  int64_t elements = 0;                 // element-wise ops: values transformed
  int64_t weight_bytes = 0;             // constants read, as stored
  int64_t kv_len = 0;                   // attention: keys its graph covers (window-capped)
  int64_t real_rows = 0;                // rows that are not padding
  std::vector<int64_t> kept;            // key-selecting attention: pairs attended per head
  struct Part {
    soc::Processor processor;
    int64_t row_begin, row_end, col_begin, col_end;
  };
  std::vector<Part> parts;       // a partitioned linear: the blocks computed, in order
  int64_t shadow_channels = -1;  // shadow-outlier linear: outlier channels (-1: no CPU part)
  nlohmann::json to_json() const;
};

// ---- Numerics: one layer of a batch of rows ----

// The rows of one sequence in a batch.
struct SeqRows {
  KVCache* cache = nullptr;
  int64_t row0 = 0;
  int64_t T = 0;  // real (non-padding) rows, the first T of the sequence's rows
  // The plan's attention scheme applies (prefill rows); decoding steps run full attention.
  bool plan_attention = true;
};

// What the ops of a chunk saw, for the tasks of the same loop (and the engine's counters).
struct ChunkObservation {
  std::vector<quant::ShadowStats> shadow;  // [n_layers * 4] per linear input (shadow outliers)
  std::vector<int64_t> buckets;            // [n_layers * n_heads] shadow-attn's scale buckets
  std::vector<double> rescore_share;       // [n_layers] certified rescoring over causal pairs
  void reset(const ModelConfig& c);
};

// Everything an op's run reads and writes. The engine fills it per call and per layer.
struct LayerRun {
  const Model* model = nullptr;
  const ModelConfig* config = nullptr;
  const Plan* plan = nullptr;  // the phase's plan (Plan::for_decode for decoding steps)
  bool decode = false;
  int64_t chunk = -1;            // for records
  int64_t N = 0;                 // rows, padding included
  const int64_t* pos = nullptr;  // [N] absolute positions
  std::vector<SeqRows>* seqs = nullptr;
  std::span<const quant::RowSegment> segments;  // real rows of each sequence
  // Buffers, row-major: x [N, d] the residual stream; h [N, d]; qkv [N, qkv_dim];
  // att [N, q_dim]; gu [N, mlp_in_dim]; act [N, d_ff]; o [N, d].
  float *x = nullptr, *h = nullptr, *qkv = nullptr, *att = nullptr, *gu = nullptr, *act = nullptr,
        *o = nullptr;
  // kernels::attention_scratch_floats(T, past + T, ...) floats for the longest sequence.
  float* attention_scratch = nullptr;
  // The NPU's tile grid (rows, columns) on the plan's device: float linears off the CPU compute
  // tile by tile, so a partition aligned to it computes every tile as the whole linear does.
  int64_t tile_m = 32, tile_n = 256;
  // Plan::residual_scale as resolved (1: none): what the embeddings and the outputs the residual
  // adds carry, and eps·c² in the norms reading the stream.
  float residual_scale = 1.0f;
  // Per layer:
  int64_t layer = 0;
  const LayerWeights* weights = nullptr;
  // The layer's linears prepared for the plan (null: fp32, the model's weights), and its
  // attention/MLP norm gains (with a folded input smoothing).
  std::array<const quant::PreparedLinear*, kNumLinearSites> linears{};
  std::array<const float*, 2> norm_gain{};
  const attention::LayerConsts* attention = nullptr;  // null: full fp32 attention
  const float* inv_freq = nullptr;                    // this layer's RoPE frequencies
  // Outputs besides the buffers (each optional).
  ChunkObservation* seen = nullptr;
  std::vector<OpRecord>* records = nullptr;

  // The op class's format applied to an op's output y[n]: binary16 rounding for fp16
  // (Unsupported naming the layer if a value overflows it). Returns the format's name.
  const char* store(OpClass c, float* y, int64_t n) const;
  void record(OpRecord r) const;
};

// Instrumentation of a run (calibration statistics, captures, ablations), around each op.
class OpHooks {
 public:
  virtual ~OpHooks() = default;
  virtual void before(const BlockOpInfo& op, LayerRun& r) {}
  // false: stop the run after this op (the rest of the model is not needed).
  virtual bool after(const BlockOpInfo& op, LayerRun& r) { return true; }
};

// ---- Timing: the task graph ----

// Head-wise timing options of plans whose attention is not fp32 (seed 000).
struct AttentionTimingOptions {
  // Core class of /cost_model/cpu_core the attention's CPU ops are timed on ("mid", "prime",
  // "small"; "" = the whole CPU's /cost_model/cpu rates). "auto": "mid" (seed 000 §4-5: one mid
  // core is the CPU budget of every baseline) for non-fp32 attention, "" for fp32 (today's
  // whole-CPU attention task; pass "mid" to time seed 000's C/G-Full).
  std::string cpu_core = "auto";
  // Heads fused into one NPU launch at most (seed 000 §3.4 measures fused graphs of 1, 2 and 4
  // heads; 0: no limit, 1: no fusion).
  int64_t max_fused_heads = 4;
  // [n_layers * n_heads] keep ratios per query head in (0, 1] (e.g. Eq. 3's from calibration);
  // empty: the plan's keep for every head.
  std::vector<double> head_ratios;
  // [n_layers * n_heads] scale-bucket id of each head (heads of a layer sharing an id may fuse);
  // empty: every head of a layer in one bucket (the upper bound of fusion; our assumption for
  // shape-only configs, since which bucket a head's input falls in is only known at run time).
  std::vector<int64_t> head_buckets;
  // Certified shadow-attn: the share of a head's causal (query, key) pairs rescored in fp32,
  // timed as an fp32 Q·Kᵀ on the top-k task's core. 1 (default for shape-only configs) is the
  // bound's worst case; a recorded prefill uses what the engine rescored in each layer.
  double rescore_share = 1.0;
  // The core class the options resolve to for `plan` ("auto" as above).
  std::string resolved_core(const Plan& plan) const;
  // InvalidArgument naming the field: sizes, ratios outside (0, 1], negative buckets or limits.
  void validate(const ModelConfig& c) const;
};

// The CPU work of one shadow-outlier linear input in one chunk.
struct ShadowLoad {
  bool pruned = false;          // CPU part pruned (no task)
  double outlier_channels = 0;  // channels gathered into the dense tensor
  double cold_fetch_bytes = 0;  // float weight columns read from flash
  bool operator==(const ShadowLoad&) const = default;
};

// Records the tasks of a request chunk by chunk (the chunk's plan: the prompt's, or
// Plan::for_decode for decoding steps). Ops call it from their tasks().
class GraphRecorder {
 public:
  GraphRecorder(ModelConfig config, Plan plan, AttentionTimingOptions attention = {});
  // Static graphs built at run time before the first chunk (naive NPU execution builds and
  // optimizes one graph per prompt shape, seed 001 §2.2): one NPU task per layer.
  void add_graph_builds(int64_t rows, double build_ms, double optimize_ms);
  // A chunk of `rows` rows (a static graph's padded length) whose attention covers `kv_len`
  // positions; decode: a decoding step (one row, the decode plan). shadow: the expected loads
  // per input [layer * 4 + site] (plans with shadow outliers; an observed chunk replaces them
  // with what its run measured).
  void begin_chunk(int64_t chunk, int64_t rows, int64_t kv_len, bool decode,
                   std::span<const ShadowLoad> shadow = {});
  void begin_layer(int64_t layer);
  // The run's observation of the chunk (null: expected loads, the options' buckets).
  void observe(const ChunkObservation* seen) { seen_ = seen; }
  void end_chunk();
  // Final norm + LM head of the last `rows` positions (after a prompt, after each decoding step).
  void add_lm_head(int64_t rows);
  sched::TaskGraph take();

  // What tasks() read.
  const ModelConfig& config() const { return c_; }
  const Plan& plan() const { return *phase_plan_; }
  int64_t layer() const { return layer_; }
  int64_t rows() const { return rows_; }
  int64_t kv_len() const { return kv_len_; }
  bool decode() const { return decode_; }
  // The shadow load of (layer, site) in this chunk: measured, else expected.
  ShadowLoad shadow_load(LinearSite site) const;
  const AttentionTimingOptions& attention_options() const { return attn_; }
  std::string attention_core() const;             // resolved for the chunk's plan
  std::span<const int64_t> head_buckets() const;  // this layer's (empty: none)
  double rescore_share() const;                   // this layer's

  // The recording primitives of the ops.
  // An op's work on a processor: joins the open task when it holds ops of the same subgraph on
  // the same processor, else opens a new task.
  void add_op(const BlockOpInfo& op, soc::Processor processor, std::vector<soc::OpDesc> ops);
  // A linear cut into parts (seed 002 §4.1): one task per part, all reading the same input;
  // the next task waits for every part.
  void add_parts(const BlockOpInfo& op, const soc::OpDesc& whole,
                 const sched::MatmulPartition& partition);
  // The shadow part of the linear just added (Eq. 1): a CPU task reading its input, which the
  // next task waits for.
  void add_shadow(const BlockOpInfo& op, const soc::OpDesc& shadow);
  // A head-wise attention: the scheme adds its tasks (Eq. 2 deps included).
  void add_attention(const attention::AttentionScheme& scheme, const attention::TaskShape& shape);

 private:
  struct Open;
  void close_open();
  int64_t add_task(sched::Task t, bool reads_kv);
  std::string prefix() const;
  ModelConfig c_;
  Plan plan_, decode_plan_;
  const Plan* phase_plan_ = &plan_;
  AttentionTimingOptions attn_;
  sched::TaskGraph graph_;
  std::vector<std::vector<int64_t>> prev_attention_;  // per layer (Eq. 2)
  std::vector<int64_t> builds_;                       // per layer: graph-build task, if any
  std::vector<int64_t> frontier_;                     // what the next task waits for
  std::vector<int64_t> inputs_;  // what produced the open linear's input (its shadow reads it)
  std::vector<ShadowLoad> shadow_;
  const ChunkObservation* seen_ = nullptr;
  std::unique_ptr<Open> open_;
  std::optional<soc::OpDesc> pending_shadow_;
  std::string pending_shadow_name_;
  int64_t chunk_ = 0, rows_ = 0, kv_len_ = 0, layer_ = 0, decode_steps_ = 0;
  bool decode_ = false, online_prepare_added_ = false;

 public:
  ~GraphRecorder();
  GraphRecorder(GraphRecorder&&) noexcept;
  GraphRecorder& operator=(GraphRecorder&&) noexcept;
};

// ---- The op kinds ----

class BlockOpKind {
 public:
  virtual ~BlockOpKind() = default;
  // Numerics of the op on the batch's rows.
  virtual void run(const BlockOpInfo& op, LayerRun& r) const = 0;
  // The op's work on `rows` rows of one layer whose attention covers kv_len keys, as the cost
  // model sees it (shapes, format, bytes).
  virtual std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c,
                                            const Plan& plan, int64_t layer, int64_t rows,
                                            int64_t kv_len) const = 0;
  // What it records: by default describe() on the op class's processor.
  virtual void tasks(const BlockOpInfo& op, GraphRecorder& g) const;
};
const BlockOpKind& block_op_kind(BlockOp op);

// The one loop: runs (run != null) and records (rec != null) the ops of one layer in order;
// false if a hook stopped the run.
bool run_layer(std::span<const BlockOpInfo> ops, LayerRun* run, GraphRecorder* rec,
               OpHooks* hooks = nullptr);

// ---- Graphs from a config alone ----

// Rows of the static graphs a prompt of prompt_len runs on with chunk_len (0: one graph of the
// whole prompt). A prompt shorter than a chunk runs on the smallest pre-built graph that holds
// it: powers of two from kMinGraphRows (the standard graph sizes of seed 002 §5.2.2), capped at
// chunk_len. InvalidArgument for a non-positive prompt or negative chunk.
constexpr int64_t kMinGraphRows = 32;
int64_t prefill_graph_rows(int64_t prompt_len, int64_t chunk_len);
// The chunks a prompt is prefilled in (ceil(prompt_len / prefill_graph_rows)); a session's
// decoding steps are the chunks after them.
int64_t prefill_chunks(int64_t prompt_len, int64_t chunk_len);

// Expected loads of every input ([layer * kNumLinearSites + site]) when no calibration of the
// model exists (shape-only configs): `channels` outlier channels per input per chunk ("around
// 5-15", seed 001 §3.3 Fig. 10), a share 1 - hot_share of them fetched cold; the pruned inputs
// are round(pruning_rate * n), keeping first the FFN-down inputs of evenly spaced layers (on
// SmolLM2 the profile keeps down-projection inputs almost only: notebooks/02_outliers.ipynb).
constexpr double kDefaultShadowChannels = 10.0;
// Bytes of the fp32 weight columns `channels` outlier channels of a site's input fetch from flash
// when a share hot_share of them is resident.
double cold_fetch_bytes(const ModelConfig& c, LinearSite site, double channels, double hot_share);
std::vector<ShadowLoad> expected_shadow_loads(const ModelConfig& c, const quant::ShadowOptions& o,
                                              double channels = kDefaultShadowChannels);

struct GraphOptions {
  // Run-time graph build and optimize times of the whole model (0: graphs are pre-built).
  double build_ms = 0, optimize_ms = 0;
  std::vector<ShadowLoad> expected;  // empty: expected_shadow_loads(config, plan options)
  AttentionTimingOptions attention;  // head-wise attention (seed 000)
};

// The prefill graph of a prompt from a config alone: chunks of prefill_graph_rows(prompt_len,
// chunk_len), the last one padded, then the LM head of the last position; with decode_tokens
// > 0 a session: that many decoding steps after it (the phase's plan), each ending with the LM
// head. meta records the request (config, plan, prompt_len, chunk_len, graph_rows,
// decode_tokens) and resident_bytes.
sched::TaskGraph prefill_task_graph(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                    int64_t chunk_len, const GraphOptions& opts = {},
                                    int64_t decode_tokens = 0);
// One decoding step on a cache of kv_len - 1 positions (meta phase "decode").
sched::TaskGraph decode_task_graph(const ModelConfig& c, const Plan& plan, int64_t kv_len,
                                   const GraphOptions& opts = {});

// Graph preparation at run time for one prompt length (Online-prepare, seed 002 §5.2.2):
// linear in the length through the two Llama-8B points the seed gives, scaled by the model's
// linear weights.
double online_prepare_ms(const ModelConfig& c, const soc::DeviceProfile& device,
                         int64_t prompt_len);

// The partitions a plan cuts its linears into for a request: per linear and phase the rows,
// the partition and its §4.3 time on the plan's device (empty when it cuts none).
nlohmann::json partitions_meta(const ModelConfig& c, const Plan& plan, int64_t prefill_rows,
                               bool decode);

// The request a graph describes, as its meta (with partitions_meta as "partitions").
nlohmann::json graph_meta(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                          int64_t chunk_len, const std::string& phase, int64_t decode_tokens = 0);

// Bytes resident during a request: linear weights as stored, the LM head's, the fp16 embedding
// and the fp16 KV cache of kv_len positions.
int64_t resident_bytes(const ModelConfig& c, const Plan& plan, int64_t kv_len);

// The static graph of one subgraph (its ops' input/output widths, weight and buffer bytes) for a
// chunk of `rows` rows at `chunk_index` (attention covers (chunk_index + 1) * rows positions).
npu::StaticGraph describe_subgraph(const ModelConfig& c, const Plan& plan, SubgraphKind kind,
                                   int64_t layer, int64_t rows, int64_t chunk_index);
// Graph census of one chunked prefill from the config alone: the graphs the engine acquires.
npu::GraphCacheStats graph_census(const ModelConfig& c, const Plan& plan, int64_t prompt_len,
                                  int64_t chunk_len, bool sharing = true);

}  // namespace socllm
