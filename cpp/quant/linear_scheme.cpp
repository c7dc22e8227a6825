#include "quant/linear_scheme.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/core.h"
#include "kernels/kernels.h"

namespace socllm::quant {

namespace {

constexpr WeightFormat kWeightFormats[] = {WeightFormat::F32, WeightFormat::Int8,
                                           WeightFormat::Int4};
constexpr ActFormat kActFormats[] = {ActFormat::F32, ActFormat::F16, ActFormat::Int8StaticPerTensor,
                                     ActFormat::Int8DynamicPerRow, ActFormat::Int8DynamicPerGroup};
// SmoothQuant's clamp on both statistics and on the factor (its smooth_lm).
constexpr float kSmoothClamp = 1e-5f;

template <typename E, size_t N>
std::string names_of(const E (&all)[N], std::string (*name)(E)) {
  std::string s;
  for (E e : all) s += (s.empty() ? "" : ", ") + name(e);
  return s;
}

template <typename E, size_t N>
E parse_enum(const nlohmann::json& v, const char* field, const E (&all)[N],
             std::string (*name)(E)) {
  if (!v.is_string())
    throw InvalidArgument(std::string("[LinearScheme] '") + field + "' must be a string, got " +
                          json_text(v) + " (known: " + names_of(all, name) + ")");
  for (E e : all)
    if (name(e) == v.get<std::string>()) return e;
  throw InvalidArgument(std::string("[LinearScheme] unknown ") + field + " mode '" +
                        v.get<std::string>() + "' (known: " + names_of(all, name) + ")");
}

double number_field(const nlohmann::json& v, const char* field) {
  if (!v.is_number())
    throw InvalidArgument(std::string("[LinearScheme] '") + field + "' must be a number, got " +
                          json_text(v));
  return v.get<double>();
}

bool integer_activations(ActFormat a) {
  return a == ActFormat::Int8StaticPerTensor || a == ActFormat::Int8DynamicPerRow;
}

constexpr OutputQuant kOutputQuants[] = {OutputQuant::None, OutputQuant::Int8, OutputQuant::Int16};

int32_t output_qmax(OutputQuant q) { return q == OutputQuant::Int8 ? 127 : 32767; }

}  // namespace

std::string weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "fp32";
    case WeightFormat::Int8: return "int8";
    case WeightFormat::Int4: return "int4";
  }
  return "?";
}

std::string output_quant_name(OutputQuant q) {
  switch (q) {
    case OutputQuant::None: return "none";
    case OutputQuant::Int8: return "int8";
    case OutputQuant::Int16: return "int16";
  }
  return "?";
}

std::vector<float> npu_input_smoothing(std::span<const float> act_absmax, double alpha) {
  std::vector<float> s(act_absmax.size());
  for (size_t j = 0; j < s.size(); ++j)
    s[j] = static_cast<float>(std::pow(std::max(act_absmax[j], kSmoothClamp), alpha));
  return s;
}

std::string act_format_name(ActFormat f) {
  switch (f) {
    case ActFormat::F32: return "fp32";
    case ActFormat::F16: return "fp16";
    case ActFormat::Int8StaticPerTensor: return "int8-static-per-tensor";
    case ActFormat::Int8DynamicPerRow: return "int8-dynamic-per-row";
    case ActFormat::Int8DynamicPerGroup: return "int8-dynamic-per-group";
  }
  return "?";
}

bool LinearScheme::is_fp32() const {
  return weights == WeightFormat::F32 && activations == ActFormat::F32 && !smooth_alpha &&
         !outlier_threshold && !shadow && !channel_bits && !npu_smoothing &&
         output_quant == OutputQuant::None;
}

std::string rounding_name(Rounding r) { return r == Rounding::Gptq ? "gptq" : "nearest"; }

Rounding rounding_from_name(const std::string& name) {
  if (name != "nearest" && name != "gptq")
    throw InvalidArgument("[LinearScheme] rounding must be nearest or gptq, got '" + name + "'");
  return name == "gptq" ? Rounding::Gptq : Rounding::Nearest;
}

bool LinearScheme::needs_calibration() const {
  return activations == ActFormat::Int8StaticPerTensor || smooth_alpha.has_value() ||
         needs_hessians() || shadow.has_value() || npu_smoothing.has_value() ||
         output_quant != OutputQuant::None || (channel_bits && channel_bits->stored);
}

void LinearScheme::validate() const {
  if (group_size <= 0)
    throw InvalidArgument("[LinearScheme] group_size must be > 0, got " +
                          std::to_string(group_size));
  if (smooth_alpha && !(*smooth_alpha >= 0.0 && *smooth_alpha <= 1.0))
    throw InvalidArgument("[LinearScheme] smoothing alpha must be in [0, 1], got " +
                          std::to_string(*smooth_alpha));
  if (outlier_threshold && !(*outlier_threshold > 0.0))
    throw InvalidArgument("[LinearScheme] outlier threshold must be > 0, got " +
                          std::to_string(*outlier_threshold));
  if (shadow) {
    if (!(shadow->pruning_rate >= 0.0 && shadow->pruning_rate <= 1.0))
      throw InvalidArgument("[LinearScheme] shadow pruning_rate must be in [0, 1], got " +
                            std::to_string(shadow->pruning_rate));
    if (!(shadow->hot_share >= 0.0 && shadow->hot_share <= 1.0))
      throw InvalidArgument("[LinearScheme] shadow hot_share must be in [0, 1], got " +
                            std::to_string(shadow->hot_share));
    if (activations != ActFormat::Int8StaticPerTensor || weights != WeightFormat::Int8 ||
        weight_granularity == Granularity::PerGroup || outlier_threshold || smooth_alpha)
      throw InvalidArgument(
          "[LinearScheme] shadow outlier execution runs on the NPU's static per-tensor int8 "
          "activations with int8 per-tensor/per-channel weights, without smoothing or LLM.int8 "
          "outliers");
  }
  if (weight_bits < 2 || weight_bits > 8 || (weights != WeightFormat::Int8 && weight_bits != 8))
    throw InvalidArgument("[LinearScheme] weight bits must be in 2..8 on int8 weights, got " +
                          std::to_string(weight_bits) + " on " + weight_format_name(weights));
  if (channel_bits && weight_bits != 8)
    throw InvalidArgument(
        "[LinearScheme] per-channel bit-widths replace the weight bits: give "
        "one of them");
  if (weights == WeightFormat::F32 && weight_granularity != Granularity::PerChannel)
    throw InvalidArgument("[LinearScheme] fp32 weights take no granularity (got " +
                          granularity_name(weight_granularity) + ")");
  if (channel_bits) {
    if (!(channel_bits->bits >= kMinChannelBits && channel_bits->bits <= kMaxChannelBits))
      throw InvalidArgument(
          "[LinearScheme] channel_bits.bits (the average budget) must be in "
          "[1, 8], got " +
          std::to_string(channel_bits->bits));
    if (weights != WeightFormat::Int8 || weight_granularity != Granularity::PerChannel)
      throw InvalidArgument(
          "[LinearScheme] per-channel bit-widths apply to int8 per-channel "
          "weights, got " +
          weight_format_name(weights) + " " + granularity_name(weight_granularity));
  }
  const bool npu_static = activations == ActFormat::Int8StaticPerTensor && !shadow &&
                          !outlier_threshold && weights == WeightFormat::Int8 &&
                          weight_granularity != Granularity::PerGroup;
  // fp32 linears with npu smoothing compute the same function as without it: the identity the
  // folding must preserve, testable in fp32.
  const bool float_identity = weights == WeightFormat::F32 && activations == ActFormat::F32 &&
                              !shadow && !outlier_threshold && !smooth_alpha;
  if (npu_smoothing) {
    const auto& n = *npu_smoothing;
    if (n.alpha && !(*n.alpha >= 0.0 && *n.alpha <= 1.0))
      throw InvalidArgument("[LinearScheme] npu_smoothing.alpha must be in [0, 1], got " +
                            std::to_string(*n.alpha));
    if (!(n.beta >= 0.0 && n.beta <= 1.0))
      throw InvalidArgument("[LinearScheme] npu_smoothing.beta must be in [0, 1], got " +
                            std::to_string(n.beta));
    if (!npu_static && !float_identity)
      throw InvalidArgument(
          "[LinearScheme] npu smoothing runs on the NPU's static per-tensor "
          "int8 activations with int8 weights (no shadow or LLM.int8 outliers), "
          "or on fp32 linears (where it changes nothing but rounding)");
    if (n.has_input_part() && smooth_alpha)
      throw InvalidArgument(
          "[LinearScheme] npu smoothing's input part (alpha) and SmoothQuant's "
          "smoothing_alpha both divide the input: set one");
  }
  if (output_quant != OutputQuant::None && !npu_static)
    throw InvalidArgument("[LinearScheme] output_quant '" + output_quant_name(output_quant) +
                          "' models the NPU's static output quantization: it needs static "
                          "per-tensor int8 activations and int8 weights");
  if (act_percentile) {
    if (!(*act_percentile > 0.0 && *act_percentile <= 100.0))
      throw InvalidArgument("[LinearScheme] act_percentile must be in (0, 100], got " +
                            std::to_string(*act_percentile));
    if (activations != ActFormat::Int8StaticPerTensor || shadow || smooth_alpha ||
        (npu_smoothing && npu_smoothing->has_input_part()))
      throw InvalidArgument(
          "[LinearScheme] act_percentile clips static per-tensor int8 activations without an "
          "input smoothing or shadow outliers (the calibrated |x| histogram is of the raw input)");
  }
  if (rounding == Rounding::Gptq) {
    if (weights == WeightFormat::F32)
      throw InvalidArgument(
          "[LinearScheme] rounding gptq chooses the integers of quantized weights: these "
          "weights are fp32");
    gptq.validate();
  }
}

nlohmann::json LinearScheme::to_json() const {
  nlohmann::json w = {{"format", weight_format_name(weights)}};
  if (weights != WeightFormat::F32) w["granularity"] = granularity_name(weight_granularity);
  if (weight_bits != 8) w["bits"] = weight_bits;
  if (weight_granularity == Granularity::PerGroup || activations == ActFormat::Int8DynamicPerGroup)
    w["group_size"] = group_size;
  nlohmann::json j = {{"weights", w}, {"activations", act_format_name(activations)}};
  j["smoothing_alpha"] = smooth_alpha ? nlohmann::json(*smooth_alpha) : nlohmann::json(nullptr);
  j["outlier_threshold"] =
      outlier_threshold ? nlohmann::json(*outlier_threshold) : nlohmann::json(nullptr);
  j["shadow_outliers"] = shadow ? nlohmann::json{{"pruning_rate", shadow->pruning_rate},
                                                 {"hot_share", shadow->hot_share}}
                                : nlohmann::json(nullptr);
  // EdgeFlow's fields only when set, so the other schemes' JSON is what it always was.
  if (channel_bits)
    j["channel_bits"] = {{"bits", channel_bits->bits},
                         {"allocation", bit_allocation_name(channel_bits->allocation)},
                         {"metric", error_metric_name(channel_bits->metric)},
                         {"stored", channel_bits->stored}};
  if (npu_smoothing)
    j["npu_smoothing"] = {{"alpha", npu_smoothing->alpha_calibrated ? nlohmann::json("calibrated")
                                    : npu_smoothing->alpha ? nlohmann::json(*npu_smoothing->alpha)
                                                           : nlohmann::json(nullptr)},
                          {"beta", npu_smoothing->beta},
                          {"fold", npu_smoothing->fold}};
  if (output_quant != OutputQuant::None) j["output_quant"] = output_quant_name(output_quant);
  if (act_percentile) j["act_percentile"] = *act_percentile;
  if (rounding == Rounding::Gptq)
    j["rounding"] = {{"method", rounding_name(rounding)},
                     {"damp", gptq.damp},
                     {"block", gptq.block},
                     {"order", gptq.order_name()}};
  return j;
}

LinearScheme LinearScheme::from_json(const nlohmann::json& j) {
  if (!j.is_object())
    throw InvalidArgument("[LinearScheme] expected an object, got " + json_text(j));
  LinearScheme s;
  for (const auto& [key, v] : j.items()) {
    if (key == "weights") {
      if (!v.is_object())
        throw InvalidArgument("[LinearScheme] 'weights' must be an object, got " + json_text(v));
      for (const auto& [wk, wv] : v.items()) {
        if (wk == "format") {
          s.weights = parse_enum(wv, "weights.format", kWeightFormats, weight_format_name);
        } else if (wk == "granularity") {
          if (!wv.is_string())
            throw InvalidArgument("[LinearScheme] 'granularity' must be a string, got " +
                                  json_text(wv));
          s.weight_granularity = granularity_from_name(wv.get<std::string>());
        } else if (wk == "bits") {
          if (!wv.is_number_integer() || wv.get<int64_t>() < 2 || wv.get<int64_t>() > 8)
            throw InvalidArgument("[LinearScheme] 'weights.bits' must be an integer in 2..8, got " +
                                  json_text(wv));
          s.weight_bits = static_cast<int>(wv.get<int64_t>());
        } else if (wk == "group_size") {
          if (!wv.is_number_integer())
            throw InvalidArgument("[LinearScheme] 'group_size' must be an integer, got " +
                                  json_text(wv));
          s.group_size = wv.get<int64_t>();
        } else {
          throw InvalidArgument("[LinearScheme] unknown weights field '" + wk +
                                "' (known: format, granularity, bits, group_size)");
        }
      }
    } else if (key == "activations") {
      s.activations = parse_enum(v, "activations", kActFormats, act_format_name);
    } else if (key == "smoothing_alpha") {
      if (!v.is_null()) s.smooth_alpha = number_field(v, "smoothing_alpha");
    } else if (key == "outlier_threshold") {
      if (!v.is_null()) s.outlier_threshold = number_field(v, "outlier_threshold");
    } else if (key == "shadow_outliers") {
      if (v.is_null()) continue;
      if (!v.is_object())
        throw InvalidArgument("[LinearScheme] 'shadow_outliers' must be an object or null, got " +
                              json_text(v));
      ShadowOptions o;
      for (const auto& [sk, sv] : v.items()) {
        if (sk == "pruning_rate") o.pruning_rate = number_field(sv, "shadow_outliers.pruning_rate");
        else if (sk == "hot_share") o.hot_share = number_field(sv, "shadow_outliers.hot_share");
        else
          throw InvalidArgument("[LinearScheme] unknown shadow_outliers field '" + sk +
                                "' (known: pruning_rate, hot_share)");
      }
      s.shadow = o;
    } else if (key == "channel_bits") {
      if (v.is_null()) continue;
      if (!v.is_object())
        throw InvalidArgument("[LinearScheme] 'channel_bits' must be an object or null, got " +
                              json_text(v));
      ChannelBits c;
      for (const auto& [ck, cv] : v.items()) {
        if (ck == "bits") c.bits = number_field(cv, "channel_bits.bits");
        else if (ck == "allocation" && cv.is_string())
          c.allocation = bit_allocation_from_name(cv.get<std::string>());
        else if (ck == "metric" && cv.is_string())
          c.metric = error_metric_from_name(cv.get<std::string>());
        else if (ck == "stored" && cv.is_boolean()) c.stored = cv.get<bool>();
        else
          throw InvalidArgument("[LinearScheme] bad channel_bits field '" + ck +
                                "': " + json_text(cv) +
                                " (known: bits number, allocation, metric names, stored bool)");
      }
      s.channel_bits = c;
    } else if (key == "npu_smoothing") {
      if (v.is_null()) continue;
      if (!v.is_object())
        throw InvalidArgument("[LinearScheme] 'npu_smoothing' must be an object or null, got " +
                              json_text(v));
      NpuSmoothing n;
      for (const auto& [nk, nv] : v.items()) {
        if (nk == "alpha" && nv.is_string() && nv.get<std::string>() == "calibrated")
          n.alpha_calibrated = true;
        else if (nk == "alpha" && !nv.is_null()) n.alpha = number_field(nv, "npu_smoothing.alpha");
        else if (nk == "alpha") continue;
        else if (nk == "beta") n.beta = number_field(nv, "npu_smoothing.beta");
        else if (nk == "fold" && nv.is_boolean()) n.fold = nv.get<bool>();
        else
          throw InvalidArgument("[LinearScheme] bad npu_smoothing field '" + nk +
                                "': " + json_text(nv) + " (known: alpha, beta numbers, fold bool)");
      }
      s.npu_smoothing = n;
    } else if (key == "output_quant") {
      s.output_quant = parse_enum(v, "output_quant", kOutputQuants, output_quant_name);
    } else if (key == "act_percentile") {
      if (!v.is_null()) s.act_percentile = number_field(v, "act_percentile");
    } else if (key == "rounding") {
      if (v.is_null()) continue;
      if (!v.is_object())
        throw InvalidArgument("[LinearScheme] 'rounding' must be an object or null, got " +
                              json_text(v));
      for (const auto& [rk, rv] : v.items()) {
        if (rk == "method" && rv.is_string())
          s.rounding = rounding_from_name(rv.get<std::string>());
        else if (rk == "damp") s.gptq.damp = number_field(rv, "rounding.damp");
        else if (rk == "block" && rv.is_number_integer()) s.gptq.block = rv.get<int64_t>();
        else if (rk == "order" && rv.is_string())
          s.gptq.act_order = GptqOptions::act_order_from_name(rv.get<std::string>());
        else
          throw InvalidArgument("[LinearScheme] bad rounding field '" + rk + "': " + json_text(rv) +
                                " (known: method nearest|gptq, damp number, block integer, "
                                "order natural|act)");
      }
    } else {
      throw InvalidArgument("[LinearScheme] unknown field '" + key +
                            "' (known: weights, activations, smoothing_alpha, outlier_threshold, "
                            "shadow_outliers, channel_bits, npu_smoothing, output_quant, "
                            "rounding, act_percentile)");
    }
  }
  s.validate();
  return s;
}

float round_to_f16(float x) { return static_cast<float>(static_cast<_Float16>(x)); }

namespace {

// Checks a per-channel calibration span: its length and finite, non-negative values.
void check_channel_stats(std::span<const float> v, int64_t n, const char* what, const char* side) {
  if (static_cast<int64_t>(v.size()) != n)
    throw ShapeError("[PreparedLinear] " + std::string(what) + " has " + std::to_string(v.size()) +
                     " channels, this linear's " + side + " has " + std::to_string(n));
  for (size_t j = 0; j < v.size(); ++j)
    if (!std::isfinite(v[j]) || v[j] < 0.0f)
      throw InvalidArgument("[PreparedLinear] " + std::string(what) + " of channel " +
                            std::to_string(j) + " is " + std::to_string(v[j]));
}

// The row ranges of the tensors fused into a linear of `out` rows.
std::vector<std::pair<int64_t, int64_t>> tensor_ranges(std::span<const int64_t> rows, int64_t out) {
  std::vector<std::pair<int64_t, int64_t>> r;
  int64_t at = 0;
  for (int64_t n : rows) {
    r.emplace_back(at, at + n);
    at += n;
  }
  if (rows.empty()) r.emplace_back(0, out);
  else if (at != out)
    throw ShapeError("[PreparedLinear] fused tensors have " + std::to_string(at) +
                     " rows, the linear " + std::to_string(out));
  return r;
}

// Stored bytes of rows at their bit-widths: codes, bit-width metadata, an fp32 scale per row.
// Bytes of one stored weight scale: per-group scales in fp16 (llama.cpp's Q4_0/Q8_0 blocks, the
// W4A16 formats seed 002 deploys: 4.5 bits per weight at groups of 32), per-row and per-tensor
// ones in fp32. The numerics keep the scales in fp32 (a relative difference below 2^-11).
int64_t scale_bytes(Granularity g) { return g == Granularity::PerGroup ? 2 : 4; }

int64_t channel_bits_bytes(const std::vector<uint8_t>& bits, int64_t in, int meta_bits) {
  const int64_t rows = static_cast<int64_t>(bits.size());
  int64_t total = 0;
  for (uint8_t b : bits) total += int64_t{b} * in;
  return (total + rows * meta_bits + 7) / 8 + rows * static_cast<int64_t>(sizeof(float));
}

}  // namespace

PreparedLinear::PreparedLinear(const float* W, int64_t out, int64_t in, const float* bias,
                               const LinearScheme& scheme, const LinearContext& ctx)
    : out_(out), in_(in), scheme_(scheme) {
  scheme_.validate();
  if (out <= 0 || in <= 0)
    throw ShapeError("[PreparedLinear] empty weight shape [" + std::to_string(out) + ", " +
                     std::to_string(in) + "]");
  const std::span<const float> act_absmax = ctx.act_absmax;
  const bool per_group = scheme_.weight_granularity == Granularity::PerGroup ||
                         scheme_.activations == ActFormat::Int8DynamicPerGroup;
  if (per_group && in % scheme_.group_size != 0)
    throw InvalidArgument("[PreparedLinear] group_size " + std::to_string(scheme_.group_size) +
                          " does not divide the input width " + std::to_string(in));
  if (scheme_.needs_calibration())
    check_channel_stats(act_absmax, in, "calibration absmax", "input");
  if (scheme_.needs_output_absmax())
    check_channel_stats(ctx.out_absmax, out, "calibration output absmax", "output");
  if (!ctx.row_post.empty()) check_channel_stats(ctx.row_post, out, "row multiplier", "output");
  const auto tensors = tensor_ranges(ctx.tensor_rows, out);

  // Smoothed weights W·diag(s) (SmoothQuant Eq. 4, or npu smoothing's S_I^α); the input is
  // divided by s at run time unless the caller folded it into the preceding op.
  std::vector<float> ws(W, W + out * in);
  std::vector<float> eff_absmax(act_absmax.begin(), act_absmax.end());
  std::vector<float> s_in;
  if (scheme_.smooth_alpha) {
    const double a = *scheme_.smooth_alpha;
    s_in.resize(static_cast<size_t>(in));
    for (int64_t j = 0; j < in; ++j) {
      float wmax = 0.0f;
      for (int64_t i = 0; i < out; ++i) wmax = std::max(wmax, std::abs(W[i * in + j]));
      const double sj = std::pow(std::max(act_absmax[j], kSmoothClamp), a) /
                        std::pow(std::max(wmax, kSmoothClamp), 1.0 - a);
      s_in[j] = std::max(static_cast<float>(sj), kSmoothClamp);
    }
  } else if (scheme_.npu_smoothing && scheme_.npu_smoothing->has_input_part()) {
    if (!ctx.input_smooth.empty()) {
      check_channel_stats(ctx.input_smooth, in, "input smoothing", "input");
      s_in.assign(ctx.input_smooth.begin(), ctx.input_smooth.end());
    } else if (scheme_.npu_smoothing->alpha) {
      s_in = npu_input_smoothing(act_absmax, *scheme_.npu_smoothing->alpha);
    } else {
      throw InvalidArgument(
          "[PreparedLinear] a calibrated smoothing alpha needs this input's factors "
          "(calibration step 'smoothing')");
    }
    for (float v : s_in)
      if (!(v > 0.0f))
        throw InvalidArgument("[PreparedLinear] input smoothing factor " + std::to_string(v) +
                              " is not positive");
  }
  if (!s_in.empty()) {
    for (int64_t j = 0; j < in; ++j) eff_absmax[j] = act_absmax[j] / s_in[j];
    for (int64_t i = 0; i < out; ++i)
      for (int64_t j = 0; j < in; ++j) ws[i * in + j] *= s_in[j];
    if (!ctx.input_folded) smooth_ = s_in;
  } else if (ctx.input_folded) {
    throw InvalidArgument("[PreparedLinear] input_folded without an input smoothing");
  }
  // The bias joins the output after dequantization and before the folded next smoothing.
  if (bias) {
    bias_.assign(bias, bias + out);
    if (!ctx.row_post.empty())
      for (int64_t i = 0; i < out; ++i) bias_[i] *= ctx.row_post[i];
  }
  if (scheme_.shadow) {
    if (!ctx.shadow)
      throw InvalidArgument(
          "[PreparedLinear] shadow outlier execution needs this input's "
          "profiled threshold (calibration step 'outliers')");
    const ShadowLinearConfig* shadow = ctx.shadow;
    if (!(shadow->threshold > 0.0f) || !std::isfinite(shadow->threshold))
      throw InvalidArgument("[PreparedLinear] shadow threshold must be finite and > 0, got " +
                            std::to_string(shadow->threshold));
    shadow_ = *shadow;
    // Static scale from the threshold (seed 001 Eq. 1): values beyond it go to the CPU part.
    act_scale_ = shadow_.threshold / 127.0f;
    hot_row_.assign(static_cast<size_t>(in), -1);
    w_hot_.reserve(shadow_.hot_channels.size() * static_cast<size_t>(out));
    for (int64_t j : shadow_.hot_channels) {
      if (j < 0 || j >= in || hot_row_[static_cast<size_t>(j)] >= 0)
        throw InvalidArgument("[PreparedLinear] hot channel " + std::to_string(j) +
                              " is outside [0, " + std::to_string(in) + ") or repeated");
      hot_row_[static_cast<size_t>(j)] = static_cast<int64_t>(w_hot_.size()) / out;
      for (int64_t i = 0; i < out; ++i) w_hot_.push_back(ws[i * in + j]);
    }
  } else if (scheme_.activations == ActFormat::Int8StaticPerTensor) {
    if (scheme_.act_percentile && !(ctx.act_clip > 0.0f))
      throw InvalidArgument(
          "[PreparedLinear] act_percentile needs this input's calibrated |x| at "
          "that percentile (step act-scales' histogram)");
    const float amax = scheme_.act_percentile
                           ? ctx.act_clip
                           : *std::max_element(eff_absmax.begin(), eff_absmax.end());
    if (!(amax > 0.0f))
      throw InvalidArgument(
          "[PreparedLinear] calibration absmax of this input is 0: no static scale");
    act_scale_ = amax / 127.0f;
  }
  // The float weights outlier columns / cold channels are read from: the caller's W itself
  // (the model file's copy, which outlives the prepared linear), or the smoothed copy.
  if (scheme_.shadow || scheme_.outlier_threshold) {
    if (scheme_.smooth_alpha) w_float_ = ws;
    w_float_src_ = scheme_.smooth_alpha ? w_float_.data() : W;
  }

  // NPU-aware output smoothing (seed 004 §4.1): W' rows divided by S_O^β; the NPU's output is
  // the smoothed one, multiplied back by S_O^β at dequantization.
  std::vector<float> o_smooth;
  if (scheme_.npu_smoothing && scheme_.npu_smoothing->beta != 0.0) {
    o_smooth.resize(static_cast<size_t>(out));
    for (int64_t i = 0; i < out; ++i) {
      o_smooth[i] = static_cast<float>(
          std::pow(std::max(ctx.out_absmax[i], kSmoothClamp), scheme_.npu_smoothing->beta));
      for (int64_t j = 0; j < in; ++j) ws[i * in + j] /= o_smooth[i];
    }
  }
  if (!o_smooth.empty() || !ctx.row_post.empty()) {
    post_.assign(static_cast<size_t>(out), 1.0f);
    for (int64_t i = 0; i < out; ++i) {
      if (!o_smooth.empty()) post_[i] *= o_smooth[i];
      if (!ctx.row_post.empty()) post_[i] *= ctx.row_post[i];
    }
  }
  if (scheme_.output_quant != OutputQuant::None) {
    // One static scale per fused tensor: the calibrated range of its (smoothed) output.
    out_scale_.resize(static_cast<size_t>(out));
    const float qmax = static_cast<float>(output_qmax(scheme_.output_quant));
    for (const auto& [r0, r1] : tensors) {
      float m = 0.0f;
      for (int64_t i = r0; i < r1; ++i)
        m = std::max(m, ctx.out_absmax[i] / (o_smooth.empty() ? 1.0f : o_smooth[i]));
      if (!(m > 0.0f))
        throw InvalidArgument("[PreparedLinear] calibration output absmax of rows [" +
                              std::to_string(r0) + ", " + std::to_string(r1) +
                              ") is 0: no static output scale");
      for (int64_t i = r0; i < r1; ++i) out_scale_[i] = m / qmax;
    }
  }

  // GPTQ's Hessian of the input the weights see: x / s_in after an input smoothing, so
  // H' = diag(1/s) H diag(1/s) (output smoothing scales rows, which GPTQ treats apart).
  std::vector<float> gptq_h;
  if (scheme_.rounding == Rounding::Gptq) {
    if (static_cast<int64_t>(ctx.hessian.size()) != in * in)
      throw InvalidArgument("[PreparedLinear] rounding gptq needs this input's Hessian [" +
                            std::to_string(in) + ", " + std::to_string(in) + "], got " +
                            std::to_string(ctx.hessian.size()) +
                            " values (calibration step 'gptq')");
    gptq_h.assign(ctx.hessian.begin(), ctx.hessian.end());
    if (!s_in.empty())
      for (int64_t a = 0; a < in; ++a)
        for (int64_t b = 0; b < in; ++b) gptq_h[a * in + b] /= s_in[a] * s_in[b];
  }
  if (scheme_.weights == WeightFormat::F32) {
    w_hat_ = std::move(ws);
    stored_weight_bytes_ = out * in * static_cast<int64_t>(sizeof(float));
  } else if (scheme_.channel_bits) {
    // Per-row bit-widths (seed 004 Algorithm 1 or a baseline), allocated per fused tensor on
    // the weights as the NPU stores them (RE is invariant to a row's scale, so S_O^β does not
    // change it; S_I^α does).
    const ChannelBits& cb = *scheme_.channel_bits;
    if (cb.stored) {
      if (static_cast<int64_t>(ctx.row_bits.size()) != out)
        throw InvalidArgument("[PreparedLinear] stored bit-widths requested, " +
                              std::to_string(ctx.row_bits.size()) + " given for " +
                              std::to_string(out) + " rows (calibration step 'bitwidths')");
      row_bits_.assign(ctx.row_bits.begin(), ctx.row_bits.end());
    } else {
      row_bits_.resize(static_cast<size_t>(out));
      for (const auto& [r0, r1] : tensors) {
        const auto table = channel_error_table(ws.data() + r0 * in, r1 - r0, in, cb.metric);
        const auto b = allocate_bits(cb.allocation, table, r1 - r0, cb.bits);
        std::copy(b.begin(), b.end(), row_bits_.begin() + r0);
      }
    }
    std::vector<int8_t> q(static_cast<size_t>(out * in));
    w_scales_.resize(static_cast<size_t>(out));
    if (gptq_h.empty()) {
      for (int64_t i = 0; i < out; ++i)
        w_scales_[i] = quantize_row_bits(ws.data() + i * in, in, row_bits_[i], q.data() + i * in);
    } else {
      QuantizedWeights g = gptq_quantize(ws.data(), out, in, gptq_h, {8, Granularity::PerChannel},
                                         scheme_.gptq, row_bits_);
      q = std::move(g.q);
      w_scales_ = std::move(g.scales);
    }
    stored_weight_bytes_ =
        channel_bits_bytes(row_bits_, in, bit_allocation_metadata_bits(cb.allocation));
    if (integer_activations(scheme_.activations)) {
      packed_ = std::make_unique<kernels::PackedWeightsS8>(q.data(), in, out, in);
    } else {
      w_hat_.resize(static_cast<size_t>(out * in));
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) w_hat_[i * in + j] = q[i * in + j] * w_scales_[i];
    }
  } else {
    const QuantSpec spec{scheme_.weights == WeightFormat::Int8 ? scheme_.weight_bits : 4,
                         scheme_.weight_granularity, scheme_.group_size};
    const QuantizedWeights q = gptq_h.empty()
                                   ? quantize_weights(ws.data(), out, in, spec)
                                   : gptq_quantize(ws.data(), out, in, gptq_h, spec, scheme_.gptq);
    stored_weight_bytes_ = (out * in * spec.bits + 7) / 8 +
                           static_cast<int64_t>(q.scales.size()) * scale_bytes(spec.granularity);
    if (integer_activations(scheme_.activations) &&
        scheme_.weight_granularity != Granularity::PerGroup) {
      w_scales_.resize(static_cast<size_t>(out));
      for (int64_t i = 0; i < out; ++i)
        w_scales_[i] = q.scales.size() == 1 ? q.scales[0] : q.scales[static_cast<size_t>(i)];
      row_bits_.assign(static_cast<size_t>(out), static_cast<uint8_t>(spec.bits));
      packed_ = std::make_unique<kernels::PackedWeightsS8>(q.q.data(), in, out, in);
    } else if (scheme_.activations == ActFormat::Int8DynamicPerGroup &&
               scheme_.weight_granularity == Granularity::PerGroup) {
      // llama.cpp's Q8_0 / Q4_0 x Q8_0: integer dots per group, float sum over groups
      grouped_ = std::make_unique<kernels::PackedGroupedWeightsS8>(q.q.data(), in, q.scales.data(),
                                                                   out, in, scheme_.group_size);
    } else {
      w_hat_.resize(static_cast<size_t>(out * in));
      dequantize_weights(q, w_hat_.data());
    }
  }
  if (!bias_.empty()) stored_weight_bytes_ += out * static_cast<int64_t>(sizeof(float));
  if (!post_.empty() && !packed_ && !grouped_ && scheme_.weights != WeightFormat::F32)
    throw InvalidArgument("[PreparedLinear] a row multiplier needs the integer or fp32 path");
}

PreparedLinear::PreparedLinear(const LinearScheme& scheme, const PackedLinearWeights& w)
    : out_(w.out), in_(w.in), scheme_(scheme) {
  scheme_.validate();
  if (scheme_.activations != ActFormat::Int8StaticPerTensor ||
      scheme_.weights != WeightFormat::Int8 || scheme_.shadow || scheme_.outlier_threshold)
    throw InvalidArgument("[PreparedLinear] prequantized weights run static int8 schemes only");
  const auto n = static_cast<size_t>(w.out);
  auto sized = [&](const std::vector<float>& v, size_t want, const char* what, bool optional) {
    if ((optional && v.empty()) || v.size() == want) return;
    throw ShapeError("[PreparedLinear] prequantized " + std::string(what) + " has " +
                     std::to_string(v.size()) + " values, expected " + std::to_string(want));
  };
  if (w.out <= 0 || w.in <= 0 || w.codes.size() != n * static_cast<size_t>(w.in) ||
      w.row_bits.size() != n)
    throw ShapeError("[PreparedLinear] prequantized codes/bits do not match [" +
                     std::to_string(w.out) + ", " + std::to_string(w.in) + "]");
  sized(w.scales, n, "scales", false);
  sized(w.post, n, "post", true);
  sized(w.out_scale, n, "output scales", true);
  sized(w.bias, n, "bias", true);
  sized(w.input_smooth, static_cast<size_t>(w.in), "input divisor", true);
  if (w.out_scale.empty() != (scheme_.output_quant == OutputQuant::None))
    throw InvalidArgument(
        "[PreparedLinear] prequantized output scales disagree with output_quant '" +
        output_quant_name(scheme_.output_quant) + "'");
  if (!(w.act_scale > 0.0f) || !std::isfinite(w.act_scale))
    throw InvalidArgument("[PreparedLinear] prequantized activation scale " +
                          std::to_string(w.act_scale) + " is not finite and > 0");
  act_scale_ = w.act_scale;
  w_scales_ = w.scales;
  post_ = w.post;
  out_scale_ = w.out_scale;
  bias_ = w.bias;
  smooth_ = w.input_smooth;
  row_bits_ = w.row_bits;
  packed_ = std::make_unique<kernels::PackedWeightsS8>(w.codes.data(), w.in, w.out, w.in);
  stored_weight_bytes_ = channel_bits_bytes(
      row_bits_, w.in,
      scheme_.channel_bits ? bit_allocation_metadata_bits(scheme_.channel_bits->allocation) : 0);
  if (!bias_.empty()) stored_weight_bytes_ += w.out * static_cast<int64_t>(sizeof(float));
}

double PreparedLinear::stored_bits_per_weight() const {
  return 8.0 * static_cast<double>(stored_weight_bytes_) / static_cast<double>(out_ * in_);
}

int64_t PreparedLinear::weight_bytes() const { return stored_weight_bytes_; }

void PreparedLinear::forward_integer(const float* xs, int64_t N, float* y, int64_t ldy,
                                     bool accumulate, int64_t col_begin, int64_t col_end) const {
  // Every element of A and C is written before it is read: no zero fill (a serial pass over
  // tens of MB at prefill sizes).
  std::unique_ptr<int8_t[]> A_static;
  const int8_t* A = nullptr;
  std::vector<float> row_scale(static_cast<size_t>(N), act_scale_);
  QuantizedWeights qa;
  if (scheme_.activations == ActFormat::Int8StaticPerTensor) {
    A_static = std::make_unique_for_overwrite<int8_t[]>(static_cast<size_t>(N * in_));
    quantize_static(xs, N * in_, act_scale_, 8, A_static.get());
    A = A_static.get();
  } else {  // dynamic per row: LLM.int8's vector-wise activation scales
    qa = quantize_weights(xs, N, in_, {8, Granularity::PerChannel, 0});
    A = qa.q.data();
    row_scale = std::move(qa.scales);
  }
  // The int32 accumulators are exact on every path, so a block of columns (a partition's part)
  // equals the same columns of the whole product.
  const int64_t cols = col_end - col_begin;
  const auto C = std::make_unique_for_overwrite<int32_t[]>(static_cast<size_t>(N * cols));
  if (col_begin == 0 && col_end == out_)
    kernels::gemm_s8s8s32_packed(A, in_, *packed_, C.get(), cols, N, kernels::best_isa());
  else
    kernels::gemm_s8s8s32(A, in_, packed_->rows().data() + col_begin * in_, in_, C.get(), cols, N,
                          cols, in_, kernels::best_isa());
  // Float epilogue: dequantize the int32 accumulators (the NPU's requantize step).
  const float oq_max = scheme_.output_quant == OutputQuant::None
                           ? 0.0f
                           : static_cast<float>(output_qmax(scheme_.output_quant));
#pragma omp parallel for schedule(static) if (N * cols >= (int64_t{1} << 15))
  for (int64_t m = 0; m < N; ++m) {
    float* yr = y + m * ldy;
    const int32_t* cr = C.get() + m * cols;  // columns [col_begin, col_end)
    const float sx = row_scale[static_cast<size_t>(m)];
    for (int64_t n = col_begin; n < col_end; ++n) {
      float v = static_cast<float>(cr[n - col_begin]) * (sx * w_scales_[static_cast<size_t>(n)]);
      if (!out_scale_.empty()) {  // the NPU's static per-tensor output quantization
        const float so = out_scale_[static_cast<size_t>(n)];
        v = std::clamp(std::nearbyint(v / so), -oq_max, oq_max) * so;
      }
      if (!post_.empty()) v *= post_[static_cast<size_t>(n)];  // S_O^β, folded next smoothing
      if (!bias_.empty()) v += bias_[static_cast<size_t>(n)];
      yr[n] = accumulate ? yr[n] + v : v;
    }
  }
}

void PreparedLinear::forward_grouped(const float* xs, int64_t N, float* y, int64_t ldy,
                                     bool accumulate, int64_t col_begin, int64_t col_end) const {
  const QuantizedWeights qa =
      quantize_weights(xs, N, in_, {8, Granularity::PerGroup, scheme_.group_size});
  const int64_t groups = in_ / scheme_.group_size;
  const bool direct = !accumulate && post_.empty() && bias_.empty();
  std::vector<float> t(direct ? 0 : static_cast<size_t>(N * out_));
  float* c = direct ? y : t.data();
  const int64_t ldc = direct ? ldy : out_;
  kernels::gemm_grouped_s8s8f32(qa.q.data(), in_, qa.scales.data(), groups, *grouped_, c, ldc, N,
                                col_begin, col_end, kernels::best_isa());
  if (direct) return;
  for (int64_t m = 0; m < N; ++m)
    for (int64_t n = col_begin; n < col_end; ++n) {
      float v = t[static_cast<size_t>(m * out_ + n)];
      if (!post_.empty()) v *= post_[static_cast<size_t>(n)];
      if (!bias_.empty()) v += bias_[static_cast<size_t>(n)];
      y[m * ldy + n] = accumulate ? y[m * ldy + n] + v : v;
    }
}

void PreparedLinear::forward(const float* x, int64_t N, float* y, int64_t ldy, bool accumulate,
                             std::span<const RowSegment> segments, ShadowStats* call_stats) const {
  if (N <= 0) return;
  if (scheme_.is_fp32()) {
    kernels::linear(x, N, in_, in_, w_hat_.data(), out_, bias_.empty() ? nullptr : bias_.data(), y,
                    ldy, accumulate);
    return;
  }
  if (!packed_ && !grouped_ &&
      !post_.empty()) {  // fp32 with npu smoothing: x / s, W', then y' * post + b
    std::vector<float> xs(x, x + N * in_), t(static_cast<size_t>(N * out_));
    if (!smooth_.empty())
      for (int64_t m = 0; m < N; ++m)
        for (int64_t j = 0; j < in_; ++j) xs[m * in_ + j] /= smooth_[j];
    kernels::linear(xs.data(), N, in_, in_, w_hat_.data(), out_, nullptr, t.data(), out_);
    for (int64_t m = 0; m < N; ++m)
      for (int64_t n = 0; n < out_; ++n) {
        float v = t[m * out_ + n] * post_[n];
        if (!bias_.empty()) v += bias_[n];
        y[m * ldy + n] = accumulate ? y[m * ldy + n] + v : v;
      }
    return;
  }
  // The integer paths read x as it is; a copy is made only for what changes it below
  // (smoothing, outlier columns taken out, float fake-quantization).
  if (smooth_.empty() && !scheme_.shadow && !scheme_.outlier_threshold) {
    if (packed_) return forward_integer(x, N, y, ldy, accumulate, 0, out_);
    if (grouped_) return forward_grouped(x, N, y, ldy, accumulate, 0, out_);
  }
  std::vector<float> xs(x, x + N * in_);
  if (!smooth_.empty())
    for (int64_t m = 0; m < N; ++m)
      for (int64_t j = 0; j < in_; ++j) xs[m * in_ + j] /= smooth_[j];

  // LLM.int8 decomposition: per segment, the columns holding any |x| > threshold leave the
  // quantized product and run in float (their float weights), added after the main product.
  struct OutlierPart {
    RowSegment rows;
    std::vector<int64_t> cols;
    std::vector<float> x;  // [rows, cols]
  };
  std::vector<OutlierPart> parts;
  std::vector<OutlierResidual> shadow_parts;
  if (scheme_.shadow) {
    shadow_parts = shadow_outlier_split(xs.data(), N, in_, shadow_.threshold, segments);
    if (shadow_.pruned) {  // the CPU part is pruned: the outliers stay clipped
      ShadowStats st;
      st.segments = static_cast<int64_t>(shadow_parts.size());
      for (const auto& p : shadow_parts)
        for (float v : p.values) st.pruned_values += v != 0.0f;
      shadow_counters_.add(st);
      if (call_stats) *call_stats += st;
      shadow_parts.clear();
    }
  }
  if (scheme_.outlier_threshold) {
    const float thr = static_cast<float>(*scheme_.outlier_threshold);
    const RowSegment whole{0, N};
    for (const RowSegment& seg :
         segments.empty() ? std::span<const RowSegment>(&whole, 1) : segments) {
      if (seg.begin < 0 || seg.end > N || seg.begin > seg.end)
        throw ShapeError("[PreparedLinear] row segment [" + std::to_string(seg.begin) + ", " +
                         std::to_string(seg.end) + ") outside [0, " + std::to_string(N) + ")");
      OutlierPart p{seg, {}, {}};
      // columns' largest |x| in one row-major pass (a column-wise scan strides through memory)
      std::vector<float> col_max(static_cast<size_t>(in_), 0.0f);
      for (int64_t m = seg.begin; m < seg.end; ++m) {
        const float* row = xs.data() + m * in_;
        for (int64_t j = 0; j < in_; ++j) col_max[j] = std::max(col_max[j], std::abs(row[j]));
      }
      for (int64_t j = 0; j < in_; ++j)
        if (col_max[j] > thr) p.cols.push_back(j);
      if (p.cols.empty()) continue;
      const int64_t nc = static_cast<int64_t>(p.cols.size());
      p.x.resize(static_cast<size_t>((seg.end - seg.begin) * nc));
      for (int64_t m = seg.begin; m < seg.end; ++m)
        for (int64_t c = 0; c < nc; ++c) {
          float& v = xs[m * in_ + p.cols[c]];
          p.x[(m - seg.begin) * nc + c] = v;
          v = 0.0f;
        }
      parts.push_back(std::move(p));
    }
  }

  if (packed_) {
    forward_integer(xs.data(), N, y, ldy, accumulate, 0, out_);
  } else if (grouped_) {
    forward_grouped(xs.data(), N, y, ldy, accumulate, 0, out_);
  } else {
    quantize_activations_float(xs, N);
    kernels::linear(xs.data(), N, in_, in_, w_hat_.data(), out_,
                    bias_.empty() ? nullptr : bias_.data(), y, ldy, accumulate);
  }

  if (scheme_.shadow && !shadow_.pruned) add_shadow_residuals(shadow_parts, y, ldy, call_stats);
  for (const OutlierPart& p : parts) {
    const int64_t nc = static_cast<int64_t>(p.cols.size());
    std::vector<float> wo(static_cast<size_t>(out_ * nc));
    for (int64_t i = 0; i < out_; ++i)
      for (int64_t c = 0; c < nc; ++c) wo[i * nc + c] = w_float_src_[i * in_ + p.cols[c]];
    kernels::linear(p.x.data(), p.rows.end - p.rows.begin, nc, nc, wo.data(), out_, nullptr,
                    y + p.rows.begin * ldy, ldy, /*accumulate=*/true);
  }
}

void PreparedLinear::quantize_activations_float(std::vector<float>& xs, int64_t N) const {
  switch (scheme_.activations) {
    case ActFormat::F32: break;
    case ActFormat::F16: {
      if (!kernels::round_to_fp16(xs.data(), static_cast<int64_t>(xs.size())))
        throw Unsupported(
            "[PreparedLinear] a linear's fp16 input overflows (|x| > 65504): the model's "
            "activations exceed binary16 (use fp32 activations)");
      break;
    }
    case ActFormat::Int8StaticPerTensor: {
      std::vector<int8_t> q(xs.size());
      quantize_static(xs.data(), N * in_, act_scale_, 8, q.data());
      for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(q[i]) * act_scale_;
      break;
    }
    case ActFormat::Int8DynamicPerRow:
    case ActFormat::Int8DynamicPerGroup: {
      const QuantSpec spec{8,
                           scheme_.activations == ActFormat::Int8DynamicPerRow
                               ? Granularity::PerChannel
                               : Granularity::PerGroup,
                           scheme_.group_size};
      fake_quantize(xs.data(), N, in_, spec);
      break;
    }
  }
}

bool PreparedLinear::float_path() const {
  return !(packed_ || grouped_ || scheme_.outlier_threshold || scheme_.shadow || !post_.empty() ||
           !smooth_.empty());
}

void PreparedLinear::forward_block(const float* x, float* y, int64_t ldy, int64_t row_begin,
                                   int64_t row_end, int64_t col_begin, int64_t col_end) const {
  if (scheme_.outlier_threshold || scheme_.shadow)
    throw Unsupported(
        "[PreparedLinear] a partitioned linear computes each output block from its rows alone; "
        "LLM.int8's outlier columns and llm.npu's shadow outliers are gathered over a whole "
        "sequence, so their linears run whole (scheme " +
        json_text(scheme_.to_json()) + ")");
  if (row_begin < 0 || row_end <= row_begin || col_begin < 0 || col_end > out_ ||
      col_end <= col_begin)
    throw ShapeError("[PreparedLinear] block rows [" + std::to_string(row_begin) + ", " +
                     std::to_string(row_end) + "), columns [" + std::to_string(col_begin) + ", " +
                     std::to_string(col_end) + ") of a linear with " + std::to_string(out_) +
                     " outputs");
  // Every path below computes an output element from its row of x and its weight row alone
  // (static or per-row scales, per-column epilogues), as forward() does.
  const int64_t n = row_end - row_begin;
  float* yb = y + row_begin * ldy;
  std::vector<float> xs(x + row_begin * in_, x + row_end * in_);
  if (!smooth_.empty())
    for (int64_t m = 0; m < n; ++m)
      for (int64_t j = 0; j < in_; ++j) xs[m * in_ + j] /= smooth_[j];
  if (packed_) return forward_integer(xs.data(), n, yb, ldy, false, col_begin, col_end);
  if (grouped_) return forward_grouped(xs.data(), n, yb, ldy, false, col_begin, col_end);
  if (!scheme_.is_fp32()) quantize_activations_float(xs, n);
  const bool post = !post_.empty();
  kernels::linear(xs.data(), n, in_, in_, w_hat_.data() + col_begin * in_, col_end - col_begin,
                  post || bias_.empty() ? nullptr : bias_.data() + col_begin, yb + col_begin, ldy);
  if (post)  // fp32 with npu smoothing: y' * post + b
    for (int64_t m = 0; m < n; ++m)
      for (int64_t c = col_begin; c < col_end; ++c) {
        float& v = yb[m * ldy + c];
        v *= post_[static_cast<size_t>(c)];
        if (!bias_.empty()) v += bias_[static_cast<size_t>(c)];
      }
}

const char* PreparedLinear::compute_format() const {
  if (packed_ || grouped_) return "int8";
  switch (scheme_.activations) {
    case ActFormat::F32: return "fp32";
    case ActFormat::F16: return "fp16";
    default: return "int8";  // integer activations fake-quantized on float weights
  }
}

int64_t stored_weight_bytes(const LinearScheme& s, int64_t out, int64_t in,
                            std::span<const int64_t> tensor_rows, bool bias) {
  int64_t bytes = 0;
  if (s.weights == WeightFormat::F32) {
    bytes = out * in * static_cast<int64_t>(sizeof(float));
  } else if (s.channel_bits) {
    // Per tensor floor(rows x bits) bits of codes (what the allocation spends), the bit-width
    // metadata of every row and one fp32 scale per row.
    std::vector<int64_t> rows(tensor_rows.begin(), tensor_rows.end());
    if (rows.empty()) rows = {out};
    int64_t code_bits = 0;
    for (int64_t r : rows) code_bits += total_channel_bits(r, s.channel_bits->bits) * in;
    const int meta = bit_allocation_metadata_bits(s.channel_bits->allocation);
    bytes = (code_bits + out * meta + 7) / 8 + out * static_cast<int64_t>(sizeof(float));
  } else {
    const int64_t bits = s.weights == WeightFormat::Int8 ? s.weight_bits : 4;
    const int64_t scales = s.weight_granularity == Granularity::PerTensor ? 1
                           : s.weight_granularity == Granularity::PerChannel
                               ? out
                               : out * in / s.group_size;
    bytes = (out * in * bits + 7) / 8 + scales * scale_bytes(s.weight_granularity);
  }
  return bytes + (bias ? out * static_cast<int64_t>(sizeof(float)) : 0);
}

void PreparedLinear::add_shadow_residuals(const std::vector<OutlierResidual>& parts, float* y,
                                          int64_t ldy, ShadowStats* call_stats) const {
  ShadowStats st;
  st.segments = static_cast<int64_t>(parts.size());
  for (const OutlierResidual& p : parts) {
    const int64_t nc = static_cast<int64_t>(p.cols.size());
    if (nc == 0) continue;
    ++st.syncs;
    st.outlier_channels += nc;
    for (float v : p.values) st.outlier_values += v != 0.0f;
    std::vector<float> wo(static_cast<size_t>(out_ * nc));
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t j = p.cols[c];
      const int64_t hot = hot_row_[static_cast<size_t>(j)];
      if (hot >= 0) {
        ++st.hot_hits;
        const float* col = w_hot_.data() + hot * out_;
        for (int64_t i = 0; i < out_; ++i) wo[i * nc + c] = col[i];
      } else {  // cold: one weight column read from the model file on demand
        ++st.cold_fetches;
        st.cold_fetch_bytes += out_ * static_cast<int64_t>(sizeof(float));
        for (int64_t i = 0; i < out_; ++i) wo[i * nc + c] = w_float_src_[i * in_ + j];
      }
    }
    kernels::linear(p.values.data(), p.rows, nc, nc, wo.data(), out_, nullptr,
                    y + p.row_begin * ldy, ldy, /*accumulate=*/true);
  }
  shadow_counters_.add(st);
  if (call_stats) *call_stats += st;
}

}  // namespace socllm::quant
