// SoC layer: device profiles and per-processor cost models. Knows nothing about numerics:
// an operator is a shape (OpDesc), a processor is a set of fitted rates from the profile.
//
// Profiles are JSON data (python/socllm/devices/*.json). Every number is an object
//   {"value": 12.5, "unit": "GB/s", "source": "seed 002 §3.3 Fig. 6: ..."}
// so a table in RESULTS can always say where a predicted latency came from. The cost model
// reads numbers by JSON pointer and throws MissingData naming the pointer, the profile and the
// operator that needed it when one is absent.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/core.h"

namespace socllm::soc {

// A profile lacks a number that a plan or an operator needs.
class MissingData : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// Two resources of cold starts (seed 004 §3.2 Fig. 4: "two threads to load the model ... and one
// thread to unpack"), on which no model operator can be placed: Io, the storage read path (the
// loader threads reading flash), and CpuAux, a CPU core kept apart from compute for unpacking
// (timed at the CPU's rates).
enum class Processor : int { Npu = 0, Cpu, Gpu, Io, CpuAux };
constexpr int kNumProcessors = 5;
const char* processor_name(Processor p);
Processor processor_from_name(const std::string& s);  // "npu" | "cpu" | "gpu" | "io" | "cpu-aux"

enum class DType : int { Int8 = 0, Fp16, Fp32 };
const char* dtype_name(DType d);
int64_t dtype_bytes(DType d);  // 1, 2, 4
DType dtype_from_name(const std::string& s);
// The names those parsers accept, comma-separated (for messages), and a name's value if it is one.
std::string processor_names();
std::string dtype_names();
std::optional<Processor> find_processor(const std::string& s);
std::optional<DType> find_dtype(const std::string& s);

enum class OpKind : int {
  MatMul = 0,     // [m, k] x [k, n]
  Attention,      // m query rows over kv_len keys: n = heads, k = head_dim, elements = kv_len
  Elementwise,    // norms, activations, residual adds, (de)quantization: `elements` values
  OutlierMatMul,  // shadow outlier part on the CPU: [m, k channels] x [k, n] + cold fetches
  Fixed,          // a fixed duration (graph build / optimize), `fixed_us`
  MemoryCopy,     // `bytes` moved through DRAM
  // Head-wise attention pieces (seed 000 §3.2-3.4). `n` heads of `k` dims; `elements` = the
  // (query row, key) pairs per head the op touches (the builder counts causal or dense pairs).
  AttnMatMul,       // Q·Kᵀ (or P·V) scores of `elements` pairs: 2·elements·k·n ops
  TopK,             // per-row top-k over `elements` scores per head (CPU; memory-bound)
  SparseAttention,  // softmax and P·V over `elements` kept pairs, Q·K recomputed: 4·elements·k·n
  NpuLaunch,        // one NPU graph launch round trip (seed 000 §3.4 fused launch), no shape
  // Cold start (seed 004 §3-4): `bytes` read from flash (on Io), and `elements` weights unpacked
  // to INT8 rows on one CPU thread from the format `name` names ("weightlet": EdgeFlow's
  // packed format, "kquant": llama.cpp's K-quant blocks).
  FlashRead,
  Unpack
};
const char* op_kind_name(OpKind k);
OpKind op_kind_from_name(const std::string& s);

struct OpDesc {
  // What the op is in the block description (block.h), for display and graph comparison; the
  // cost model reads only the shape fields below.
  std::string name;      // e.g. "qkv", "attn_norm"; empty for ops outside a block
  std::string op_class;  // the plan's op class: "linear", "norm", "attention" ...
  OpKind kind = OpKind::MatMul;
  DType dtype = DType::Fp32;
  int64_t m = 0, k = 0, n = 0;
  int64_t elements = 0;
  int64_t bytes = 0;   // DRAM traffic (MemoryCopy) / flash reads (OutlierMatMul)
  int64_t groups = 1;  // per-group quantized matmul on the NPU: sub-matmuls
  double fixed_us = 0;
  int64_t weight_bytes = 0;      // constants the op reads (weights, norm gains), as stored
  int64_t activation_bytes = 0;  // activations it reads and writes, at its format
  // CPU core class the op is timed on ("mid", "prime", "small": /cost_model/cpu_core/<core>);
  // empty: the whole CPU (/cost_model/cpu). Attention ops only (seed 000's CPU budget, §4).
  std::string core;
  // Multiply-accumulates x 2 (Attention: QK^T and PV).
  double flops() const;
  nlohmann::json to_json() const;
  static OpDesc from_json(const nlohmann::json& j);
};

class DeviceProfile {
 public:
  // From the JSON text of a profile; `origin` names it in error messages.
  static DeviceProfile from_json(const nlohmann::json& j, const std::string& origin);
  const std::string& name() const { return name_; }
  // 'name' (and the file it came from, when that is not its name), for messages.
  std::string label() const;
  // Named characterizations (/characterizations/<name>): alternative measurements of the same
  // SoC by another software stack or tensor layout (e.g. seed 001's QNN FP16 matmul at 2 GFLOPS
  // vs seed 002's ~10 TFLOPS), each a JSON merge patch of /cost_model with its sources.
  std::vector<std::string> characterizations() const;
  // This profile with /cost_model patched by characterization `name` ("" or "default": as is);
  // InvalidArgument naming it and the known ones when absent.
  DeviceProfile with_characterization(const std::string& name) const;
  const std::string& characterization() const { return characterization_; }
  const nlohmann::json& json() const { return j_; }
  // A hash of the profile's content (and characterization): what caches of its answers key on.
  size_t fingerprint() const { return fingerprint_; }
  bool has(const std::string& pointer) const;
  // The "value" of the number at `pointer` (e.g. "/processors/npu/int8_gops"); MissingData
  // naming the pointer, the profile and `needed_for` if absent.
  double number(const std::string& pointer, const std::string& needed_for) const;
  // A number something is divided by (GB/s, GOPS, ...): InvalidArgument naming it unless > 0.
  double rate(const std::string& pointer, const std::string& needed_for) const;
  // number() that must be a whole count >= 1 (a tile side, a graph's rows); InvalidArgument
  // naming the pointer and the value otherwise.
  int64_t count(const std::string& pointer, const std::string& needed_for) const;
  // Its "source" string ("" if absent).
  std::string source(const std::string& pointer) const;

 private:
  std::string name_, origin_;
  std::string characterization_ = "default";
  nlohmann::json j_;
  size_t fingerprint_ = 0;
};

// The device socllm plans and times for when none is named (a profile name, not a number).
inline constexpr const char* kDefaultDevice = "snapdragon-8gen3";
// The folder of the named profiles: set by the Python package when it is imported (its
// devices/ folder); else the environment variable SOCLLM_DEVICE_DIR.
void set_device_dir(const std::string& dir);
std::string device_dir();
// A profile by name (<device_dir>/<name>.json) or by the path of a .json file, read once and
// kept. InvalidArgument naming an unknown name and listing the known ones; MissingFile,
// FormatError (not a regular file, not JSON, no 'name') naming the file.
std::shared_ptr<const DeviceProfile> load_device(const std::string& name_or_path);
std::vector<std::string> known_devices();

// The component energy model (issue 40; sources in the profile's /cost_model/power): a phone's
// power while an LLM request runs is a static floor (rails, DRAM refresh, the idle cores)
// over the request's whole span, plus each processor's active power above that floor over its
// busy time, plus DRAM energy per byte moved. Two processors running together then cost
// floor + both active powers, not the sum of two whole-phone powers. Profiles without
// /cost_model/power/static_w keep the older whole-system reading: static 0, DRAM 0, and
// <processor>_w the phone's power while that processor runs.
struct EnergyModel {
  double static_w = 0;
  double dram_pj_per_byte = 0;
};

// How results cross between the GPU and the NPU (seed 002 §3.1, §4.2). Conventional: a driver
// synchronization and a buffer copy (/cost_model/sync/gpu_npu_us, >= 400 µs) and, into the GPU,
// the resubmission of an emptied queue (gpu_resubmit_us, 50-100 µs). Fast: shared buffers and
// predicted sleep then flag polling (fast_gpu_npu_us); into the GPU a resubmission only when the
// GPU waited for the NPU (prefill is NPU-dominant: fast_gpu_resubmit_us), none when the NPU's
// work is hidden under a queued GPU kernel (decode, GPU-dominant: gpu_queue_kept).
struct SyncOptions {
  bool fast = false;
  bool gpu_queue_kept = false;
};

// Latency and power of operators on one device (parameters under /cost_model in the profile):
//   matmul (every processor and dtype; keys <dtype>_overhead_us, _compute_gops, _weight_gbps):
//     overhead + max(flops / compute rate, weight bytes / weight rate), a roofline whose
//     weight term is what seed 001 Table 3's small-M rows measure; on the NPU the flops are
//     counted on whole tiles (stage performance, seed 002 §3.2), and per-group quantized
//     matmuls run as one padded sub-matmul per group plus a float reduction (seed 001 §2.3);
//   NPU element-wise ops: their own slow rate (seed 004 Fig. 5b);
//   attention: flops / compute rate; outlier matmul: fp32 flops + columns from DRAM / flash
//     (+ a fitted fixed cost and a per-element merge rate when the profile has them);
//   element-wise ops on CPU/GPU and copies: bytes / DRAM bandwidth;
//   head-wise attention (seed 000): NPU INT8 Q·Kᵀ at the fused-launch rate plus one launch per
//   graph (§3.4: 2/3/4 ms for 1/2/4 heads); on a CPU core class (OpDesc::core) the rates under
//   /cost_model/cpu_core/<core> (dense attention counts causal pairs only, §2 Fig. 4a split);
//   flash reads: bytes / /cost_model/memory/flash_gbps; unpacking: weights /
//   /cost_model/cpu/unpack_<format>_gweights_s (one thread; seed 004 §3.2, §5.4.2).
// Synchronizing with Io costs nothing (a loader thread hands over a buffer in shared memory).
//   memory contention (seed 002 §3.3): one processor alone reaches its own bandwidth
//   (/cost_model/memory/<processor>_gbps, 40-45 GB/s), two together share
//   two_processors_gbps (59.1), three or more peak_gbps (68); the simulator shares it among
//   running tasks by their DRAM traffic (dram_bytes / duration).
class CostModel {
 public:
  explicit CostModel(DeviceProfile profile, SyncOptions sync = {});
  const SyncOptions& sync_options() const { return sync_; }
  // A copy sharing the SoC with a co-running app (/scenarios/<name>: seed 000 Table 9's and
  // seed 002 §5.5's situations): each processor keeps 1 - <processor>_time_share of its time
  // (operators take 1 / (1 - share) as long) and the app's DRAM traffic (dram_gbps) comes off
  // the bandwidth the SoC's peak leaves. "" or "none": no co-runner. InvalidArgument naming an
  // unknown scenario and the known ones.
  CostModel with_co_runner(const std::string& scenario) const;
  const std::string& co_runner() const { return co_runner_; }
  std::vector<std::string> scenarios() const;
  const DeviceProfile& profile() const { return p_; }
  double latency_us(const OpDesc& op, Processor on) const;
  double latency_us(const std::vector<OpDesc>& ops, Processor on) const;
  // Active power of a processor while it runs a task (W), for energy: above the static floor
  // under the component model (EnergyModel), the whole phone's otherwise.
  double active_power_w(Processor p) const;
  EnergyModel energy_model() const;
  // Time for a result produced on `from` to be usable on `to` (0 on the same processor).
  double sync_us(Processor from, Processor to) const;
  // The memory model, when the profile has one (else the simulator applies no contention).
  bool has_memory_model() const;
  // DRAM bandwidth available to `processors` running at once: alone, two, three or more.
  double shared_bandwidth_gbps(const std::vector<Processor>& processors) const;

 private:
  double alone_latency_us(const OpDesc& op, Processor on) const;  // without a co-runner
  double matmul_us(const OpDesc& op, Processor on) const;
  double attention_us(const OpDesc& op, Processor on) const;
  DeviceProfile p_;
  SyncOptions sync_;
  std::string co_runner_ = "none";
  std::array<double, kNumProcessors> busy_share_{};  // taken by the co-runner
  double dram_taken_gbps_ = 0;
};

// The cost model a graph is timed with: the device under a characterization ("" or "default":
// as is) with conventional or fast GPU-NPU synchronization (in decode the GPU's queue stays
// filled, seed 002 §4.2), sharing the SoC with a co-running app ("" or "none": alone).
CostModel timing_cost_model(const DeviceProfile& device, const std::string& characterization,
                            bool fast_sync, bool decode, const std::string& co_runner = "");

// DRAM bytes an op moves (its weights as stored and its activations): the simulator's
// bandwidth demand of a task is their sum over its duration.
double dram_bytes(const OpDesc& op);

}  // namespace socllm::soc
