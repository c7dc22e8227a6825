#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "model/model.h"

namespace socllm {

std::vector<std::string> ModelConfig::supported_archs() { return {"llama", "qwen2", "gemma3"}; }

void ModelConfig::check_runnable() const {
  auto archs = supported_archs();
  if (std::find(archs.begin(), archs.end(), arch) == archs.end())
    throw Unsupported(
        "[ModelConfig] architecture '" + arch +
        "' is not supported by the engine (llama, qwen2, gemma3); shape-only configs of "
        "other architectures can be timed, not run");
  if (!gated_mlp)
    throw Unsupported("[ModelConfig] '" + name +
                      "': plain (non-gated) MLPs are not supported by "
                      "the engine");
}

void ModelConfig::validate() const {
  if (arch.empty()) throw InvalidArgument("[ModelConfig] arch must not be empty");
  // Dimensions index int32 token ids and int64 products of two of them (vocab x d_model), so each
  // stays below 2^31.
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  auto positive = [](const char* what, int64_t v) {
    if (v <= 0 || v > kMaxDim)
      throw InvalidArgument(std::string("[ModelConfig] ") + what + " must be in [1, " +
                            std::to_string(kMaxDim) + "], got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("head_dim", head_dim);
  positive("d_ff", d_ff);
  positive("context_length", context_length);
  if (n_heads * head_dim > kMaxDim)  // both <= 2^31: the products fit in int64
    throw InvalidArgument(
        "[ModelConfig] n_heads x head_dim = " + std::to_string(n_heads * head_dim) + " exceeds " +
        std::to_string(kMaxDim));
  if (n_heads % n_kv_heads != 0)
    throw InvalidArgument("[ModelConfig] n_heads " + std::to_string(n_heads) +
                          " is not a multiple of n_kv_heads " + std::to_string(n_kv_heads));
  if (head_dim % 2 != 0)
    throw InvalidArgument("[ModelConfig] head_dim must be even for RoPE, got " +
                          std::to_string(head_dim));
  if (!(rope_theta > 0) || !std::isfinite(rope_theta))
    throw InvalidArgument("[ModelConfig] rope_theta must be finite and > 0, got " +
                          std::to_string(rope_theta));
  if (!(rms_eps > 0) || !std::isfinite(rms_eps))
    throw InvalidArgument("[ModelConfig] rms_eps must be finite and > 0, got " +
                          std::to_string(rms_eps));
  if (activation != "silu" && activation != "gelu_tanh")
    throw InvalidArgument("[ModelConfig] activation must be silu or gelu_tanh, got '" + activation +
                          "'");
  if (sliding_window < 0 || sliding_window_pattern < 0 || !(rope_theta_local >= 0))
    throw InvalidArgument("[ModelConfig] sliding_window " + std::to_string(sliding_window) +
                          ", sliding_window_pattern " + std::to_string(sliding_window_pattern) +
                          " and rope_theta_local " + std::to_string(rope_theta_local) +
                          " must be >= 0");
  for (auto [what, id] : {std::pair{"bos_id", bos_id}, std::pair{"eos_id", eos_id}})
    if (id < -1 || id >= vocab_size)
      throw InvalidArgument(std::string("[ModelConfig] ") + what +
                            " must be -1 (none) or a token id in [0, " +
                            std::to_string(vocab_size) + "), got " + std::to_string(id));
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = extra;
  j.update(nlohmann::json{{"arch", arch},
                          {"name", name},
                          {"vocab_size", vocab_size},
                          {"d_model", d_model},
                          {"n_layers", n_layers},
                          {"n_heads", n_heads},
                          {"n_kv_heads", n_kv_heads},
                          {"head_dim", head_dim},
                          {"d_ff", d_ff},
                          {"context_length", context_length},
                          {"rope_theta", rope_theta},
                          {"rms_eps", rms_eps},
                          {"tie_embeddings", tie_embeddings},
                          {"qkv_bias", qkv_bias},
                          {"bos_id", bos_id},
                          {"eos_id", eos_id},
                          {"mlp", gated_mlp ? "gated" : "plain"}});
  // Gemma 3's fields only when set, so llama/qwen2 configs keep their shape.
  if (activation != "silu") j["activation"] = activation;
  if (sliding_window) j["sliding_window"] = sliding_window;
  if (sliding_window_pattern) j["sliding_window_pattern"] = sliding_window_pattern;
  if (rope_theta_local) j["rope_theta_local"] = rope_theta_local;
  if (qk_norm) j["qk_norm"] = true;
  if (post_norms) j["post_norms"] = true;
  if (embed_scale) j["embed_scale"] = true;
  return j;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  ModelConfig c;
  if (!j.is_object())
    throw InvalidArgument("[ModelConfig.from_json] a model config is a JSON object, got " +
                          json_text(j));
  std::string missing;
  for (const char* key :
       {"arch", "vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "context_length"})
    if (!j.contains(key)) missing += std::string(missing.empty() ? "" : ", ") + "'" + key + "'";
  if (!missing.empty())
    throw InvalidArgument("[ModelConfig.from_json] model config lacks " + missing);
  try {
    c.arch = j.at("arch").get<std::string>();
    c.name = j.value("name", std::string());
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.d_model = j.at("d_model").get<int64_t>();
    c.n_layers = j.at("n_layers").get<int64_t>();
    c.n_heads = j.at("n_heads").get<int64_t>();
    c.n_kv_heads = j.value("n_kv_heads", c.n_heads);
    c.head_dim = j.value("head_dim", c.n_heads ? c.d_model / c.n_heads : 0);
    c.d_ff = j.at("d_ff").get<int64_t>();
    c.context_length = j.at("context_length").get<int64_t>();
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.rms_eps = j.value("rms_eps", 1e-5);
    c.tie_embeddings = j.value("tie_embeddings", false);
    c.qkv_bias = j.value("qkv_bias", false);
    c.bos_id = j.value("bos_id", int64_t{-1});
    c.eos_id = j.value("eos_id", int64_t{-1});
    const std::string mlp = j.value("mlp", std::string("gated"));
    if (mlp != "gated" && mlp != "plain")
      throw InvalidArgument("[ModelConfig.from_json] unknown mlp '" + mlp + "' (gated, plain)");
    c.gated_mlp = mlp == "gated";
    c.activation = j.value("activation", std::string("silu"));
    c.sliding_window = j.value("sliding_window", int64_t{0});
    c.sliding_window_pattern = j.value("sliding_window_pattern", int64_t{0});
    c.rope_theta_local = j.value("rope_theta_local", 0.0);
    c.qk_norm = j.value("qk_norm", false);
    c.post_norms = j.value("post_norms", false);
    // shape-only configs may describe the scale in words (gemma-2b: "sqrt_d_model"): kept as
    // an extra key then, not modelled
    if (j.contains("embed_scale") && j["embed_scale"].is_boolean())
      c.embed_scale = j["embed_scale"].get<bool>();
    const nlohmann::json modelled = c.to_json();
    for (const auto& [k, v] : j.items())
      if (!modelled.contains(k) && k != "_source") c.extra[k] = v;
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("[ModelConfig.from_json] ") + e.what() + " in " +
                          json_text(j));
  }
  c.validate();
  return c;
}

}  // namespace socllm
