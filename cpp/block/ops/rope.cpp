// Rotary embedding of the q and k heads (rotate-half layout; a sliding-window layer uses its own
// base, Gemma 3).
#include "block/ops/ops.h"
#include "kernels/kernels.h"

namespace socllm::block_ops {

namespace {

class Rope final : public BlockOpKind {
 public:
  void run(const BlockOpInfo& op, LayerRun& r) const override {
    const ModelConfig& c = *r.config;
    const int64_t N = r.N, ld = c.qkv_dim(), qd = c.q_dim(), kvd = c.kv_dim();
    kernels::rope_neox(r.qkv, N, c.n_heads, c.head_dim, ld, r.pos, r.inv_freq);
    kernels::rope_neox(r.qkv + qd, N, c.n_kv_heads, c.head_dim, ld, r.pos, r.inv_freq);
    OpRecord rec;
    rec.op = op.name;
    rec.processor = r.plan->at(OpClass::Rope).processor;
    for (int64_t row = 0; row < N; ++row)
      rec.format = r.store(OpClass::Rope, r.qkv + row * ld, qd + kvd);
    rec.rows = N;
    rec.in_width = rec.out_width = ld;
    rec.elements = N * (qd + kvd);
    r.record(std::move(rec));
  }

  std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c, const Plan& plan,
                                    int64_t, int64_t rows, int64_t) const override {
    return {elementwise(op, plan.at(OpClass::Rope).format, rows * (c.q_dim() + c.kv_dim()), 0,
                        rows * 2 * c.qkv_dim())};
  }
};

}  // namespace

const BlockOpKind& rope_kind() {
  static const Rope kKind;
  return kKind;
}

}  // namespace socllm::block_ops
