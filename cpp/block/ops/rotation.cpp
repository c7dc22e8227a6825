// down_rotate: the online Hadamard a rotated model applies to the down projection's input
// (QuaRot §4.2; quant/rotation.h folds W_down Hᵀ offline), placed with the activation whose
// output it transforms. Numerics: kernels::HadamardTransform (Paley base ⊗ fast Walsh-Hadamard).
// Timing: the transform as the processor computes it. H_n = H_m ⊗ H_p is two passes over the
// [rows, n] values: the base H_m as a small matmul [rows·p, m]·[m, m] everywhere, and H_p as a
// matmul [rows·m, p]·[p, p] on the NPU and GPU (their matrix units have no butterfly op) or as
// log2(p) add/subtract passes on the CPU (Sylvester's fast transform, what the kernel runs).
// A chain of smaller Kronecker factors (H_64 ⊗ H_2 for p = 128) has fewer multiply-adds, but
// the profiles' per-launch costs make it 2-5x slower on the NPU: one dense H_p it is.
#include <bit>
#include <map>
#include <memory>
#include <mutex>

#include "block/ops/ops.h"
#include "core/core.h"
#include "kernels/hadamard.h"

namespace socllm::block_ops {

namespace {

// One transform per size, built once (its Paley base costs m² work).
const kernels::HadamardTransform& hadamard_of(int64_t n) {
  static std::mutex mu;
  static std::map<int64_t, std::unique_ptr<kernels::HadamardTransform>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& h = cache[n];
  if (!h) h = std::make_unique<kernels::HadamardTransform>(n);
  return *h;
}

class DownRotate final : public BlockOpKind {
 public:
  void run(const BlockOpInfo& op, LayerRun& r) const override {
    const int64_t N = r.N, dff = r.config->d_ff;
    hadamard_of(dff).apply(r.act, N, dff);
    OpRecord rec;
    rec.op = op.name;
    rec.processor = r.plan->at(OpClass::Activation).processor;
    rec.format = r.store(OpClass::Activation, r.act, N * dff);
    rec.rows = N;
    rec.in_width = rec.out_width = dff;
    rec.elements = N * dff;
    r.record(std::move(rec));
  }

  std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c, const Plan& plan,
                                    int64_t, int64_t rows, int64_t) const override {
    const OpPlacement& at = plan.at(OpClass::Activation);
    const auto& H = hadamard_of(c.d_ff);
    const int64_t m = H.base_order(), p = c.d_ff / m;
    std::vector<soc::OpDesc> out;
    if (m > 1) out.push_back(matmul(op, at.format, rows * p, m, m));
    if (p > 1 && at.processor == soc::Processor::Cpu)
      out.push_back(elementwise(op, at.format, rows * c.d_ff * std::countr_zero(uint64_t(p)), 0,
                                2 * rows * c.d_ff));
    else if (p > 1) out.push_back(matmul(op, at.format, rows * m, p, p));
    return out;
  }
};

}  // namespace

const BlockOpKind& down_rotate_kind() {
  static const DownRotate kKind;
  return kKind;
}

}  // namespace socllm::block_ops
