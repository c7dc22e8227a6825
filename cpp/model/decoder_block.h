// Model layer: the facts of a llama-family decoder block, in one table (DESIGN.md, "one task
// graph, two interpretations"). Every other layer reads them from here: the op list and its
// order, each op's class (what a plan places), its NPU subgraph (what one static graph runs,
// seed 001 §3.2), its input/output widths, and for linears the site (the input a calibration
// observes) and the weight tensors fused into it with their names in the model file. The
// behaviour of each op (numerics and timing) lives in block/ (block.h); this file is data.
//
//   subgraph   ops                                        (Gemma 3's extra ops in brackets)
//   attn_in    attn_norm, qkv, [qk_norm]
//   attention  rope, attention
//   o_proj     o_proj, [post_attn_norm], attn_residual
//   mlp_in     ffn_norm, gate_up
//   mlp_act    act, (down_rotate)
//   down       down, [post_ffn_norm], ffn_residual
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace socllm {

// Operator classes of a decoder that a plan places (processor + number format).
enum class OpClass : int {
  Norm = 0,    // RMSNorms: before attention / MLP, Gemma 3's q/k head norms and post-norms
  Linear,      // the four linear sites (q/k/v, o, gate/up, down)
  Rope,        // rotary embedding of q and k
  Attention,   // Q·Kᵀ, softmax, P·V over the KV cache
  Activation,  // SiLU/GeLU(gate) * up
  Residual,    // residual adds after o_proj and down
  Shadow,      // the float outlier part of a shadow-outlier linear (seed 001 §3.3)
  LmHead       // final norm + LM head
};
constexpr int kNumOpClasses = 8;
const char* op_class_name(OpClass c);
// InvalidArgument naming the class and listing the known ones.
OpClass op_class_from_name(const std::string& s);
std::string op_class_list();  // "norm, linear, ..."

// The four linear inputs of a block: input of q/k/v, of o, of gate/up and of down.
enum class LinearSite : int { AttnIn = 0, AttnOut = 1, MlpIn = 2, MlpAct = 3 };
constexpr int kNumLinearSites = 4;
const char* linear_site_name(LinearSite s);  // "attn_in", "attn_out", "mlp_in", "mlp_act"
// InvalidArgument naming the value and listing the sites.
LinearSite linear_site_from_name(const std::string& s);
// Input width of the linear at a site, and its output width (its fused weight's rows).
int64_t linear_site_width(const ModelConfig& c, LinearSite s);
int64_t linear_out_width(const ModelConfig& c, LinearSite s);
// The linear weights of one block (sum of in x out over the sites).
int64_t linear_params_per_block(const ModelConfig& c);

// One weight tensor fused into a site's linear: its name in the model file (weights/layers/<i>,
// packed_linears/layers/<i>; docs/MODEL_FORMAT.md) and its rows in the fused matrix.
struct FusedTensor {
  std::string name;  // "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"
  int64_t rows = 0;
};
// The tensors of a site in row order: [wq, wk, wv], [wo], [w_gate, w_up] ([w_up] for a plain
// MLP), [w_down].
std::vector<FusedTensor> fused_tensors(const ModelConfig& c, LinearSite s);
// A block's fused weight of a site ([out, in]: the tensors above stacked).
const TensorF32& site_weights(const LayerWeights& L, LinearSite s);
// Its bias (Qwen-style q/k/v biases on attn_in only), null when it has none.
const float* site_bias(const LayerWeights& L, LinearSite s);

// What one NPU graph executes (seed 001 §3.2): six subgraphs per layer.
enum class SubgraphKind : int { AttnIn = 0, Attention, OProj, MlpIn, MlpAct, Down };
constexpr int kSubgraphsPerLayer = 6;
const char* subgraph_kind_name(SubgraphKind k);

enum class BlockOp : int {
  AttnNorm = 0,
  Qkv,
  QkNorm,  // Gemma 3: RMSNorm of every q and k head (config qk_norm)
  Rope,
  Attention,
  OProj,
  PostAttnNorm,  // Gemma 3: RMSNorm of the attention output before the add (post_norms)
  AttnResidual,
  FfnNorm,
  GateUp,
  Act,
  DownRotate,  // a rotated model's online Hadamard on the down projection's input (issue 39)
  Down,
  PostFfnNorm,  // Gemma 3: RMSNorm of the MLP output before the add (post_norms)
  FfnResidual
};
constexpr int kNumBlockOps = 15;

struct BlockOpInfo {
  BlockOp op;
  const char* name;  // "attn_norm", "qkv" ...
  OpClass op_class;
  SubgraphKind subgraph;
  std::optional<LinearSite> site;  // the linear site (linears only)
};

// Every op any block can have, in execution order.
std::span<const BlockOpInfo> all_block_ops();
const BlockOpInfo& block_op(BlockOp op);
// InvalidArgument naming the value and listing the ops.
const BlockOpInfo& block_op_from_name(const std::string& name);
// The ops of one block of this config in execution order (Gemma 3's norms only where the config
// has them); down_rotate only with online_down_rotation (a rotation the plan adds and the model's
// weights expect: quant/rotation.h).
std::vector<BlockOpInfo> decoder_block(const ModelConfig& c, bool online_down_rotation = false);
// Whether the config's block has the op (down_rotate: not from a config alone, as above).
bool has_block_op(const ModelConfig& c, BlockOp op);
// The linear op of a site ("qkv", "o_proj", "gate_up", "down").
const BlockOpInfo& linear_op(LinearSite s);

// Values per row an op reads and writes ([rows, in] -> [rows, out]; QK-norm and RoPE work on
// the q and k columns of the qkv rows, attention reads q|k|v and writes the heads' outputs).
int64_t op_in_width(const ModelConfig& c, BlockOp op);
int64_t op_out_width(const ModelConfig& c, BlockOp op);

}  // namespace socllm
