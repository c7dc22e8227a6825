#include "engine/engine.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "attention/attention_scheme.h"
#include "block/block.h"
#include "kernels/kernels.h"
#include "kernels/sparse_attention.h"

namespace socllm {

namespace k = kernels;

// Marks the caches of one call in use for its duration (see KVCache): all or none. A call that
// fails or is interrupted part-way (a chunked prefill appends chunk by chunk) leaves every cache
// at the length it had: commit() keeps what the call appended.
class KVCacheUse {
 public:
  KVCacheUse(const std::vector<KVCache*>& caches, const char* fn) {
    for (KVCache* c : caches) {
      bool expected = false;
      if (!c->in_use_.compare_exchange_strong(expected, true)) {
        release();
        throw InvalidArgument(std::string("[") + fn +
                              "] this KV cache is in use by another call (a cache serves one "
                              "call at a time; give each thread its own cache)");
      }
      held_.push_back({c, c->length_});
    }
  }
  ~KVCacheUse() {
    if (!committed_)
      for (auto& [c, length] : held_) c->length_ = length;
    release();
  }
  void commit() { committed_ = true; }
  KVCacheUse(const KVCacheUse&) = delete;
  KVCacheUse& operator=(const KVCacheUse&) = delete;

 private:
  void release() {
    for (auto& [c, length] : held_) c->in_use_ = false;
    held_.clear();
  }
  std::vector<std::pair<KVCache*, int64_t>> held_;
  bool committed_ = false;
};

Engine::Engine(std::shared_ptr<const Model> model) : model_(std::move(model)) {
  if (!model_) throw InvalidArgument("[Engine] model is null");
  const auto& c = model_->config();
  inv_freq_.resize(static_cast<size_t>(c.head_dim / 2));
  k::rope_inv_freq(c.rope_theta, c.head_dim, inv_freq_.data());
  inv_freq_local_.resize(inv_freq_.size());
  k::rope_inv_freq(c.rope_theta_local > 0 ? c.rope_theta_local : c.rope_theta, c.head_dim,
                   inv_freq_local_.data());
  num_threads();  // applies the default thread count once
}

KVCache Engine::new_cache(int64_t capacity) const {
  const int64_t ctx = model_->config().context_length;
  if (capacity == 0) capacity = ctx;
  if (capacity > ctx)
    throw ContextOverflow("[Engine.new_cache] capacity " + std::to_string(capacity) +
                          " exceeds the model's context length " + std::to_string(ctx));
  return KVCache(model_->config(), capacity);
}

void Engine::check_tokens(std::span<const int32_t> tokens, const char* fn) const {
  if (tokens.empty()) throw InvalidArgument(std::string("[") + fn + "] empty token sequence");
  const int64_t V = model_->config().vocab_size;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      throw InvalidArgument(std::string("[") + fn + "] token id " + std::to_string(tokens[i]) +
                            " at position " + std::to_string(i) +
                            " is outside the vocabulary [0, " + std::to_string(V) + ")");
}

struct Engine::Batch {
  int64_t N = 0;             // rows, padding included
  std::vector<int64_t> pos;  // absolute position of every row
  std::vector<SeqRows> seqs;
  std::vector<quant::RowSegment> segments;  // real rows of each sequence
};

int64_t PreparedLinears::weight_bytes() const {
  int64_t b = 0;
  for (const auto& l : layers)
    for (const auto& p : l) b += p->weight_bytes();
  return b;
}

TensorF32 LinearGraph::run(const float* x, int64_t rows, int64_t cols) const {
  graph.check_input(rows, cols);
  TensorF32 y({rows, graph.out_cols});
  if (linear) {
    const quant::RowSegment all{0, rows};
    linear->forward(x, rows, y.ptr(), graph.out_cols, false, {&all, 1});
  } else {
    kernels::linear(x, rows, cols, cols, fp32_weights, graph.out_cols, fp32_bias, y.ptr(),
                    graph.out_cols);
  }
  return y;
}

void Engine::embed_rows(std::span<const int32_t> tokens, float* x, float scale) const {
  const int64_t d = model_->config().d_model;
  const float* E = model_->embed_tokens().ptr();
  for (size_t t = 0; t < tokens.size(); ++t)
    std::memcpy(x + static_cast<int64_t>(t) * d, E + static_cast<int64_t>(tokens[t]) * d,
                d * sizeof(float));
  const int64_t n = static_cast<int64_t>(tokens.size()) * d;
  if (model_->config().embed_scale) {  // Gemma: embeddings times sqrt(d_model), in fp32
    const float gemma = std::sqrt(static_cast<float>(d));
    for (int64_t i = 0; i < n; ++i) x[i] *= gemma;
  }
  if (scale != 1.0f)  // a plan's residual_scale, folded into the table
    for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

float Engine::residual_scale(const Plan& plan) const {
  if (!plan.residual_scale_auto) return static_cast<float>(plan.residual_scale.value_or(1.0));
  const auto calib = calibration();
  if (!calib || calib->residual_absmax.empty())
    throw InvalidArgument("[Engine] plan '" + plan.name +
                          "': residual_scale=auto needs the calibrated maxima of the residual "
                          "stream, and the loaded calibration has none (socllm calibrate --steps "
                          "act-scales; files from before issue 39 lack them)");
  const float m = *std::max_element(calib->residual_absmax.begin(), calib->residual_absmax.end());
  const int k = std::max(0, static_cast<int>(std::ceil(std::log2(m / Plan::kAutoResidualMax))));
  return std::ldexp(1.0f, -k);
}

Engine& Engine::rotated_engine(const quant::RotationSpec& r) const {
  const std::string name = r.name();
  if (model_->rotation() != "none")
    throw InvalidArgument("[Engine] the model is rotated already (" + model_->rotation() +
                          "): it runs plans of that rotation, not '" + name +
                          "' (rotate the model as loaded)");
  std::lock_guard lock(mu_);
  auto& e = rotated_[name];
  if (!e) {
    e = std::make_shared<Engine>(quant::rotate_model(model_, r));
    e->graphs_ = graphs_;
  }
  return *e;
}

const Engine& Engine::for_rotation(const quant::RotationSpec& r) const {
  if (r.none() || r.name() == model_->rotation()) return *this;
  return rotated_engine(r);
}

void Engine::set_calibration(std::shared_ptr<const Calibration> calib) {
  if (calib) calib->check_matches(model_->config());
  if (calib && calib->rotation != model_->rotation()) {
    rotated_engine(quant::RotationSpec::from_name(calib->rotation)).set_calibration(calib);
    return;
  }
  std::map<std::string, std::shared_ptr<Engine>> rotated;
  {
    std::lock_guard lock(mu_);
    if (!calib) rotated = rotated_;
    calib_ = std::move(calib);
    prepared_.clear();
    prepared_attention_.clear();
    graphs_->clear();
  }
  for (auto& [name, e] : rotated) e->set_calibration(nullptr);
}

void Engine::check_rotation_matches(const Calibration& into, const char* fn) const {
  if (into.rotation != model_->rotation())
    throw InvalidArgument(std::string("[") + fn +
                          "] the statistics are of the model with rotation '" + into.rotation +
                          "', this engine's model has '" + model_->rotation() +
                          "' (Engine.for_rotation / Calibration.empty_for(rotated model))");
}

std::vector<std::string> Engine::calibrated_rotations() const {
  std::vector<std::string> out;
  std::map<std::string, std::shared_ptr<Engine>> rotated;
  {
    std::lock_guard lock(mu_);
    if (calib_) out.push_back(model_->rotation());
    rotated = rotated_;
  }
  for (const auto& [name, e] : rotated)
    if (e->calibration()) out.push_back(name);
  return out;
}

std::shared_ptr<const Calibration> Engine::calibration() const {
  std::lock_guard lock(mu_);
  return calib_;
}

struct Engine::SiteContext {
  std::span<const float> act_absmax, out_absmax;
  std::vector<float> input_smooth;  // npu smoothing's S_I^α of this input (empty: none)
  bool folded = false;
  std::vector<float> row_post;  // the next input's divisor folded into these rows
  std::vector<int64_t> tensor_rows;
  std::vector<uint8_t> row_bits;
  std::span<const float> hessian;
  float act_clip = 0.0f;
  quant::LinearContext context() const {
    quant::LinearContext ctx;
    ctx.act_absmax = act_absmax;
    ctx.out_absmax = out_absmax;
    ctx.input_smooth = input_smooth;
    ctx.input_folded = folded && !input_smooth.empty();
    ctx.row_post = row_post;
    ctx.tensor_rows = tensor_rows;
    ctx.row_bits = row_bits;
    ctx.hessian = hessian;
    ctx.act_clip = act_clip;
    return ctx;
  }
};

void Engine::check_linears_available(const Plan& plan) const {
  const PackedModelLinears* pk = model_->packed_linears();
  if (!pk || plan.linear.to_json() == pk->scheme) return;
  throw InvalidArgument("[Engine] '" + model_->path() + "' holds linears prequantized for plan " +
                        pk->plan.dump() + " (no fp32 weights): plan '" + plan.name +
                        "' with linears " + plan.linear.to_json().dump() +
                        " cannot run on it; run that plan, or load the model it was converted "
                        "from");
}

namespace {
// What `plan`'s linears read from the calibration, checked before any is built; the message
// names the step that writes what is missing. `alpha_given`: an explicit smoothing exponent
// stands in for the calibrated ones.
void check_calibration_for(const Plan& plan, const Calibration* calib, bool alpha_given,
                           const std::string& where) {
  const auto& ls = plan.linear;
  if (ls.needs_calibration() && (!calib || !calib->has_act_scales())) {
    const auto& r = plan.rotation;
    // the calibrate flags that make statistics of this rotation (cli.py)
    std::string flags;
    if (r.residual) flags += " --rotate " + quant::rotation_name(*r.residual);
    if (r.residual && *r.residual != quant::RotationKind::Fold)
      flags += " --rotate-seed " + std::to_string(r.seed);
    if (r.online_down) flags += " --rotate-down hadamard";
    if (r.heads) flags += " --rotate-heads hadamard";
    throw InvalidArgument(where + " plan '" + plan.name +
                          "' fixes static activation scales or smoothing factors from "
                          "calibration, and none is loaded" +
                          (r.none() ? "" : " for its rotation '" + r.name() + "'") +
                          " (socllm calibrate" + flags +
                          " --steps act-scales, then --calib PATH / calib=PATH)");
  }
  if (!calib) return;
  if (ls.needs_output_absmax() && !calib->has_output_absmax())
    throw InvalidArgument(where + " plan '" + plan.name +
                          "' smooths or quantizes linear outputs from their calibrated channel "
                          "maxima, and the loaded calibration has none (socllm calibrate --steps "
                          "act-scales again: older files predate them)");
  if (ls.needs_smoothing_calibration() && !alpha_given && !calib->has_smoothing())
    throw InvalidArgument(where + " plan '" + plan.name +
                          "' uses the calibrated smoothing exponents, and the loaded calibration "
                          "has none (socllm calibrate --steps act-scales,smoothing)");
  if (ls.channel_bits && ls.channel_bits->stored && !calib->has_channel_bits())
    throw InvalidArgument(where + " plan '" + plan.name +
                          "' uses stored bit-widths, and the loaded calibration has none "
                          "(socllm calibrate --steps ...,bitwidths)");
  if (ls.needs_hessians() && !calib->has_hessians())
    throw InvalidArgument(where + " plan '" + plan.name +
                          "' rounds its weights with GPTQ, and the loaded calibration has no "
                          "Hessians (socllm calibrate --steps ...,gptq)");
  if (ls.needs_outlier_calibration() && !calib->has_outlier_stats())
    throw InvalidArgument(where + " plan '" + plan.name +
                          "' needs outlier thresholds and statistics, and the loaded calibration "
                          "has none (socllm calibrate --steps act-scales,outliers)");
}
}  // namespace

Engine::SiteContext Engine::site_context(const Calibration* calib, const Plan& plan, int64_t layer,
                                         LinearSite site, bool fold,
                                         std::optional<double> alpha) const {
  const auto& c = model_->config();
  const quant::LinearScheme& ls = plan.linear;
  SiteContext sc;
  // A rotated model's online Hadamard sits between up_proj and down_proj (down_rotate), so
  // down_proj's input divisor cannot ride on up_proj's rows: down divides its input itself.
  const bool down_folds = !model_->transform().online_down_hadamard;
  sc.folded = fold && (site != LinearSite::MlpAct || down_folds);
  if (calib) sc.act_absmax = calib->absmax(layer, site);
  if (ls.needs_output_absmax()) sc.out_absmax = calib->output_absmax(layer, site);
  if (ls.needs_hessians()) sc.hessian = calib->hessian_of(layer, site);
  if (ls.act_percentile) sc.act_clip = calib->abs_percentile(layer, site, *ls.act_percentile / 100);
  if (site == LinearSite::AttnIn) sc.tensor_rows = {c.q_dim(), c.kv_dim(), c.kv_dim()};
  if (site == LinearSite::MlpIn) sc.tensor_rows = {c.d_ff, c.d_ff};
  if (ls.channel_bits && ls.channel_bits->stored) {
    const auto& cb = calib->channel_bits[static_cast<size_t>(site)];
    const int64_t w = calib->out_width[static_cast<size_t>(site)];
    sc.row_bits.assign(cb.begin() + layer * w, cb.begin() + (layer + 1) * w);
  }
  const auto* npu = ls.npu_smoothing ? &*ls.npu_smoothing : nullptr;
  if (!npu || !npu->has_input_part()) return sc;
  // S_I^α of one input site; o_proj's input is tied across the query heads sharing a KV head,
  // so that its divisor folds into that KV head's v_proj rows.
  auto divisor = [&](LinearSite st, std::optional<double> a) {
    const double e = a ? *a
                     : npu->alpha
                         ? *npu->alpha
                         : calib->smooth_alpha[static_cast<size_t>(st)][static_cast<size_t>(layer)];
    const auto absmax = calib->absmax(layer, st);
    std::vector<float> m(absmax.begin(), absmax.end());
    if (st == LinearSite::AttnOut) {
      const int64_t group = c.n_heads / c.n_kv_heads, hd = c.head_dim;
      for (int64_t g = 0; g < c.n_kv_heads; ++g)
        for (int64_t e2 = 0; e2 < hd; ++e2) {
          float mx = 0.0f;
          for (int64_t h = g * group; h < (g + 1) * group; ++h) mx = std::max(mx, m[h * hd + e2]);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) m[h * hd + e2] = mx;
        }
    }
    return quant::npu_input_smoothing(m, e);
  };
  sc.input_smooth = divisor(site, alpha);
  if (fold && (site == LinearSite::AttnIn || site == LinearSite::MlpIn)) {
    const int64_t out = linear_out_width(c, site);
    sc.row_post.assign(static_cast<size_t>(out), 1.0f);
    if (site == LinearSite::AttnIn) {  // v rows carry o_proj's input divisor (head 0 of a group)
      const auto next = divisor(LinearSite::AttnOut, {});
      const int64_t group = c.n_heads / c.n_kv_heads, hd = c.head_dim;
      for (int64_t g = 0; g < c.n_kv_heads; ++g)
        for (int64_t e2 = 0; e2 < hd; ++e2)
          sc.row_post[c.q_dim() + c.kv_dim() + g * hd + e2] = 1.0f / next[g * group * hd + e2];
    } else if (down_folds) {  // up rows carry down_proj's input divisor
      const auto next = divisor(LinearSite::MlpAct, {});
      for (int64_t j = 0; j < c.d_ff; ++j) sc.row_post[c.d_ff + j] = 1.0f / next[j];
    }
  }
  return sc;
}

std::shared_ptr<const PreparedLinears> Engine::prepare(const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this) return e.prepare(plan);
  check_linears_available(plan);
  if (plan.linear.is_fp32()) return nullptr;
  std::lock_guard lock(mu_);
  const std::string key = plan.linear.to_json().dump();
  if (auto it = prepared_.find(key); it != prepared_.end()) {
    it->second.last_use = ++use_clock_;
    return it->second.linears;
  }
  if (const PackedModelLinears* pk = model_->packed_linears()) {
    // A model file with prequantized linears: the linears of the plan it was converted under.
    auto prep = std::make_shared<PreparedLinears>();
    prep->model = model_;
    prep->norm_gains = pk->norm_gains;
    prep->layers.resize(pk->sites.size());
    for (size_t l = 0; l < pk->sites.size(); ++l)
      for (int s = 0; s < kNumLinearSites; ++s)
        prep->layers[l][s] = std::make_unique<quant::PreparedLinear>(plan.linear, pk->sites[l][s]);
    prepared_.emplace(key, PreparedEntry{prep, ++use_clock_});
    return prep;
  }
  check_calibration_for(plan, calib_.get(), /*alpha_given=*/false, "[Engine]");
  std::vector<quant::ShadowLinearConfig> shadow;
  if (plan.linear.shadow) shadow = calib_->shadow_configs(*plan.linear.shadow);
  const auto& c = model_->config();
  auto prep = std::make_shared<PreparedLinears>();
  prep->model = model_;  // outlier schemes read the model's float weights (PreparedLinear)
  prep->layers.resize(static_cast<size_t>(c.n_layers));
  // npu smoothing's input divisors fold into the norms and into the rows of v_proj / up_proj.
  const bool fold = plan.linear.npu_smoothing && plan.linear.npu_smoothing->has_input_part() &&
                    plan.linear.npu_smoothing->fold;
  if (fold) prep->norm_gains.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int s = 0; s < kNumLinearSites; ++s) {
      const auto site = static_cast<LinearSite>(s);
      const LayerWeights& L = model_->layer(l);
      const SiteContext sc = site_context(calib_.get(), plan, l, site, fold, {});
      quant::LinearContext ctx = sc.context();
      ctx.shadow = shadow.empty() ? nullptr : &shadow[static_cast<size_t>(l * kNumLinearSites + s)];
      prep->layers[l][s] = std::make_unique<quant::PreparedLinear>(
          site_weights(L, site).ptr(), linear_out_width(c, site), linear_site_width(c, site),
          site_bias(L, site), plan.linear, ctx);
      if (fold && (site == LinearSite::AttnIn || site == LinearSite::MlpIn)) {
        const TensorF32& g = site == LinearSite::AttnIn ? L.attn_norm : L.ffn_norm;
        auto& gain = prep->norm_gains[l][site == LinearSite::AttnIn ? 0 : 1];
        gain.resize(static_cast<size_t>(c.d_model));
        for (int64_t j = 0; j < c.d_model; ++j) gain[j] = g.ptr()[j] / sc.input_smooth[j];
      }
    }
  spdlog::debug("prepared linears for plan '{}': {} weight bytes", plan.name, prep->weight_bytes());
  // A bounded cache: each prepared plan holds quantized (and, for outlier schemes, float)
  // copies of every linear, so a sweep over a plan's options would otherwise keep them all.
  if (prepared_.size() >= kMaxPreparedPlans) {
    auto lru = prepared_.begin();
    for (auto it = prepared_.begin(); it != prepared_.end(); ++it)
      if (it->second.last_use < lru->second.last_use) lru = it;
    prepared_.erase(lru);  // callers holding it keep it alive
  }
  prepared_.emplace(key, PreparedEntry{prep, ++use_clock_});
  return prep;
}

std::shared_ptr<const std::vector<attention::LayerConsts>> Engine::prepare_attention(
    const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this) return e.prepare_attention(plan);
  const attention::AttentionScheme& a = plan.attention;
  if (a.is_fp32()) return nullptr;
  std::lock_guard lock(mu_);
  const std::string key = a.to_json().dump();
  if (auto it = prepared_attention_.find(key); it != prepared_attention_.end()) return it->second;
  const std::string who = "[Engine] attention " + a.label() + " of plan '" + plan.name + "'";
  auto out = std::make_shared<const std::vector<attention::LayerConsts>>(
      a.kind->prepare(a, calib_.get(), model_->config(), who));
  prepared_attention_.emplace(key, out);
  return out;
}

npu::StaticGraph Engine::subgraph(const Plan& plan, const PreparedLinears* prep, SubgraphKind kind,
                                  int64_t layer, int64_t rows, int64_t chunk_index) const {
  npu::StaticGraph g = describe_subgraph(model_->config(), plan, kind, layer, rows, chunk_index);
  // The static activation scale of the linear the subgraph holds is baked into the graph.
  if (prep)
    for (const BlockOpInfo& op : all_block_ops())
      if (op.subgraph == kind && op.site) g.scales = {prep->at(layer, *op.site).static_act_scale()};
  return g;
}

std::unique_ptr<quant::PreparedLinear> Engine::prepare_linear(const Plan& plan, int64_t layer,
                                                              LinearSite site,
                                                              std::optional<double> alpha,
                                                              const Calibration* given) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.prepare_linear(plan, layer, site, alpha, given);
  const auto& c = model_->config();
  if (layer < 0 || layer >= c.n_layers)
    throw InvalidArgument("[Engine.prepare_linear] layer " + std::to_string(layer) +
                          " outside [0, " + std::to_string(c.n_layers) + ")");
  if (alpha && !(*alpha >= 0.0 && *alpha <= 1.0))
    throw InvalidArgument("[Engine.prepare_linear] alpha must be in [0, 1], got " +
                          std::to_string(*alpha));
  std::shared_ptr<const Calibration> loaded;
  {
    std::lock_guard lock(mu_);
    loaded = calib_;
  }
  const Calibration* calib = given ? given : loaded.get();
  if (given) given->check_matches(c);
  check_calibration_for(plan, calib, alpha.has_value(), "[Engine.prepare_linear]");
  if (plan.linear.shadow)
    throw InvalidArgument(
        "[Engine.prepare_linear] shadow-outlier linears are built with the "
        "whole plan (Engine.prepare)");
  check_linears_available(Plan{});  // built from the model's fp32 weights
  const SiteContext sc = site_context(calib, plan, layer, site, /*fold=*/false, alpha);
  const LayerWeights& L = model_->layer(layer);
  return std::make_unique<quant::PreparedLinear>(
      site_weights(L, site).ptr(), linear_out_width(c, site), linear_site_width(c, site),
      site_bias(L, site), plan.linear, sc.context());
}

std::vector<float> Engine::input_smoothing(const Plan& plan, int64_t layer, LinearSite site,
                                           std::optional<double> alpha,
                                           const Calibration* given) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.input_smoothing(plan, layer, site, alpha, given);
  std::shared_ptr<const Calibration> loaded;
  {
    std::lock_guard lock(mu_);
    loaded = calib_;
  }
  const Calibration* calib = given ? given : loaded.get();
  const auto* npu = plan.linear.npu_smoothing ? &*plan.linear.npu_smoothing : nullptr;
  if (!npu || !npu->has_input_part()) return {};
  if (!calib || (!alpha && !npu->alpha && !calib->has_smoothing()))
    throw InvalidArgument("[Engine.input_smoothing] plan '" + plan.name +
                          "' needs calibration (act-scales, smoothing) or an alpha");
  if (layer < 0 || layer >= model_->config().n_layers)
    throw InvalidArgument("[Engine.input_smoothing] layer " + std::to_string(layer) +
                          " outside [0, " + std::to_string(model_->config().n_layers) + ")");
  return site_context(calib, plan, layer, site, false, alpha).input_smooth;
}

std::vector<std::array<TensorF32, kNumLinearSites>> Engine::linear_inputs(
    std::span<const int32_t> tokens, const std::vector<int64_t>& rows) const {
  const auto& c = model_->config();
  for (int64_t r : rows)
    if (r < 0 || r >= static_cast<int64_t>(tokens.size()))
      throw InvalidArgument("[Engine.linear_inputs] row " + std::to_string(r) + " outside [0, " +
                            std::to_string(tokens.size()) + ")");
  std::vector<std::array<TensorF32, kNumLinearSites>> out(static_cast<size_t>(c.n_layers));
  RunHooks hooks;
  hooks.site_rows = &rows;
  hooks.site_inputs = &out;
  run_fp32({tokens}, hooks);
  return out;
}

LinearGraph Engine::linear_graph(const Plan& plan, int64_t layer, LinearSite site,
                                 int64_t rows) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.linear_graph(plan, layer, site, rows);
  const auto& c = model_->config();
  if (layer < 0 || layer >= c.n_layers)
    throw InvalidArgument("[Engine.linear_graph] layer " + std::to_string(layer) + " outside [0, " +
                          std::to_string(c.n_layers) + ")");
  LinearGraph g;
  g.owner = prepare(plan);
  g.graph = subgraph(plan, g.owner.get(), linear_op(site).subgraph, layer, rows, -1);
  // The graph's input is the linear's input (the norms of attn_in/mlp_in run before it).
  g.graph.in_cols = linear_site_width(c, site);
  g.graph.out_cols = linear_out_width(c, site);
  if (g.owner) {
    g.linear = &g.owner->at(layer, site);
  } else {
    g.fp32_weights = site_weights(model_->layer(layer), site).ptr();
    g.fp32_bias = site_bias(model_->layer(layer), site);
  }
  return g;
}

// The engine's instrumentation of a run (calibration statistics, captures, ablations) and the
// static graphs of a chunked prefill, around each op of the block.
class Engine::Hooks final : public OpHooks {
 public:
  Hooks(const Engine& e, const Batch& b, const Plan& plan, const PreparedLinears* prep,
        int64_t chunk_index, Calibration* observe, const RunHooks* hooks)
      : e_(e),
        b_(b),
        plan_(plan),
        prep_(prep),
        chunk_index_(chunk_index),
        observe_(observe),
        h_(hooks) {}

  void layer_start(int64_t l, const float* x) {
    current_.reset();
    if (observe_)
      for (const auto& s : b_.seqs)
        observe_->observe_residual(l, x + s.row0 * e_.model_->config().d_model, s.T,
                                   e_.model_->config().d_model);
    if (h_ && h_->layer_inputs)
      (*h_->layer_inputs)[l].assign(x, x + b_.N * e_.model_->config().d_model);
  }

  void before(const BlockOpInfo& op, LayerRun& r) override {
    // In chunked prefill every subgraph is a static graph of the chunk length: acquire it
    // (built once, or per chunk for attention) and check the input has its shape.
    if (chunk_index_ >= 0 && op.subgraph != current_) {
      current_ = op.subgraph;
      const npu::StaticGraph& g =
          e_.graphs_->acquire(e_.subgraph(plan_, prep_, op.subgraph, r.layer, r.N, chunk_index_));
      g.check_input(r.N, g.in_cols);
    }
    if (!op.site) return;
    const auto& c = e_.model_->config();
    const LinearSite site = *op.site;
    const int64_t w = linear_site_width(c, site);
    const float* in = linear_input(op, r);
    if (observe_)
      for (const auto& s : b_.seqs) observe_->observe(r.layer, site, in + s.row0 * w, s.T, w);
    if (h_ && h_->site_inputs) {
      const auto& rows = *h_->site_rows;
      TensorF32 t({static_cast<int64_t>(rows.size()), w});
      for (size_t i = 0; i < rows.size(); ++i)
        std::memcpy(t.ptr() + static_cast<int64_t>(i) * w, in + rows[i] * w,
                    static_cast<size_t>(w) * sizeof(float));
      (*h_->site_inputs)[r.layer][static_cast<size_t>(site)] = std::move(t);
    }
  }

  bool after(const BlockOpInfo& op, LayerRun& r) override {
    const auto& c = e_.model_->config();
    const int64_t l = r.layer;
    if (op.site && observe_) {
      const auto [out, ld] = linear_output(op, r);
      for (const auto& s : b_.seqs)
        observe_->observe_output(l, *op.site, out + s.row0 * ld, s.T, ld);
    }
    if (!h_) return true;
    if (op.op == BlockOp::Rope) {
      const int64_t qkv_w = c.qkv_dim();
      if (h_->qkv_absmax)
        for (size_t si = 0; si < b_.seqs.size(); ++si) {
          // [layer][q heads, k heads, v heads] of each sequence (step qk-scales)
          const auto& sq = b_.seqs[si];
          float* dst = (*h_->qkv_absmax)[si].data() + l * (c.n_heads + 2 * c.n_kv_heads);
          const float* rows = r.qkv + sq.row0 * qkv_w;
          for (int64_t h = 0; h < c.n_heads + 2 * c.n_kv_heads; ++h)
            dst[h] = kernels::absmax_rows(rows + h * c.head_dim, sq.T, c.head_dim, qkv_w);
        }
      if (h_->qkv_out) {
        if (h_->capture_layers[static_cast<size_t>(l)])
          (*h_->qkv_out)[static_cast<size_t>(l)].assign(r.qkv, r.qkv + b_.N * qkv_w);
        const int64_t last = h_->stop_layer >= 0 ? h_->stop_layer : c.n_layers - 1;
        if (l == last) return false;  // captured: the rest of the model is not needed
      }
    }
    if (h_->head_mask && l == h_->start_layer) {
      const int64_t qd = c.q_dim();
      if (op.op == BlockOp::Attention)
        for (size_t si = 0; si < b_.seqs.size(); ++si) {
          // head ablation (seed 000 Eq. 1/2): the masked heads' outputs are zeroed
          const auto& mask = (*h_->head_mask)[si];
          for (int64_t t = 0; t < b_.seqs[si].T; ++t)
            for (int64_t h = 0; h < c.n_heads; ++h)
              if (mask[static_cast<size_t>(h)] != 1.0f)
                for (int64_t e = 0; e < c.head_dim; ++e)
                  r.att[(b_.seqs[si].row0 + t) * qd + h * c.head_dim + e] *=
                      mask[static_cast<size_t>(h)];
        }
      if (op.op == BlockOp::OProj)
        for (size_t si = 0; si < b_.seqs.size(); ++si) {
          // a layer ablated whole (Eq. 2): its attention output, o_proj bias included, is 0
          const auto& mask = (*h_->head_mask)[si];
          if (std::all_of(mask.begin(), mask.end(), [](float m) { return m == 0.0f; }))
            std::fill(r.o + b_.seqs[si].row0 * c.d_model,
                      r.o + (b_.seqs[si].row0 + b_.seqs[si].T) * c.d_model, 0.0f);
        }
    }
    return true;
  }

 private:
  static const float* linear_input(const BlockOpInfo& op, const LayerRun& r) {
    switch (*op.site) {
      case LinearSite::AttnIn:
      case LinearSite::MlpIn: return r.h;
      case LinearSite::AttnOut: return r.att;
      case LinearSite::MlpAct: return r.act;
    }
    return nullptr;
  }
  static std::pair<const float*, int64_t> linear_output(const BlockOpInfo& op, const LayerRun& r) {
    const auto& c = *r.config;
    switch (*op.site) {
      case LinearSite::AttnIn: return {r.qkv, c.qkv_dim()};
      case LinearSite::AttnOut: return {r.o, c.d_model};
      case LinearSite::MlpIn: return {r.gu, c.mlp_in_dim()};
      case LinearSite::MlpAct: return {r.o, c.d_model};
    }
    return {nullptr, 0};
  }
  const Engine& e_;
  const Batch& b_;
  const Plan& plan_;
  const PreparedLinears* prep_;
  int64_t chunk_index_;
  Calibration* observe_;
  const RunHooks* h_;
  std::optional<SubgraphKind> current_;
};

void Engine::run_blocks(Batch& b, float* x, const Plan& plan, bool decode,
                        const PreparedLinears* prep, int64_t chunk_index, Calibration* observe,
                        const RunHooks* hooks, Recording* rec) const {
  const auto& c = model_->config();
  if (!prep) check_linears_available(Plan{});  // fp32 linears read the model's weights
  const auto attn = prepare_attention(plan);
  const int64_t first_layer = hooks ? hooks->start_layer : 0;
  const int64_t last_layer = hooks && hooks->stop_layer >= 0 ? hooks->stop_layer : c.n_layers - 1;
  const int64_t N = b.N;
  const int64_t d = c.d_model, dff = c.d_ff;
  std::vector<float> h(static_cast<size_t>(N * d)), qkv(static_cast<size_t>(N * c.qkv_dim())),
      att(static_cast<size_t>(N * c.q_dim())), gu(static_cast<size_t>(N * c.mlp_in_dim())),
      act(static_cast<size_t>(N * dff)), o(static_cast<size_t>(N * d));
  int64_t scratch = 0;
  for (const auto& s : b.seqs)
    scratch = std::max(scratch, k::attention_scratch_floats(s.T, s.cache->length() + s.T, c.n_heads,
                                                            c.n_kv_heads, c.head_dim));
  std::vector<float> S(static_cast<size_t>(scratch));

  LayerRun r;
  r.model = model_.get();
  r.config = &c;
  r.plan = &plan;
  r.residual_scale = residual_scale(plan);
  r.decode = decode;
  r.chunk = rec ? rec->chunk : -1;
  r.N = N;
  r.pos = b.pos.data();
  r.seqs = &b.seqs;
  r.segments = b.segments;
  r.x = x, r.h = h.data(), r.qkv = qkv.data(), r.att = att.data(), r.gu = gu.data();
  r.act = act.data(), r.o = o.data(), r.attention_scratch = S.data();
  // Only float linears off the CPU compute tile by tile (ops/linear.cpp), so only they read the
  // NPU's tile from the plan's device.
  if (prep && !prep->layers.empty() && prep->at(0, LinearSite::AttnIn).float_path() &&
      plan.at(OpClass::Linear).processor != soc::Processor::Cpu) {
    const auto tile = plan.partition_rules(false, N);  // the NPU's tile on the plan's device
    r.tile_m = tile.npu_row_align, r.tile_n = tile.npu_col_align;
  }
  ChunkObservation seen;
  if (rec) {
    seen.reset(c);
    r.seen = &seen;
    r.records = rec->records;
    if (rec->graph) rec->graph->observe(&seen);
  }
  Hooks eh(*this, b, plan, prep, chunk_index, observe, hooks);
  const auto ops = decoder_block(c, model_->transform().online_down_hadamard);
  for (int64_t l = first_layer; l <= last_layer; ++l) {
    const LayerWeights& L = model_->layer(l);
    r.layer = l;
    r.weights = &L;
    for (int s = 0; s < kNumLinearSites; ++s)
      r.linears[static_cast<size_t>(s)] = prep ? &prep->at(l, static_cast<LinearSite>(s)) : nullptr;
    // RMSNorm gains, with a folded input smoothing if the plan has one.
    const bool folded = prep && !prep->norm_gains.empty();
    r.norm_gain = {folded ? prep->norm_gains[static_cast<size_t>(l)][0].data() : L.attn_norm.ptr(),
                   folded ? prep->norm_gains[static_cast<size_t>(l)][1].data() : L.ffn_norm.ptr()};
    r.attention = attn ? &(*attn)[static_cast<size_t>(l)] : nullptr;
    r.inv_freq = c.is_local_layer(l) ? inv_freq_local_.data() : inv_freq_.data();
    eh.layer_start(l, x);
    if (!run_layer(ops, &r, rec ? rec->graph : nullptr, &eh)) return;
  }
  for (auto& s : b.seqs) s.cache->length_ += s.T;
  if (observe)
    observe->tokens += [&] {
      int64_t n = 0;
      for (const auto& s : b.seqs) n += s.T;
      return n;
    }();
}

TensorF32 Engine::forward_chunked(const std::vector<KVCache*>& caches,
                                  const std::vector<std::span<const int32_t>>& seqs,
                                  const Plan& plan, const PreparedLinears* prep,
                                  Recording* rec) const {
  const auto& c = model_->config();
  const int64_t d = c.d_model;
  const float rs = residual_scale(plan);
  int64_t total = 0;
  for (const auto& s : seqs) total += static_cast<int64_t>(s.size());
  TensorF32 out({total, d});
  int64_t out_row = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const auto& seq = seqs[si];
    const int64_t T = static_cast<int64_t>(seq.size());
    // Static graph rows: chunk_len, or a smaller pre-built graph for a short prompt (block.h).
    const int64_t C = prefill_graph_rows(T, plan.chunk_len);
    std::vector<float> x(static_cast<size_t>(C * d));
    for (int64_t c0 = 0; c0 < T; c0 += C) {
      const int64_t valid = std::min(C, T - c0);
      Batch b;
      b.N = C;
      b.pos.resize(static_cast<size_t>(C));
      const int64_t past = caches[si]->length();
      // Padding rows are zero vectors after the real rows (any value would do: every
      // operator but attention is row-wise, and attention skips them).
      std::fill(x.begin(), x.end(), 0.0f);
      embed_rows(seq.subspan(static_cast<size_t>(c0), static_cast<size_t>(valid)), x.data(), rs);
      for (int64_t t = 0; t < C; ++t) b.pos[static_cast<size_t>(t)] = past + t;
      b.seqs = {{caches[si], 0, valid, true}};
      b.segments = {{0, valid}};
      // The attention graph is fixed by the KV length it sees: chunk index = past / C.
      if (rec) {
        rec->chunk = past / C;
        if (rec->graph) rec->graph->begin_chunk(past / C, C, past + C, false, rec->expected);
      }
      run_blocks(b, x.data(), plan, false, prep, past / C, nullptr, nullptr, rec);
      if (rec && rec->graph) rec->graph->end_chunk();
      k::rms_norm(x.data(), model_->final_norm().ptr(), valid, d, c.rms_eps * rs * rs,
                  out.ptr() + out_row * d);
      if (plan.at(OpClass::LmHead).format == soc::DType::Fp16)
        k::round_to_fp16(out.ptr() + out_row * d, valid * d);
      out_row += valid;
    }
  }
  return out;
}

TensorF32 Engine::forward_hidden(const std::vector<KVCache*>& caches,
                                 const std::vector<std::span<const int32_t>>& seqs,
                                 const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.forward_hidden(caches, seqs, plan);
  return forward(caches, seqs, plan, nullptr);
}

TensorF32 Engine::forward(const std::vector<KVCache*>& caches,
                          const std::vector<std::span<const int32_t>>& seqs, const Plan& plan,
                          Recording* rec) const {
  const auto& c = model_->config();
  const float rs = residual_scale(plan);
  if (seqs.empty()) throw InvalidArgument("[Engine.forward] no sequences given");
  if (caches.size() != seqs.size())
    throw ShapeError("[Engine.forward] " + std::to_string(seqs.size()) + " sequences but " +
                     std::to_string(caches.size()) + " caches");
  plan.validate_placement();
  if (plan.chunk_len > c.context_length)
    throw InvalidArgument("[Engine.forward] chunk length " + std::to_string(plan.chunk_len) +
                          " exceeds the model's context length " +
                          std::to_string(c.context_length));
  for (size_t i = 0; i < caches.size(); ++i) {
    if (!caches[i]) throw InvalidArgument("[Engine.forward] null cache");
    for (size_t j = 0; j < i; ++j)
      if (caches[i] == caches[j])
        throw InvalidArgument("[Engine.forward] sequences " + std::to_string(j) + " and " +
                              std::to_string(i) + " share one KV cache");
  }
  // A single new token on a non-empty cache is a decoding step: it runs under the plan's decode
  // placement with full attention (seed 000 §4). A batch mixing steps and prompts runs each
  // group under its own phase.
  std::vector<size_t> steps, prompts;
  for (size_t s = 0; s < seqs.size(); ++s)
    (seqs[s].size() == 1 && caches[s]->length() > 0 ? steps : prompts).push_back(s);
  if (!steps.empty() && !prompts.empty()) {
    if (rec) throw InvalidArgument("[Engine.forward] a recorded call runs one phase at a time");
    std::vector<TensorF32> parts;
    std::vector<int64_t> row_of(seqs.size());
    for (const auto* group : {&prompts, &steps}) {
      std::vector<KVCache*> gc;
      std::vector<std::span<const int32_t>> gs;
      for (size_t s : *group) gc.push_back(caches[s]), gs.push_back(seqs[s]);
      parts.push_back(forward(gc, gs, plan, nullptr));
    }
    const int64_t d = c.d_model;
    int64_t total = 0;
    for (const auto& s : seqs) total += static_cast<int64_t>(s.size());
    TensorF32 out({total, d});
    std::vector<int64_t> start(seqs.size());
    for (size_t s = 0, r = 0; s < seqs.size(); r += seqs[s].size(), ++s)
      start[s] = static_cast<int64_t>(r);
    size_t gi = 0;
    for (const auto* group : {&prompts, &steps}) {
      int64_t r = 0;
      for (size_t s : *group) {
        const auto T = static_cast<int64_t>(seqs[s].size());
        std::copy_n(parts[gi].ptr() + r * d, T * d, out.ptr() + start[s] * d);
        r += T;
      }
      ++gi;
    }
    return out;
  }
  const bool decode = prompts.empty();
  const Plan decode_plan = decode ? plan.for_decode() : Plan();
  const Plan& phase_plan = decode ? decode_plan : plan;
  // Held before the lengths are read: another call must not append between the capacity check
  // and the writes.
  KVCacheUse in_use(caches, "Engine.forward");
  int64_t N = 0;
  Batch b;
  for (size_t s = 0; s < seqs.size(); ++s) {
    check_tokens(seqs[s], "Engine.forward");
    if (caches[s]->n_layers_ != c.n_layers || caches[s]->kv_dim_ != c.kv_dim())
      throw InvalidArgument("[Engine.forward] cache made for another model (" +
                            std::to_string(caches[s]->n_layers_) + " layers x kv_dim " +
                            std::to_string(caches[s]->kv_dim_) + "; this model has " +
                            std::to_string(c.n_layers) + " x " + std::to_string(c.kv_dim()) + ")");
    const int64_t T = static_cast<int64_t>(seqs[s].size());
    const int64_t need = caches[s]->length() + T;
    if (need > c.context_length)
      throw ContextOverflow("[Engine.forward] sequence of " + std::to_string(need) +
                            " tokens exceeds the model's context length " +
                            std::to_string(c.context_length));
    if (need > caches[s]->capacity())
      throw ContextOverflow("[Engine.forward] sequence of " + std::to_string(need) +
                            " tokens exceeds the cache capacity " +
                            std::to_string(caches[s]->capacity()));
    b.seqs.push_back({caches[s], N, T, true});
    b.segments.push_back({N, N + T});
    N += T;
  }
  const auto prep = prepare(phase_plan);
  // Chunked plans run prompts on static graphs (a recorded one-token prompt too); decoding
  // steps run unchunked (llm.npu decodes on the CPU, seed 001 §3.1) with the same linear
  // numerics.
  if (!decode && plan.chunk_len > 0) {
    TensorF32 out = forward_chunked(caches, seqs, plan, prep.get(), rec);
    in_use.commit();
    return out;
  }

  const int64_t d = c.d_model;
  TensorF32 x({N, d});
  b.N = N;
  b.pos.resize(static_cast<size_t>(N));
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const auto& s = b.seqs[si];
    embed_rows(seqs[si], x.ptr() + s.row0 * d, rs);
    for (int64_t t = 0; t < s.T; ++t)
      b.pos[static_cast<size_t>(s.row0 + t)] = s.cache->length() + t;
  }
  if (rec && rec->graph)  // one chunk of the whole prompt, or one decoding step
    rec->graph->begin_chunk(rec->chunk, N, b.seqs[0].cache->length() + N, decode, rec->expected);
  run_blocks(b, x.ptr(), phase_plan, decode, prep.get(), -1, nullptr, nullptr, rec);
  if (rec && rec->graph) rec->graph->end_chunk();
  TensorF32 out({N, d});
  k::rms_norm(x.ptr(), model_->final_norm().ptr(), N, d, c.rms_eps * rs * rs, out.ptr());
  if (phase_plan.at(OpClass::LmHead).format == soc::DType::Fp16) k::round_to_fp16(out.ptr(), N * d);
  in_use.commit();
  return out;
}

AttentionTimingOptions Engine::attention_timing(const Plan& plan) const {
  // the head-wise timing uses the keep ratios this engine runs (Eq. 3's from calibration)
  AttentionTimingOptions timing;
  if (const auto attn = prepare_attention(plan); attn && plan.attention.is_sparse())
    for (const auto& layer : *attn)
      timing.head_ratios.insert(timing.head_ratios.end(), layer.head_ratio.begin(),
                                layer.head_ratio.end());
  return timing;
}

Engine::Prefill Engine::prefill(std::span<const int32_t> tokens, const Plan& plan,
                                bool all_positions, bool return_graph, int64_t decode_tokens,
                                bool return_records) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.prefill(tokens, plan, all_positions, return_graph, decode_tokens, return_records);
  check_tokens(tokens, "Engine.prefill");
  const int64_t T = static_cast<int64_t>(tokens.size());
  const auto& c = model_->config();
  if (T > c.context_length)
    throw ContextOverflow("[Engine.prefill] prompt of " + std::to_string(T) +
                          " tokens exceeds the model's context length " +
                          std::to_string(c.context_length));
  if (plan.chunk_len > c.context_length)
    throw InvalidArgument("[Engine.prefill] chunk length " + std::to_string(plan.chunk_len) +
                          " exceeds the model's context length " +
                          std::to_string(c.context_length));
  if (decode_tokens < 0)
    throw InvalidArgument("[Engine.prefill] decode_tokens must be >= 0, got " +
                          std::to_string(decode_tokens));
  if (decode_tokens > c.context_length - T)
    throw ContextOverflow("[Engine.prefill] prompt of " + std::to_string(T) + " tokens + " +
                          std::to_string(decode_tokens) +
                          " decoded exceed the model's context length " +
                          std::to_string(c.context_length));
  KVCache cache = new_cache(T + decode_tokens);
  std::optional<GraphRecorder> graph;
  Recording rec;
  Prefill out;
  if (return_graph) graph.emplace(c, timing_plan(plan), attention_timing(plan));
  rec.graph = graph ? &*graph : nullptr;
  rec.records = return_records ? &out.records : nullptr;
  const bool recording = return_graph || return_records;
  if (recording) rec.expected = expected_shadow_loads(plan);
  TensorF32 h = forward({&cache}, {tokens}, plan, recording ? &rec : nullptr);
  const int64_t d = h.dim(1);
  out.logits = all_positions ? logits_from_hidden(h.ptr(), T, plan)
                             : logits_from_hidden(h.ptr() + (T - 1) * d, 1, plan);
  if (graph) graph->add_lm_head(1);
  // Greedy decoding steps, each one chunk after the prompt's (block.h).
  const int64_t chunks = prefill_chunks(T, plan.chunk_len);
  const Plan decode_plan = decode_tokens > 0 ? plan.for_decode() : Plan();
  if (recording && decode_tokens > 0) rec.expected = expected_shadow_loads(decode_plan);
  const float* last = out.logits.ptr() + (out.logits.dim(0) - 1) * c.vocab_size;
  int32_t tok = static_cast<int32_t>(k::argmax(last, c.vocab_size));
  for (int64_t s = 0; s < decode_tokens; ++s) {
    out.decoded.push_back(tok);
    rec.chunk = chunks + s;
    TensorF32 hs =
        forward({&cache}, {std::span<const int32_t>(&tok, 1)}, plan, recording ? &rec : nullptr);
    const TensorF32 lg = logits_from_hidden(hs.ptr(), 1, decode_plan);
    if (graph) graph->add_lm_head(1);
    tok = static_cast<int32_t>(k::argmax(lg.ptr(), c.vocab_size));
  }
  if (graph) {
    out.graph = graph->take();
    out.graph.meta = graph_meta(c, plan, T, plan.chunk_len,
                                decode_tokens > 0 ? "session" : "prefill", decode_tokens);
  }
  return out;
}

std::vector<ShadowLoad> Engine::expected_shadow_loads(const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.expected_shadow_loads(plan);
  if (!plan.linear.shadow) return {};
  const auto prep = prepare(plan);
  const auto calib = calibration();
  const auto& c = model_->config();
  std::vector<ShadowLoad> loads(static_cast<size_t>(c.n_layers * kNumLinearSites));
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int s = 0; s < kNumLinearSites; ++s) {
      const auto site = static_cast<LinearSite>(s);
      auto& ld = loads[static_cast<size_t>(l * kNumLinearSites + s)];
      const quant::ShadowLinearConfig& cfg = *prep->at(l, site).shadow();
      ld.pruned = cfg.pruned;
      // Distinct outlier channels per calibration sequence, the cold ones fetched from flash.
      const auto seqs = calib->outlier_seqs[s][static_cast<size_t>(l)];
      ld.outlier_channels =
          seqs > 0 ? static_cast<double>(calib->outlier_seq_channels[s][static_cast<size_t>(l)]) /
                         static_cast<double>(seqs)
                   : 0.0;
      ld.cold_fetch_bytes =
          cold_fetch_bytes(c, site, ld.outlier_channels, plan.linear.shadow->hot_share);
    }
  return loads;
}

sched::TaskGraph Engine::task_graph(const Plan& plan, int64_t prompt_len, int64_t chunk_len,
                                    int64_t decode_tokens) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.task_graph(plan, prompt_len, chunk_len, decode_tokens);
  GraphOptions o;
  o.expected = expected_shadow_loads(plan);
  o.attention = attention_timing(plan);
  return prefill_task_graph(model_->config(), timing_plan(plan), prompt_len, chunk_len, o,
                            decode_tokens);
}

Plan Engine::timing_plan(const Plan& plan) const {
  const auto& cb = plan.linear.channel_bits;
  if (!cb || !cb->stored) return plan;
  const auto calib = calibration();
  if (!calib || !calib->has_channel_bits()) return plan;  // the run refuses it (prepare)
  // Each row's codes cost its width times its input width (quant::stored_weight_bytes).
  const auto& c = model_->config();
  double code_bits = 0, weights = 0;
  for (int s = 0; s < kNumLinearSites; ++s) {
    const double in = static_cast<double>(linear_site_width(c, static_cast<LinearSite>(s)));
    for (int64_t b : calib->channel_bits[static_cast<size_t>(s)]) {
      code_bits += static_cast<double>(b) * in;
      weights += in;
    }
  }
  Plan timed = plan;
  timed.linear.channel_bits->bits = code_bits / weights;
  return timed;
}

void Engine::observe_activations(const std::vector<std::vector<int32_t>>& seqs,
                                 Calibration& into) const {
  into.check_matches(model_->config());
  check_rotation_matches(into, "Engine.observe_activations");
  for (const auto& s : seqs) {
    check_tokens(s, "Engine.observe_activations");
    KVCache cache = new_cache(static_cast<int64_t>(s.size()));
    Batch b;
    const int64_t T = static_cast<int64_t>(s.size()), d = model_->config().d_model;
    b.N = T;
    b.seqs = {{&cache, 0, T, true}};
    b.segments = {{0, T}};
    b.pos.resize(static_cast<size_t>(T));
    TensorF32 x({T, d});
    embed_rows(s, x.ptr());
    for (int64_t t = 0; t < T; ++t) b.pos[static_cast<size_t>(t)] = t;
    run_blocks(b, x.ptr(), Plan{}, false, nullptr, -1, &into);
    into.observe_residual(model_->config().n_layers, x.ptr(), T, d);
  }
}

TensorF32 Engine::run_fp32(const std::vector<std::span<const int32_t>>& seqs, const RunHooks& hooks,
                           const float* x_in) const {
  const int64_t d = model_->config().d_model;
  std::vector<KVCache> caches;
  caches.reserve(seqs.size());
  Batch b;
  for (const auto& s : seqs) {
    check_tokens(s, "Engine");
    const int64_t T = static_cast<int64_t>(s.size());
    if (T > model_->config().context_length)
      throw ContextOverflow("[Engine] sequence of " + std::to_string(T) +
                            " tokens exceeds the model's context length " +
                            std::to_string(model_->config().context_length));
    caches.push_back(new_cache(T));
    b.seqs.push_back({&caches.back(), b.N, T, true});
    b.segments.push_back({b.N, b.N + T});
    for (int64_t t = 0; t < T; ++t) b.pos.push_back(t);
    b.N += T;
  }
  TensorF32 x({b.N, d});
  if (x_in) {
    std::memcpy(x.ptr(), x_in, static_cast<size_t>(b.N * d) * sizeof(float));
  } else {
    for (const auto& s : b.seqs) embed_rows(seqs[&s - b.seqs.data()], x.ptr() + s.row0 * d);
  }
  run_blocks(b, x.ptr(), Plan{}, false, nullptr, -1, nullptr, &hooks);
  return x;
}

void Engine::observe_attention_scales(const std::vector<std::vector<int32_t>>& seqs,
                                      Calibration& into) const {
  const auto& c = model_->config();
  into.check_matches(c);
  check_rotation_matches(into, "Engine.observe_attention_scales");
  const int64_t per = c.n_heads + 2 * c.n_kv_heads;
  for (const auto& s : seqs) {
    std::vector<std::vector<float>> absmax(1, std::vector<float>(c.n_layers * per));
    RunHooks hooks;
    hooks.qkv_absmax = &absmax;
    run_fp32({s}, hooks);
    const auto& a = absmax[0];
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const float* row = a.data() + l * per;
      into.q_absmax.insert(into.q_absmax.end(), row, row + c.n_heads);
      into.k_absmax.insert(into.k_absmax.end(), row + c.n_heads, row + c.n_heads + c.n_kv_heads);
      into.v_absmax.insert(into.v_absmax.end(), row + c.n_heads + c.n_kv_heads, row + per);
    }
  }
}

Engine::Capture Engine::capture(std::span<const int32_t> tokens, int64_t layer) const {
  return std::move(capture(tokens, std::vector<int64_t>{layer})[0]);
}

std::vector<Engine::Capture> Engine::capture(std::span<const int32_t> tokens,
                                             const std::vector<int64_t>& layers) const {
  const auto& c = model_->config();
  if (layers.empty()) throw InvalidArgument("[Engine.capture] no layers given");
  RunHooks hooks;
  hooks.capture_layers.assign(static_cast<size_t>(c.n_layers), false);
  for (int64_t layer : layers) {
    if (layer < 0 || layer >= c.n_layers)
      throw InvalidArgument("[Engine.capture] layer " + std::to_string(layer) + " outside [0, " +
                            std::to_string(c.n_layers) + ")");
    hooks.capture_layers[static_cast<size_t>(layer)] = true;
    hooks.stop_layer = std::max(hooks.stop_layer, layer);
  }
  check_tokens(tokens, "Engine.capture");
  const int64_t T = static_cast<int64_t>(tokens.size()), hd = c.head_dim, w = c.qkv_dim();
  std::vector<std::vector<float>> qkv(static_cast<size_t>(c.n_layers));
  hooks.qkv_out = &qkv;
  run_fp32({tokens}, hooks);
  std::vector<Capture> out;
  for (int64_t layer : layers) {
    const auto& rows = qkv[static_cast<size_t>(layer)];
    Capture cap{TensorF32({c.n_heads, T, hd}), TensorF32({c.n_kv_heads, T, hd}),
                TensorF32({c.n_kv_heads, T, hd})};
    const auto split = [&](TensorF32& dst, int64_t col0, int64_t heads) {
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < T; ++t)
          std::memcpy(dst.ptr() + (h * T + t) * hd, rows.data() + t * w + col0 + h * hd,
                      static_cast<size_t>(hd) * sizeof(float));
    };
    split(cap.q, 0, c.n_heads);
    split(cap.k, c.q_dim(), c.n_kv_heads);
    split(cap.v, c.q_dim() + c.kv_dim(), c.n_kv_heads);
    out.push_back(std::move(cap));
  }
  return out;
}

std::vector<TensorF32> Engine::layer_inputs(std::span<const int32_t> tokens) const {
  const auto& c = model_->config();
  std::vector<std::vector<float>> xs(static_cast<size_t>(c.n_layers));
  RunHooks hooks;
  hooks.layer_inputs = &xs;
  run_fp32({tokens}, hooks);
  std::vector<TensorF32> out;
  for (auto& x : xs) {
    TensorF32 t({static_cast<int64_t>(tokens.size()), c.d_model});
    t.data = std::move(x);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<std::vector<float>> Engine::ablation_logprobs(
    std::span<const int32_t> tokens, int64_t layer, const TensorF32& x,
    const std::vector<std::vector<float>>& masks) const {
  const auto& c = model_->config();
  const int64_t T = static_cast<int64_t>(tokens.size()), d = c.d_model;
  if (layer < 0 || layer >= c.n_layers)
    throw InvalidArgument("[Engine.ablation_logprobs] layer " + std::to_string(layer) +
                          " outside [0, " + std::to_string(c.n_layers) + ")");
  if (T < 2)
    throw InvalidArgument("[Engine.ablation_logprobs] needs at least 2 tokens, got " +
                          std::to_string(T));
  if (x.shape != std::vector<int64_t>{T, d})
    throw ShapeError("[Engine.ablation_logprobs] x must be [" + std::to_string(T) + ", " +
                     std::to_string(d) + "] (the layer's input), got " + shape_str(x.shape));
  if (masks.empty()) throw InvalidArgument("[Engine.ablation_logprobs] no masks given");
  for (const auto& m : masks)
    if (static_cast<int64_t>(m.size()) != c.n_heads)
      throw ShapeError("[Engine.ablation_logprobs] a mask has " + std::to_string(m.size()) +
                       " values, the model has " + std::to_string(c.n_heads) + " heads");
  const int64_t M = static_cast<int64_t>(masks.size());
  std::vector<float> xin(static_cast<size_t>(M * T * d));
  for (int64_t i = 0; i < M; ++i) std::copy(x.data.begin(), x.data.end(), xin.begin() + i * T * d);
  RunHooks hooks;
  hooks.start_layer = layer;
  hooks.head_mask = &masks;
  const std::vector<std::span<const int32_t>> seqs(static_cast<size_t>(M), tokens);
  TensorF32 h = run_fp32(seqs, hooks, xin.data());
  std::vector<float> normed(static_cast<size_t>(T * d));
  std::vector<std::vector<float>> out;
  constexpr int64_t kRowBlock = 256;  // bounds the logits block to kRowBlock x V floats
  for (int64_t i = 0; i < M; ++i) {
    k::rms_norm(h.ptr() + i * T * d, model_->final_norm().ptr(), T, d, c.rms_eps, normed.data());
    std::vector<float> lp(static_cast<size_t>(T - 1));
    for (int64_t b0 = 0; b0 < T - 1; b0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, T - 1 - b0);
      TensorF32 lg = logits_from_hidden(normed.data() + b0 * d, rows, Plan());
      k::log_softmax_gather(lg.ptr(), rows, c.vocab_size, c.vocab_size, tokens.data() + b0 + 1,
                            lp.data() + b0);
    }
    out.push_back(std::move(lp));
  }
  return out;
}

TensorF32 Engine::logits_from_hidden(const float* h, int64_t rows, const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.logits_from_hidden(h, rows, plan);
  const auto& c = model_->config();
  TensorF32 out({rows, c.vocab_size});
  const bool fp16 = plan.at(OpClass::LmHead).format == soc::DType::Fp16;
  if (!plan.lm_head_linear && !fp16) {
    k::linear(h, rows, c.d_model, c.d_model, model_->lm_head().ptr(), c.vocab_size, nullptr,
              out.ptr(), c.vocab_size);
    return out;
  }
  // The head's weights as the plan holds them, built once per form (the last one kept: a
  // vocabulary-sized copy).
  const std::string key = plan.lm_head_linear ? plan.linear.to_json().dump() : "fp16";
  std::shared_ptr<const quant::PreparedLinear> lin;
  std::shared_ptr<const std::vector<float>> w16;
  {
    std::lock_guard lock(mu_);
    if (lm_head_key_ != key) {
      lm_head_linear_.reset();
      lm_head_fp16_.reset();
      if (plan.lm_head_linear) {
        // the head's input has no calibrated Hessian: GPTQ plans round the head to nearest
        quant::LinearScheme head = plan.linear;
        head.rounding = quant::Rounding::Nearest;
        if (head.needs_calibration() || head.shadow || head.outlier_threshold)
          throw InvalidArgument("[Engine] plan '" + plan.name +
                                "': lm_head_weights=linear quantizes the LM head with a "
                                "weight-only scheme (the head has no calibrated activation "
                                "scales); its linears are " +
                                plan.linear.to_json().dump());
        lm_head_linear_ = std::make_shared<const quant::PreparedLinear>(
            model_->lm_head().ptr(), c.vocab_size, c.d_model, nullptr, head,
            quant::LinearContext{});
      } else {
        auto w = std::make_shared<std::vector<float>>(model_->lm_head().data);
        k::round_to_fp16(w->data(), static_cast<int64_t>(w->size()));
        lm_head_fp16_ = std::move(w);
      }
      lm_head_key_ = key;
    }
    lin = lm_head_linear_;
    w16 = lm_head_fp16_;
  }
  if (lin) {
    const quant::RowSegment all{0, rows};
    lin->forward(h, rows, out.ptr(), c.vocab_size, false, {&all, 1});
  } else {
    k::linear(h, rows, c.d_model, c.d_model, w16->data(), c.vocab_size, nullptr, out.ptr(),
              c.vocab_size);
  }
  return out;
}

int64_t Engine::lm_head_weight_bytes(const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.lm_head_weight_bytes(plan);
  const auto& c = model_->config();
  if (plan.lm_head_linear) {
    (void)logits_from_hidden(std::vector<float>(static_cast<size_t>(c.d_model), 0.0f).data(), 1,
                             plan);
    std::lock_guard lock(mu_);
    return lm_head_linear_->weight_bytes();
  }
  return c.vocab_size * c.d_model * soc::dtype_bytes(plan.at(OpClass::LmHead).format);
}

TensorF32 Engine::step(KVCache& cache, std::span<const int32_t> tokens, bool all_positions,
                       const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.step(cache, tokens, all_positions, plan);
  // a decoding step's LM head is placed as the plan's decode phase places it
  const bool decode = tokens.size() == 1 && cache.length() > 0;
  TensorF32 h = forward_hidden({&cache}, {tokens}, plan);
  const int64_t T = h.dim(0), d = h.dim(1);
  const Plan head_plan = decode ? plan.for_decode() : plan;
  return all_positions ? logits_from_hidden(h.ptr(), T, head_plan)
                       : logits_from_hidden(h.ptr() + (T - 1) * d, 1, head_plan);
}

namespace {
// Runs each sequence from an empty cache sized to it, so a batch of short sequences stays small.
TensorF32 forward_fresh(const Engine& e, const std::vector<std::vector<int32_t>>& seqs,
                        const Plan& plan) {
  std::vector<KVCache> caches;
  caches.reserve(seqs.size());
  const int64_t ctx = e.model().config().context_length;
  for (const auto& s : seqs) {
    if (static_cast<int64_t>(s.size()) > ctx)
      throw ContextOverflow("[Engine] sequence of " + std::to_string(s.size()) +
                            " tokens exceeds the model's context length " + std::to_string(ctx));
    caches.push_back(e.new_cache(std::max<int64_t>(1, static_cast<int64_t>(s.size()))));
  }
  std::vector<KVCache*> cp;
  std::vector<std::span<const int32_t>> sp;
  for (size_t i = 0; i < seqs.size(); ++i) {
    cp.push_back(&caches[i]);
    sp.emplace_back(seqs[i]);
  }
  return e.forward_hidden(cp, sp, plan);
}
}  // namespace

std::vector<TensorF32> Engine::logits(const std::vector<std::vector<int32_t>>& seqs,
                                      const Plan& plan,
                                      const std::vector<int64_t>& last_rows) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.logits(seqs, plan, last_rows);
  if (!last_rows.empty() && last_rows.size() != seqs.size())
    throw InvalidArgument("[Engine.logits] last_rows has " + std::to_string(last_rows.size()) +
                          " counts for " + std::to_string(seqs.size()) + " sequences");
  for (size_t i = 0; i < last_rows.size(); ++i)
    if (last_rows[i] < 1 || last_rows[i] > static_cast<int64_t>(seqs[i].size()))
      throw InvalidArgument("[Engine.logits] last_rows[" + std::to_string(i) +
                            "] = " + std::to_string(last_rows[i]) + " is outside 1.." +
                            std::to_string(seqs[i].size()) + " (the sequence's length)");
  TensorF32 h = forward_fresh(*this, seqs, plan);
  const int64_t d = h.dim(1), V = model_->config().vocab_size;
  // Short sequences share one vocabulary projection: sgemm repacks the [V, d] head on every
  // call, which costs more than a few rows' product (Gemma 3's head is 671 MB). A group is
  // capped at kHeadRows rows to bound its temporary [rows, V] before it is split.
  constexpr int64_t kHeadRows = 256;
  const size_t n_seqs = seqs.size();
  // Sequence i's rows start at row first[i] of src: h itself, or its picked last rows.
  std::vector<int64_t> rows(n_seqs), first(n_seqs), start(n_seqs);
  int64_t total = 0, in_h = 0;
  for (size_t i = 0; i < n_seqs; ++i) {
    const auto T = static_cast<int64_t>(seqs[i].size());
    rows[i] = last_rows.empty() ? T : last_rows[i];
    start[i] = in_h + T - rows[i];
    first[i] = last_rows.empty() ? start[i] : total;
    total += rows[i];
    in_h += T;
  }
  std::vector<float> picked;
  const float* src = h.ptr();
  if (!last_rows.empty()) {
    picked.resize(static_cast<size_t>(total * d));
    for (size_t i = 0; i < n_seqs; ++i)
      std::copy_n(h.ptr() + start[i] * d, rows[i] * d, picked.data() + first[i] * d);
    src = picked.data();
  }
  std::vector<TensorF32> out(n_seqs);
  for (size_t i = 0; i < n_seqs;) {
    size_t j = i + 1;
    int64_t m = rows[i];
    while (j < n_seqs && m + rows[j] <= kHeadRows) m += rows[j++];
    if (j == i + 1) {
      out[i] = logits_from_hidden(src + first[i] * d, rows[i], plan);
    } else {
      const TensorF32 group = logits_from_hidden(src + first[i] * d, m, plan);
      for (size_t k = i; k < j; ++k) {
        out[k] = TensorF32({rows[k], V});
        std::copy_n(group.ptr() + (first[k] - first[i]) * V, rows[k] * V, out[k].ptr());
      }
    }
    i = j;
  }
  return out;
}

std::vector<std::vector<float>> Engine::token_logprobs(
    const std::vector<std::vector<int32_t>>& seqs, const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.token_logprobs(seqs, plan);
  for (const auto& s : seqs)
    if (s.size() < 2)
      throw InvalidArgument("[Engine.token_logprobs] each sequence needs at least 2 tokens, got " +
                            std::to_string(s.size()));
  TensorF32 h = forward_fresh(*this, seqs, plan);
  const int64_t d = h.dim(1), V = model_->config().vocab_size;
  constexpr int64_t kRowBlock = 256;  // bounds the logits block to kRowBlock x V floats
  std::vector<std::vector<float>> out;
  int64_t r0 = 0;
  for (const auto& s : seqs) {
    const int64_t n = static_cast<int64_t>(s.size()) - 1;  // positions that predict a token
    std::vector<float> lp(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; b += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, n - b);
      TensorF32 lg = logits_from_hidden(h.ptr() + (r0 + b) * d, rows, plan);
      k::log_softmax_gather(lg.ptr(), rows, V, V, s.data() + b + 1, lp.data() + b);
    }
    out.push_back(std::move(lp));
    r0 += static_cast<int64_t>(s.size());
  }
  return out;
}

std::vector<int32_t> Engine::generate_greedy(std::span<const int32_t> prompt,
                                             int64_t max_new_tokens,
                                             const std::vector<int32_t>& stop_ids,
                                             const Plan& plan) const {
  if (const Engine& e = for_rotation(plan.rotation); &e != this)
    return e.generate_greedy(prompt, max_new_tokens, stop_ids, plan);
  if (max_new_tokens < 0)
    throw InvalidArgument("[Engine.generate] max_new_tokens must be >= 0, got " +
                          std::to_string(max_new_tokens));
  check_tokens(prompt, "Engine.generate");
  const int64_t ctx = model_->config().context_length;
  // Compared before adding: max_new_tokens may be anything up to 2^63 - 1.
  if (max_new_tokens > ctx - static_cast<int64_t>(prompt.size()))
    throw ContextOverflow("[Engine.generate] prompt of " + std::to_string(prompt.size()) +
                          " tokens + " + std::to_string(max_new_tokens) +
                          " new tokens exceeds the model's context length " + std::to_string(ctx));
  std::vector<int32_t> out;
  if (max_new_tokens == 0) return out;
  KVCache cache = new_cache(static_cast<int64_t>(prompt.size()) + max_new_tokens);
  TensorF32 lg = step(cache, prompt, false, plan);
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int32_t tok = static_cast<int32_t>(k::argmax(lg.ptr(), lg.dim(1)));
    out.push_back(tok);
    if (std::find(stop_ids.begin(), stop_ids.end(), tok) != stop_ids.end()) break;
    if (i + 1 < max_new_tokens) lg = step(cache, std::span<const int32_t>(&tok, 1), false, plan);
  }
  spdlog::debug("generated {} tokens", out.size());
  return out;
}

}  // namespace socllm
