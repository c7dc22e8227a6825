#include "soc/soc.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

namespace socllm::soc {

namespace {
constexpr std::array<const char*, kNumProcessors> kProcNames = {"npu", "cpu", "gpu", "io",
                                                                "cpu-aux"};
constexpr std::array<const char*, 3> kDTypeNames = {"int8", "fp16", "fp32"};
constexpr std::array<const char*, 12> kOpNames = {
    "matmul",      "attention", "elementwise",      "outlier_matmul", "fixed",      "memory_copy",
    "attn_matmul", "topk",      "sparse_attention", "npu_launch",     "flash_read", "unpack"};

template <size_t N>
std::string name_list(const std::array<const char*, N>& names) {
  std::string known;
  for (size_t i = 0; i < N; ++i) known += (i ? ", " : "") + std::string(names[i]);
  return known;
}

template <size_t N, typename E>
std::optional<E> find_name(const std::array<const char*, N>& names, const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

template <size_t N, typename E>
E from_name(const std::array<const char*, N>& names, const std::string& s, const char* what) {
  if (const auto e = find_name<N, E>(names, s)) return *e;
  throw InvalidArgument(std::string("[soc] unknown ") + what + " '" + s + "' (" + name_list(names) +
                        ")");
}

int64_t round_up(int64_t x, int64_t tile) { return tile > 1 ? (x + tile - 1) / tile * tile : x; }
}  // namespace

const char* processor_name(Processor p) { return kProcNames.at(static_cast<size_t>(p)); }
Processor processor_from_name(const std::string& s) {
  return from_name<kNumProcessors, Processor>(kProcNames, s, "processor");
}
std::string processor_names() { return name_list(kProcNames); }
std::string dtype_names() { return name_list(kDTypeNames); }
std::optional<Processor> find_processor(const std::string& s) {
  return find_name<kNumProcessors, Processor>(kProcNames, s);
}
std::optional<DType> find_dtype(const std::string& s) {
  return find_name<3, DType>(kDTypeNames, s);
}

int64_t dtype_bytes(DType d) { return d == DType::Int8 ? 1 : d == DType::Fp16 ? 2 : 4; }

const char* dtype_name(DType d) { return kDTypeNames.at(static_cast<size_t>(d)); }
DType dtype_from_name(const std::string& s) { return from_name<3, DType>(kDTypeNames, s, "dtype"); }
const char* op_kind_name(OpKind k) { return kOpNames.at(static_cast<size_t>(k)); }
OpKind op_kind_from_name(const std::string& s) {
  return from_name<12, OpKind>(kOpNames, s, "op kind");
}

double OpDesc::flops() const {
  const double m_ = static_cast<double>(m), k_ = static_cast<double>(k),
               n_ = static_cast<double>(n);
  switch (kind) {
    case OpKind::MatMul:
    case OpKind::OutlierMatMul: return 2.0 * m_ * k_ * n_;
    case OpKind::Attention:  // QK^T and PV over `elements` keys for n heads of k dims
      return 4.0 * m_ * static_cast<double>(elements) * k_ * n_;
    case OpKind::AttnMatMul: return 2.0 * static_cast<double>(elements) * k_ * n_;
    case OpKind::SparseAttention: return 4.0 * static_cast<double>(elements) * k_ * n_;
    case OpKind::Elementwise: return static_cast<double>(elements);
    default: return 0.0;
  }
}

nlohmann::json OpDesc::to_json() const {
  nlohmann::json j = {{"op", op_kind_name(kind)}, {"dtype", dtype_name(dtype)}};
  if (!name.empty()) j["name"] = name;
  if (!op_class.empty()) j["op_class"] = op_class;
  if (m) j["m"] = m;
  if (k) j["k"] = k;
  if (n) j["n"] = n;
  if (elements) j["elements"] = elements;
  if (bytes) j["bytes"] = bytes;
  if (groups != 1) j["groups"] = groups;
  if (fixed_us != 0) j["fixed_us"] = fixed_us;
  if (weight_bytes) j["weight_bytes"] = weight_bytes;
  if (activation_bytes) j["activation_bytes"] = activation_bytes;
  if (!core.empty()) j["core"] = core;
  return j;
}

OpDesc OpDesc::from_json(const nlohmann::json& j) {
  OpDesc o;
  o.kind = op_kind_from_name(j.at("op").get<std::string>());
  o.dtype = dtype_from_name(j.value("dtype", std::string("fp32")));
  o.m = j.value("m", int64_t{0});
  o.k = j.value("k", int64_t{0});
  o.n = j.value("n", int64_t{0});
  o.elements = j.value("elements", int64_t{0});
  o.bytes = j.value("bytes", int64_t{0});
  o.groups = j.value("groups", int64_t{1});
  o.fixed_us = j.value("fixed_us", 0.0);
  o.name = j.value("name", std::string());
  o.op_class = j.value("op_class", std::string());
  o.weight_bytes = j.value("weight_bytes", int64_t{0});
  o.activation_bytes = j.value("activation_bytes", int64_t{0});
  o.core = j.value("core", std::string());
  for (int64_t v : {o.m, o.k, o.n, o.elements, o.bytes, o.weight_bytes, o.activation_bytes})
    if (v < 0) throw InvalidArgument("[OpDesc] negative size in " + json_text(j));
  if (o.groups < 1 || o.fixed_us < 0 || !std::isfinite(o.fixed_us))
    throw InvalidArgument("[OpDesc] bad groups / fixed_us in " + json_text(j));
  return o;
}

// ---------------------------------------------------------------------------------------------

std::vector<std::string> DeviceProfile::characterizations() const {
  std::vector<std::string> out;
  if (j_.contains("characterizations") && j_["characterizations"].is_object())
    for (const auto& [k, _] : j_["characterizations"].items()) out.push_back(k);
  return out;
}

DeviceProfile DeviceProfile::with_characterization(const std::string& name) const {
  if (name.empty() || name == "default") return *this;
  const auto known = characterizations();
  if (std::find(known.begin(), known.end(), name) == known.end()) {
    std::string list = "default";
    for (const auto& k : known) list += ", " + k;
    throw InvalidArgument("[DeviceProfile] profile " + label() + " has no characterization '" +
                          name + "' (known: " + list + ")");
  }
  const auto& c = j_["characterizations"][name];
  if (!c.is_object() || !c.contains("cost_model") || !c["cost_model"].is_object())
    throw FormatError("[DeviceProfile] profile " + label() + ": characterization '" + name +
                      "' needs a 'cost_model' object (a merge patch of /cost_model)");
  DeviceProfile out = *this;
  out.j_["cost_model"].merge_patch(c["cost_model"]);
  out.characterization_ = name;
  out.fingerprint_ = fingerprint_ ^ (std::hash<std::string>{}(name) + 0x9e3779b97f4a7c15ULL);
  return out;
}

namespace {
struct DeviceRegistry {
  std::mutex mu;
  std::string dir;
  // By canonical path; reloaded when the file's time or size changed (a refit rewrites it).
  struct Loaded {
    std::filesystem::file_time_type mtime;
    std::uintmax_t bytes = 0;
    std::shared_ptr<const DeviceProfile> profile;
  };
  std::map<std::string, Loaded> loaded;
};
DeviceRegistry& registry() {
  static DeviceRegistry r;
  return r;
}
}  // namespace

void set_device_dir(const std::string& dir) {
  std::lock_guard lock(registry().mu);
  registry().dir = dir;
}

std::string device_dir() {
  std::lock_guard lock(registry().mu);
  if (!registry().dir.empty()) return registry().dir;
  const char* env = std::getenv("SOCLLM_DEVICE_DIR");
  return env ? env : "";
}

std::vector<std::string> known_devices() {
  std::vector<std::string> out;
  const std::string dir = device_dir();
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::shared_ptr<const DeviceProfile> load_device(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  fs::path path(name_or_path);
  if (path.extension() != ".json") {
    const std::string dir = device_dir();
    if (dir.empty())
      throw InvalidArgument("[load_device] no device folder is set to find '" + name_or_path +
                            "' in (import socllm, or set SOCLLM_DEVICE_DIR; or give a .json path)");
    path = fs::path(dir) / (name_or_path + ".json");
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      std::string known;
      for (const auto& n : known_devices()) known += (known.empty() ? "" : ", ") + n;
      throw InvalidArgument("[load_device] unknown device '" + name_or_path + "' (known: " + known +
                            ", or a .json path)");
    }
  }
  const std::string key = path.string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw MissingFile("[load_device] device profile file not found: " + key);
  if (!fs::is_regular_file(path, ec))
    throw FormatError("[load_device] device profile " + key + " is not a regular file");
  const std::string canonical = fs::weakly_canonical(path, ec).string();
  const auto mtime = fs::last_write_time(path, ec);
  const auto bytes = fs::file_size(path, ec);
  {
    std::lock_guard lock(registry().mu);
    if (auto it = registry().loaded.find(canonical);
        it != registry().loaded.end() && it->second.mtime == mtime && it->second.bytes == bytes)
      return it->second.profile;
  }
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError("[load_device] device profile " + key + " is not valid JSON: " + e.what());
  }
  auto p = std::make_shared<const DeviceProfile>(DeviceProfile::from_json(j, key));
  std::lock_guard lock(registry().mu);
  registry().loaded[canonical] = {mtime, bytes, p};
  return p;
}

CostModel timing_cost_model(const DeviceProfile& device, const std::string& characterization,
                            bool fast_sync, bool decode, const std::string& co_runner) {
  return CostModel(device.with_characterization(characterization),
                   {.fast = fast_sync, .gpu_queue_kept = decode && fast_sync})
      .with_co_runner(co_runner);
}

DeviceProfile DeviceProfile::from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string())
    throw FormatError("[DeviceProfile] " + origin + ": a profile is a JSON object with a 'name'");
  DeviceProfile p;
  p.name_ = j["name"].get<std::string>();
  p.origin_ = origin;
  p.j_ = j;
  p.fingerprint_ = std::hash<std::string>{}(j.dump());
  return p;
}

std::string DeviceProfile::label() const {
  return "'" + name_ + "'" + (origin_.empty() || origin_ == name_ ? "" : " (" + origin_ + ")");
}

bool DeviceProfile::has(const std::string& pointer) const {
  const nlohmann::json::json_pointer ptr(pointer);
  return j_.contains(ptr) && j_[ptr].is_object() && j_[ptr].contains("value") &&
         j_[ptr]["value"].is_number();
}

double DeviceProfile::number(const std::string& pointer, const std::string& needed_for) const {
  if (!has(pointer))
    throw MissingData("[DeviceProfile] profile " + label() + " has no number at " + pointer +
                      " (needed for " + needed_for + ")");
  const double v = j_[nlohmann::json::json_pointer(pointer)]["value"].get<double>();
  if (!std::isfinite(v) || v < 0)
    throw InvalidArgument("[DeviceProfile] profile " + label() + ": " + pointer + " = " +
                          std::to_string(v) + " (needs a finite non-negative number)");
  return v;
}

double DeviceProfile::rate(const std::string& pointer, const std::string& needed_for) const {
  const double v = number(pointer, needed_for);
  if (!(v > 0))
    throw InvalidArgument("[DeviceProfile] profile " + label() + ": " + pointer + " = " +
                          std::to_string(v) + " (a rate, needed for " + needed_for +
                          ": must be > 0)");
  return v;
}

int64_t DeviceProfile::count(const std::string& pointer, const std::string& needed_for) const {
  const double v = number(pointer, needed_for);
  if (v < 1 || v != std::floor(v) || v > 1e15)
    throw InvalidArgument("[DeviceProfile] profile " + label() + ": " + pointer + " = " +
                          std::to_string(v) + " (needs a whole count >= 1, for " + needed_for +
                          ")");
  return static_cast<int64_t>(v);
}

std::string DeviceProfile::source(const std::string& pointer) const {
  const nlohmann::json::json_pointer ptr(pointer);
  if (!j_.contains(ptr) || !j_[ptr].is_object()) return "";
  return j_[ptr].value("source", std::string());
}

// ---------------------------------------------------------------------------------------------

CostModel::CostModel(DeviceProfile profile, SyncOptions sync)
    : p_(std::move(profile)), sync_(sync) {}

double CostModel::matmul_us(const OpDesc& op, Processor on) const {
  const std::string pn = processor_name(on);
  const std::string d = dtype_name(op.dtype);
  const std::string c = "/cost_model/" + pn + "/" + d + "_";
  const std::string why = d + " matmul on " + pn;
  // Stage performance (seed 002 §3.2): an NPU computes whole tiles, padding the rest.
  int64_t tm = 1, tk = 1, tn = 1;
  if (on == Processor::Npu) {
    tm = p_.count("/cost_model/npu/tile_m", why);
    tk = p_.count("/cost_model/npu/tile_k", why);
    tn = p_.count("/cost_model/npu/tile_n", why);
  }
  const double overhead = p_.number(c + "overhead_us", why);
  const double gops = p_.rate(c + "compute_gops", why);
  const double gbps = p_.rate(c + "weight_gbps", why);
  // Per-group quantization: an NPU graph runs one sub-matmul per group over k / groups, whose
  // partial sums are reduced in float (seed 001 §2.3, Fig. 3b): each sub-matmul is padded to
  // whole tiles, the graph's launch overhead is paid once. CPU and GPU kernels fuse the group
  // scales into one matmul (llama.cpp's Q8 dot products), so only the NPU pays per group.
  const int64_t g = on == Processor::Npu ? std::max<int64_t>(op.groups, 1) : 1;
  const int64_t kg = (op.k + g - 1) / g;
  const double padded = 2.0 * static_cast<double>(round_up(op.m, tm)) *
                        static_cast<double>(round_up(kg, tk)) *
                        static_cast<double>(round_up(op.n, tn));
  // Weights streamed at the compute format (seed 001 Table 3's fit), or as stored when the
  // kernel dequantizes on the fly (a W4A16 kernel reads int4 + scales: <dtype>_weights_as_stored).
  const bool as_stored = p_.has(c + "weights_as_stored") &&
                         p_.number(c + "weights_as_stored", why) > 0 && op.weight_bytes > 0;
  const double weight_bytes = as_stored
                                  ? static_cast<double>(op.weight_bytes) / static_cast<double>(g)
                                  : static_cast<double>(kg) * static_cast<double>(op.n) *
                                        static_cast<double>(dtype_bytes(op.dtype));
  // Order and shape sensitivity of a weight-stall array (seed 002 §3.2, Fig. 5), when the
  // characterization models them: the weights [n, k] stream through an array holding the
  // activations [k, m] (HeteroLLM's order); efficiency grows with the streamed tensor's
  // rows / columns r = n / k as e_min + (1 - e_min) r / (r + r_half) (Fig. 5 is only a plot:
  // the form is our choice, e_min = the GPU level the worst case regresses to, r_half fitted), and
  // drops by order_penalty (6x, Fig. 5) when the stationary operand is the larger one (m > n).
  double efficiency = 1.0;
  if (p_.has(c + "shape_ratio_half")) {
    const double r = static_cast<double>(op.n) / static_cast<double>(std::max<int64_t>(kg, 1));
    const double r_half = p_.number(c + "shape_ratio_half", why);
    const double e_min = p_.number(c + "shape_efficiency_min", why);
    efficiency = e_min + (1.0 - e_min) * r / (r + r_half);
    if (op.m > op.n) efficiency /= p_.number(c + "order_penalty", why);
  }
  // Roofline of one sub-matmul: compute on padded tiles vs streaming its weights (Table 3's
  // small-M rows follow the weight bytes on every processor).
  double us = overhead + static_cast<double>(g) * std::max(padded / (gops * efficiency * 1e3),
                                                           weight_bytes / (gbps * 1e3));
  if (g > 1) {
    OpDesc red;
    red.kind = OpKind::Elementwise;
    red.dtype = DType::Fp16;
    red.elements = op.m * op.n * g;
    us += alone_latency_us(red, on);
  }
  return us;
}

double CostModel::latency_us(const OpDesc& op, Processor on) const {
  const double share =
      busy_share_[static_cast<size_t>(on == Processor::CpuAux ? Processor::Cpu : on)];
  return alone_latency_us(op, on) / (1.0 - share);
}

double CostModel::alone_latency_us(const OpDesc& op, Processor on) const {
  if (on == Processor::CpuAux) on = Processor::Cpu;  // a CPU core: the CPU's rates
  const std::string pn = processor_name(on);
  const std::string c = "/cost_model/" + pn + "/";
  const std::string what =
      std::string(op_kind_name(op.kind)) + " " + dtype_name(op.dtype) + " on " + pn;
  auto rate_us = [&](double flops, const std::string& key, double scale) {
    return flops / (p_.rate(c + key, what) * scale);
  };
  switch (op.kind) {
    case OpKind::Fixed: return op.fixed_us;
    case OpKind::MemoryCopy:
      return static_cast<double>(op.bytes) / (p_.rate("/cost_model/memory/dram_gbps", what) * 1e3);
    case OpKind::Elementwise:
      // NPU: its own (slow, seed 004 Fig. 5b) float element rate; CPU/GPU: DRAM-bound, reading
      // and writing each value once.
      if (on == Processor::Npu) return rate_us(op.flops(), "elementwise_gelems", 1e3);
      return 2.0 * static_cast<double>(op.elements) * static_cast<double>(dtype_bytes(op.dtype)) /
             (p_.rate("/cost_model/memory/dram_gbps", what) * 1e3);
    case OpKind::OutlierMatMul: {
      // Dense [m, channels] x [channels, n] in fp32 on the CPU, with the channels' resident
      // float columns read from DRAM and cold ones from flash (seed 004 flash bandwidth).
      if (op.k == 0) return 0.0;
      double us = rate_us(op.flops(), "fp32_compute_gops", 1e3) +
                  4.0 * static_cast<double>(op.k * op.n) /
                      (p_.rate("/cost_model/memory/dram_gbps", what) * 1e3);
      if (op.bytes > 0)
        us +=
            static_cast<double>(op.bytes) / (p_.rate("/cost_model/memory/flash_gbps", what) * 1e3);
      // What a shadow part costs beyond its arithmetic when a characterization fits it from
      // end-to-end numbers (gathering, dispatch, merging; scripts/llmnpu_e2e_fit.py).
      if (p_.has(c + "outlier_fixed_us")) us += p_.number(c + "outlier_fixed_us", what);
      // Adding the part's [m, n] result into the NPU's output (seed 001 §3.3: the shadow
      // result is merged with the NPU's), when a fit gives its rate (issue 40): a per-element
      // cost, so wider linears pay more (Gemma-2B's 16384-wide FFN against Qwen's 5504).
      if (p_.has(c + "outlier_merge_gelems"))
        us += static_cast<double>(op.m * op.n) / (p_.rate(c + "outlier_merge_gelems", what) * 1e3);
      return us;
    }
    case OpKind::Attention:
      // Compute-bound in prefill; a decoding step streams the KV cache (its activation bytes)
      // at the DRAM rate: a roofline like the matmuls'.
      if (on == Processor::Cpu && !op.core.empty()) return attention_us(op, on);
      return std::max(rate_us(op.flops(), std::string(dtype_name(op.dtype)) + "_compute_gops", 1e3),
                      static_cast<double>(op.activation_bytes) /
                          (p_.rate("/cost_model/memory/dram_gbps", what) * 1e3));
    case OpKind::MatMul: return matmul_us(op, on);
    case OpKind::AttnMatMul:
    case OpKind::TopK:
    case OpKind::SparseAttention:
    case OpKind::NpuLaunch: return attention_us(op, on);
    case OpKind::FlashRead:
      return static_cast<double>(op.bytes) / (p_.rate("/cost_model/memory/flash_gbps", what) * 1e3);
    case OpKind::Unpack:
      if (op.name.empty())
        throw InvalidArgument("[soc] an unpack op names its format (weightlet, kquant)");
      return static_cast<double>(op.elements) /
             (p_.rate("/cost_model/cpu/unpack_" + op.name + "_gweights_s", what) * 1e3);
  }
  return 0.0;
}

// Head-wise attention ops (seed 000). Rates live under the processor's cost model, or for a CPU
// core class (the attention's CPU budget, seed 000 §4: one mid core) under /cost_model/cpu_core.
double CostModel::attention_us(const OpDesc& op, Processor on) const {
  const std::string pn = processor_name(on);
  const std::string base = on == Processor::Cpu && !op.core.empty()
                               ? "/cost_model/cpu_core/" + op.core + "/"
                               : "/cost_model/" + pn + "/";
  const std::string d = dtype_name(op.dtype);
  const std::string what = std::string(op_kind_name(op.kind)) + " " + d + " on " + pn +
                           (op.core.empty() ? "" : " (" + op.core + " core)");
  const double n = static_cast<double>(op.n), k = static_cast<double>(op.k);
  switch (op.kind) {
    case OpKind::NpuLaunch: return p_.number(base + "launch_us", what);
    case OpKind::AttnMatMul:
      return op.flops() / (p_.rate(base + d + "_attn_matmul_gops", what) * 1e3);
    case OpKind::TopK:
      return static_cast<double>(op.elements) * n / (p_.rate(base + "topk_gscores", what) * 1e3);
    case OpKind::SparseAttention:
      // The kernel's name picks its rate: C/G-Sparse's vanilla fp32 "sparse_attention" (seed 000
      // Fig. 4a) or shadowAttn's own "fused_sparse_attention" (seed 000 §4).
      if (op.name.empty())
        throw InvalidArgument(
            "[soc] a sparse attention op names its kernel (sparse_attention, "
            "fused_sparse_attention)");
      return op.flops() / (p_.rate(base + d + "_" + op.name + "_gops", what) * 1e3);
    case OpKind::Attention: {
      // Dense causal attention of m rows ending at key `elements`: a CPU kernel skips masked
      // pairs, so it computes m·kv - m(m-1)/2 of them (QK and PV: 4 ops per pair and dim).
      const double m = static_cast<double>(op.m), kv = static_cast<double>(op.elements);
      const double pairs = op.m <= op.elements ? m * kv - m * (m - 1) / 2 : m * kv;
      return 4.0 * pairs * k * n / (p_.rate(base + d + "_attention_gops", what) * 1e3);
    }
    default: return 0.0;
  }
}

double CostModel::latency_us(const std::vector<OpDesc>& ops, Processor on) const {
  double us = 0;
  for (const auto& o : ops) us += latency_us(o, on);
  return us;
}

double CostModel::active_power_w(Processor p) const {
  return p_.number("/cost_model/power/" + std::string(processor_name(p)) + "_w",
                   std::string("energy of ") + processor_name(p) + " tasks");
}

EnergyModel CostModel::energy_model() const {
  EnergyModel e;
  if (!p_.has("/cost_model/power/static_w")) return e;  // whole-system powers
  e.static_w = p_.number("/cost_model/power/static_w", "the SoC's static power");
  e.dram_pj_per_byte = p_.number("/cost_model/power/dram_pj_per_byte", "DRAM energy per byte");
  return e;
}

double CostModel::sync_us(Processor from, Processor to) const {
  // Loader and unpack threads hand buffers over in shared memory.
  for (Processor p : {from, to})
    if (p == Processor::Io || p == Processor::CpuAux) return 0.0;
  if (from == to) return 0.0;
  const bool gpu = from == Processor::Gpu || to == Processor::Gpu;
  const bool npu = from == Processor::Npu || to == Processor::Npu;
  const std::string why =
      std::string("synchronizing ") + processor_name(from) + " -> " + processor_name(to);
  if (!(gpu && npu))
    return p_.number(gpu ? "/cost_model/sync/cpu_gpu_us" : "/cost_model/sync/cpu_npu_us", why);
  // GPU <-> NPU (seed 002 §3.1, §4.2; SyncOptions).
  const std::string s = "/cost_model/sync/";
  double us = p_.number(s + (sync_.fast ? "fast_gpu_npu_us" : "gpu_npu_us"), why);
  if (to == Processor::Gpu && !(sync_.fast && sync_.gpu_queue_kept))
    us += p_.number(s + (sync_.fast ? "fast_gpu_resubmit_us" : "gpu_resubmit_us"), why);
  return us;
}

bool CostModel::has_memory_model() const {
  return p_.has("/cost_model/memory/two_processors_gbps") && p_.has("/cost_model/memory/peak_gbps");
}

double CostModel::shared_bandwidth_gbps(const std::vector<Processor>& processors) const {
  const std::string m = "/cost_model/memory/";
  const std::string why =
      "memory contention of " + std::to_string(processors.size()) + " processors";
  double gbps = 0;
  if (processors.size() == 1)
    gbps = p_.rate(
        m + processor_name(processors[0] == Processor::CpuAux ? Processor::Cpu : processors[0]) +
            std::string("_gbps"),
        why);
  else gbps = p_.rate(m + (processors.size() == 2 ? "two_processors_gbps" : "peak_gbps"), why);
  if (dram_taken_gbps_ > 0) {  // a co-runner's traffic comes off what the SoC's peak leaves
    const double left = p_.rate(m + "peak_gbps", why) - dram_taken_gbps_;
    if (!(left > 0))
      throw InvalidArgument("[CostModel] profile '" + p_.name() + "': the co-runner's dram_gbps " +
                            std::to_string(dram_taken_gbps_) + " leaves no bandwidth of " + m +
                            "peak_gbps");
    gbps = std::min(gbps, left);
  }
  return gbps;
}

std::vector<std::string> CostModel::scenarios() const {
  std::vector<std::string> out = {"none"};
  const auto& j = p_.json();
  if (j.contains("scenarios") && j["scenarios"].is_object())
    for (const auto& [k, v] : j["scenarios"].items())
      if (v.is_object()) out.push_back(k);
  return out;
}

CostModel CostModel::with_co_runner(const std::string& scenario) const {
  CostModel out = *this;
  out.busy_share_.fill(0.0);
  out.dram_taken_gbps_ = 0;
  out.co_runner_ = scenario.empty() ? "none" : scenario;
  if (scenario.empty() || scenario == "none") return out;
  const auto known = scenarios();
  if (std::find(known.begin(), known.end(), scenario) == known.end()) {
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    throw InvalidArgument("[CostModel] profile '" + p_.name() + "' has no co-runner scenario '" +
                          scenario + "' (known: " + list + ")");
  }
  const std::string base = "/scenarios/" + scenario + "/";
  const std::string why = "co-runner scenario '" + scenario + "'";
  for (Processor p : {Processor::Npu, Processor::Cpu, Processor::Gpu}) {
    const std::string key = base + processor_name(p) + "_time_share";
    const double share = p_.has(key) ? p_.number(key, why) : 0.0;
    if (!(share >= 0 && share < 1))
      throw InvalidArgument("[CostModel] " + key + " = " + std::to_string(share) +
                            " (a time share in [0, 1))");
    out.busy_share_[static_cast<size_t>(p)] = share;
  }
  out.dram_taken_gbps_ = p_.has(base + "dram_gbps") ? p_.number(base + "dram_gbps", why) : 0.0;
  return out;
}

double dram_bytes(const OpDesc& op) {
  return static_cast<double>(op.weight_bytes) + static_cast<double>(op.activation_bytes);
}

}  // namespace socllm::soc
