#include "calibration/calibration.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/core.h"
#include "io/model_store.h"
#include "kernels/kernels.h"

namespace socllm {

Calibration Calibration::empty_for(const ModelConfig& c) {
  Calibration cal;
  cal.n_layers = c.n_layers;
  cal.n_heads = c.n_heads;
  cal.n_kv_heads = c.n_kv_heads;
  for (int s = 0; s < kNumLinearSites; ++s) {
    cal.width[s] = linear_site_width(c, static_cast<LinearSite>(s));
    cal.out_width[s] = linear_out_width(c, static_cast<LinearSite>(s));
    cal.channel_absmax[s].assign(static_cast<size_t>(c.n_layers * cal.width[s]), 0.0f);
    cal.abs_hist[s].assign(static_cast<size_t>(c.n_layers * kAbsHistBins), 0);
  }
  return cal;
}

void Calibration::check_matches(const ModelConfig& c) const {
  if (n_layers != c.n_layers)
    throw ShapeError("[Calibration] statistics are for " + std::to_string(n_layers) +
                     " layers, the model has " + std::to_string(c.n_layers) +
                     " (calibration file from another model?)");
  for (int s = 0; s < kNumLinearSites; ++s) {
    const auto site = static_cast<LinearSite>(s);
    const int64_t w = linear_site_width(c, site);
    if (width[s] != w || static_cast<int64_t>(channel_absmax[s].size()) != n_layers * w)
      throw ShapeError(std::string("[Calibration] site '") + linear_site_name(site) +
                       "' has width " + std::to_string(width[s]) + ", the model's is " +
                       std::to_string(w) + " (calibration file from another model?)");
    if (!abs_hist[s].empty() && static_cast<int64_t>(abs_hist[s].size()) != n_layers * kAbsHistBins)
      throw ShapeError(std::string("[Calibration] site '") + linear_site_name(site) +
                       "' has a |x| histogram of " + std::to_string(abs_hist[s].size()) +
                       " bins, expected " + std::to_string(n_layers * kAbsHistBins));
    if (!outlier_threshold[s].empty() &&
        (static_cast<int64_t>(outlier_threshold[s].size()) != n_layers ||
         static_cast<int64_t>(outlier_count[s].size()) != n_layers * w))
      throw ShapeError(std::string("[Calibration] site '") + linear_site_name(site) +
                       "' has outlier statistics of the wrong shape (calibration file from another "
                       "model?)");
    for (size_t i = 0; i < channel_absmax[s].size(); ++i)
      if (!std::isfinite(channel_absmax[s][i]) || channel_absmax[s][i] < 0.0f)
        throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                              "' has an invalid absmax " + std::to_string(channel_absmax[s][i]) +
                              " at flat index " + std::to_string(i));
    for (size_t i = 0; i < outlier_threshold[s].size(); ++i)
      if (!std::isfinite(outlier_threshold[s][i]) || !(outlier_threshold[s][i] > 0.0f))
        throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                              "' has an invalid outlier threshold " +
                              std::to_string(outlier_threshold[s][i]) + " at layer " +
                              std::to_string(i));
    // Counts are summed per layer (percentiles, hot channels): negative ones or sums beyond
    // int64 come only from a corrupt file.
    const auto check_counts = [&](const std::vector<int64_t>& v, const char* what) {
      if (v.empty()) return;
      const size_t row = v.size() / static_cast<size_t>(n_layers);
      for (size_t r = 0; r < static_cast<size_t>(n_layers); ++r) {
        int64_t sum = 0;
        for (size_t i = r * row; i < (r + 1) * row; ++i)
          if (v[i] < 0 || __builtin_add_overflow(sum, v[i], &sum))
            throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                                  "': " + what + " at layer " + std::to_string(r) +
                                  (v[i] < 0 ? " has a negative count " + std::to_string(v[i])
                                            : std::string(" sums beyond 64 bits")));
      }
    };
    const auto check_sized = [&](size_t n, size_t want, const char* what) {
      if (n != 0 && n != want)
        throw ShapeError(std::string("[Calibration] site '") + linear_site_name(site) +
                         "': " + what + " holds " + std::to_string(n) + " values, expected " +
                         std::to_string(want) + " (calibration file from another model?)");
    };
    const size_t ow = static_cast<size_t>(n_layers * linear_out_width(c, site));
    check_sized(out_absmax[s].size(), ow, "out_absmax");
    check_sized(smooth_alpha[s].size(), static_cast<size_t>(n_layers), "smooth_alpha");
    check_sized(smooth_alpha_error[s].size(), static_cast<size_t>(n_layers * kSmoothAlphaGrid),
                "smooth_alpha_error");
    check_sized(channel_bits[s].size(), ow, "channel_bits");
    check_sized(hessian[s].size(), static_cast<size_t>(n_layers * w * w), "hessian");
    for (float v : hessian[s])
      if (!std::isfinite(v))
        throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                              "' has a non-finite Hessian entry");
    for (float v : out_absmax[s])
      if (!std::isfinite(v) || v < 0.0f)
        throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                              "' has an invalid output absmax " + std::to_string(v));
    for (float v : smooth_alpha[s])
      if (!(v >= 0.0f && v <= 1.0f))
        throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                              "' has a smoothing alpha " + std::to_string(v) + " outside [0, 1]");
    for (int64_t v : channel_bits[s])
      if (v < 1 || v > 8)
        throw InvalidArgument(std::string("[Calibration] site '") + linear_site_name(site) +
                              "' has a channel bit-width " + std::to_string(v) + " outside 1..8");
    check_counts(abs_hist[s], "abs_hist");
    check_counts(outlier_count[s], "outlier_count");
    check_counts(outlier_seq_channels[s], "outlier_seq_channels");
    check_counts(outlier_seqs[s], "outlier_seqs");
  }
  check_attention_matches(c);
}

void Calibration::check_attention_matches(const ModelConfig& c) const {
  if (n_heads != c.n_heads || n_kv_heads != c.n_kv_heads)
    throw ShapeError("[Calibration] statistics are for " + std::to_string(n_heads) + "/" +
                     std::to_string(n_kv_heads) + " heads, the model has " +
                     std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads));
  const auto check = [&](const std::vector<float>& v, const char* name, int64_t per, bool windows) {
    if (v.empty()) return;
    const int64_t n = static_cast<int64_t>(v.size());
    if (windows ? n % per != 0 : n != per)
      throw ShapeError(std::string("[Calibration] '") + name + "' holds " + std::to_string(n) +
                       " values, expected " + (windows ? "a multiple of " : "") +
                       std::to_string(per));
    for (float x : v)
      if (!std::isfinite(x) || (windows && x < 0))
        throw InvalidArgument(std::string("[Calibration] '") + name + "' holds " +
                              std::to_string(x));
  };
  check(head_importance, "head_importance", n_layers * n_heads, false);
  check(residual_absmax, "residual_absmax", n_layers + 1, false);
  check(layer_importance, "layer_importance", n_layers, false);
  check(q_absmax, "q_absmax", n_layers * n_heads, true);
  check(k_absmax, "k_absmax", n_layers * n_kv_heads, true);
  check(v_absmax, "v_absmax", n_layers * n_kv_heads, true);
  if (k_absmax.size() * static_cast<size_t>(n_heads) !=
          q_absmax.size() * static_cast<size_t>(n_kv_heads) ||
      k_absmax.size() != v_absmax.size())
    throw ShapeError("[Calibration] q_absmax, k_absmax and v_absmax cover different windows");
}

std::span<const float> Calibration::absmax(int64_t layer, LinearSite s) const {
  const int64_t w = width[static_cast<int>(s)];
  return {channel_absmax[static_cast<int>(s)].data() + layer * w, static_cast<size_t>(w)};
}

void Calibration::observe(int64_t layer, LinearSite s, const float* x, int64_t rows, int64_t ld) {
  const int si = static_cast<int>(s);
  if (!hessian[si].empty()) observe_hessian(layer, s, x, rows, ld);
  const int64_t w = width[si];
  float* m = channel_absmax[si].data() + layer * w;
  int64_t* hist = abs_hist[si].empty() ? nullptr : abs_hist[si].data() + layer * kAbsHistBins;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < w; ++j) {
      const float a = std::abs(x[r * ld + j]);
      m[j] = std::max(m[j], a);
      if (hist) ++hist[std::bit_cast<uint32_t>(a) >> kAbsHistShift];
    }
  if (outlier_threshold[si].empty()) return;
  const float t = outlier_threshold[si][static_cast<size_t>(layer)];
  int64_t* count = outlier_count[si].data() + layer * w;
  int64_t channels = 0;
  for (int64_t j = 0; j < w; ++j) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; ++r) n += std::abs(x[r * ld + j]) > t;
    count[j] += n;
    channels += n > 0;
  }
  outlier_seq_channels[si][static_cast<size_t>(layer)] += channels;
  ++outlier_seqs[si][static_cast<size_t>(layer)];
}

void Calibration::observe_hessian(int64_t layer, LinearSite s, const float* x, int64_t rows,
                                  int64_t ld) {
  const int si = static_cast<int>(s);
  const int64_t w = width[si];
  if (hessian[si].empty()) hessian[si].assign(static_cast<size_t>(n_layers * w * w), 0.0f);
  kernels::add_gram_upper(x, rows, w, ld, hessian[si].data() + layer * w * w, w);
  if (layer == 0 && s == LinearSite::AttnIn) hessian_rows += rows;
}

void Calibration::finish_hessians() {
  if (hessian_rows <= 0) throw InvalidArgument("[Calibration] no rows observed for the Hessians");
  const float inv = 1.0f / static_cast<float>(hessian_rows);
  for (int si = 0; si < kNumLinearSites; ++si) {
    const int64_t w = width[si];
    for (int64_t l = 0; l < n_layers; ++l) {
      float* H = hessian[si].data() + l * w * w;
      for (int64_t a = 0; a < w; ++a) {
        H[a * w + a] *= inv;
        for (int64_t b = a + 1; b < w; ++b) H[b * w + a] = H[a * w + b] *= inv;
      }
    }
  }
}

void Calibration::observe_residual(int64_t index, const float* x, int64_t rows, int64_t d) {
  if (residual_absmax.empty()) residual_absmax.assign(static_cast<size_t>(n_layers + 1), 0.0f);
  float& m = residual_absmax.at(static_cast<size_t>(index));
  for (int64_t i = 0; i < rows * d; ++i) m = std::max(m, std::abs(x[i]));
}

std::span<const float> Calibration::hessian_of(int64_t layer, LinearSite s) const {
  const int si = static_cast<int>(s);
  const int64_t w = width[si];
  if (hessian[si].empty())
    throw InvalidArgument("[Calibration] no Hessians (socllm calibrate --steps ...,gptq)");
  return {hessian[si].data() + layer * w * w, static_cast<size_t>(w * w)};
}

std::span<const float> Calibration::output_absmax(int64_t layer, LinearSite s) const {
  const int si = static_cast<int>(s);
  if (out_absmax[si].empty())
    throw InvalidArgument(
        "[Calibration] no output channel maxima: this file's act-scales step "
        "predates them (socllm calibrate --steps act-scales again)");
  const int64_t w = out_width[si];
  return {out_absmax[si].data() + layer * w, static_cast<size_t>(w)};
}

void Calibration::observe_output(int64_t layer, LinearSite s, const float* y, int64_t rows,
                                 int64_t ld) {
  const int si = static_cast<int>(s);
  const int64_t w = out_width[si];
  if (out_absmax[si].empty()) out_absmax[si].assign(static_cast<size_t>(n_layers * w), 0.0f);
  float* m = out_absmax[si].data() + layer * w;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < w; ++j) m[j] = std::max(m[j], std::abs(y[r * ld + j]));
}

float Calibration::abs_percentile(int64_t layer, LinearSite s, double p) const {
  const int si = static_cast<int>(s);
  if (!(p > 0.0 && p <= 1.0))
    throw InvalidArgument("[Calibration] percentile fraction must be in (0, 1], got " +
                          std::to_string(p));
  if (layer < 0 || layer >= n_layers)
    throw InvalidArgument("[Calibration] layer " + std::to_string(layer) + " outside [0, " +
                          std::to_string(n_layers) + ")");
  const auto m = absmax(layer, s);
  const float exact_max = m.empty() ? 0.0f : *std::max_element(m.begin(), m.end());
  if (p == 1.0) return exact_max;
  if (abs_hist[si].empty())
    throw InvalidArgument("[Calibration] no |x| histogram (calibrate with step act-scales)");
  const int64_t* hist = abs_hist[si].data() + layer * kAbsHistBins;
  int64_t total = 0;
  for (int64_t b = 0; b < kAbsHistBins; ++b) total += hist[b];
  if (total == 0) throw InvalidArgument("[Calibration] nothing observed for this input");
  const double want = p * static_cast<double>(total);
  int64_t cum = 0;
  for (int64_t b = 0; b < kAbsHistBins; ++b) {
    cum += hist[b];
    if (static_cast<double>(cum) >= want) {
      const float upper = std::bit_cast<float>(static_cast<uint32_t>((b + 1) << kAbsHistShift));
      return std::min(upper, exact_max);
    }
  }
  return exact_max;
}

void Calibration::set_outlier_thresholds(LinearSite s, std::span<const float> thresholds) {
  const int si = static_cast<int>(s);
  if (static_cast<int64_t>(thresholds.size()) != n_layers)
    throw ShapeError("[Calibration] " + std::to_string(thresholds.size()) + " thresholds for " +
                     std::to_string(n_layers) + " layers of site '" + linear_site_name(s) + "'");
  for (size_t l = 0; l < thresholds.size(); ++l)
    if (!(thresholds[l] > 0.0f) || !std::isfinite(thresholds[l]))
      throw InvalidArgument(std::string("[Calibration] outlier threshold of layer ") +
                            std::to_string(l) + " site '" + linear_site_name(s) +
                            "' must be finite and > 0, got " + std::to_string(thresholds[l]));
  outlier_threshold[si].assign(thresholds.begin(), thresholds.end());
  outlier_count[si].assign(static_cast<size_t>(n_layers * width[si]), 0);
  outlier_seq_channels[si].assign(static_cast<size_t>(n_layers), 0);
  outlier_seqs[si].assign(static_cast<size_t>(n_layers), 0);
}

bool Calibration::has_outlier_stats() const {
  for (int s = 0; s < kNumLinearSites; ++s)
    if (outlier_threshold[s].empty()) return false;
  return true;
}

std::vector<double> Calibration::outlier_importance() const {
  if (!has_outlier_stats())
    throw InvalidArgument("[Calibration] no outlier statistics (calibrate with step 'outliers')");
  std::vector<double> imp(static_cast<size_t>(n_layers * kNumLinearSites));
  for (int64_t l = 0; l < n_layers; ++l)
    for (int s = 0; s < kNumLinearSites; ++s) {
      const auto m = absmax(l, static_cast<LinearSite>(s));
      imp[l * kNumLinearSites + s] = quant::outlier_importance(
          *std::max_element(m.begin(), m.end()), outlier_threshold[s][static_cast<size_t>(l)]);
    }
  return imp;
}

std::vector<quant::ShadowLinearConfig> Calibration::shadow_configs(
    const quant::ShadowOptions& opts) const {
  const std::vector<double> imp = outlier_importance();
  const std::vector<bool> pruned = quant::select_pruned(imp, opts.pruning_rate);
  std::vector<quant::ShadowLinearConfig> out(imp.size());
  for (int64_t l = 0; l < n_layers; ++l)
    for (int s = 0; s < kNumLinearSites; ++s) {
      const size_t i = static_cast<size_t>(l * kNumLinearSites + s);
      const int64_t w = width[s];
      out[i].threshold = outlier_threshold[s][static_cast<size_t>(l)];
      out[i].hot_channels = quant::select_hot_channels(
          {outlier_count[s].data() + l * w, static_cast<size_t>(w)}, opts.hot_share);
      out[i].pruned = pruned[i];
    }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The artifact file.

namespace {

constexpr std::array<CalibrationArraySpec, 17> kSchema = {{
    {"act_absmax", "float32", "[n_layers, width]", "act-scales", false,
     "running max of |x| per input channel (static scales: max / 127)"},
    {"abs_hist", "int64", "[n_layers, 16384]", "act-scales", false,
     "histogram of |x|, bin = float bits >> 17 (64 bins per octave), for percentile thresholds"},
    {"outlier_threshold", "float32", "[n_layers]", "outliers", false,
     "shadow-outlier threshold t of each input (seed 001 §3.3; the NPU scale is t / 127)"},
    {"outlier_count", "int64", "[n_layers, width]", "outliers", false,
     "values beyond t per input channel (hot channels, Fig. 11)"},
    {"outlier_seq_channels", "int64", "[n_layers]", "outliers", false,
     "distinct channels beyond t per calibration window, summed"},
    {"outlier_seqs", "int64", "[n_layers]", "outliers", false, "calibration windows counted"},
    {"head_importance", "float32", "[n_layers, n_heads]", "head-importance", false,
     "loss increase (nats/token) when the head's attention output is zeroed (seed 000 Eq. 1)",
     false},
    {"layer_importance", "float32", "[n_layers]", "head-importance", false,
     "loss increase (nats/token) when the layer's attention output is zeroed (seed 000 Eq. 2)",
     false},
    {"q_absmax", "float32", "[windows, n_layers, n_heads]", "qk-scales", false,
     "max |Q| of each head (post-RoPE) per calibration window (scale = max / 127, §3.3)", false},
    {"k_absmax", "float32", "[windows, n_layers, n_kv_heads]", "qk-scales", false,
     "max |K| of each KV head (post-RoPE) per calibration window", false},
    {"v_absmax", "float32", "[windows, n_layers, n_kv_heads]", "qk-scales", false,
     "max |V| of each KV head per calibration window (npu-int8's static V scale)", false},
    {"out_absmax", "float32", "[n_layers, out_width]", "act-scales", false,
     "running max of |y| per output channel of the site's linear (EdgeFlow's S_O, seed 004 "
     "§4.1; static output scales)"},
    {"smooth_alpha", "float32", "[n_layers]", "smoothing", false,
     "EdgeFlow's smoothing exponent alpha of the input (grid search, seed 004 §4.1)"},
    {"smooth_alpha_error", "float32", "[n_layers, 11]", "smoothing", false,
     "relative output error of the quantized linear at alpha = 0, 0.1, ..., 1"},
    {"channel_bits", "int64", "[n_layers, out_width]", "bitwidths", false,
     "bit-width (1..8) of every output channel of the site's linear (seed 004 Algorithm 1)"},
    {"residual_absmax", "float32", "[n_layers + 1]", "act-scales", false,
     "max |x| of the residual stream entering each layer and after the last (residual_scale=auto)",
     false},
    {"hessian", "float32", "[n_layers, width, width]", "gptq", false,
     "mean X^T X of the site's inputs over the calibration rows (GPTQ's Hessian, Frantar et al. "
     "2023; rows: attribute hessian_rows)"},
}};

// The config keys that decide whether statistics fit a model (its name may differ).
constexpr const char* kShapeKeys[] = {
    "arch", "vocab_size", "d_model", "n_layers",       "n_heads",  "n_kv_heads", "head_dim",
    "d_ff", "rope_theta", "rms_eps", "tie_embeddings", "qkv_bias", "mlp"};

}  // namespace

std::span<const CalibrationArraySpec> Calibration::schema() { return kSchema; }

const CalibrationArraySpec& Calibration::spec(const std::string& name) {
  for (const auto& spec : kSchema)
    if (name == spec.name) return spec;
  std::string known;
  for (const auto& spec : kSchema) known += (known.empty() ? "" : ", ") + std::string(spec.name);
  throw InvalidArgument("[Calibration] unknown array '" + name + "' (" + known + ")");
}

bool Calibration::has_act_scales() const {
  for (const auto& a : channel_absmax)
    if (std::any_of(a.begin(), a.end(), [](float x) { return x != 0.0f; })) return true;
  return false;
}

std::vector<float> Calibration::mean_scale(char which) const {
  const auto& a = which == 'q' ? q_absmax : which == 'k' ? k_absmax : v_absmax;
  const int64_t per = n_layers * (which == 'q' ? n_heads : n_kv_heads);
  std::vector<float> m(static_cast<size_t>(per), 0.0f);
  if (a.empty() || per == 0) return m;
  const int64_t windows = static_cast<int64_t>(a.size()) / per;
  for (int64_t w = 0; w < windows; ++w)
    for (int64_t i = 0; i < per; ++i) m[i] += a[w * per + i] / 127.0f / static_cast<float>(windows);
  return m;
}

float Calibration::static_scale(int64_t layer, char which) const {
  const auto& a = which == 'q' ? q_absmax : which == 'k' ? k_absmax : v_absmax;
  const int64_t heads = which == 'q' ? n_heads : n_kv_heads, per = n_layers * heads;
  float m = 0.0f;
  for (size_t w = 0; per > 0 && w < a.size() / static_cast<size_t>(per); ++w)
    for (int64_t h = 0; h < heads; ++h) m = std::max(m, a[w * per + layer * heads + h]);
  return m / 127.0f;
}

Calibration::ArrayRef Calibration::array(const std::string& name, LinearSite site) {
  const int s = static_cast<int>(site);
  const auto windows = [&](int64_t heads) { return std::vector<int64_t>{-1, n_layers, heads}; };
  if (name == "head_importance") return {&head_importance, nullptr, {n_layers, n_heads}};
  if (name == "layer_importance") return {&layer_importance, nullptr, {n_layers}};
  if (name == "q_absmax") return {&q_absmax, nullptr, windows(n_heads)};
  if (name == "k_absmax") return {&k_absmax, nullptr, windows(n_kv_heads)};
  if (name == "v_absmax") return {&v_absmax, nullptr, windows(n_kv_heads)};
  if (name == "residual_absmax") return {&residual_absmax, nullptr, {n_layers + 1}};
  const auto sh = [&](const char* spec_name) {
    for (const auto& spec : kSchema)
      if (std::string(spec.name) == spec_name) {
        const std::string shape = spec.shape;
        if (shape == "[n_layers]") return std::vector<int64_t>{n_layers};
        if (shape == "[n_layers, width]") return std::vector<int64_t>{n_layers, width[s]};
        if (shape == "[n_layers, out_width]") return std::vector<int64_t>{n_layers, out_width[s]};
        static_assert(kSmoothAlphaGrid == 11, "the schema's smooth_alpha_error shape");
        if (shape == "[n_layers, 11]") return std::vector<int64_t>{n_layers, kSmoothAlphaGrid};
        if (shape == "[n_layers, width, width]")
          return std::vector<int64_t>{n_layers, width[s], width[s]};
        return std::vector<int64_t>{n_layers, kAbsHistBins};
      }
    return std::vector<int64_t>{};
  };
  if (name == "act_absmax") return {&channel_absmax[s], nullptr, sh("act_absmax")};
  if (name == "abs_hist") return {nullptr, &abs_hist[s], sh("abs_hist")};
  if (name == "outlier_threshold") return {&outlier_threshold[s], nullptr, sh("outlier_threshold")};
  if (name == "outlier_count") return {nullptr, &outlier_count[s], sh("outlier_count")};
  if (name == "outlier_seq_channels")
    return {nullptr, &outlier_seq_channels[s], sh("outlier_seq_channels")};
  if (name == "outlier_seqs") return {nullptr, &outlier_seqs[s], sh("outlier_seqs")};
  if (name == "out_absmax") return {&out_absmax[s], nullptr, sh("out_absmax")};
  if (name == "smooth_alpha") return {&smooth_alpha[s], nullptr, sh("smooth_alpha")};
  if (name == "smooth_alpha_error")
    return {&smooth_alpha_error[s], nullptr, sh("smooth_alpha_error")};
  if (name == "channel_bits") return {nullptr, &channel_bits[s], sh("channel_bits")};
  if (name == "hessian") return {&hessian[s], nullptr, sh("hessian")};
  spec(name);  // throws listing the names
  return {};
}

void Calibration::save(const std::string& path, const ModelConfig& model,
                       const nlohmann::json& provenance) const {
  check_matches(model);
  if (!provenance.is_object())
    throw InvalidArgument("[Calibration.save] provenance must be an object, got " +
                          json_text(provenance));
  H5Writer w(path);
  for (const auto& [k, v] : provenance.items())
    w.attr("/", k, v.is_array() || v.is_object() ? nlohmann::json(v.dump()) : v);
  w.attr("/", "format", kFormat);
  w.attr("/", "format_version", kFormatVersion);
  w.attr("/", "model_name", model.name);
  w.attr("/", "model_config", model.to_json().dump());
  w.attr("/", "tokens", tokens);
  w.attr("/", "rotation", rotation);
  if (has_hessians()) w.attr("/", "hessian_rows", hessian_rows);
  auto& self = const_cast<Calibration&>(*this);  // array() hands out mutable views
  for (const auto& spec : kSchema) {
    if (std::string(spec.step) == "act-scales" && !has_act_scales()) continue;  // did not run
    if (!spec.per_site) {
      const auto a = self.array(spec.name, LinearSite::AttnIn);
      if (a.f->empty()) continue;
      auto shape = a.shape;
      if (shape[0] == -1) shape[0] = static_cast<int64_t>(a.f->size()) / (shape[1] * shape[2]);
      w.write(spec.name, shape, a.f->data());
      continue;
    }
    for (int s = 0; s < kNumLinearSites; ++s) {
      const auto a = self.array(spec.name, static_cast<LinearSite>(s));
      const size_t n = a.f ? a.f->size() : a.i->size();
      if (n == 0) continue;  // its step did not run
      const auto& shape = a.shape;
      const std::string ds =
          std::string(spec.name) + "/" + linear_site_name(static_cast<LinearSite>(s));
      if (a.f) w.write(ds, shape, a.f->data());
      else w.write(ds, shape, a.i->data());
    }
  }
  if (has_outlier_stats()) {
    // What the shadow-outlier plan builds at its default options, for inspection.
    const quant::ShadowOptions d;
    const auto cfgs = shadow_configs(d);
    const auto imp = outlier_importance();
    std::vector<float> importance(imp.begin(), imp.end());
    std::vector<uint8_t> pruned(cfgs.size());
    for (size_t i = 0; i < cfgs.size(); ++i) pruned[i] = cfgs[i].pruned;
    w.group("/shadow_defaults");
    w.attr("/shadow_defaults", "hot_share", d.hot_share);
    w.attr("/shadow_defaults", "pruning_rate", d.pruning_rate);
    std::string sites;
    for (int s = 0; s < kNumLinearSites; ++s)
      sites += (s ? "," : "") + std::string(linear_site_name(static_cast<LinearSite>(s)));
    w.attr("/shadow_defaults", "sites", sites);
    w.write("/shadow_defaults/importance", {n_layers, kNumLinearSites}, importance.data());
    w.write_mask("/shadow_defaults/pruned", {n_layers, kNumLinearSites}, pruned.data());
    for (int s = 0; s < kNumLinearSites; ++s) {
      std::vector<uint8_t> hot(static_cast<size_t>(n_layers * width[s]), 0);
      for (int64_t l = 0; l < n_layers; ++l)
        for (int64_t ch : cfgs[static_cast<size_t>(l * kNumLinearSites + s)].hot_channels)
          hot[static_cast<size_t>(l * width[s] + ch)] = 1;
      w.write_mask(
          std::string("/shadow_defaults/hot_mask/") + linear_site_name(static_cast<LinearSite>(s)),
          {n_layers, width[s]}, hot.data());
    }
  }
  w.commit();
}

Calibration Calibration::load(const std::string& path, const ModelConfig& model,
                              nlohmann::json* provenance) {
  H5File f(path);
  if (!f.has_attr("/", "format") || f.attr_json("/", "format") != kFormat)
    throw FormatError("[Calibration] '" + path +
                      "' is not a socllm calibration file (format attribute missing)");
  const auto version =
      f.has_attr("/", "format_version") ? f.attr_json("/", "format_version") : nlohmann::json(0);
  if (!version.is_number_integer())
    throw FormatError("[Calibration] '" + path + "': format_version must be an integer, got " +
                      json_text(version));
  if (version < kOldestFormatVersion || version > kFormatVersion)
    throw InvalidArgument("[Calibration] '" + path + "' has schema version " + json_text(version) +
                          "; this socllm reads versions " + std::to_string(kOldestFormatVersion) +
                          " to " + std::to_string(kFormatVersion) +
                          " (recalibrate: socllm calibrate)");
  if (version < kFormatVersion)
    spdlog::warn(
        "'{}' is calibration format version {}: its attributes carry no checksums (calibrate "
        "again to have them verified)",
        path, version.get<int>());
  f.verify_attributes(version >= kFormatVersion);
  const std::string name = f.has_attr("/", "model_name") ? f.attr_str("/", "model_name") : "";
  if (!f.has_attr("/", "model_config"))
    throw FormatError("[Calibration] '" + path + "' lacks the model_config attribute");
  nlohmann::json theirs;
  try {
    theirs = nlohmann::json::parse(f.attr_str("/", "model_config"));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("[Calibration] '" + path + "': model_config is not JSON (" + e.what() + ")");
  }
  if (!theirs.is_object())
    throw FormatError("[Calibration] '" + path + "': model_config must be a JSON object, got " +
                      json_text(theirs));
  const nlohmann::json ours = model.to_json();
  for (const char* k : kShapeKeys)
    if (theirs.value(k, nlohmann::json()) != ours.value(k, nlohmann::json()))
      throw InvalidArgument("[Calibration] '" + path + "' was calibrated on model '" + name +
                            "' (" + k + " " + json_text(theirs.value(k, nlohmann::json())) +
                            "), not on this one ('" + model.name + "', " + k + " " +
                            json_text(ours.value(k, nlohmann::json())) + ")");
  Calibration c = empty_for(model);
  const auto shape_str = [](const std::vector<int64_t>& v) {
    std::string o = "[";
    for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
    return o + "]";
  };
  for (const auto& spec : kSchema) {
    if (!spec.per_site) {
      const std::string ds = std::string("/") + spec.name;
      if (!f.has(ds)) continue;
      const auto a = c.array(spec.name, LinearSite::AttnIn);
      const auto got = f.shape(ds);
      bool ok = got.size() == a.shape.size();
      for (size_t i = 0; ok && i < got.size(); ++i)
        ok = a.shape[i] == -1 ? got[i] >= 1 : got[i] == a.shape[i];
      if (!ok)
        throw FormatError("[Calibration] '" + path + "': " + ds + " has shape " + shape_str(got) +
                          ", the schema gives " + shape_str(a.shape) + " for this model");
      *a.f = f.read_f32(ds, got).data;
      for (float x : *a.f)
        if (!std::isfinite(x))
          throw FormatError("[Calibration] '" + path + "': " + ds + " holds " + std::to_string(x));
      continue;
    }
    int present = 0;
    for (int s = 0; s < kNumLinearSites; ++s) {
      const std::string ds =
          std::string("/") + spec.name + "/" + linear_site_name(static_cast<LinearSite>(s));
      if (!f.has(ds)) continue;
      ++present;
      const auto a = c.array(spec.name, static_cast<LinearSite>(s));
      const auto& want = a.shape;
      const auto got = f.shape(ds);
      if (got != want) {
        throw FormatError("[Calibration] '" + path + "': " + ds + " has shape " + shape_str(got) +
                          ", the schema gives " + shape_str(want) + " for this model");
      }
      if (a.f) {
        TensorF32 t = f.read_f32(ds);
        *a.f = std::move(t.data);
      } else {
        *a.i = f.read_i64(ds);
      }
    }
    if (present != 0 && present != kNumLinearSites)
      throw FormatError("[Calibration] '" + path + "' has " + spec.name + " for " +
                        std::to_string(present) + " of the " + std::to_string(kNumLinearSites) +
                        " sites");
    if (present == 0 && spec.required)
      throw FormatError("[Calibration] '" + path + "' lacks " + spec.name + " (written by step " +
                        spec.step + ")");
  }
  const bool outliers = !c.outlier_threshold[0].empty();
  for (int s = 0; s < kNumLinearSites; ++s)
    if (outliers && (c.outlier_count[s].empty() || c.outlier_seqs[s].empty() ||
                     c.outlier_seq_channels[s].empty()))
      throw FormatError("[Calibration] '" + path + "' has outlier thresholds without their counts");
  // save() writes act_absmax only once step act-scales observed something, so stored zeros
  // everywhere are damage; loaded, they would read as "no calibration" and replace a good one.
  if (f.has("/act_absmax") && !c.has_act_scales())
    throw FormatError("[Calibration] '" + path +
                      "': act_absmax holds only zeros (step act-scales writes it only after "
                      "observing activations: the file is damaged or was edited)");
  c.tokens = f.has_attr("/", "tokens") ? f.attr_int("/", "tokens") : 0;
  c.hessian_rows = f.has_attr("/", "hessian_rows") ? f.attr_int("/", "hessian_rows") : 0;
  if (f.has_attr("/", "rotation")) {
    const nlohmann::json r = f.attr_json("/", "rotation");
    if (!r.is_string())
      throw FormatError("[Calibration] '" + path + "': attribute rotation is " + json_text(r));
    c.rotation = r.get<std::string>();
  }
  c.check_matches(model);
  if (provenance) {
    *provenance = nlohmann::json::object();
    for (const auto& k : f.attr_names("/")) (*provenance)[k] = f.attr_json("/", k);
  }
  return c;
}

}  // namespace socllm
