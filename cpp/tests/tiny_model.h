// Test helper: a tiny llama model file (2 layers, d_model 8, random weights) written through the
// io layer's writer, for tests that run the engine without a real model.
#pragma once

#include <filesystem>
#include <random>
#include <string>

#include "io/model_store.h"
#include "model/model.h"

namespace tiny_model {

using namespace socllm;
namespace fs = std::filesystem;

inline fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("socllm_test_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline constexpr int64_t kVocab = 16, kDModel = 8, kLayers = 2, kHeads = 2, kKvHeads = 1, kDff = 16;
inline constexpr int64_t kHeadDim = kDModel / kHeads, kContext = 64;

// A tiny llama model file written through the io layer's writer (random weights, tied
// embeddings). `n_layers_attr` is the config's claim, kLayers are stored; post_norms adds Gemma
// 3's post-attention and post-MLP norms.
inline void write_tiny_model(const std::string& path, int64_t n_layers_attr = kLayers,
                             int64_t format_version = 2, bool post_norms = false) {
  H5Writer w(path);
  w.attr("/", "format", "socllm-model");
  w.attr("/", "format_version", format_version);
  w.group("/config");
  const nlohmann::json cfg = {{"arch", "llama"},
                              {"name", "tiny"},
                              {"vocab_size", kVocab},
                              {"d_model", kDModel},
                              {"n_layers", n_layers_attr},
                              {"n_heads", kHeads},
                              {"n_kv_heads", kKvHeads},
                              {"head_dim", kHeadDim},
                              {"d_ff", kDff},
                              {"context_length", kContext},
                              {"rope_theta", 10000.0},
                              {"rms_eps", 1e-5},
                              {"tie_embeddings", 1},
                              {"qkv_bias", 0}};
  for (const auto& [k, v] : cfg.items()) w.attr("/config", k, v);
  if (post_norms) w.attr("/config", "post_norms", int64_t{1});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  auto put = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal(rng);
    w.write("/weights/" + name, shape, v.data());
  };
  put("embed_tokens", {kVocab, kDModel});
  put("final_norm", {kDModel});
  const int64_t q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "layers/" + std::to_string(l) + "/";
    put(p + "attn_norm", {kDModel});
    put(p + "wq", {q, kDModel});
    put(p + "wk", {kv, kDModel});
    put(p + "wv", {kv, kDModel});
    put(p + "wo", {kDModel, q});
    put(p + "ffn_norm", {kDModel});
    put(p + "w_gate", {kDff, kDModel});
    put(p + "w_up", {kDff, kDModel});
    put(p + "w_down", {kDModel, kDff});
    if (post_norms) put(p + "post_attn_norm", {kDModel}), put(p + "post_ffn_norm", {kDModel});
  }
  w.commit();
}

// The tiny model, written into a fresh folder and loaded.
inline std::shared_ptr<const Model> load_tiny_model(const std::string& name) {
  const std::string path = (fresh_dir(name) / "m.h5").string();
  write_tiny_model(path);
  return Model::load(path);
}

}  // namespace tiny_model
