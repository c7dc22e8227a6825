// Step bitwidths (EdgeFlow, seed 004 §4.1): per weight tensor, how well the closed-form relative
// error ranks output channels against the exact cosine distance (Spearman correlation at the
// average bit-width), and whether Algorithm 1's integer optimum differs from the rounded
// water-filling solution the closed form implies (channels that differ, summed-error gap), on
// the weights as plan edgeflow at `bits` sees them (smoothed by step smoothing's exponents).
// The report is the root attribute bitwidth_report (JSON).
//
// bit_scope per-tensor (the paper): the plan allocates every tensor's bits itself when it is
// built, so nothing is stored but the report (storing the plan's own answer for it to read back
// would fix nothing). bit_scope global-ttft (beyond the paper, issue 14 item 6): the bit-widths
// come from one heap over every output channel of the model (quant::allocate_bits_budgeted)
// under a cold-start time budget, the modelled time of the per-tensor allocation at `bits`
// (sim/cold_start.h: channel_cold_start_cost on `cost_device`), so the two compare at equal
// TTFT; they are stored as channel_bits, which the plan then uses. A channel's error is the
// closed form weighted by what it contributes to its tensor's output,
// e_i(B) = RE_i(B) · ||W'_i||² · mean_j E[x'_j²] / E[||y||²] (W', x': smoothed weights and
// inputs; E over the rows the caller sampled, as step smoothing's): the uniform-rounding
// estimate of the channel's share of its tensor's relative output error up to a constant, so
// summing it weighs every tensor's relative error equally (our choice; the paper allocates
// within a tensor only). bit_importance: output-share (this), output-absolute (without the
// division by E[||y||²]) or none (the plain closed form).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "calibrate/steps.h"
#include "core/core.h"
#include "kernels/kernels.h"
#include "quant/bitwidth.h"
#include "sim/cold_start.h"
#include "soc/soc.h"

namespace socllm::calibrate {

namespace {

constexpr int kLevels = quant::kChannelBitLevels;

// Spearman's rank correlation (ties ranked by position); NaN if a side is constant.
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t k = 0; k < idx.size(); ++k) r[idx[k]] = static_cast<double>(k);
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  const auto n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += ra[i], mb += rb[i];
  ma /= n, mb /= n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  // equal values rank by position, so only a length-1 side is constant
  if (saa == 0 || sbb == 0) return std::nan("");
  return sab / std::sqrt(saa * sbb);
}

std::vector<double> column(const std::vector<double>& table, int bits) {
  std::vector<double> c(table.size() / kLevels);
  for (size_t i = 0; i < c.size(); ++i) c[i] = table[i * kLevels + static_cast<size_t>(bits - 1)];
  return c;
}

// One weight tensor as the allocation sees it.
struct Tensor {
  int64_t layer = 0;
  LinearSite site{};
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> Ws;  // [rows, cols] smoothed weights
  std::vector<float> s_in;
  std::vector<double> closed;  // [rows, 8]
  std::vector<uint8_t> alloc;  // the per-tensor allocation's bits
};

// Per-channel weights of the closed form in the global heap (file comment), from the sampled
// linear inputs x [n, cols] of the tensor's site.
std::vector<double> channel_weights(const Tensor& t, const TensorF32& x,
                                    const std::string& importance) {
  if (importance == "none") return std::vector<double>(static_cast<size_t>(t.rows), 1.0);
  const int64_t n = x.dim(0);
  std::vector<float> xs = x.data;
  if (!t.s_in.empty())
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < t.cols; ++j) xs[static_cast<size_t>(r * t.cols + j)] /= t.s_in[j];
  double ex2 = 0;
  for (float v : xs) ex2 += static_cast<double>(v) * v;
  ex2 /= static_cast<double>(std::max<size_t>(xs.size(), 1));
  std::vector<double> w(static_cast<size_t>(t.rows));
  for (int64_t i = 0; i < t.rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < t.cols; ++j) {
      const double v = t.Ws[static_cast<size_t>(i * t.cols + j)];
      s += v * v;
    }
    w[static_cast<size_t>(i)] = s * ex2;
  }
  if (importance == "output-share") {
    std::vector<float> y(static_cast<size_t>(n * t.rows));
    kernels::linear(xs.data(), n, t.cols, t.cols, t.Ws.data(), t.rows, nullptr, y.data(), t.rows);
    double ey2 = 0;
    for (float v : y) ey2 += static_cast<double>(v) * v;
    ey2 /= static_cast<double>(std::max<int64_t>(n, 1));
    if (ey2 > 0)
      for (auto& v : w) v /= ey2;
  }
  return w;
}

void run(StepContext& ctx) {
  const double bits = ctx.options["bits"].get<double>();
  const std::string scope = ctx.options["bit_scope"].get<std::string>();
  const std::string importance = ctx.options["bit_importance"].get<std::string>();
  const std::string device = ctx.options["cost_device"].get<std::string>();
  const bool global = scope == "global-ttft";
  if (global && ctx.windows.empty())
    throw InvalidArgument("[calibrate] bitwidths: bit_scope global-ttft needs sampled windows");
  const auto cost_profile = global ? soc::load_device(device) : nullptr;

  // the plan allocates per tensor from these statistics, never from bits stored before
  Calibration base = ctx.stats;
  for (auto& b : base.channel_bits) b.clear();
  const std::string plan_text = "edgeflow:bits=" + json_text(bits);
  const Plan plan = Plan::parse(plan_text);
  const ModelConfig& c = ctx.engine.model().config();
  const int b_int = static_cast<int>(std::lround(bits));
  nlohmann::json rows = nlohmann::json::array();
  std::vector<Tensor> tensors;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int s = 0; s < kNumLinearSites; ++s) {
      const auto site = static_cast<LinearSite>(s);
      const auto lin = ctx.engine.prepare_linear(plan, l, site, std::nullopt, &base);
      const auto s_in = ctx.engine.input_smoothing(plan, l, site, std::nullopt, &base);
      const TensorF32& W = site_weights(ctx.engine.model().layer(l), site);
      const int64_t cols = W.dim(1);
      int64_t start = 0;
      for (const FusedTensor& ft : fused_tensors(c, site)) {
        Tensor t{l, site, ft.name, ft.rows, cols, {}, s_in, {}, {}};
        t.Ws.assign(W.data.begin() + start * cols, W.data.begin() + (start + ft.rows) * cols);
        if (!s_in.empty())
          for (int64_t i = 0; i < ft.rows; ++i)
            for (int64_t j = 0; j < cols; ++j) t.Ws[static_cast<size_t>(i * cols + j)] *= s_in[j];
        t.alloc.assign(lin->row_bits().begin() + start, lin->row_bits().begin() + start + ft.rows);
        start += ft.rows;
        t.closed =
            quant::channel_error_table(t.Ws.data(), t.rows, cols, quant::ErrorMetric::ClosedForm);
        const auto exact =
            quant::channel_error_table(t.Ws.data(), t.rows, cols, quant::ErrorMetric::Exact);
        int64_t total = 0;
        for (uint8_t b : t.alloc) total += b;
        const auto wf = quant::allocate_bits_waterfill(t.Ws.data(), t.rows, cols, total);
        const double e_heap = quant::allocation_error(t.closed, t.alloc);
        const double e_wf = quant::allocation_error(t.closed, wf);
        int64_t differ = 0;
        for (int64_t i = 0; i < t.rows; ++i) differ += wf[i] != t.alloc[i];
        rows.push_back(
            {{"layer", l},
             {"tensor", ft.name},
             {"rows", ft.rows},
             {"mean_bits", static_cast<double>(total) / static_cast<double>(ft.rows)},
             {"spearman_closed_vs_exact", spearman(column(t.closed, b_int), column(exact, b_int))},
             {"heap_vs_waterfill_channels", differ},
             {"waterfill_error_over_heap", e_heap > 0 ? e_wf / e_heap : 1.0}});
        if (global) tensors.push_back(std::move(t));
      }
    }
    ctx.progress(l + 1, c.n_layers, "layers");
  }

  nlohmann::json global_report = nullptr;
  for (auto& b : ctx.stats.channel_bits) b.clear();
  if (global) {
    // the sampled linear inputs of every layer and site, all windows stacked
    std::vector<std::array<TensorF32, kNumLinearSites>> X(static_cast<size_t>(c.n_layers));
    for (size_t w = 0; w < ctx.windows.size(); ++w) {
      const auto inputs = ctx.engine.linear_inputs(ctx.windows[w], ctx.rows_of(w));
      for (int64_t l = 0; l < c.n_layers; ++l)
        for (int s = 0; s < kNumLinearSites; ++s) {
          auto& dst = X[static_cast<size_t>(l)][static_cast<size_t>(s)];
          const auto& src = inputs[static_cast<size_t>(l)][static_cast<size_t>(s)];
          if (dst.shape.empty()) dst.shape = {0, src.dim(1)};
          dst.data.insert(dst.data.end(), src.data.begin(), src.data.end());
          dst.shape[0] += src.dim(0);
        }
    }
    std::vector<double> E, in_width_of_row;
    std::vector<int64_t> in_features;
    std::vector<uint8_t> per_tensor;
    for (const Tensor& t : tensors) {
      const auto w = channel_weights(
          t, X[static_cast<size_t>(t.layer)][static_cast<size_t>(t.site)], importance);
      for (int64_t i = 0; i < t.rows; ++i)
        for (int b = 0; b < kLevels; ++b)
          E.push_back(t.closed[static_cast<size_t>(i * kLevels + b)] * w[static_cast<size_t>(i)]);
      in_features.insert(in_features.end(), static_cast<size_t>(t.rows), t.cols);
      per_tensor.insert(per_tensor.end(), t.alloc.begin(), t.alloc.end());
    }
    const auto cost = channel_cold_start_cost(*cost_profile, in_features);
    const auto n_rows = static_cast<int64_t>(in_features.size());
    const double budget = quant::allocation_cost(cost.seconds, per_tensor);
    const auto g = quant::allocate_bits_budgeted(E, cost.seconds, n_rows, budget);
    // stored per site [n_layers, out] in the fused row order
    for (int s = 0; s < kNumLinearSites; ++s)
      ctx.stats.channel_bits[static_cast<size_t>(s)].assign(
          static_cast<size_t>(c.n_layers * linear_out_width(c, static_cast<LinearSite>(s))), 0);
    std::array<int64_t, kNumLinearSites> row_in_site{};
    int64_t start = 0;
    double w_all = 0, pt_bits = 0, g_bits = 0;
    std::array<double, kLevels> pt_share{}, g_share{};
    nlohmann::json by_tensor = nlohmann::json::object();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const Tensor& t = tensors[k];
      const int64_t out = linear_out_width(c, t.site);
      if (k > 0 && tensors[k - 1].layer != t.layer) row_in_site.fill(0);
      auto& cb = ctx.stats.channel_bits[static_cast<size_t>(t.site)];
      auto& off = row_in_site[static_cast<size_t>(t.site)];
      double tensor_g = 0;
      for (int64_t i = 0; i < t.rows; ++i) {
        const uint8_t gb = g[static_cast<size_t>(start + i)];
        cb[static_cast<size_t>(t.layer * out + off + i)] = gb;
        const auto n = static_cast<double>(t.cols);
        w_all += n, pt_bits += t.alloc[i] * n, g_bits += gb * n, tensor_g += gb;
        pt_share[t.alloc[i] - 1] += n, g_share[gb - 1] += n;
      }
      off += t.rows;
      start += t.rows;
      auto& kind = by_tensor[t.name];
      if (kind.is_null()) kind = {{"weights", 0.0}, {"per_tensor", 0.0}, {"global", 0.0}};
      double pt = 0;
      for (uint8_t b : t.alloc) pt += b;
      kind["weights"] = kind["weights"].get<double>() + static_cast<double>(t.rows * t.cols);
      kind["per_tensor"] = kind["per_tensor"].get<double>() + pt * static_cast<double>(t.cols);
      kind["global"] = kind["global"].get<double>() + tensor_g * static_cast<double>(t.cols);
      for (auto& r : rows)
        if (r["layer"] == t.layer && r["tensor"] == t.name)
          r["global_mean_bits"] = tensor_g / static_cast<double>(t.rows);
    }
    nlohmann::json mean_by_tensor = nlohmann::json::object();
    for (const auto& [name, k] : by_tensor.items())
      mean_by_tensor[name] = {
          {"per_tensor", k["per_tensor"].get<double>() / k["weights"].get<double>()},
          {"global", k["global"].get<double>() / k["weights"].get<double>()}};
    std::vector<double> pts(kLevels), gs(kLevels);
    for (int b = 0; b < kLevels; ++b) pts[b] = pt_share[b] / w_all, gs[b] = g_share[b] / w_all;
    global_report = {{"device", device},
                     {"importance", importance},
                     {"cost_inputs", cost.inputs},
                     {"budget_s", budget},
                     {"global_s", quant::allocation_cost(cost.seconds, g)},
                     {"per_tensor_mean_bits", pt_bits / w_all},
                     {"global_mean_bits", g_bits / w_all},
                     {"per_tensor_weighted_error", quant::allocation_error(E, per_tensor)},
                     {"global_weighted_error", quant::allocation_error(E, g)},
                     {"weight_share_by_bits", {{"per_tensor", pts}, {"global", gs}}},
                     {"mean_bits_by_tensor", mean_by_tensor}};
  }

  std::vector<double> rho;
  int64_t differs = 0;
  double max_gap = 0;
  for (const auto& r : rows) {
    const double v = r["spearman_closed_vs_exact"].is_number()
                         ? r["spearman_closed_vs_exact"].get<double>()
                         : std::nan("");
    if (std::isfinite(v)) rho.push_back(v);
    differs += r["heap_vs_waterfill_channels"].get<int64_t>() > 0;
    max_gap = std::max(max_gap, r["waterfill_error_over_heap"].get<double>());
  }
  std::sort(rho.begin(), rho.end());
  const auto median = [](const std::vector<double>& v) {
    if (v.empty()) return std::nan("");
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
  };
  const nlohmann::json summary = {{"bits", bits},
                                  {"plan", plan_text},
                                  {"tensors", rows.size()},
                                  {"spearman_median", median(rho)},
                                  {"spearman_min", rho.empty() ? std::nan("") : rho.front()},
                                  {"tensors_where_heap_differs_from_waterfill", differs},
                                  {"max_waterfill_error_over_heap", max_gap},
                                  {"bit_scope", scope},
                                  {"global_ttft", global_report},
                                  {"per_tensor", rows}};
  ctx.provenance["bitwidth_report"] = summary.dump();
  ctx.provenance["bitwidth_bits"] = bits;
  ctx.provenance["bitwidth_scope"] = scope;
}

constexpr const char* kDefaultCostDevice = "snapdragon-8elite";  // EdgeFlow's testbed (§5.1)
constexpr const char* kDefaultImportance = "output-share";

const bool kRegistered = register_step({
    "bitwidths",
    "EdgeFlow's per-output-channel bit-widths: a report on Algorithm 1 per tensor (closed-form "
    "vs exact ranking, heap vs water-filling), and with bit_scope global-ttft one heap over the "
    "model under a cold-start time budget (seed 004 §4.1)",
    70,
    {"act_absmax", "out_absmax", "smooth_alpha"},
    {"bitwidth_report", "bitwidth_bits", "bitwidth_scope"},
    {bits_option(),
     {"bit_scope",
      "per-tensor",
      "Algorithm 1 per tensor (the paper; the plan's own) or one heap over every channel at the "
      "per-tensor allocation's modelled cold-start time",
      {"per-tensor", "global-ttft"}},
     {"cost_device", kDefaultCostDevice,
      "global-ttft: the device profile whose flash and unpack costs price a bit (default: "
      "EdgeFlow's testbed, Snapdragon 8 Elite, seed 004 §5.1)"},
     {"bit_importance",
      kDefaultImportance,
      "global-ttft: what weights a channel's error",
      {"output-share", "output-absolute", "none"}},
     sample_options()[0],
     sample_options()[1]},
    run,
    [](const std::string& step, const nlohmann::json& o) {
      check_sample_options(step, o);
      if (o["bit_scope"] == "global-ttft") {
        soc::load_device(o["cost_device"].get<std::string>());
        return;
      }
      // Only the global heap prices or weights a channel: off their defaults they would be
      // ignored, so they are refused (issue 37).
      for (const auto& [key, fallback] : {std::pair{"cost_device", kDefaultCostDevice},
                                          std::pair{"bit_importance", kDefaultImportance}})
        if (o[key] != fallback)
          throw InvalidArgument("[calibrate] " + step + ": " + key + "=" + json_text(o[key]) +
                                " applies with bit_scope=global-ttft, not " +
                                json_text(o["bit_scope"]));
    },
});

}  // namespace

}  // namespace socllm::calibrate
