// The residual adds after the attention and MLP branches (their outputs in o).
#include "block/ops/ops.h"
#include "kernels/kernels.h"

namespace socllm::block_ops {

namespace {

class Residual final : public BlockOpKind {
 public:
  void run(const BlockOpInfo& op, LayerRun& r) const override {
    const int64_t N = r.N, d = r.config->d_model;
    kernels::add_inplace(r.x, r.o, N * d);
    OpRecord rec;
    rec.op = op.name;
    rec.processor = r.plan->at(OpClass::Residual).processor;
    rec.format = r.store(OpClass::Residual, r.x, N * d);
    rec.rows = N;
    rec.in_width = rec.out_width = d;
    rec.elements = N * d;
    r.record(std::move(rec));
  }

  std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c, const Plan& plan,
                                    int64_t, int64_t rows, int64_t) const override {
    return {elementwise(op, plan.at(OpClass::Residual).format, rows * c.d_model, 0,
                        rows * 2 * c.d_model)};
  }
};

}  // namespace

const BlockOpKind& residual_kind() {
  static const Residual kKind;
  return kKind;
}

}  // namespace socllm::block_ops
