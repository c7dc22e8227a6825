// Model layer: configuration and fp32 weights of llama-family decoders
// (Llama: RMSNorm, RoPE, grouped-query attention, SwiGLU; Qwen2: + q/k/v biases).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/core.h"

namespace socllm {

// The one model configuration type. A config read from a model file describes weights the
// engine can run; a shape-only config (python/socllm/configs/*.json: published models timed
// without weights) is the same type, accepted everywhere a config is (block description, task
// graphs, graph census, simulation), and refused only where weights would be needed.
struct ModelConfig {
  std::string arch;  // "llama" | "qwen2" run in the engine; shape-only configs name others
  std::string name;
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t d_ff = 0;
  int64_t context_length = 0;
  double rope_theta = 10000.0;
  double rms_eps = 1e-5;
  bool tie_embeddings = false;
  bool qkv_bias = false;
  int64_t bos_id = -1;
  int64_t eos_id = -1;
  // Gated MLP (SwiGLU/GeGLU: gate and up projections) or plain (one up projection, Phi-2).
  bool gated_mlp = true;
  // Gemma 3 (transformers Gemma3TextModel; all off for llama/qwen2):
  std::string activation = "silu";     // gate activation: "silu" | "gelu_tanh"
  int64_t sliding_window = 0;          // keys a local layer's query sees (0: every layer global)
  int64_t sliding_window_pattern = 0;  // every pattern-th layer is global, the rest local
  double rope_theta_local = 0;         // RoPE base of local layers (0: rope_theta)
  bool qk_norm = false;                // RMSNorm of each q and k head before RoPE
  bool post_norms = false;             // RMSNorm of the attention and MLP outputs before the adds
  bool embed_scale = false;            // embeddings times sqrt(d_model)
  // Keys of a shape-only config this type does not model (hidden_act, norm, sliding_window ...),
  // kept verbatim so to_json round-trips them.
  nlohmann::json extra = nlohmann::json::object();

  // Architectures the engine runs numerically.
  static std::vector<std::string> supported_archs();
  // InvalidArgument naming the field for inconsistent or non-positive sizes.
  void validate() const;
  // Unsupported unless the engine can run weights of this config (arch and MLP kind).
  void check_runnable() const;
  // Whether layer l attends through a sliding window, and its RoPE base.
  bool is_local_layer(int64_t l) const {
    return sliding_window > 0 && sliding_window_pattern > 0 &&
           (l + 1) % sliding_window_pattern != 0;
  }
  // Keys layer l's query sees at most: the sliding window on local layers, 0 (all) elsewhere.
  int64_t layer_window(int64_t l) const { return is_local_layer(l) ? sliding_window : 0; }
  double layer_rope_theta(int64_t l) const {
    return is_local_layer(l) && rope_theta_local > 0 ? rope_theta_local : rope_theta;
  }
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Output width of the MLP's input projection(s): gate and up stacked, or up alone.
  int64_t mlp_in_dim() const { return gated_mlp ? 2 * d_ff : d_ff; }
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json& j);
};

// Weights of one decoder block, with projections that read the same input fused
// into one matrix so each is a single GEMM: wqkv = [wq; wk; wv], w_gate_up = [w_gate; w_up].
struct LayerWeights {
  TensorF32 attn_norm;  // [d_model]
  TensorF32 wqkv;       // [q_dim + 2*kv_dim, d_model]
  TensorF32 bqkv;       // [q_dim + 2*kv_dim] or empty
  TensorF32 wo;         // [d_model, q_dim]
  TensorF32 ffn_norm;   // [d_model]
  TensorF32 w_gate_up;  // [2*d_ff, d_model]
  TensorF32 w_down;     // [d_model, d_ff]
  // Gemma 3 only (empty otherwise): q/k head norms [head_dim], post-attention and post-MLP
  // norms [d_model].
  TensorF32 q_norm, k_norm, post_attn_norm, post_ffn_norm;
};

// One linear of a model file holding prequantized weights (`socllm convert --edgeflow-bits`,
// docs/MODEL_FORMAT.md), unpacked to INT8 rows: everything a prepared linear of the plan it was
// converted under holds, so the loaded model runs that plan without its fp32 weights or a
// calibration. Plain data; the quant layer builds the linear from it.
struct PackedLinearWeights {
  int64_t out = 0, in = 0;
  std::vector<int8_t> codes;        // [out, in]
  std::vector<uint8_t> row_bits;    // [out] bit-width each row was stored at
  std::vector<float> scales;        // [out] per-row weight scale
  std::vector<float> post;          // [out] multiplier after dequantization, or empty
  std::vector<float> out_scale;     // [out] static output scale, or empty
  std::vector<float> bias;          // [out] (after post), or empty
  std::vector<float> input_smooth;  // [in] divisor of x when not folded, or empty
  float act_scale = 0.0f;           // static per-tensor activation scale
};

// The prequantized linears of a model file and what was folded into its norms.
struct PackedModelLinears {
  nlohmann::json scheme;  // LinearScheme::to_json() of the plan converted under
  nlohmann::json plan;    // that plan's JSON (name, options)
  int64_t group = 0;      // weightlet group R of the file (0: stored as raw int8)
  std::vector<std::array<PackedLinearWeights, 4>> sites;      // [layer][LinearSite]
  std::vector<std::array<std::vector<float>, 2>> norm_gains;  // folded attn/ffn gains, or empty
  // What loading them cost: bytes read from the file, and seconds reading and unpacking.
  int64_t bytes_read = 0;
  double read_seconds = 0.0, unpack_seconds = 0.0;
};

class Model {
 public:
  // Model file format versions (docs/MODEL_FORMAT.md): `socllm convert` writes kFormatVersion;
  // load reads kOldestFormatVersion..kFormatVersion; from kChecksumFormatVersion on, every weight
  // must carry a Fletcher-32 checksum (verified on read).
  // Version 3: version 2 plus prequantized linears (group packed_linears) instead of fp32 ones.
  // Version 4: every object's attributes carry a CRC-32 (kAttributesChecksum, model_store.h).
  static constexpr int64_t kFormatVersion = 4;
  static constexpr int64_t kOldestFormatVersion = 1;
  static constexpr int64_t kChecksumFormatVersion = 2;
  static constexpr int64_t kAttributeChecksumFormatVersion = 4;

  // Loads a socllm HDF5 model file (docs/MODEL_FORMAT.md). Throws MissingFile,
  // FormatError (missing tensors, wrong shapes, NaN/Inf weights, checksum mismatch),
  // Unsupported (arch, format version).
  static std::shared_ptr<const Model> load(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const std::string& path() const { return path_; }
  const TensorF32& embed_tokens() const { return embed_; }  // [vocab, d_model]
  const TensorF32& lm_head() const {
    return config_.tie_embeddings && !own_head_ ? embed_ : lm_head_;
  }
  const TensorF32& final_norm() const { return final_norm_; }
  const LayerWeights& layer(int64_t i) const { return layers_.at(static_cast<size_t>(i)); }
  int64_t weight_bytes() const;
  // Non-null for a file with prequantized linears: then the fp32 linear weights are absent and
  // only the plan it was converted under runs.
  const PackedModelLinears* packed_linears() const { return packed_.get(); }

  // What a transformation of the weights (quant/rotation.h, issue 39) changed in how the model
  // runs: its name ("none" for a model as loaded; a calibration holds for one rotation only),
  // and whether the down projection expects its input rotated online by the normalized Hadamard
  // matrix of size d_ff (its weight W H folded offline: the block's down_rotate op applies H).
  struct Transform {
    std::string rotation = "none";
    bool online_down_hadamard = false;
  };
  const Transform& transform() const { return transform_; }
  const std::string& rotation() const { return transform_.rotation; }

  // The fp32 weights a transformation of this model gives (a rotation, issue 39), everything else
  // this model's; the LM head stored apart when `lm_head` is not empty (config unchanged).
  // path() returns this model's path and the transform's name. ShapeError for a tensor whose
  // shape is not this model's, InvalidArgument for a model of prequantized linears (no fp32 weights
  // to replace) or one transformed already (transformations are made from the file's weights).
  std::shared_ptr<const Model> with_weights(TensorF32 embed, TensorF32 lm_head,
                                            TensorF32 final_norm, std::vector<LayerWeights> layers,
                                            Transform transform) const;

 private:
  ModelConfig config_;
  std::string path_;
  TensorF32 embed_, lm_head_, final_norm_;
  // The LM head is stored apart though the config ties it (a rotated model's head folds the final
  // norm's gain, its embeddings do not; the config stays the file's, so calibrations match).
  bool own_head_ = false;
  Transform transform_;
  std::vector<LayerWeights> layers_;
  std::shared_ptr<const PackedModelLinears> packed_;
};

}  // namespace socllm
