#include "socllm/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "socllm/kernels.h"

namespace socllm {

namespace k = kernels;

KVCache::KVCache(const ModelConfig& config, int64_t capacity)
    : capacity_(capacity), n_layers_(config.n_layers), kv_dim_(config.kv_dim()) {
  if (capacity <= 0)
    throw InvalidArgument("[KVCache] capacity must be > 0, got " + std::to_string(capacity));
  const size_t n = static_cast<size_t>(capacity * kv_dim_);
  k_.assign(static_cast<size_t>(config.n_layers), std::vector<float>(n));
  v_.assign(static_cast<size_t>(config.n_layers), std::vector<float>(n));
}

int64_t KVCache::bytes() const {
  return static_cast<int64_t>(2 * k_.size()) * capacity_ * kv_dim_ *
         static_cast<int64_t>(sizeof(float));
}

Engine::Engine(std::shared_ptr<const Model> model) : model_(std::move(model)) {
  if (!model_) throw InvalidArgument("[Engine] model is null");
  const auto& c = model_->config();
  inv_freq_.resize(static_cast<size_t>(c.head_dim / 2));
  k::rope_inv_freq(c.rope_theta, c.head_dim, inv_freq_.data());
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
                            " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                            std::to_string(V) + ")");
}

TensorF32 Engine::forward_hidden(const std::vector<KVCache*>& caches,
                                 const std::vector<std::span<const int32_t>>& seqs,
                                 const Plan& plan) const {
  Plan::from_name(plan.name);  // validates
  const auto& c = model_->config();
  if (seqs.empty()) throw InvalidArgument("[Engine.forward] no sequences given");
  if (caches.size() != seqs.size())
    throw ShapeError("[Engine.forward] " + std::to_string(seqs.size()) + " sequences but " +
                     std::to_string(caches.size()) + " caches");
  int64_t N = 0;
  std::vector<int64_t> row0(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    check_tokens(seqs[s], "Engine.forward");
    if (!caches[s]) throw InvalidArgument("[Engine.forward] null cache");
    if (caches[s]->n_layers_ != c.n_layers || caches[s]->kv_dim_ != c.kv_dim())
      throw InvalidArgument("[Engine.forward] cache made for another model (" +
                            std::to_string(caches[s]->n_layers_) + " layers x kv_dim " +
                            std::to_string(caches[s]->kv_dim_) + "; this model has " +
                            std::to_string(c.n_layers) + " x " + std::to_string(c.kv_dim()) + ")");
    const int64_t need = caches[s]->length() + static_cast<int64_t>(seqs[s].size());
    if (need > c.context_length)
      throw ContextOverflow("[Engine.forward] sequence of " + std::to_string(need) +
                            " tokens exceeds the model's context length " +
                            std::to_string(c.context_length));
    if (need > caches[s]->capacity())
      throw ContextOverflow("[Engine.forward] sequence of " + std::to_string(need) +
                            " tokens exceeds the cache capacity " +
                            std::to_string(caches[s]->capacity()));
    row0[s] = N;
    N += static_cast<int64_t>(seqs[s].size());
  }

  const int64_t d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim(), dff = c.d_ff;
  const int64_t qkv_w = qd + 2 * kvd;
  TensorF32 x({N, d});
  std::vector<int64_t> pos(static_cast<size_t>(N));
  const float* E = model_->embed_tokens().ptr();
  for (size_t s = 0; s < seqs.size(); ++s)
    for (size_t t = 0; t < seqs[s].size(); ++t) {
      const int64_t r = row0[s] + static_cast<int64_t>(t);
      std::memcpy(x.ptr() + r * d, E + static_cast<int64_t>(seqs[s][t]) * d, d * sizeof(float));
      pos[static_cast<size_t>(r)] = caches[s]->length() + static_cast<int64_t>(t);
    }

  std::vector<float> h(static_cast<size_t>(N * d)), qkv(static_cast<size_t>(N * qkv_w)),
      att(static_cast<size_t>(N * qd)), gu(static_cast<size_t>(N * 2 * dff)),
      act(static_cast<size_t>(N * dff));
  int64_t scratch = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    scratch = std::max(scratch, k::attention_scratch_floats(
                                    static_cast<int64_t>(seqs[s].size()),
                                    caches[s]->length() + static_cast<int64_t>(seqs[s].size()),
                                    c.n_heads, c.n_kv_heads, c.head_dim));
  std::vector<float> S(static_cast<size_t>(scratch));

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = model_->layer(l);
    k::rms_norm(x.ptr(), L.attn_norm.ptr(), N, d, c.rms_eps, h.data());
    k::linear(h.data(), N, d, d, L.wqkv.ptr(), qkv_w, L.bqkv.numel() ? L.bqkv.ptr() : nullptr,
              qkv.data(), qkv_w);
    k::rope_neox(qkv.data(), N, c.n_heads, c.head_dim, qkv_w, pos.data(), inv_freq_.data());
    k::rope_neox(qkv.data() + qd, N, c.n_kv_heads, c.head_dim, qkv_w, pos.data(),
                 inv_freq_.data());
    for (size_t s = 0; s < seqs.size(); ++s) {
      KVCache& cache = *caches[s];
      const int64_t T = static_cast<int64_t>(seqs[s].size()), past = cache.length();
      float* K = cache.k(l);
      float* Vc = cache.v(l);
      for (int64_t t = 0; t < T; ++t) {
        const float* src = qkv.data() + (row0[s] + t) * qkv_w;
        std::memcpy(K + (past + t) * kvd, src + qd, kvd * sizeof(float));
        std::memcpy(Vc + (past + t) * kvd, src + qd + kvd, kvd * sizeof(float));
      }
      k::attention_causal(qkv.data() + row0[s] * qkv_w, qkv_w, K, Vc, kvd, T, past, c.n_heads,
                          c.n_kv_heads, c.head_dim, att.data() + row0[s] * qd, qd, S.data());
    }
    k::linear(att.data(), N, qd, qd, L.wo.ptr(), d, nullptr, x.ptr(), d, /*accumulate=*/true);
    k::rms_norm(x.ptr(), L.ffn_norm.ptr(), N, d, c.rms_eps, h.data());
    k::linear(h.data(), N, d, d, L.w_gate_up.ptr(), 2 * dff, nullptr, gu.data(), 2 * dff);
    k::silu_mul(gu.data(), N, dff, act.data());
    k::linear(act.data(), N, dff, dff, L.w_down.ptr(), d, nullptr, x.ptr(), d, true);
  }
  for (size_t s = 0; s < seqs.size(); ++s)
    caches[s]->length_ += static_cast<int64_t>(seqs[s].size());
  TensorF32 out({N, d});
  k::rms_norm(x.ptr(), model_->final_norm().ptr(), N, d, c.rms_eps, out.ptr());
  return out;
}

TensorF32 Engine::logits_from_hidden(const float* h, int64_t rows) const {
  const auto& c = model_->config();
  TensorF32 out({rows, c.vocab_size});
  k::linear(h, rows, c.d_model, c.d_model, model_->lm_head().ptr(), c.vocab_size, nullptr,
            out.ptr(), c.vocab_size);
  return out;
}

TensorF32 Engine::step(KVCache& cache, std::span<const int32_t> tokens, bool all_positions,
                       const Plan& plan) const {
  TensorF32 h = forward_hidden({&cache}, {tokens}, plan);
  const int64_t T = h.dim(0), d = h.dim(1);
  return all_positions ? logits_from_hidden(h.ptr(), T) : logits_from_hidden(h.ptr() + (T - 1) * d, 1);
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
                                      const Plan& plan) const {
  TensorF32 h = forward_fresh(*this, seqs, plan);
  std::vector<TensorF32> out;
  int64_t r = 0;
  for (const auto& s : seqs) {
    out.push_back(logits_from_hidden(h.ptr() + r * h.dim(1), static_cast<int64_t>(s.size())));
    r += static_cast<int64_t>(s.size());
  }
  return out;
}

std::vector<std::vector<float>> Engine::token_logprobs(
    const std::vector<std::vector<int32_t>>& seqs, const Plan& plan) const {
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
      TensorF32 lg = logits_from_hidden(h.ptr() + (r0 + b) * d, rows);
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
  if (max_new_tokens < 0)
    throw InvalidArgument("[Engine.generate] max_new_tokens must be >= 0, got " +
                          std::to_string(max_new_tokens));
  check_tokens(prompt, "Engine.generate");
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_new_tokens;
  const int64_t ctx = model_->config().context_length;
  if (total > ctx)
    throw ContextOverflow("[Engine.generate] prompt of " + std::to_string(prompt.size()) +
                          " tokens + " + std::to_string(max_new_tokens) +
                          " new tokens exceeds the model's context length " + std::to_string(ctx));
  std::vector<int32_t> out;
  if (max_new_tokens == 0) return out;
  KVCache cache = new_cache(total);
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
