// Calibration layer: activation statistics of a model's linear inputs, gathered offline on a
// calibration corpus (calibration/, `socllm calibrate --steps act-scales,...`) and read by the
// plans that fix static scales or smoothing factors when their graphs are built
// (seed 001 §2.3, §3.3: per-tensor scales from max-min on calibration data).
//
// The calibration artifact is one HDF5 file whose schema is defined here, once (schema()): per
// array a group with one dataset per linear site ("act_absmax/attn_in" ...), its dtype and shape,
// and the calibration step that writes it; root attributes format, format_version, model_name,
// model_config (the model's config JSON: a file loads only for a model of the same architecture,
// shapes and RoPE/norm constants; weights are not fingerprinted), tokens and
// the steps' provenance (corpus, samples, seqlen, seed, steps, step options ...). save() and
// load() go through the io layer's HDF5 reader/writer (model_store.h); h5py reads every file.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "model/decoder_block.h"
#include "model/model.h"
#include "quant/shadow_outlier.h"

namespace socllm {

// One array of the calibration artifact.
struct CalibrationArraySpec {
  const char* name;   // group name; one dataset per site under it
  const char* dtype;  // "float32" | "int64"
  const char* shape;  // per site, e.g. "[n_layers, width]"
  const char* step;   // the calibration step that writes it
  bool required;      // in every file (others only once their step ran)
  const char* description;
  bool per_site = true;  // one dataset per site ("name/attn_in" ...), else one ("name")
};

struct Calibration {
  static constexpr const char* kFormat = "socllm-calibration";
  // 3: schema owned by the C++ core, model_config replaces the Python fingerprint
  // 4: every object's attributes carry a CRC-32 (kAttributesChecksum, model_store.h); version 3
  //    files still load, with a warning
  static constexpr int kFormatVersion = 4;
  static constexpr int kOldestFormatVersion = 3;
  static std::span<const CalibrationArraySpec> schema();

  // One array of the schema for one site (ignored for arrays that are not per site), by name: a
  // view of its storage (float or int64; empty until its step ran) and the shape the schema
  // gives it for this model; a leading -1 means any count (calibration windows).
  // InvalidArgument listing the schema's names for an unknown one.
  struct ArrayRef {
    std::vector<float>* f = nullptr;
    std::vector<int64_t>* i = nullptr;
    std::vector<int64_t> shape;
  };
  ArrayRef array(const std::string& name, LinearSite site);
  static const CalibrationArraySpec& spec(const std::string& name);

  int64_t n_layers = 0;
  std::array<int64_t, kNumLinearSites> width{};
  // Per site: [n_layers, width] row-major running max of |x| per input channel.
  std::array<std::vector<float>, kNumLinearSites> channel_absmax;
  int64_t tokens = 0;  // rows observed
  // The rotation of the model the statistics were observed on (Model::rotation(), quant/
  // rotation.h): they hold for that rotation only, and a plan with another one refuses them.
  std::string rotation = "none";
  // Per site: [n_layers, kAbsHistBins] histogram of |x| (step act-scales), for percentile
  // thresholds. Bin b holds the floats whose bit pattern >> kAbsHistShift is b: 64 bins per
  // octave, so a percentile read off it is exact to within 1.1% (relative).
  static constexpr int kAbsHistShift = 17;
  static constexpr int64_t kAbsHistBins = int64_t{1} << (31 - kAbsHistShift);
  std::array<std::vector<int64_t>, kNumLinearSites> abs_hist;
  // Outlier profiling (step 'outliers', seed 001 §3.3): per site the threshold of each layer's
  // input ([n_layers]; empty until set); while set, observe() also counts per channel the
  // values beyond it ([n_layers, width]) and, per observed sequence, the distinct channels that
  // had one (summed in outlier_seq_channels, sequences counted in outlier_seqs).
  std::array<std::vector<float>, kNumLinearSites> outlier_threshold;
  std::array<std::vector<int64_t>, kNumLinearSites> outlier_count;
  std::array<std::vector<int64_t>, kNumLinearSites> outlier_seq_channels;
  std::array<std::vector<int64_t>, kNumLinearSites> outlier_seqs;

  // EdgeFlow (seed 004 §4.1), empty until their step ran:
  //   act-scales: per site [n_layers, out_width] running max |y| of the site's linear output
  //   (S_O of NPU-aware smoothing; static output scales);
  //   smoothing: per site [n_layers] the input exponent α chosen by grid search, and
  //   [n_layers, kSmoothAlphaGrid] the relative output error at each grid point;
  //   bitwidths: per site [n_layers, out_width] the bit-width of every output channel.
  static constexpr int64_t kSmoothAlphaGrid = 11;  // α = 0, 0.1, ..., 1
  std::array<int64_t, kNumLinearSites> out_width{};
  std::array<std::vector<float>, kNumLinearSites> out_absmax;
  std::array<std::vector<float>, kNumLinearSites> smooth_alpha;
  std::array<std::vector<float>, kNumLinearSites> smooth_alpha_error;
  std::array<std::vector<int64_t>, kNumLinearSites> channel_bits;
  // gptq: per site [n_layers, width, width] the mean XᵀX / rows of the site's inputs (GPTQ's
  // Hessian, quant/gptq.h), rows counted in hessian_rows. While allocated (the step's own
  // statistics), observe() also accumulates XᵀX into it (upper triangle; finish_hessians()
  // mirrors and divides).
  std::array<std::vector<float>, kNumLinearSites> hessian;
  int64_t hessian_rows = 0;
  bool has_hessians() const { return !hessian[0].empty(); }
  std::span<const float> hessian_of(int64_t layer, LinearSite s) const;
  void finish_hessians();
  // act-scales: max |x| of the residual stream entering each layer and after the last one
  // ([n_layers + 1]; residual_scale=auto).
  std::vector<float> residual_absmax;
  void observe_residual(int64_t index, const float* x, int64_t rows, int64_t d);
  bool has_output_absmax() const { return !out_absmax[0].empty(); }
  bool has_smoothing() const { return !smooth_alpha[0].empty(); }
  bool has_channel_bits() const { return !channel_bits[0].empty(); }
  std::span<const float> output_absmax(int64_t layer, LinearSite s) const;
  // Folds rows y[rows, out_width] (ld) of one sequence into out_absmax (allocated on first use).
  void observe_output(int64_t layer, LinearSite s, const float* y, int64_t rows, int64_t ld);

  // Attention statistics (seed 000 §3.2-3.3), empty until their step ran:
  //   head-importance: loss increase (nats/token) when a head's output (Eq. 1, [n_layers,
  //   n_heads]) or a layer's attention output (Eq. 2, [n_layers]) is zeroed;
  //   qk-scales: per calibration window max |x| of each head's post-RoPE Q, K and V
  //   ([windows, n_layers, heads]); the scale of a head is absmax / 127.
  int64_t n_heads = 0, n_kv_heads = 0;
  std::vector<float> head_importance, layer_importance;
  std::vector<float> q_absmax, k_absmax, v_absmax;
  // Step act-scales ran (or its arrays were set): some channel max is nonzero.
  bool has_act_scales() const;
  bool has_head_importance() const { return !head_importance.empty(); }
  bool has_qk_scales() const { return !q_absmax.empty(); }
  // Mean over windows of absmax / 127 per (layer, head) of 'q', 'k' or 'v' ([n_layers, heads]):
  // the bucket centres λ̄ (§3.3).
  std::vector<float> mean_scale(char which) const;
  // The static per-tensor scale of a layer's Q, K or V (max over windows and heads of
  // absmax / 127; npu-int8, the max-min rule of seed 001 §2.3).
  float static_scale(int64_t layer, char which) const;

  static Calibration empty_for(const ModelConfig& c);
  // ShapeError when the statistics were gathered on a model with other shapes.
  void check_matches(const ModelConfig& c) const;
  void check_attention_matches(const ModelConfig& c) const;
  std::span<const float> absmax(int64_t layer, LinearSite s) const;
  // Folds rows x[rows, width] (ld) of one sequence into the statistics of (layer, site).
  void observe(int64_t layer, LinearSite s, const float* x, int64_t rows, int64_t ld);
  // Adds XᵀX of rows x into hessian (allocated on first use; step gptq).
  void observe_hessian(int64_t layer, LinearSite s, const float* x, int64_t rows, int64_t ld);

  // The |x| below which a fraction p in (0, 1] of the observed values of (layer, site) lie:
  // the upper edge of the histogram bin where the count reaches p (p = 1: the exact max).
  float abs_percentile(int64_t layer, LinearSite s, double p) const;
  // Sets the thresholds of every input (per site [n_layers]) and clears the outlier counts.
  void set_outlier_thresholds(LinearSite s, std::span<const float> thresholds);
  bool has_outlier_stats() const;
  // The profiled configuration of every linear input, [layer * kNumLinearSites + site]:
  // threshold, hot channels covering `opts.hot_share` of its outliers, and pruning of the
  // round(opts.pruning_rate * n) inputs of least outlier importance (seed 001 §3.3).
  std::vector<quant::ShadowLinearConfig> shadow_configs(const quant::ShadowOptions& opts) const;
  // Outlier importance of every input, [layer * kNumLinearSites + site] (seed 001 Fig. 12).
  std::vector<double> outlier_importance() const;

  // Writes the artifact atomically (temp file, then rename): every array present, provenance
  // (an object of strings / numbers) as root attributes, and for inspection what the
  // shadow-outlier plan builds at its default options (group shadow_defaults).
  void save(const std::string& path, const ModelConfig& model,
            const nlohmann::json& provenance) const;
  // Reads an artifact for `model`: MissingFile, FormatError (not an artifact, missing or
  // malformed arrays), InvalidArgument naming the value for a file of another schema version or
  // from another model (the first config key that differs). provenance, if given, receives the
  // root attributes.
  static Calibration load(const std::string& path, const ModelConfig& model,
                          nlohmann::json* provenance = nullptr);
};

}  // namespace socllm
