// C/G-Full (seed 000 §5): dense causal attention in fp32. Not head-wise: the block times it as
// one op of its attention subgraph (soc::OpKind::Attention).
#include <vector>

#include "attention/attention_scheme.h"
#include "kernels/kernels.h"

namespace socllm::attention {

namespace {

class Fp32 final : public SchemeKind {
 public:
  const char* name() const override { return "fp32"; }
  const char* description() const override {
    return "C/G-Full: dense causal attention in fp32 (the engine's kernel)";
  }
  std::vector<OptionSpec> options() const override { return {}; }
  bool head_wise() const override { return false; }
  void run(const AttentionScheme&, const LayerConsts&, const float* q, int64_t ldq, const float* k,
           const float* v, int64_t ldkv, const Shape& sh, float* out, int64_t ldo,
           Trace*) const override {
    const int64_t L = sh.past + sh.T;
    std::vector<float> scratch(static_cast<size_t>(
        kernels::attention_scratch_floats(sh.T, L, sh.n_heads, sh.n_kv_heads, sh.head_dim)));
    kernels::attention_causal(q, ldq, k, v, ldkv, sh.T, sh.past, sh.n_heads, sh.n_kv_heads,
                              sh.head_dim, out, ldo, scratch.data(), sh.window);
  }
};

}  // namespace

const SchemeKind& fp32_scheme() {
  static const Fp32 kScheme;
  return kScheme;
}

}  // namespace socllm::attention
