// RMSNorm ops (Zhang & Sennrich 2019): before attention and MLP (with an input smoothing folded
// into the gains, seed 004 §4.1), and Gemma 3's per-head q/k norms and post-attention/post-MLP
// norms (transformers Gemma3TextModel), each placed by the plan's `norm` class.
#include "block/ops/ops.h"
#include "core/core.h"
#include "kernels/kernels.h"

namespace socllm::block_ops {

namespace {

namespace k = socllm::kernels;

class Norm final : public BlockOpKind {
 public:
  void run(const BlockOpInfo& op, LayerRun& r) const override {
    const ModelConfig& c = *r.config;
    const LayerWeights& w = *r.weights;
    const int64_t N = r.N, d = c.d_model, qd = c.q_dim(), kvd = c.kv_dim();
    OpRecord rec;
    rec.op = op.name;
    rec.processor = r.plan->at(OpClass::Norm).processor;
    rec.rows = N;
    rec.in_width = op_in_width(c, op.op);
    rec.out_width = op_out_width(c, op.op);
    switch (op.op) {
      case BlockOp::AttnNorm:
      case BlockOp::FfnNorm: {
        const float* gain = r.norm_gain[op.op == BlockOp::AttnNorm ? 0 : 1];
        // the stream carries residual_scale c: eps c² keeps the norm's output exact
        const double rs = r.residual_scale;
        k::rms_norm(r.x, gain, N, d, c.rms_eps * rs * rs, r.h);
        rec.format = r.store(OpClass::Norm, r.h, N * d);
        rec.elements = N * d;
        rec.weight_bytes = d * static_cast<int64_t>(sizeof(float));
        break;
      }
      case BlockOp::QkNorm: {  // every q and k head, before the rotation
        const int64_t ld = c.qkv_dim();
        for (int64_t row = 0; row < N; ++row) {
          float* q = r.qkv + row * ld;
          k::rms_norm(q, w.q_norm.ptr(), c.n_heads, c.head_dim, c.rms_eps, q);
          k::rms_norm(q + qd, w.k_norm.ptr(), c.n_kv_heads, c.head_dim, c.rms_eps, q + qd);
          rec.format = r.store(OpClass::Norm, q, qd + kvd);
        }
        rec.elements = N * (qd + kvd);
        rec.weight_bytes =
            (w.q_norm.numel() + w.k_norm.numel()) * static_cast<int64_t>(sizeof(float));
        break;
      }
      case BlockOp::PostAttnNorm:
      case BlockOp::PostFfnNorm: {  // the branch's output, before the residual add
        const TensorF32& gain = op.op == BlockOp::PostAttnNorm ? w.post_attn_norm : w.post_ffn_norm;
        k::rms_norm(r.o, gain.ptr(), N, d, c.rms_eps, r.o);
        // residual_scale folded into the post norm's gain: the branch joins the scaled stream
        if (r.residual_scale != 1.0f)
          for (int64_t i = 0; i < N * d; ++i) r.o[i] *= r.residual_scale;
        rec.format = r.store(OpClass::Norm, r.o, N * d);
        rec.elements = N * d;
        rec.weight_bytes = gain.numel() * static_cast<int64_t>(sizeof(float));
        break;
      }
      default: throw InvalidArgument(std::string("[norm] not a norm op: ") + op.name);
    }
    r.record(std::move(rec));
  }

  std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c, const Plan& plan,
                                    int64_t, int64_t rows, int64_t) const override {
    constexpr auto kGain = static_cast<int64_t>(sizeof(float));
    const bool qk = op.op == BlockOp::QkNorm;
    const int64_t elements = rows * (qk ? c.q_dim() + c.kv_dim() : c.d_model);
    const int64_t gains = qk ? 2 * c.head_dim : c.d_model;
    return {elementwise(op, plan.at(OpClass::Norm).format, elements, gains * kGain,
                        rows * (op_in_width(c, op.op) + op_out_width(c, op.op)))};
  }
};

}  // namespace

const BlockOpKind& norm_kind() {
  static const Norm kKind;
  return kKind;
}

}  // namespace socllm::block_ops
