// The gated MLP's activation: SiLU(gate) * up (SwiGLU) or GeLU-tanh(gate) * up (Gemma's GeGLU).
#include "block/ops/ops.h"
#include "core/core.h"
#include "kernels/kernels.h"

namespace socllm::block_ops {

namespace {

class Activation final : public BlockOpKind {
 public:
  void run(const BlockOpInfo& op, LayerRun& r) const override {
    const ModelConfig& c = *r.config;
    if (!c.gated_mlp)
      throw Unsupported("[Engine] a plain MLP (no gate) is timed from its config, not run");
    const int64_t N = r.N, dff = c.d_ff;
    if (c.activation == "gelu_tanh") kernels::gelu_tanh_mul(r.gu, N, dff, r.act);
    else kernels::silu_mul(r.gu, N, dff, r.act);
    OpRecord rec;
    rec.op = op.name;
    rec.processor = r.plan->at(OpClass::Activation).processor;
    rec.format = r.store(OpClass::Activation, r.act, N * dff);
    rec.rows = N;
    rec.in_width = c.mlp_in_dim();
    rec.out_width = dff;
    rec.elements = N * c.mlp_in_dim();
    r.record(std::move(rec));
  }

  std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c, const Plan& plan,
                                    int64_t, int64_t rows, int64_t) const override {
    return {elementwise(op, plan.at(OpClass::Activation).format, rows * c.mlp_in_dim(), 0,
                        rows * (c.mlp_in_dim() + c.d_ff))};
  }
};

}  // namespace

const BlockOpKind& activation_kind() {
  static const Activation kKind;
  return kKind;
}

}  // namespace socllm::block_ops
