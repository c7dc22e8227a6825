// Engine layer: runs a Model on token sequences under a Plan (plan.h): the block's ops (block.h)
// on batches of rows, whole or in chunks on static graphs, decoding steps under the plan's
// decode placement; a call may also record the task graph it executed and what each op did.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attention/attention_scheme.h"
#include "block/block.h"
#include "block/kv_cache.h"
#include "calibration/calibration.h"
#include "core/core.h"
#include "model/model.h"
#include "npu/static_graph.h"
#include "plan/plan.h"
#include "quant/linear_scheme.h"
#include "quant/rotation.h"

namespace socllm {

// The four linears of every block prepared for one linear scheme (quantized, packed,
// smoothed, static scales fixed): what the graphs of a plan hold.
struct PreparedLinears {
  std::vector<std::array<std::unique_ptr<quant::PreparedLinear>, kNumLinearSites>> layers;
  // Per layer the attention and MLP RMSNorm gains with an input smoothing folded in (npu
  // smoothing, seed 004 §4.1: x / S_I^α costs nothing at run time); empty: the model's gains.
  std::vector<std::array<std::vector<float>, 2>> norm_gains;
  // The model whose weights outlier schemes read at run time (kept alive with them).
  std::shared_ptr<const Model> model;
  const quant::PreparedLinear& at(int64_t layer, LinearSite s) const {
    return *layers[static_cast<size_t>(layer)][static_cast<size_t>(s)];
  }
  int64_t weight_bytes() const;
};

// One linear subgraph built for a fixed row count, runnable on its own (tests, notebooks):
// shape and scales are those of the engine's graphs for the same plan.
struct LinearGraph {
  npu::StaticGraph graph;
  std::shared_ptr<const PreparedLinears> owner;
  const quant::PreparedLinear* linear = nullptr;
  const float* fp32_weights = nullptr;  // fp32 plans run the model's weights directly
  const float* fp32_bias = nullptr;
  // y [rows, out] for x [rows, in]; ShapeError on any other shape.
  TensorF32 run(const float* x, int64_t rows, int64_t cols) const;
};

class Engine {
 public:
  explicit Engine(std::shared_ptr<const Model> model);
  const Model& model() const { return *model_; }
  std::shared_ptr<const Model> model_ptr() const { return model_; }

  // The engine that runs plans with rotation `r` (Plan::rotation, issue 39): this one when its
  // model has that rotation (Model::rotation()) or `r` is none (a plan without rotation runs the
  // model as it is: on an engine of a rotated model, the calibration steps' fp32 runs), else one
  // over the model rotated so (quant::rotate_model), built on first use and kept, with its own
  // calibration and this engine's static graph cache. Every call below that takes a plan runs
  // there. InvalidArgument when this engine's model is rotated already and `r` is another one.
  const Engine& for_rotation(const quant::RotationSpec& r) const;

  // A cache for up to `capacity` tokens (<= context_length; 0 means context_length).
  KVCache new_cache(int64_t capacity = 0) const;

  // Runs several independent sequences in one pass (linears batched over all rows),
  // appending each to its cache. Returns final-normed hidden states [sum T_i, d_model].
  TensorF32 forward_hidden(const std::vector<KVCache*>& caches,
                           const std::vector<std::span<const int32_t>>& seqs,
                           const Plan& plan) const;
  // A prefill of one prompt from an empty cache under `plan` (chunked if plan.chunk_len > 0),
  // then `decode_tokens` greedy decoding steps (the plan's decode placement): the logits of the
  // prompt's last position [1, V] (all positions [T, V] with all_positions), the tokens decoded,
  // and with return_graph the task graph it executed (block.h: its chunks as run, with the
  // shadow loads and attention choices each chunk measured, then one step per decoded token),
  // with return_records what every op's run did (the harness compares the two).
  struct Prefill {
    TensorF32 logits;
    std::vector<int32_t> decoded;
    sched::TaskGraph graph;
    std::vector<OpRecord> records;
  };
  Prefill prefill(std::span<const int32_t> tokens, const Plan& plan, bool all_positions = false,
                  bool return_graph = false, int64_t decode_tokens = 0,
                  bool return_records = false) const;
  // The graph of a prompt of prompt_len tokens (and decode_tokens decoding steps) from the
  // config (no numerics), with this model's calibration: shadow pruning and expected loads
  // (expected_shadow_loads), the attention's calibrated head ratios.
  sched::TaskGraph task_graph(const Plan& plan, int64_t prompt_len, int64_t chunk_len,
                              int64_t decode_tokens = 0) const;
  // Per input [layer * 4 + site]: the plan's pruning, and the outlier channels a calibration
  // sequence had on average (cold share 1 - hot_share). Empty for plans without shadow outliers.
  std::vector<ShadowLoad> expected_shadow_loads(const Plan& plan) const;

  // logits [rows, vocab] for final-normed hidden states h [rows, d_model], with the LM head's
  // weights as the plan holds them: fp32, rounded to fp16 (lm_head placed in fp16), or
  // quantized with the linear scheme (lm_head_weights=linear).
  TensorF32 logits_from_hidden(const float* h, int64_t rows, const Plan& plan = Plan()) const;
  // The plan's residual_scale as the numerics apply it: 1 without one; auto: 2^-k for the
  // smallest k >= 0 that brings the calibration's residual_absmax under Plan::kAutoResidualMax
  // (InvalidArgument naming the step when the calibration has none).
  float residual_scale(const Plan& plan) const;
  // The stored bytes of the LM head's weights under the plan (what its numerics read).
  int64_t lm_head_weight_bytes(const Plan& plan) const;

  // Incremental step on one cache: logits for every new position [T, V], or the last [1, V].
  TensorF32 step(KVCache& cache, std::span<const int32_t> tokens, bool all_positions,
                 const Plan& plan) const;
  // Fresh context per sequence; logits for all positions, one [T_i, V] per sequence, or with
  // last_rows (one count per sequence, 1..T_i) only the last last_rows[i] positions'
  // [last_rows[i], V]: scoring a continuation needs only its rows, and the vocabulary
  // projection of the others is most of a large-vocabulary model's work (Gemma 3: 262k x 640).
  std::vector<TensorF32> logits(const std::vector<std::vector<int32_t>>& seqs, const Plan& plan,
                                const std::vector<int64_t>& last_rows = {}) const;
  // For each sequence x: log p(x_t | x_<t) for t = 1 .. T-1 (T-1 values), computed block
  // by block so the [T, V] logits never exist at once.
  std::vector<std::vector<float>> token_logprobs(const std::vector<std::vector<int32_t>>& seqs,
                                                 const Plan& plan) const;
  // Greedy decoding: returns only the new tokens; stops after a token in stop_ids.
  std::vector<int32_t> generate_greedy(std::span<const int32_t> prompt, int64_t max_new_tokens,
                                       const std::vector<int32_t>& stop_ids,
                                       const Plan& plan) const;

  // Calibration statistics for plans with static scales / smoothing (ShapeError if they are
  // from a model with other shapes). Replacing them drops prepared linears and graphs.
  // Statistics of a rotated model (Calibration::rotation) go to the engine of that rotation
  // (for_rotation), for the plans that have it; null drops every rotation's.
  void set_calibration(std::shared_ptr<const Calibration> calib);
  // The statistics of this engine's rotation (null: none loaded).
  std::shared_ptr<const Calibration> calibration() const;
  // The rotations (names) with statistics loaded, this engine's first if it has some.
  std::vector<std::string> calibrated_rotations() const;
  // Runs each sequence in fp32 from a fresh context and folds every linear input into `into`.
  void observe_activations(const std::vector<std::vector<int32_t>>& seqs, Calibration& into) const;
  // Step qk-scales (seed 000 §3.3): appends, per sequence (a calibration window) run in fp32,
  // the max |x| of every head's post-RoPE Q, K and V at every layer to into.q/k/v_absmax.
  void observe_attention_scales(const std::vector<std::vector<int32_t>>& seqs,
                                Calibration& into) const;

  // A layer's post-RoPE Q [n_heads, T, head_dim], K and V [n_kv_heads, T, head_dim] of an fp32
  // run of a prompt from an empty cache (the model stops after that layer's RoPE).
  // InvalidArgument for a layer outside [0, n_layers).
  struct Capture {
    TensorF32 q, k, v;
  };
  Capture capture(std::span<const int32_t> tokens, int64_t layer) const;
  // Several layers from one run (up to the deepest of them), in the order given.
  std::vector<Capture> capture(std::span<const int32_t> tokens,
                               const std::vector<int64_t>& layers) const;
  // The residual stream entering every layer, [n_layers] x [T, d_model], of an fp32 run.
  std::vector<TensorF32> layer_inputs(std::span<const int32_t> tokens) const;
  // Head ablation (seed 000 Eq. 1/2) from a layer's cached input x [T, d_model] (layer_inputs):
  // for each mask [n_heads] (1 keeps a head, 0 zeroes its attention output; all zero zeroes the
  // layer's attention output) the fp32 log p(x_t | x_<t), t = 1 .. T-1, of running layers
  // `layer` .. n_layers-1 with the mask applied at `layer`. The masks run as one batch.
  std::vector<std::vector<float>> ablation_logprobs(
      std::span<const int32_t> tokens, int64_t layer, const TensorF32& x,
      const std::vector<std::vector<float>>& masks) const;

  // The linears prepared for `plan` (cached per linear scheme and calibration, the 4 most recently
  // used schemes kept); null for fp32.
  // InvalidArgument if the plan needs calibration and none is set.
  std::shared_ptr<const PreparedLinears> prepare(const Plan& plan) const;
  LinearGraph linear_graph(const Plan& plan, int64_t layer, LinearSite site, int64_t rows) const;
  // One linear of the plan built on its own, its input smoothing divided at run time rather
  // than folded (x is the site's input as the fp32 model computes it); `alpha`, if given,
  // replaces npu smoothing's input exponent (step smoothing's grid search).
  // `calib`, if given, replaces the loaded calibration (a calibration step's statistics).
  std::unique_ptr<quant::PreparedLinear> prepare_linear(const Plan& plan, int64_t layer,
                                                        LinearSite site,
                                                        std::optional<double> alpha = {},
                                                        const Calibration* calib = nullptr) const;
  // npu smoothing's input divisor S_I^α of a site ([in]; empty without one), as prepare uses it.
  std::vector<float> input_smoothing(const Plan& plan, int64_t layer, LinearSite site,
                                     std::optional<double> alpha = {},
                                     const Calibration* calib = nullptr) const;
  // The inputs of every linear site of an fp32 run of a prompt, rows `rows` of it only:
  // [n_layers][site] -> [rows.size(), width] (step smoothing's samples).
  std::vector<std::array<TensorF32, kNumLinearSites>> linear_inputs(
      std::span<const int32_t> tokens, const std::vector<int64_t>& rows) const;
  // Per-layer constants of the plan's attention scheme (head ratios, buckets, static scales);
  // null for fp32 attention. InvalidArgument naming the missing calibration step and the
  // command that makes it.
  std::shared_ptr<const std::vector<attention::LayerConsts>> prepare_attention(
      const Plan& plan) const;

  // Static graphs built by chunked prefill so far (chunk-sharing cache, seed 001 §3.2).
  npu::GraphCacheStats graph_stats() const { return graphs_->stats(); }
  std::vector<npu::GraphBuildEvent> graph_events() const { return graphs_->events(); }
  void clear_graphs() const { graphs_->clear(); }

 private:
  struct Batch;
  // Optional instrumentation of run_blocks (calibration steps, capture).
  struct RunHooks {
    int64_t start_layer = 0;  // x is the input of this layer; earlier layers are skipped
    int64_t stop_layer = -1;  // >= 0: the last layer run
    // per layer: the post-RoPE q|k|v rows of the layers whose entry is requested (non-empty
    // capture_layers[l]); the run stops after stop_layer's RoPE
    std::vector<std::vector<float>>* qkv_out = nullptr;
    std::vector<bool> capture_layers;
    std::vector<std::vector<float>>* qkv_absmax = nullptr;       // per sequence [L * (H + 2 Hkv)]
    std::vector<std::vector<float>>* layer_inputs = nullptr;     // per layer [N * d]
    const std::vector<std::vector<float>>* head_mask = nullptr;  // per sequence [H], start_layer
    // Rows of the linear inputs to keep, per layer and site (linear_inputs).
    const std::vector<int64_t>* site_rows = nullptr;
    std::vector<std::array<TensorF32, kNumLinearSites>>* site_inputs = nullptr;
  };
  // What a call records: the graph it executed and what each op did (each optional).
  struct Recording {
    GraphRecorder* graph = nullptr;
    std::vector<OpRecord>* records = nullptr;
    std::vector<ShadowLoad> expected;  // the plan's shadow pruning and expected loads
    int64_t chunk = 0;                 // chunk id of the next recorded chunk or step
  };
  class Hooks;
  // InvalidArgument unless the plan's linears can run on this model (a model file with
  // prequantized linears runs the plan it was converted under only).
  void check_linears_available(const Plan& plan) const;
  // The LinearContext pieces of one site for a plan (calibration spans, smoothing, folds).
  struct SiteContext;
  SiteContext site_context(const Calibration* calib, const Plan& plan, int64_t layer,
                           LinearSite site, bool fold, std::optional<double> alpha) const;
  void check_tokens(std::span<const int32_t> tokens, const char* fn) const;
  // x[t, :] = embedding of tokens[t] times scale (a plan's residual_scale).
  void embed_rows(std::span<const int32_t> tokens, float* x, float scale = 1.0f) const;
  // All decoder blocks on x [batch.N, d_model] in place, op by op (block.h run_layer);
  // chunk_index >= 0 runs each subgraph as the static graph of a chunk of batch.N rows at that
  // index; `plan` is the phase's (Plan::for_decode for decoding steps). A recorded run records
  // its ops' tasks in the same loop.
  void run_blocks(Batch& batch, float* x, const Plan& plan, bool decode,
                  const PreparedLinears* prep, int64_t chunk_index, Calibration* observe,
                  const RunHooks* hooks = nullptr, Recording* rec = nullptr) const;
  // The sequences as one fresh-context fp32 batch; x_in [sum T, d_model]: the input of
  // hooks.start_layer (else the embeddings). Returns the residual stream after the last layer.
  TensorF32 run_fp32(const std::vector<std::span<const int32_t>>& seqs, const RunHooks& hooks,
                     const float* x_in = nullptr) const;
  // forward_hidden, recording each executed chunk (or decoding step) if asked.
  TensorF32 forward(const std::vector<KVCache*>& caches,
                    const std::vector<std::span<const int32_t>>& seqs, const Plan& plan,
                    Recording* rec) const;
  TensorF32 forward_chunked(const std::vector<KVCache*>& caches,
                            const std::vector<std::span<const int32_t>>& seqs, const Plan& plan,
                            const PreparedLinears* prep, Recording* rec) const;
  // The static graph of one subgraph with the static scale of the linear it holds.
  npu::StaticGraph subgraph(const Plan& plan, const PreparedLinears* prep, SubgraphKind kind,
                            int64_t layer, int64_t rows, int64_t chunk_index) const;
  // The head ratios the engine's attention runs with, for the graph's head-wise tasks.
  AttentionTimingOptions attention_timing(const Plan& plan) const;
  // The plan its task graph is timed with: under stored bit-widths the modelled weight budget
  // is the calibration's mean width (what the numerics run), not the plan's default `bits`.
  Plan timing_plan(const Plan& plan) const;
  std::shared_ptr<const Model> model_;
  std::vector<float> inv_freq_;
  std::vector<float> inv_freq_local_;  // local (sliding-window) layers' RoPE (Gemma 3)
  mutable std::mutex mu_;
  std::shared_ptr<const Calibration> calib_;
  // Prepared linears per linear scheme, the kMaxPreparedPlans most recently used.
  static constexpr size_t kMaxPreparedPlans = 4;
  struct PreparedEntry {
    std::shared_ptr<const PreparedLinears> linears;
    uint64_t last_use = 0;
  };
  mutable std::map<std::string, PreparedEntry> prepared_;
  mutable std::map<std::string, std::shared_ptr<const std::vector<attention::LayerConsts>>>
      prepared_attention_;
  // The LM head's weights as plans hold them other than fp32: "fp16" (rounded) or a linear
  // scheme's JSON (quantized), the last one used.
  mutable std::string lm_head_key_;
  mutable std::shared_ptr<const quant::PreparedLinear> lm_head_linear_;
  mutable std::shared_ptr<const std::vector<float>> lm_head_fp16_;
  mutable uint64_t use_clock_ = 0;
  // Shared with the engines of rotated models (for_rotation).
  std::shared_ptr<npu::GraphCache> graphs_ = std::make_shared<npu::GraphCache>(true);
  // The engines of rotated models, by rotation name.
  mutable std::map<std::string, std::shared_ptr<Engine>> rotated_;
  Engine& rotated_engine(const quant::RotationSpec& r) const;
  // InvalidArgument unless `into` holds statistics of this engine's model's rotation.
  void check_rotation_matches(const Calibration& into, const char* fn) const;
};

}  // namespace socllm
