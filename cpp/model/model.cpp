#include <spdlog/spdlog.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <span>

#include "io/model_store.h"
#include "kernels/weightlet.h"
#include "model/decoder_block.h"
#include "model/model.h"

namespace socllm {
namespace {

TensorF32 read_checked(const H5File& f, const std::string& name, std::vector<int64_t> shape,
                       bool checksummed) {
  // Required, not only verified when present: a file whose filter was stripped is caught too.
  const std::string ds = "/weights/" + name;
  if (!f.has(ds)) throw FormatError("[Model.load] '" + f.path() + "' has no weight '" + name + "'");
  if (checksummed && !f.has_checksum(ds))
    throw FormatError("[Model.load] weight '" + name + "' in '" + f.path() +
                      "' has no Fletcher-32 checksum (format version 2 requires one)");
  TensorF32 t = f.read_f32(ds, shape);
  for (size_t i = 0; i < t.data.size(); ++i)
    if (!std::isfinite(t.data[i]))
      throw FormatError("[Model.load] weight '" + name + "' in '" + f.path() +
                        "' contains NaN/Inf at flat index " + std::to_string(i));
  return t;
}

// Stacks matrices with equal column counts along rows.
TensorF32 stack_rows(std::span<const TensorF32* const> parts) {
  int64_t rows = 0, cols = parts.front()->shape.back();
  for (auto* p : parts) rows += p->shape.size() == 2 ? p->shape[0] : 1;
  TensorF32 out(parts.front()->shape.size() == 2 ? std::vector<int64_t>{rows, cols}
                                                 : std::vector<int64_t>{rows * cols});
  size_t off = 0;
  for (auto* p : parts) {
    std::memcpy(out.ptr() + off, p->ptr(), p->data.size() * sizeof(float));
    off += p->data.size();
  }
  return out;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<float> floats_or_empty(const H5File& f, const std::string& ds, int64_t n) {
  if (!f.has(ds)) return {};
  TensorF32 t = f.read_f32(ds, {n});
  for (float v : t.data)
    if (!std::isfinite(v))
      throw FormatError("[Model.load] '" + ds + "' holds " + std::to_string(v));
  return std::move(t.data);
}

uint32_t crc_of(uint32_t crc, const void* p, size_t n) {
  if (n == 0) return crc;  // zlib's crc32 with a null buffer returns its initial value, not crc
  return static_cast<uint32_t>(crc32(crc, static_cast<const Bytef*>(p), static_cast<uInt>(n)));
}

// Reads the prequantized linears (docs/MODEL_FORMAT.md, "packed_linears"): per tensor its
// stored rows (weightlets or raw int8), checked against the tensor's CRC-32, unpacked to int8.
std::shared_ptr<const PackedModelLinears> read_packed_linears(const H5File& f,
                                                              const ModelConfig& c) {
  auto pk = std::make_shared<PackedModelLinears>();
  const std::string root = "/packed_linears";
  try {
    pk->scheme = nlohmann::json::parse(f.attr_str(root, "scheme"));
    pk->plan = nlohmann::json::parse(f.attr_str(root, "plan"));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("[Model.load] '" + f.path() + "': packed_linears scheme/plan is not JSON (" +
                      e.what() + ")");
  }
  pk->group = f.attr_int(root, "group");
  const std::string storage = f.attr_str(root, "storage");
  if (storage != "weightlet" && storage != "int8")
    throw FormatError("[Model.load] '" + f.path() + "': unknown packed storage '" + storage + "'");
  const auto isa = kernels::best_unpack_isa();
  pk->sites.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string lp = root + "/layers/" + std::to_string(l) + "/";
    if (f.has(lp + "attn_norm_folded")) {
      auto& g = pk->norm_gains.emplace_back();
      if (static_cast<int64_t>(pk->norm_gains.size()) != l + 1)
        throw FormatError("[Model.load] '" + f.path() + "': folded norms missing before layer " +
                          std::to_string(l));
      g[0] = floats_or_empty(f, lp + "attn_norm_folded", c.d_model);
      g[1] = floats_or_empty(f, lp + "ffn_norm_folded", c.d_model);
      if (g[1].empty())
        throw FormatError("[Model.load] '" + f.path() + "': layer " + std::to_string(l) +
                          " has a folded attention norm but no folded ffn norm");
    }
    for (int s = 0; s < kNumLinearSites; ++s) {
      PackedLinearWeights& w = pk->sites[static_cast<size_t>(l)][static_cast<size_t>(s)];
      // [out, in] of the fused linear and its tensors (the block table's)
      const auto site = static_cast<LinearSite>(s);
      const char* site_name = linear_site_name(site);
      w.out = linear_out_width(c, site);
      w.in = linear_site_width(c, site);
      w.codes.resize(static_cast<size_t>(w.out * w.in));
      w.act_scale = static_cast<float>(
          f.attr_float(lp.substr(0, lp.size() - 1), std::string("act_scale_") + site_name));
      w.input_smooth = floats_or_empty(f, lp + "input_smooth_" + site_name, w.in);
      int64_t row0 = 0;
      for (const FusedTensor& tensor : fused_tensors(c, site)) {
        const std::string name = std::string("layers/") + std::to_string(l) + "/" + tensor.name;
        const std::string tp = root + "/" + name + "/";
        const auto t0 = Clock::now();
        const int64_t rows = f.attr_int(tp.substr(0, tp.size() - 1), "rows");
        const int64_t cols = f.attr_int(tp.substr(0, tp.size() - 1), "cols");
        if (cols != w.in || rows <= 0 || row0 + rows > w.out)
          throw FormatError("[Model.load] packed tensor '" + name + "' in '" + f.path() + "' is [" +
                            std::to_string(rows) + ", " + std::to_string(cols) +
                            "], which does not fit its linear [" + std::to_string(w.out) + ", " +
                            std::to_string(w.in) + "]");
        std::vector<uint8_t> data, meta;
        int64_t n_bytes = 0;
        if (storage == "weightlet") {
          meta = f.read_bytes(tp + "bits", kernels::weightlet_metadata_bytes(rows));
          // The size the metadata implies, checked before the data is read.
          const int64_t implied = kernels::weightlet_data_bytes(meta, rows, cols);
          const auto got = f.shape(tp + "data");
          if (got.size() != 1 || got[0] != implied)
            throw FormatError("[Model.load] packed tensor '" + name + "' in '" + f.path() +
                              "': its bit-width metadata implies " + std::to_string(implied) +
                              " bytes, the data holds " + std::to_string(got.empty() ? 0 : got[0]));
          data = f.read_bytes(tp + "data", implied);
        } else {
          data = f.read_bytes(tp + "codes", rows * cols);
        }
        n_bytes = static_cast<int64_t>(data.size() + meta.size());
        std::array<std::vector<float>, 4> extra = {
            floats_or_empty(f, tp + "scales", rows), floats_or_empty(f, tp + "post", rows),
            floats_or_empty(f, tp + "out_scale", rows), floats_or_empty(f, tp + "bias", rows)};
        if (extra[0].empty())
          throw FormatError("[Model.load] packed tensor '" + name + "' in '" + f.path() +
                            "' has no scales");
        // CRC-32 over data, bit-width metadata, scales, post, output scales, bias (as stored).
        uint32_t crc = crc_of(0, data.data(), data.size());
        crc = crc_of(crc, meta.data(), meta.size());
        for (const auto& v : extra) {
          crc = crc_of(crc, v.data(), v.size() * sizeof(float));
          n_bytes += static_cast<int64_t>(v.size() * sizeof(float));
        }
        const int64_t stored_crc = f.attr_int(tp.substr(0, tp.size() - 1), "crc32");
        if (static_cast<int64_t>(crc) != stored_crc)
          throw FormatError("[Model.load] packed tensor '" + name + "' in '" + f.path() +
                            "' fails its checksum (CRC-32 " + std::to_string(crc) + ", stored " +
                            std::to_string(stored_crc) + "): the file is corrupt");
        pk->bytes_read += n_bytes;
        pk->read_seconds += seconds_since(t0);
        const auto t1 = Clock::now();
        int8_t* dst = w.codes.data() + row0 * cols;
        if (storage == "weightlet") {
          try {
            const kernels::WeightletTensor t(rows, cols, pk->group, std::move(meta),
                                             std::move(data));
            t.unpack(dst, isa);
            const auto b = t.bit_widths();
            w.row_bits.insert(w.row_bits.end(), b.begin(), b.end());
          } catch (const Error& e) {
            throw FormatError("[Model.load] packed tensor '" + name + "' in '" + f.path() +
                              "': " + e.what());
          }
        } else {
          std::memcpy(dst, data.data(), data.size());
          w.row_bits.insert(w.row_bits.end(), static_cast<size_t>(rows), uint8_t{8});
        }
        pk->unpack_seconds += seconds_since(t1);
        auto append = [&](std::vector<float>& to, const std::vector<float>& v, const char* what) {
          if (row0 > 0 && v.empty() != to.empty())
            throw FormatError("[Model.load] packed tensor '" + name + "' in '" + f.path() +
                              "': " + what + " present in some tensors of its linear only");
          to.insert(to.end(), v.begin(), v.end());
        };
        append(w.scales, extra[0], "scales");
        append(w.post, extra[1], "post");
        append(w.out_scale, extra[2], "out_scale");
        append(w.bias, extra[3], "bias");
        row0 += rows;
      }
      if (row0 != w.out)
        throw FormatError("[Model.load] '" + f.path() + "': the packed tensors of layer " +
                          std::to_string(l) + " site " + site_name + " hold " +
                          std::to_string(row0) + " rows, the linear has " + std::to_string(w.out));
    }
  }
  if (!pk->norm_gains.empty() && static_cast<int64_t>(pk->norm_gains.size()) != c.n_layers)
    throw FormatError("[Model.load] '" + f.path() + "': folded norms for " +
                      std::to_string(pk->norm_gains.size()) + " of " + std::to_string(c.n_layers) +
                      " layers");
  return pk;
}

}  // namespace

std::shared_ptr<const Model> Model::load(const std::string& path) {
  H5File f(path);
  if (!f.has_attr("/", "format") || f.attr_str("/", "format") != "socllm-model")
    throw FormatError("[Model.load] '" + path +
                      "' is not a socllm model file (run socllm convert)");
  const int64_t version = f.attr_int("/", "format_version");
  if (version < kOldestFormatVersion || version > kFormatVersion)
    throw Unsupported("[Model.load] model format version " + std::to_string(version) + " in '" +
                      path + "' (this socllm reads " + std::to_string(kOldestFormatVersion) +
                      " to " + std::to_string(kFormatVersion) + ")");
  const bool checksummed = version >= kChecksumFormatVersion;
  if (!checksummed)
    spdlog::warn(
        "'{}' is model format version {}: its weights carry no checksums (convert it "
        "again to have them verified)",
        path, version);
  else if (version < kAttributeChecksumFormatVersion)
    spdlog::warn(
        "'{}' is model format version {}: its attributes (config, scales) carry no checksums "
        "(convert it again to have them verified)",
        path, version);
  // Before any attribute is used: a flipped bit in rope_theta or a scale loads without
  // complaint otherwise. Objects that carry a checksum are checked in any version.
  f.verify_attributes(version >= kAttributeChecksumFormatVersion);
  auto m = std::make_shared<Model>();
  m->path_ = path;
  ModelConfig& c = m->config_;
  const std::string g = "/config";
  c.arch = f.attr_str(g, "arch");
  c.name = f.has_attr(g, "name") ? f.attr_str(g, "name") : "";
  c.vocab_size = f.attr_int(g, "vocab_size");
  c.d_model = f.attr_int(g, "d_model");
  c.n_layers = f.attr_int(g, "n_layers");
  c.n_heads = f.attr_int(g, "n_heads");
  c.n_kv_heads = f.attr_int(g, "n_kv_heads");
  c.head_dim = f.attr_int(g, "head_dim");
  c.d_ff = f.attr_int(g, "d_ff");
  c.context_length = f.attr_int(g, "context_length");
  c.rope_theta = f.attr_float(g, "rope_theta");
  c.rms_eps = f.attr_float(g, "rms_eps");
  c.tie_embeddings = f.attr_int(g, "tie_embeddings") != 0;
  c.qkv_bias = f.attr_int(g, "qkv_bias") != 0;
  c.bos_id = f.has_attr(g, "bos_id") ? f.attr_int(g, "bos_id") : -1;
  c.eos_id = f.has_attr(g, "eos_id") ? f.attr_int(g, "eos_id") : -1;
  // Gemma 3's fields (absent from llama/qwen2 files)
  if (f.has_attr(g, "activation")) c.activation = f.attr_str(g, "activation");
  if (f.has_attr(g, "sliding_window")) c.sliding_window = f.attr_int(g, "sliding_window");
  if (f.has_attr(g, "sliding_window_pattern"))
    c.sliding_window_pattern = f.attr_int(g, "sliding_window_pattern");
  if (f.has_attr(g, "rope_theta_local")) c.rope_theta_local = f.attr_float(g, "rope_theta_local");
  for (auto [key, flag] : {std::pair{"qk_norm", &c.qk_norm}, std::pair{"post_norms", &c.post_norms},
                           std::pair{"embed_scale", &c.embed_scale}})
    if (f.has_attr(g, key)) *flag = f.attr_int(g, key) != 0;
  c.check_runnable();
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError("[Model.load] bad config in '" + path + "': " + e.what());
  }

  // n_layers sizes the layer table: it must match the file's layer groups before anything is
  // reserved for them.
  const int64_t stored_layers = f.has("/weights/layers") ? f.count_members("/weights/layers") : 0;
  if (stored_layers != c.n_layers)
    throw FormatError("[Model.load] '" + path + "' says n_layers = " + std::to_string(c.n_layers) +
                      " but stores " + std::to_string(stored_layers) + " layers");
  const int64_t d = c.d_model, V = c.vocab_size;
  auto read = [&](const std::string& name, std::vector<int64_t> shape) {
    return read_checked(f, name, std::move(shape), checksummed);
  };
  m->embed_ = read("embed_tokens", {V, d});
  if (!c.tie_embeddings) m->lm_head_ = read("lm_head", {V, d});
  m->final_norm_ = read("final_norm", {d});
  m->layers_.resize(static_cast<size_t>(c.n_layers));
  const bool packed = f.has("/packed_linears");
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "layers/" + std::to_string(i) + "/";
    LayerWeights& L = m->layers_[static_cast<size_t>(i)];
    L.attn_norm = read(p + "attn_norm", {d});
    if (c.qk_norm) {
      L.q_norm = read(p + "q_norm", {c.head_dim});
      L.k_norm = read(p + "k_norm", {c.head_dim});
    }
    if (c.post_norms) {
      L.post_attn_norm = read(p + "post_attn_norm", {d});
      L.post_ffn_norm = read(p + "post_ffn_norm", {d});
    }
    if (packed) {  // the linears are prequantized (below): no fp32 copies
      L.ffn_norm = read(p + "ffn_norm", {d});
      continue;
    }
    // each linear site's tensors stacked in the block table's row order
    auto fused = [&](LinearSite site) {
      std::vector<TensorF32> parts;
      for (const FusedTensor& tensor : fused_tensors(c, site))
        parts.push_back(read(p + tensor.name, {tensor.rows, linear_site_width(c, site)}));
      std::vector<const TensorF32*> ptrs;
      for (const auto& x : parts) ptrs.push_back(&x);
      return stack_rows(ptrs);
    };
    L.wqkv = fused(LinearSite::AttnIn);
    if (c.qkv_bias) {
      TensorF32 bq = read(p + "bq", {c.q_dim()});
      TensorF32 bk = read(p + "bk", {c.kv_dim()});
      TensorF32 bv = read(p + "bv", {c.kv_dim()});
      const TensorF32* b[] = {&bq, &bk, &bv};
      L.bqkv = stack_rows(b);
    }
    L.wo = fused(LinearSite::AttnOut);
    L.ffn_norm = read(p + "ffn_norm", {d});
    L.w_gate_up = fused(LinearSite::MlpIn);
    L.w_down = fused(LinearSite::MlpAct);
  }
  if (packed) {
    m->packed_ = read_packed_linears(f, c);
    spdlog::info(
        "loaded {} ({} layers, linears prequantized for plan {}: {:.1f} MB read in {:.3f} s, "
        "unpacked in {:.3f} s) from {}",
        c.name, c.n_layers, m->packed_->plan.value("name", "?"), m->packed_->bytes_read / 1e6,
        m->packed_->read_seconds, m->packed_->unpack_seconds, path);
    return m;
  }
  spdlog::info("loaded {} ({} layers, d_model {}, {:.1f} MB fp32) from {}", c.name, c.n_layers, d,
               m->weight_bytes() / 1e6, path);
  return m;
}

int64_t Model::weight_bytes() const {
  int64_t n = embed_.numel() + lm_head_.numel() + final_norm_.numel();
  for (const auto& L : layers_)
    n += L.attn_norm.numel() + L.wqkv.numel() + L.bqkv.numel() + L.wo.numel() + L.ffn_norm.numel() +
         L.w_gate_up.numel() + L.w_down.numel() + L.q_norm.numel() + L.k_norm.numel() +
         L.post_attn_norm.numel() + L.post_ffn_norm.numel();
  return n * static_cast<int64_t>(sizeof(float));
}

std::shared_ptr<const Model> Model::with_weights(TensorF32 embed, TensorF32 lm_head,
                                                 TensorF32 final_norm,
                                                 std::vector<LayerWeights> layers,
                                                 Transform transform) const {
  const std::string who = "[Model] rotate " + transform.rotation + ": ";
  if (packed_)
    throw InvalidArgument(who + "'" + path_ + "' holds prequantized linears, no fp32 weights");
  if (transform_.rotation != "none")
    throw InvalidArgument(who + "'" + path_ + "' is transformed already (" + transform_.rotation +
                          "); rotate the model as loaded");
  const auto same = [&](const TensorF32& a, const TensorF32& b, const std::string& name) {
    if (a.shape != b.shape)
      throw ShapeError(who + name + " is " + shape_str(a.shape) + ", the model's " +
                       shape_str(b.shape));
  };
  same(embed, embed_, "embed_tokens");
  same(final_norm, final_norm_, "final_norm");
  if (!lm_head.data.empty()) same(lm_head, embed_, "lm_head");
  if (layers.size() != layers_.size())
    throw ShapeError(who + std::to_string(layers.size()) + " layers, the model has " +
                     std::to_string(layers_.size()));
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights &a = layers[l], &b = layers_[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    same(a.attn_norm, b.attn_norm, p + "attn_norm");
    same(a.wqkv, b.wqkv, p + "wqkv");
    same(a.bqkv, b.bqkv, p + "bqkv");
    same(a.wo, b.wo, p + "wo");
    same(a.ffn_norm, b.ffn_norm, p + "ffn_norm");
    same(a.w_gate_up, b.w_gate_up, p + "w_gate_up");
    same(a.w_down, b.w_down, p + "w_down");
    same(a.q_norm, b.q_norm, p + "q_norm");
    same(a.k_norm, b.k_norm, p + "k_norm");
    same(a.post_attn_norm, b.post_attn_norm, p + "post_attn_norm");
    same(a.post_ffn_norm, b.post_ffn_norm, p + "post_ffn_norm");
  }
  auto m = std::make_shared<Model>();  // not a copy: the weights are all replaced
  m->config_ = config_;
  m->path_ = path_ + " (rotate " + transform.rotation + ")";
  m->transform_ = std::move(transform);
  m->embed_ = std::move(embed);
  m->final_norm_ = std::move(final_norm);
  m->layers_ = std::move(layers);
  if (!lm_head.data.empty()) {
    m->lm_head_ = std::move(lm_head);
    m->own_head_ = true;
  } else {
    m->lm_head_ = lm_head_;
    m->own_head_ = own_head_;
  }
  return m;
}

}  // namespace socllm
