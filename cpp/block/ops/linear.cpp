// The four linears of a block (q/k/v, o, gate/up, down) under the plan's linear scheme
// (quant/linear_scheme.h): whole on their processor, or cut into parts between the NPU and its
// partner (seed 002 §4.1, the plan's partition), with a shadow-outlier CPU part beside them
// (seed 001 §3.3, Eq. 1).
#include <cmath>

#include "block/ops/ops.h"
#include "core/core.h"
#include "kernels/kernels.h"

namespace socllm::block_ops {

namespace {

namespace k = socllm::kernels;

struct SiteIo {
  const float* in;
  float* out;
  int64_t ldo;
};

SiteIo site_io(const LayerRun& r, LinearSite site) {
  const ModelConfig& c = *r.config;
  switch (site) {
    case LinearSite::AttnIn: return {r.h, r.qkv, c.qkv_dim()};
    case LinearSite::AttnOut: return {r.att, r.o, c.d_model};
    case LinearSite::MlpIn: return {r.h, r.gu, c.mlp_in_dim()};
    case LinearSite::MlpAct: return {r.act, r.o, c.d_model};
  }
  throw InvalidArgument("[linear] unknown site");
}

class Linear final : public BlockOpKind {
 public:
  void run(const BlockOpInfo& op, LayerRun& r) const override {
    const ModelConfig& c = *r.config;
    const LinearSite site = *op.site;
    const int64_t N = r.N, w = linear_site_width(c, site), cols = linear_out_width(c, site);
    const SiteIo io = site_io(r, site);
    const quant::PreparedLinear* lin = r.linears[static_cast<size_t>(site)];
    const LayerWeights& L = *r.weights;
    const float* W = lin ? nullptr : site_weights(L, site).ptr();
    const float* bias = lin ? nullptr : site_bias(L, site);
    if (!lin && !W)
      throw InvalidArgument(std::string("[Engine] linear ") + op.name +
                            " has neither prepared nor fp32 weights");
    const soc::Processor proc = r.plan->at(OpClass::Linear).processor;
    // Float GEMMs off the CPU compute tile by tile on the NPU's grid (seed 002 §4.3: 32 rows x
    // 256 columns), one GEMM per tile, so a partition whose cuts are aligned to it computes
    // every output tile as the whole linear does; integer GEMMs are exact however cut.
    const bool tiled = lin && lin->float_path() && proc != soc::Processor::Cpu;
    auto compute = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      if (tiled) {
        auto edge = [](int64_t x, int64_t align, int64_t end) {
          return std::min(end, (x / align + 1) * align);
        };
        for (int64_t a = r0; a < r1; a = edge(a, r.tile_m, r1))
          for (int64_t b = c0; b < c1; b = edge(b, r.tile_n, c1))
            lin->forward_block(io.in, io.out, io.ldo, a, edge(a, r.tile_m, r1), b,
                               edge(b, r.tile_n, c1));
      } else if (lin) {
        lin->forward_block(io.in, io.out, io.ldo, r0, r1, c0, c1);
      } else {
        k::linear(io.in + r0 * w, r1 - r0, w, w, W + c0 * w, c1 - c0, bias ? bias + c0 : nullptr,
                  io.out + r0 * io.ldo + c0, io.ldo);
      }
    };
    OpRecord rec;
    rec.op = op.name;
    rec.processor = proc;
    rec.rows = N;
    rec.in_width = w;
    rec.out_width = cols;
    quant::ShadowStats stats;
    if (const auto part = r.plan->partition_for(c, site, N, r.decode)) {
      if (part->rows != N || part->cols != cols)
        throw ShapeError("[Engine] the partition of " + std::string(op.name) + " is " +
                         std::to_string(part->rows) + " x " + std::to_string(part->cols) +
                         ", the linear " + std::to_string(N) + " x " + std::to_string(cols));
      for (const auto& q : part->parts) {
        compute(q.row_begin, q.row_end, q.col_begin, q.col_end);
        rec.parts.push_back({q.processor, q.row_begin, q.row_end, q.col_begin, q.col_end});
      }
    } else if (tiled) {
      compute(0, N, 0, cols);
    } else if (lin) {
      lin->forward(io.in, N, io.out, io.ldo, false, r.segments, &stats);
    } else {
      k::linear(io.in, N, w, w, W, cols, bias, io.out, io.ldo);
    }
    // residual_scale folded into the linears whose outputs the residual adds (no post norms)
    if (r.residual_scale != 1.0f && !c.post_norms &&
        (site == LinearSite::AttnOut || site == LinearSite::MlpAct))
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < cols; ++j) io.out[i * io.ldo + j] *= r.residual_scale;
    if (r.seen)
      r.seen->shadow[static_cast<size_t>(r.layer * kNumLinearSites + static_cast<int>(site))] +=
          stats;
    rec.format = lin ? lin->compute_format() : "fp32";
    rec.weight_bytes = lin ? lin->weight_bytes()
                           : (site_weights(L, site).numel() + (bias ? cols : 0)) *
                                 static_cast<int64_t>(sizeof(float));
    if (lin && lin->shadow() && !lin->shadow()->pruned)
      rec.shadow_channels = stats.outlier_channels;
    r.record(std::move(rec));
  }

  std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c, const Plan& plan,
                                    int64_t, int64_t rows, int64_t) const override {
    return {plan.linear_desc(c, *op.site, rows)};
  }

  void tasks(const BlockOpInfo& op, GraphRecorder& g) const override {
    const ModelConfig& c = g.config();
    const Plan& plan = g.plan();
    const LinearSite site = *op.site;
    const soc::OpDesc desc = plan.linear_desc(c, site, g.rows());
    if (const auto part = plan.partition_for(c, site, g.rows(), g.decode()))
      g.add_parts(op, desc, *part);
    else g.add_op(op, plan.at(OpClass::Linear).processor, {desc});
    if (!plan.linear.shadow) return;
    // An unpruned input's CPU part exists in every chunk, outliers or not: the CPU has to scan
    // the input for values beyond t and the NPU graph waits for its answer (our choice; the
    // measured channel count, possibly 0, is its load).
    const ShadowLoad sl = g.shadow_load(site);
    if (sl.pruned) return;
    soc::OpDesc o;
    o.kind = soc::OpKind::OutlierMatMul;
    o.name = std::string("shadow.") + op.name;
    o.op_class = op_class_name(OpClass::Shadow);
    o.dtype = plan.at(OpClass::Shadow).format;
    o.m = g.rows();
    o.k = static_cast<int64_t>(std::ceil(sl.outlier_channels));
    o.n = linear_out_width(c, site);
    o.bytes = static_cast<int64_t>(sl.cold_fetch_bytes);
    g.add_shadow(op, o);
  }
};

}  // namespace

const BlockOpKind& linear_kind() {
  static const Linear kKind;
  return kKind;
}

}  // namespace socllm::block_ops
