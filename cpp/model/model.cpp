#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>

#include "socllm/model.h"
#include "socllm/model_store.h"

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
TensorF32 stack_rows(std::initializer_list<const TensorF32*> parts) {
  int64_t rows = 0, cols = (*parts.begin())->shape.back();
  for (auto* p : parts) rows += p->shape.size() == 2 ? p->shape[0] : 1;
  TensorF32 out(parts.begin()[0]->shape.size() == 2 ? std::vector<int64_t>{rows, cols}
                                                    : std::vector<int64_t>{rows * cols});
  size_t off = 0;
  for (auto* p : parts) {
    std::memcpy(out.ptr() + off, p->ptr(), p->data.size() * sizeof(float));
    off += p->data.size();
  }
  return out;
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
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "layers/" + std::to_string(i) + "/";
    LayerWeights& L = m->layers_[static_cast<size_t>(i)];
    L.attn_norm = read(p + "attn_norm", {d});
    TensorF32 wq = read(p + "wq", {c.q_dim(), d});
    TensorF32 wk = read(p + "wk", {c.kv_dim(), d});
    TensorF32 wv = read(p + "wv", {c.kv_dim(), d});
    L.wqkv = stack_rows({&wq, &wk, &wv});
    if (c.qkv_bias) {
      TensorF32 bq = read(p + "bq", {c.q_dim()});
      TensorF32 bk = read(p + "bk", {c.kv_dim()});
      TensorF32 bv = read(p + "bv", {c.kv_dim()});
      L.bqkv = stack_rows({&bq, &bk, &bv});
    }
    L.wo = read(p + "wo", {d, c.q_dim()});
    L.ffn_norm = read(p + "ffn_norm", {d});
    TensorF32 wg = read(p + "w_gate", {c.d_ff, d});
    TensorF32 wu = read(p + "w_up", {c.d_ff, d});
    L.w_gate_up = stack_rows({&wg, &wu});
    L.w_down = read(p + "w_down", {d, c.d_ff});
  }
  spdlog::info("loaded {} ({} layers, d_model {}, {:.1f} MB fp32) from {}", c.name, c.n_layers, d,
               m->weight_bytes() / 1e6, path);
  return m;
}

int64_t Model::weight_bytes() const {
  int64_t n = embed_.numel() + lm_head_.numel() + final_norm_.numel();
  for (const auto& L : layers_)
    n += L.attn_norm.numel() + L.wqkv.numel() + L.bqkv.numel() + L.wo.numel() + L.ffn_norm.numel() +
         L.w_gate_up.numel() + L.w_down.numel();
  return n * static_cast<int64_t>(sizeof(float));
}

}  // namespace socllm
