#include "attention/common.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <tuple>

#include "core/core.h"
#include "kernels/kernels.h"

namespace socllm::attention {

namespace detail {

void gather_head(const float* x, int64_t ld, int64_t rows, int64_t col0, int64_t head_dim,
                 float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * head_dim, x + r * ld + col0, static_cast<size_t>(head_dim) * 4);
}

KvHeadRows::KvHeadRows(const float* k, const float* v, int64_t ldkv, int64_t L, const Shape& sh)
    : k_src_(k), v_src_(v), L_(L), hd_(sh.head_dim), ld_(ldkv), packed_(sh.T >= kPackKvMinRows) {
  if (!packed_) return;
  const int64_t G = sh.n_kv_heads;
  k_.resize(static_cast<size_t>(G * L * hd_));
  v_.resize(static_cast<size_t>(G * L * hd_));
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < G; ++g) {
    gather_head(k, ldkv, L, g * hd_, hd_, k_.data() + g * L * hd_);
    gather_head(v, ldkv, L, g * hd_, hd_, v_.data() + g * L * hd_);
  }
  ld_ = hd_;
}

void check_shape(const Shape& sh, const char* who) {
  if (sh.T < 1 || sh.past < 0 || sh.n_heads < 1 || sh.n_kv_heads < 1 ||
      sh.n_heads % sh.n_kv_heads != 0 || sh.head_dim < 1 || sh.window < 0)
    throw ShapeError(std::string("[") + who + "] bad shape: T " + std::to_string(sh.T) + ", past " +
                     std::to_string(sh.past) + ", heads " + std::to_string(sh.n_heads) + "/" +
                     std::to_string(sh.n_kv_heads) + ", head_dim " + std::to_string(sh.head_dim) +
                     ", window " + std::to_string(sh.window));
}

std::vector<OptionSpec> keep_ratio_options(const char* default_ratios) {
  return {
      {"keep", 0.2, "global share of keys kept, in (0, 1] (seed 000 §5: 20%)"},
      {"min_keys", int64_t{1}, "keys every row keeps at least (if it sees that many)"},
      {"ratios",
       default_ratios,
       "per-head keep ratios: calibrated (Eq. 3 from step head-importance) or uniform",
       {"calibrated", "uniform"}},
      // chosen by step attention-clamp (attention_scheme.h kDefaultClampQuantile)
      {"clamp_quantile", kDefaultClampQuantile,
       "Eq. 3's clamp of headImp x layerImp: the products are bounded to the [1 - q, q] "
       "quantiles of the positive ones, q in [0.5, 1] (0.5: uniform ratios)"},
  };
}

void validate_keep_ratio_options(const AttentionScheme& s) {
  const std::string k = "[AttentionScheme] " + s.name() + ": ";
  const double keep = s.number("keep"), q = s.number("clamp_quantile");
  if (!(keep > 0.0 && keep <= 1.0))
    throw InvalidArgument(k + "keep must be in (0, 1], got " + json_text(s.options["keep"]));
  if (s.integer("min_keys") < 1)
    throw InvalidArgument(k + "min_keys must be >= 1, got " + json_text(s.options["min_keys"]));
  if (!(q >= 0.5 && q <= 1.0))  // 0.5: every product at the median (uniform ratios)
    throw InvalidArgument(k + "clamp_quantile must be in [0.5, 1], got " +
                          json_text(s.options["clamp_quantile"]));
}

bool calibrated_ratios(const AttentionScheme& s) { return s.text("ratios") == "calibrated"; }

std::vector<LayerConsts> keep_ratio_consts(const AttentionScheme& s, const Calibration* calib,
                                           const ModelConfig& c, const std::string& who) {
  std::vector<LayerConsts> out(static_cast<size_t>(c.n_layers), uniform_layer_consts(s, c.n_heads));
  if (!calibrated_ratios(s)) return out;
  if (!calib || !calib->has_head_importance())
    throw InvalidArgument(who +
                          " takes per-head keep ratios from head and layer importance, and the "
                          "loaded calibration has none (socllm calibrate --steps head-importance "
                          "[--calib FILE] --out FILE, then --calib FILE; or ratios=uniform)");
  const auto r = head_keep_ratios(calib->head_importance, calib->layer_importance, c.n_heads,
                                  s.number("keep"), s.number("clamp_quantile"));
  for (int64_t l = 0; l < c.n_layers; ++l)
    out[static_cast<size_t>(l)].head_ratio.assign(r.begin() + l * c.n_heads,
                                                  r.begin() + (l + 1) * c.n_heads);
  return out;
}

void check_head_ratios(const LayerConsts& consts, int64_t n_heads, const char* who) {
  if (static_cast<int64_t>(consts.head_ratio.size()) != n_heads)
    throw ShapeError(std::string("[") + who + "] " + std::to_string(consts.head_ratio.size()) +
                     " head ratios for " + std::to_string(n_heads) + " heads");
}

soc::OpDesc attention_op(soc::OpKind kind, const char* name, soc::DType dtype, int64_t heads,
                         int64_t head_dim, int64_t elements, const std::string& core) {
  soc::OpDesc o;
  o.kind = kind;
  o.name = name;
  o.op_class = "attention";
  o.dtype = dtype;
  o.n = heads;
  o.k = head_dim;
  o.elements = elements;
  o.core = core;
  return o;
}

double head_ratio(const TaskShape& shape, const AttentionScheme& s, int64_t h) {
  return shape.head_ratio.empty() ? s.number("keep") : shape.head_ratio[static_cast<size_t>(h)];
}

std::vector<int64_t> head_chain_tasks(const TaskShape& shape, TaskSink& sink,
                                      const std::vector<int64_t>& deps,
                                      const std::vector<HeadChainStep>& heads) {
  using soc::DType;
  using soc::OpKind;
  const int64_t d = shape.head_dim, rows = shape.rows;
  const soc::Processor P = shape.processor;
  std::vector<int64_t> on = deps;
  for (size_t h = 0; h < heads.size(); ++h) {
    const std::string hn = ".h" + std::to_string(h);
    const auto hh = static_cast<int64_t>(h);
    const HeadChainStep& st = heads[h];
    const int64_t est = sink.add("estimate" + hn, sched::TaskKind::Estimate, P, st.estimate, {hh},
                                 4 * st.scored, on);
    const int64_t tk =
        sink.add("topk" + hn, sched::TaskKind::TopK, P,
                 {attention_op(OpKind::TopK, "topk", DType::Fp32, 1, d, st.scored, shape.core)},
                 {hh}, 4 * st.scored, {est});
    on = {sink.add("sparse_attention" + hn, sched::TaskKind::SparseAttention, P,
                   {attention_op(OpKind::SparseAttention, "sparse_attention", DType::Fp32, 1, d,
                                 st.kept, shape.core)},
                   {hh}, 4 * (st.kept + 2 * rows * d), {est, tk})};
  }
  return on;
}

void trace_begin(Trace* trace, int64_t n_heads, int64_t T) {
  if (!trace) return;
  trace->bucket.assign(static_cast<size_t>(n_heads), -1);
  trace->input_q.assign(static_cast<size_t>(n_heads), 0.0f);
  trace->input_k.assign(static_cast<size_t>(n_heads), 0.0f);
  trace->keys.assign(static_cast<size_t>(trace->record_keys ? n_heads * T : 0), {});
  trace->kept.assign(static_cast<size_t>(n_heads), 0);
  trace->rescored.assign(static_cast<size_t>(n_heads), 0);
  trace->fused_rows.assign(static_cast<size_t>(n_heads), 0);
  trace->missed_rows.assign(static_cast<size_t>(n_heads), 0);
}

void trace_keys(Trace* trace, int64_t h, int64_t T, int64_t row, const int32_t* idx, int64_t n) {
  if (!trace) return;
  if (trace->record_keys) trace->keys[static_cast<size_t>(h * T + row)].assign(idx, idx + n);
#pragma omp atomic
  trace->kept[static_cast<size_t>(h)] += n;
}

}  // namespace detail

std::vector<std::pair<int, int>> bucket_offsets(int64_t n) {
  if (n < 1)
    throw InvalidArgument("[bucket_offsets] bucket count must be >= 1, got " + std::to_string(n));
  int ring = 0;
  while ((2 * ring + 1) * (2 * ring + 1) < n) ++ring;
  std::vector<std::pair<int, int>> all;
  for (int a = -ring; a <= ring; ++a)
    for (int b = -ring; b <= ring; ++b) all.emplace_back(a, b);
  std::sort(all.begin(), all.end(), [](auto x, auto y) {
    const auto key = [](std::pair<int, int> p) {
      return std::make_tuple(std::max(std::abs(p.first), std::abs(p.second)),
                             std::abs(p.first) + std::abs(p.second), p.first, p.second);
    };
    return key(x) < key(y);
  });
  all.resize(static_cast<size_t>(n));
  return all;
}

int64_t nearest_bucket(float lq, float lk, std::span<const float> bq, std::span<const float> bk) {
  if (bq.empty() || bq.size() != bk.size())
    throw ShapeError("[nearest_bucket] " + std::to_string(bq.size()) + " Q scales and " +
                     std::to_string(bk.size()) + " K scales");
  int64_t best = 0;
  double best_d = INFINITY;
  for (size_t i = 0; i < bq.size(); ++i) {
    const double dq = static_cast<double>(lq) - bq[i], dk = static_cast<double>(lk) - bk[i];
    const double d = 0.5 * (dq * dq + dk * dk);
    if (d < best_d) best_d = d, best = static_cast<int64_t>(i);
  }
  return best;
}

std::vector<double> head_keep_ratios(std::span<const float> head_importance,
                                     std::span<const float> layer_importance, int64_t n_heads,
                                     double keep, double clamp_quantile) {
  const int64_t L = static_cast<int64_t>(layer_importance.size());
  if (n_heads < 1 || static_cast<int64_t>(head_importance.size()) != L * n_heads)
    throw ShapeError("[head_keep_ratios] " + std::to_string(head_importance.size()) +
                     " head importances for " + std::to_string(L) + " layers of " +
                     std::to_string(n_heads) + " heads");
  // below a clamp of 0.5 the lower bound would pass the upper one
  if (!(keep > 0.0 && keep <= 1.0) || !(clamp_quantile >= 0.5 && clamp_quantile <= 1.0))
    throw InvalidArgument(
        "[head_keep_ratios] keep must be in (0, 1] and clamp_quantile in "
        "[0.5, 1], got " +
        json_text(keep) + " and " + json_text(clamp_quantile));
  const size_t N = head_importance.size();
  std::vector<double> c(N), positive;
  for (size_t i = 0; i < N; ++i) {
    const double h = head_importance[i], l = layer_importance[i / static_cast<size_t>(n_heads)];
    if (!std::isfinite(h) || !std::isfinite(l))
      throw InvalidArgument("[head_keep_ratios] importance of head " + std::to_string(i) +
                            " is not finite");
    c[i] = std::max(h, 0.0) * std::max(l, 0.0);
    if (c[i] > 0) positive.push_back(c[i]);
  }
  std::vector<double> r(N, keep);
  if (positive.empty()) return r;
  // The clamp, two-sided: products are bounded to the [1 - q, q] quantiles of the positive ones
  // (a head whose removal did not raise the loss gets the lower bound, not 0: keeping one key
  // replaces its output by one value row, a larger change than the ablation that measured it).
  const auto quantile = [&](double f) {
    const size_t i =
        static_cast<size_t>(std::max(0.0, std::ceil(f * static_cast<double>(positive.size())) - 1));
    std::nth_element(positive.begin(), positive.begin() + i, positive.end());
    return positive[i];
  };
  const double cap = quantile(clamp_quantile), floor = quantile(1.0 - clamp_quantile);
  for (double& x : c) x = std::clamp(x, floor, cap);
  // Water filling: heads at 1 keep 1, the budget left is shared by the others in proportion to
  // c (all c > 0 after the clamp).
  std::vector<bool> capped(N, false);
  const double total = keep * static_cast<double>(N);
  for (;;) {
    double budget = total, free_c = 0;
    for (size_t i = 0; i < N; ++i) (capped[i] ? budget -= 1.0 : free_c += c[i]);
    bool changed = false;
    for (size_t i = 0; i < N; ++i) {
      if (capped[i]) continue;
      r[i] = free_c > 0 ? budget * c[i] / free_c : 0.0;
      if (r[i] > 1.0) capped[i] = changed = true, r[i] = 1.0;
    }
    if (!changed) break;
  }
  return r;
}

int64_t keys_kept(int64_t visible, double ratio, int64_t min_keys) {
  const auto k = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(visible) - 1e-9));
  return std::min(visible, std::max(min_keys, k));
}

namespace {
// Keys the r-th of `rows` causal rows ending at key kv_len sees (at most `window`; 0: no window).
int64_t visible_keys(int64_t r, int64_t rows, int64_t kv_len, int64_t window) {
  const int64_t pos = kv_len - rows + r;
  return pos + 1 - kernels::first_visible_key(pos, window);
}
}  // namespace

int64_t causal_pairs(int64_t rows, int64_t kv_len, int64_t window) {
  if (window <= 0) return rows * kv_len - rows * (rows - 1) / 2;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) n += visible_keys(r, rows, kv_len, window);
  return n;
}

int64_t kept_pairs(int64_t rows, int64_t kv_len, int64_t window, double ratio, int64_t min_keys) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r)
    n += keys_kept(visible_keys(r, rows, kv_len, window), ratio, min_keys);
  return n;
}

std::vector<BlockSparseQueryBlock> block_sparse_query_blocks(int64_t T, int64_t past, int64_t block,
                                                             int64_t window) {
  std::vector<BlockSparseQueryBlock> out;
  for (int64_t r0 = 0; r0 < T;) {
    const int64_t diagonal = (past + r0) / block;
    const int64_t end = std::min(T, (diagonal + 1) * block - past);
    out.push_back({r0, end - r0, kernels::first_visible_key(past + r0, window) / block, diagonal});
    r0 = end;
  }
  return out;
}

LayerConsts uniform_layer_consts(const AttentionScheme& s, int64_t n_heads) {
  LayerConsts c;
  if (s.kind->selects_keys()) c.head_ratio.assign(static_cast<size_t>(n_heads), s.number("keep"));
  return c;
}

}  // namespace socllm::attention
