// NPU-Full (seed 000 §5 baseline 4): Q·Kᵀ and P·V in INT8 with static per-tensor scales from
// calibration (step qk-scales, the max-min rule of seed 001 §2.3), exact int32 accumulation;
// softmax in fp32 on the dequantized scores, rounded to fp16 (the NPU's float format) and
// quantized to uint8 at 1/255 (P in [0, 1]); P·V as u8 x s8 -> s32. One NPU graph.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/common.h"
#include "core/core.h"
#include "kernels/gemm_s8.h"
#include "kernels/kernels.h"
#include "kernels/sparse_attention.h"

namespace socllm::attention {

namespace {

namespace k = socllm::kernels;
using detail::kRowBlock;

class NpuInt8 final : public SchemeKind {
 public:
  const char* name() const override { return "npu-int8"; }
  const char* description() const override {
    return "NPU-Full: static INT8 Q·Kᵀ and P·V on the NPU, softmax fp32 -> fp16 -> u8 at 1/255";
  }
  std::vector<OptionSpec> options() const override { return {}; }
  bool computes_int8() const override { return true; }
  bool needs_qk_scales(const AttentionScheme&) const override { return true; }

  std::vector<LayerConsts> prepare(const AttentionScheme&, const Calibration* calib,
                                   const ModelConfig& c, const std::string& who) const override {
    if (!calib || !calib->has_qk_scales())
      throw InvalidArgument(
          who +
          " fixes its Q/K scales from calibration, and the loaded calibration "
          "has none (socllm calibrate --steps qk-scales [--calib FILE] --out FILE, "
          "then --calib FILE)");
    std::vector<LayerConsts> out(static_cast<size_t>(c.n_layers));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      auto& lc = out[static_cast<size_t>(l)];
      lc.static_q = calib->static_scale(l, 'q');
      lc.static_k = calib->static_scale(l, 'k');
      lc.static_v = calib->static_scale(l, 'v');
    }
    return out;
  }

  void run(const AttentionScheme&, const LayerConsts& c, const float* q, int64_t ldq,
           const float* kk, const float* v, int64_t ldkv, const Shape& sh, float* out, int64_t ldo,
           Trace*) const override {
    if (!(c.static_q > 0 && c.static_k > 0 && c.static_v > 0))
      throw InvalidArgument(
          "[prefill_attention] npu-int8 needs static Q/K/V scales (step qk-scales)");
    const int64_t T = sh.T, L = sh.past + T, hd = sh.head_dim, group = sh.n_heads / sh.n_kv_heads;
    if (L > k::kMaxExactKU8S8)
      throw ShapeError("[prefill_attention] npu-int8: P·V over " + std::to_string(L) +
                       " keys exceeds the exact int32 range (" + std::to_string(k::kMaxExactKU8S8) +
                       " keys)");
    const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
    const float qk_scale = c.static_q * c.static_k * inv_sqrt;
    const float pv_scale = c.static_v / 255.0f;
    // Per KV head: K as [L, hd] int8 and V transposed [hd, L] int8 (the GEMM's weight layout).
    std::vector<int8_t> k8(static_cast<size_t>(sh.n_kv_heads * L * hd)),
        vt8(static_cast<size_t>(sh.n_kv_heads * hd * L));
    for (int64_t g = 0; g < sh.n_kv_heads; ++g) {
      k::quantize_rows_s8(kk + g * hd, L, hd, ldkv, c.static_k, k8.data() + g * L * hd, hd);
      std::vector<int8_t> v8(static_cast<size_t>(L * hd));
      k::quantize_rows_s8(v + g * hd, L, hd, ldkv, c.static_v, v8.data(), hd);
      for (int64_t j = 0; j < L; ++j)
        for (int64_t d = 0; d < hd; ++d) vt8[(g * hd + d) * L + j] = v8[j * hd + d];
    }
    const int64_t n_blocks = (T + kRowBlock - 1) / kRowBlock;
    const auto isa = k::best_isa();
#pragma omp parallel for schedule(dynamic) collapse(2)
    for (int64_t h = 0; h < sh.n_heads; ++h)
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t g = h / group, r0 = b * kRowBlock, rows = std::min(kRowBlock, T - r0);
        const int64_t keys = sh.past + r0 + rows;
        std::vector<float> qh(static_cast<size_t>(rows * hd));
        std::vector<int8_t> q8(static_cast<size_t>(rows * hd));
        std::vector<int32_t> S(static_cast<size_t>(rows * keys)), O(static_cast<size_t>(rows * hd));
        std::vector<uint8_t> P(static_cast<size_t>(rows * keys));
        std::vector<float> p(static_cast<size_t>(keys));
        detail::gather_head(q + r0 * ldq, ldq, rows, h * hd, hd, qh.data());
        k::quantize_rows_s8(qh.data(), rows, hd, hd, c.static_q, q8.data(), hd);
        k::gemm_s8s8s32(q8.data(), hd, k8.data() + g * L * hd, hd, S.data(), keys, rows, keys, hd,
                        isa);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t vis = sh.past + r0 + i + 1, lo = k::first_visible_key(vis - 1, sh.window);
          const int32_t* s = S.data() + i * keys;
          float mx = -INFINITY;
          for (int64_t j = lo; j < vis; ++j) mx = std::max(mx, static_cast<float>(s[j]) * qk_scale);
          float sum = 0;
          for (int64_t j = lo; j < vis; ++j)
            sum += p[j] = k::exp_nonpositive(static_cast<float>(s[j]) * qk_scale - mx);
          uint8_t* pr = P.data() + i * keys;
          for (int64_t j = 0; j < keys; ++j) {
            // the probability in fp16 (the NPU's float format), then uint8 with scale 1/255
            const float pj =
                j >= lo && j < vis ? static_cast<float>(static_cast<_Float16>(p[j] / sum)) : 0;
            pr[j] = static_cast<uint8_t>(std::clamp(std::nearbyint(pj * 255.0f), 0.0f, 255.0f));
          }
        }
        k::gemm_u8s8s32(P.data(), keys, vt8.data() + g * hd * L, L, O.data(), hd, rows, hd, keys,
                        isa);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t d = 0; d < hd; ++d)
            out[(r0 + i) * ldo + h * hd + d] = static_cast<float>(O[i * hd + d]) * pv_scale;
      }
  }

  // One NPU graph: a launch, INT8 Q·Kᵀ of every (row, key) pair (a static graph computes masked
  // pairs too), mask and softmax as NPU element-wise ops, INT8 P·V.
  std::vector<int64_t> tasks(const AttentionScheme&, const TaskShape& sh, TaskSink& sink,
                             const std::vector<int64_t>& deps) const override {
    using soc::DType;
    using soc::OpKind;
    const int64_t H = sh.n_heads, d = sh.head_dim, dense = sh.rows * sh.kv_len;
    std::vector<soc::OpDesc> ops = {
        detail::attention_op(OpKind::NpuLaunch, "launch", DType::Int8, 0, 0, 0, ""),
        detail::attention_op(OpKind::AttnMatMul, "qk", DType::Int8, H, d, dense, ""),
        detail::attention_op(OpKind::Elementwise, "mask", DType::Fp16, 0, 0, H * dense, ""),
        detail::attention_op(OpKind::Elementwise, "softmax", DType::Fp16, 0, 0, H * dense, ""),
        detail::attention_op(OpKind::AttnMatMul, "pv", DType::Int8, H, d, dense, "")};
    return {sink.add("attention", sched::TaskKind::Attention, sh.processor, std::move(ops), {},
                     2 * H * dense, deps)};
  }
};

}  // namespace

const SchemeKind& npu_int8_scheme() {
  static const NpuInt8 kScheme;
  return kScheme;
}

}  // namespace socllm::attention
