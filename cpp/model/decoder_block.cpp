#include "model/decoder_block.h"

#include <array>

#include "core/core.h"

namespace socllm {

namespace {

constexpr std::array<const char*, kNumOpClasses> kOpClassNames = {
    "norm", "linear", "rope", "attention", "activation", "residual", "shadow", "lm_head"};
constexpr std::array<const char*, kNumLinearSites> kSiteNames = {"attn_in", "attn_out", "mlp_in",
                                                                 "mlp_act"};
constexpr std::array<const char*, kSubgraphsPerLayer> kSubgraphNames = {
    "attn_in", "attention", "o_proj", "mlp_in", "mlp_act", "down"};

using S = SubgraphKind;
constexpr std::array<BlockOpInfo, kNumBlockOps> kBlock = {{
    {BlockOp::AttnNorm, "attn_norm", OpClass::Norm, S::AttnIn, std::nullopt},
    {BlockOp::Qkv, "qkv", OpClass::Linear, S::AttnIn, LinearSite::AttnIn},
    {BlockOp::QkNorm, "qk_norm", OpClass::Norm, S::AttnIn, std::nullopt},
    {BlockOp::Rope, "rope", OpClass::Rope, S::Attention, std::nullopt},
    {BlockOp::Attention, "attention", OpClass::Attention, S::Attention, std::nullopt},
    {BlockOp::OProj, "o_proj", OpClass::Linear, S::OProj, LinearSite::AttnOut},
    {BlockOp::PostAttnNorm, "post_attn_norm", OpClass::Norm, S::OProj, std::nullopt},
    {BlockOp::AttnResidual, "attn_residual", OpClass::Residual, S::OProj, std::nullopt},
    {BlockOp::FfnNorm, "ffn_norm", OpClass::Norm, S::MlpIn, std::nullopt},
    {BlockOp::GateUp, "gate_up", OpClass::Linear, S::MlpIn, LinearSite::MlpIn},
    {BlockOp::Act, "act", OpClass::Activation, S::MlpAct, std::nullopt},
    // placed with the activation, whose output it transforms (on the NPU in fp16 under llm.npu's
    // placement)
    {BlockOp::DownRotate, "down_rotate", OpClass::Activation, S::MlpAct, std::nullopt},
    {BlockOp::Down, "down", OpClass::Linear, S::Down, LinearSite::MlpAct},
    {BlockOp::PostFfnNorm, "post_ffn_norm", OpClass::Norm, S::Down, std::nullopt},
    {BlockOp::FfnResidual, "ffn_residual", OpClass::Residual, S::Down, std::nullopt},
}};

template <size_t N>
std::string join_names(const std::array<const char*, N>& names) {
  std::string s;
  for (const char* n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

}  // namespace

const char* op_class_name(OpClass c) { return kOpClassNames.at(static_cast<size_t>(c)); }

std::string op_class_list() { return join_names(kOpClassNames); }

OpClass op_class_from_name(const std::string& s) {
  for (size_t i = 0; i < kOpClassNames.size(); ++i)
    if (s == kOpClassNames[i]) return static_cast<OpClass>(i);
  throw InvalidArgument("[Plan] unknown op class '" + s + "' (known: " + op_class_list() + ")");
}

const char* linear_site_name(LinearSite s) { return kSiteNames.at(static_cast<size_t>(s)); }

LinearSite linear_site_from_name(const std::string& s) {
  for (size_t i = 0; i < kSiteNames.size(); ++i)
    if (s == kSiteNames[i]) return static_cast<LinearSite>(i);
  throw InvalidArgument("[decoder_block] unknown linear site '" + s +
                        "' (known: " + join_names(kSiteNames) + ")");
}

const char* subgraph_kind_name(SubgraphKind k) { return kSubgraphNames.at(static_cast<size_t>(k)); }

int64_t linear_site_width(const ModelConfig& c, LinearSite s) {
  switch (s) {
    case LinearSite::AttnIn:
    case LinearSite::MlpIn: return c.d_model;
    case LinearSite::AttnOut: return c.q_dim();
    case LinearSite::MlpAct: return c.d_ff;
  }
  return 0;
}

int64_t linear_out_width(const ModelConfig& c, LinearSite s) {
  switch (s) {
    case LinearSite::AttnIn: return c.qkv_dim();
    case LinearSite::AttnOut:
    case LinearSite::MlpAct: return c.d_model;
    case LinearSite::MlpIn: return c.mlp_in_dim();
  }
  return 0;
}

int64_t linear_params_per_block(const ModelConfig& c) {
  int64_t n = 0;
  for (int s = 0; s < kNumLinearSites; ++s)
    n += linear_site_width(c, static_cast<LinearSite>(s)) *
         linear_out_width(c, static_cast<LinearSite>(s));
  return n;
}

const TensorF32& site_weights(const LayerWeights& L, LinearSite s) {
  switch (s) {
    case LinearSite::AttnIn: return L.wqkv;
    case LinearSite::AttnOut: return L.wo;
    case LinearSite::MlpIn: return L.w_gate_up;
    case LinearSite::MlpAct: return L.w_down;
  }
  throw InvalidArgument("[decoder_block] unknown linear site " +
                        std::to_string(static_cast<int>(s)));
}

const float* site_bias(const LayerWeights& L, LinearSite s) {
  return s == LinearSite::AttnIn && L.bqkv.numel() ? L.bqkv.ptr() : nullptr;
}

std::vector<FusedTensor> fused_tensors(const ModelConfig& c, LinearSite s) {
  switch (s) {
    case LinearSite::AttnIn: return {{"wq", c.q_dim()}, {"wk", c.kv_dim()}, {"wv", c.kv_dim()}};
    case LinearSite::AttnOut: return {{"wo", c.d_model}};
    case LinearSite::MlpIn:
      if (!c.gated_mlp) return {{"w_up", c.d_ff}};
      return {{"w_gate", c.d_ff}, {"w_up", c.d_ff}};
    case LinearSite::MlpAct: return {{"w_down", c.d_model}};
  }
  return {};
}

std::span<const BlockOpInfo> all_block_ops() { return kBlock; }

const BlockOpInfo& block_op(BlockOp op) { return kBlock.at(static_cast<size_t>(op)); }

const BlockOpInfo& block_op_from_name(const std::string& name) {
  std::string known;
  for (const auto& info : kBlock) {
    if (name == info.name) return info;
    known += (known.empty() ? "" : ", ") + std::string(info.name);
  }
  throw InvalidArgument("[decoder_block] unknown op '" + name + "' (known: " + known + ")");
}

bool has_block_op(const ModelConfig& c, BlockOp op) {
  switch (op) {
    case BlockOp::QkNorm: return c.qk_norm;
    case BlockOp::PostAttnNorm:
    case BlockOp::PostFfnNorm: return c.post_norms;
    case BlockOp::DownRotate: return false;
    default: return true;
  }
}

std::vector<BlockOpInfo> decoder_block(const ModelConfig& c, bool online_down_rotation) {
  std::vector<BlockOpInfo> out;
  for (const auto& info : kBlock)
    if (has_block_op(c, info.op) || (online_down_rotation && info.op == BlockOp::DownRotate))
      out.push_back(info);
  return out;
}

const BlockOpInfo& linear_op(LinearSite s) {
  for (const auto& info : kBlock)
    if (info.site == s) return info;
  throw InvalidArgument("[decoder_block] no linear at site " + std::to_string(static_cast<int>(s)));
}

int64_t op_in_width(const ModelConfig& c, BlockOp op) {
  const BlockOpInfo& info = block_op(op);
  if (info.site) return linear_site_width(c, *info.site);
  switch (op) {
    case BlockOp::QkNorm:
    case BlockOp::Rope:
    case BlockOp::Attention: return c.qkv_dim();
    case BlockOp::Act: return c.mlp_in_dim();
    case BlockOp::DownRotate: return c.d_ff;
    default: return c.d_model;  // norms, residual adds
  }
}

int64_t op_out_width(const ModelConfig& c, BlockOp op) {
  const BlockOpInfo& info = block_op(op);
  if (info.site) return linear_out_width(c, *info.site);
  switch (op) {
    case BlockOp::QkNorm:
    case BlockOp::Rope: return c.qkv_dim();
    case BlockOp::Attention: return c.q_dim();
    case BlockOp::Act:
    case BlockOp::DownRotate: return c.d_ff;
    default: return c.d_model;
  }
}

}  // namespace socllm
