// The attention op: appends the rows' K and V to each sequence's cache, then computes attention
// with the plan's scheme (attention/, seed 000) or, for fp32 and for decoding steps, the dense
// causal kernel. Its timing is the scheme's: one op of the attention subgraph (dense), or the
// scheme's own head-wise tasks.
#include <cstring>

#include "block/ops/ops.h"
#include "core/core.h"
#include "kernels/kernels.h"

namespace socllm::block_ops {

namespace {

class Attention final : public BlockOpKind {
 public:
  void run(const BlockOpInfo& op, LayerRun& r) const override {
    const ModelConfig& c = *r.config;
    const int64_t l = r.layer, ld = c.qkv_dim(), qd = c.q_dim(), kvd = c.kv_dim();
    const int64_t H = c.n_heads, window = c.layer_window(l);
    const attention::AttentionScheme& scheme = r.plan->attention;
    OpRecord rec;
    rec.op = op.name;
    rec.processor = r.plan->at(OpClass::Attention).processor;
    rec.rows = r.N;
    rec.in_width = ld;
    rec.out_width = qd;
    for (const SeqRows& s : *r.seqs) {
      // Only real rows enter the KV cache and attention; padding rows come after them, so
      // causal attention never lets a real row see one (their attention output stays 0).
      KVCache& cache = *s.cache;
      const int64_t past = cache.length();
      float* K = cache.k(l);
      float* V = cache.v(l);
      for (int64_t t = 0; t < s.T; ++t) {
        const float* src = r.qkv + (s.row0 + t) * ld;
        std::memcpy(K + (past + t) * kvd, src + qd, static_cast<size_t>(kvd) * sizeof(float));
        std::memcpy(V + (past + t) * kvd, src + qd + kvd, static_cast<size_t>(kvd) * sizeof(float));
      }
      // the keys the graph of these rows covers (a static graph's padding included)
      const int64_t covered = past + r.N;
      rec.kv_len = window > 0 ? std::min(covered, window) : covered;
      if (r.attention && s.plan_attention) {
        attention::Trace trace;
        trace.record_keys = false;
        const attention::Shape sh{s.T, past, H, c.n_kv_heads, c.head_dim, window};
        attention::prefill_attention(scheme, *r.attention, r.qkv + s.row0 * ld, ld, K, V, kvd, sh,
                                     r.att + s.row0 * qd, qd, &trace);
        rec.kept = trace.kept;
        if (r.seen) {
          std::copy(trace.bucket.begin(), trace.bucket.end(), r.seen->buckets.begin() + l * H);
          int64_t rescored = 0;
          for (int64_t x : trace.rescored) rescored += x;
          const int64_t pairs = H * attention::causal_pairs(s.T, past + s.T, window);
          r.seen->rescore_share[static_cast<size_t>(l)] =
              pairs > 0 ? std::min(1.0, static_cast<double>(rescored) / static_cast<double>(pairs))
                        : 0.0;
        }
      } else {
        kernels::attention_causal(r.qkv + s.row0 * ld, ld, K, V, kvd, s.T, past, H, c.n_kv_heads,
                                  c.head_dim, r.att + s.row0 * qd, qd, r.attention_scratch, window);
      }
    }
    rec.format = r.store(OpClass::Attention, r.att, r.N * qd);
    if (scheme.computes_int8() && r.attention) rec.format = "int8";
    r.record(std::move(rec));
  }

  std::vector<soc::OpDesc> describe(const BlockOpInfo& op, const ModelConfig& c, const Plan& plan,
                                    int64_t layer, int64_t rows, int64_t kv_len) const override {
    const soc::DType fmt = plan.at(OpClass::Attention).format;
    if (const int64_t window = c.layer_window(layer); window > 0) kv_len = std::min(kv_len, window);
    soc::OpDesc o;
    o.kind = soc::OpKind::Attention;
    o.name = op.name;
    o.op_class = op_class_name(OpClass::Attention);
    o.dtype = fmt;
    o.m = rows;
    o.k = c.head_dim;
    o.n = c.n_heads;
    o.elements = kv_len;
    // q|k|v in and the heads' outputs, K and V of kv_len positions, the [heads, rows, kv_len]
    // scores
    const int64_t values =
        rows * (c.qkv_dim() + c.q_dim()) + 2 * kv_len * c.kv_dim() + c.n_heads * rows * kv_len;
    o.activation_bytes = values * soc::dtype_bytes(fmt);
    return {o};
  }

  void tasks(const BlockOpInfo& op, GraphRecorder& g) const override {
    const ModelConfig& c = g.config();
    const Plan& plan = g.plan();
    const soc::Processor p = plan.at(OpClass::Attention).processor;
    // The attention's CPU budget (seed 000 §4: one mid core for the non-fp32 schemes).
    const std::string core = p == soc::Processor::Cpu ? g.attention_core() : std::string();
    if (!plan.attention.kind->head_wise()) {
      auto ops = describe(op, c, plan, g.layer(), g.rows(), g.kv_len());
      ops[0].core = core;
      g.add_op(op, p, std::move(ops));
      return;
    }
    const auto& opts = g.attention_options();
    const int64_t H = c.n_heads;
    attention::TaskShape shape;
    shape.layer = g.layer();
    shape.rows = g.rows();
    shape.kv_len = g.kv_len();
    shape.window = c.layer_window(g.layer());
    shape.n_heads = H;
    shape.head_dim = c.head_dim;
    shape.processor = p;
    shape.core = core;
    if (!opts.head_ratios.empty())
      shape.head_ratio = {opts.head_ratios.data() + g.layer() * H, static_cast<size_t>(H)};
    shape.buckets = g.head_buckets();
    shape.max_fused_heads = opts.max_fused_heads;
    shape.rescore_share = g.rescore_share();
    g.add_attention(plan.attention, shape);
  }
};

}  // namespace

const BlockOpKind& attention_kind() {
  static const Attention kKind;
  return kKind;
}

}  // namespace socllm::block_ops
