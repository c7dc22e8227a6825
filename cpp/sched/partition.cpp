#include "sched/partition.h"

#include "sched/simulator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

namespace socllm::sched {

namespace {
using soc::Processor;

constexpr std::array<const char*, 6> kCutNames = {"gpu-all", "npu-all",   "row",
                                                  "seq",     "multi-seq", "hybrid"};
constexpr std::array<const char*, 9> kSpaceNames = {
    "gpu-only", "npu-padding", "npu-pipe", "npu-online", "layer", "tensor", "row", "seq", "hybrid"};

int64_t align_up(int64_t x, int64_t a) { return a > 1 ? (x + a - 1) / a * a : x; }

std::string part_text(const MatmulPart& p, size_t i) {
  return "part " + std::to_string(i) + " (" + soc::processor_name(p.processor) + ", rows [" +
         std::to_string(p.row_begin) + ", " + std::to_string(p.row_end) + "), columns [" +
         std::to_string(p.col_begin) + ", " + std::to_string(p.col_end) + "), graph rows " +
         std::to_string(p.graph_rows) + ")";
}

bool overlap(const MatmulPart& a, const MatmulPart& b) {
  return a.row_begin < b.row_end && b.row_begin < a.row_end && a.col_begin < b.col_end &&
         b.col_begin < a.col_end;
}

// Two streams of work sharing bandwidth (bytes/µs) max-min fair until the first ends; the
// other then finishes alone (the simulator's contention model, simulator.h, for two tasks).
double overlapped_us(double t_gpu, double bytes_gpu, double t_npu, double bytes_npu,
                     double shared_bytes_per_us) {
  if (t_gpu <= 0 || t_npu <= 0 || shared_bytes_per_us <= 0) return std::max(t_gpu, t_npu);
  const double dg = bytes_gpu / t_gpu, dn = bytes_npu / t_npu;
  const std::vector<double> got = max_min_share({dg, dn}, shared_bytes_per_us);
  const double rg = dg > 0 ? got[0] / dg : 1.0;
  const double rn = dn > 0 ? got[1] / dn : 1.0;
  const double end_g = t_gpu / rg, end_n = t_npu / rn;
  if (end_g <= end_n) return end_g + (t_npu - end_g * rn);
  return end_n + (t_gpu - end_n * rg);
}
}  // namespace

const char* cut_kind_name(CutKind k) { return kCutNames[static_cast<size_t>(k)]; }

const char* partition_space_name(PartitionSpace s) { return kSpaceNames[static_cast<size_t>(s)]; }

PartitionSpace partition_space_from_name(const std::string& s) {
  std::string known;
  for (size_t i = 0; i < kSpaceNames.size(); ++i) {
    if (s == kSpaceNames[i]) return static_cast<PartitionSpace>(i);
    known += (i ? ", " : "") + std::string(kSpaceNames[i]);
  }
  throw InvalidArgument("[partition] unknown partition space '" + s + "' (known: " + known + ")");
}

CutKind MatmulPartition::kind() const {
  int64_t npu_parts = 0, npu_rows = 0, npu_cols = 0;
  bool gpu = false;
  for (const auto& p : parts) {
    if (p.processor == Processor::Npu) {
      ++npu_parts;
      npu_rows = std::max(npu_rows, p.row_end);
      npu_cols = std::max(npu_cols, p.col_end);
    } else {
      gpu = true;
    }
  }
  if (npu_parts == 0) return CutKind::GpuAll;
  if (!gpu) return CutKind::NpuAll;
  if (npu_rows == rows) return CutKind::Row;
  if (npu_cols < cols) return CutKind::Hybrid;
  return npu_parts == 1 ? CutKind::Seq : CutKind::MultiSeq;
}

double MatmulPartition::npu_share() const {
  double npu = 0;
  for (const auto& p : parts)
    if (p.processor == Processor::Npu)
      npu += static_cast<double>(p.rows()) * static_cast<double>(p.cols());
  return rows > 0 && cols > 0 ? npu / (static_cast<double>(rows) * static_cast<double>(cols)) : 0;
}

nlohmann::json MatmulPartition::to_json() const {
  auto ps = nlohmann::json::array();
  for (const auto& p : parts)
    ps.push_back({{"processor", soc::processor_name(p.processor)},
                  {"rows", {p.row_begin, p.row_end}},
                  {"cols", {p.col_begin, p.col_end}},
                  {"graph_rows", p.graph_rows}});
  return {{"rows", rows},
          {"cols", cols},
          {"kind", cut_kind_name(kind())},
          {"npu_share", npu_share()},
          {"parts", ps}};
}

MatmulPartition MatmulPartition::from_json(const nlohmann::json& j) {
  try {
    MatmulPartition m;
    m.rows = j.at("rows").get<int64_t>();
    m.cols = j.at("cols").get<int64_t>();
    for (const auto& p : j.at("parts")) {
      MatmulPart q;
      q.processor = soc::processor_from_name(p.at("processor").get<std::string>());
      q.row_begin = p.at("rows").at(0).get<int64_t>();
      q.row_end = p.at("rows").at(1).get<int64_t>();
      q.col_begin = p.at("cols").at(0).get<int64_t>();
      q.col_end = p.at("cols").at(1).get<int64_t>();
      q.graph_rows = p.value("graph_rows", q.row_end - q.row_begin);
      m.parts.push_back(q);
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(std::string("[partition] not a partition: ") + e.what() + " in " +
                          json_text(j));
  }
}

PartitionRules PartitionRules::from_profile(const soc::DeviceProfile& p) {
  PartitionRules r;
  const std::string why = "NPU partition alignment";
  r.npu_col_align = p.count("/processors/npu/tile/n", why);
  r.npu_row_align = p.count("/processors/npu/tile/m", why);
  const nlohmann::json::json_pointer ptr("/processors/npu/static_graph_seq_lengths/value");
  if (!p.json().contains(ptr))
    throw soc::MissingData("[DeviceProfile] profile '" + p.name() +
                           "' has no /processors/npu/static_graph_seq_lengths (needed for the "
                           "NPU's pre-built graph shapes)");
  const auto& rows = p.json()[ptr];
  if (!rows.is_array() || rows.empty())
    throw InvalidArgument("[DeviceProfile] profile '" + p.name() +
                          "': /processors/npu/static_graph_seq_lengths = " + json_text(rows) +
                          " (needs a non-empty list of row counts)");
  r.npu_graph_rows.clear();
  for (const auto& v : rows) {
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      throw InvalidArgument("[DeviceProfile] profile '" + p.name() +
                            "': /processors/npu/static_graph_seq_lengths = " + json_text(rows) +
                            " (needs whole row counts >= 1)");
    r.npu_graph_rows.push_back(v.get<int64_t>());
  }
  std::sort(r.npu_graph_rows.begin(), r.npu_graph_rows.end());
  return r;
}

PartitionRules PartitionRules::for_rows(int64_t decode_rows) const {
  PartitionRules r = *this;
  r.npu_row_align = 1;
  r.npu_graph_rows = {decode_rows};
  return r;
}

void validate(const MatmulPartition& p, const PartitionRules& rules) {
  const std::string f = "[partition] ";
  if (p.rows <= 0 || p.cols <= 0)
    throw InvalidArgument(f + "a partition of a " + std::to_string(p.rows) + " x " +
                          std::to_string(p.cols) + " output (needs positive sizes)");
  if (p.parts.empty()) throw InvalidArgument(f + "a partition without parts");
  // Structural rules (alignment 1, any graph) accept either partner; others only theirs.
  const bool structural = rules.npu_col_align == 1 && rules.npu_row_align == 1;
  std::optional<Processor> partner;
  if (!structural) partner = rules.partner;
  double area = 0;
  for (size_t i = 0; i < p.parts.size(); ++i) {
    const auto& q = p.parts[i];
    if (q.row_begin < 0 || q.row_end > p.rows || q.col_begin < 0 || q.col_end > p.cols ||
        q.rows() <= 0 || q.cols() <= 0)
      throw InvalidArgument(f + part_text(q, i) + " is empty or outside the " +
                            std::to_string(p.rows) + " x " + std::to_string(p.cols) + " output");
    for (size_t j = 0; j < i; ++j)
      if (overlap(q, p.parts[j]))
        throw InvalidArgument(f + part_text(q, i) + " overlaps " + part_text(p.parts[j], j));
    area += static_cast<double>(q.rows()) * static_cast<double>(q.cols());
    if (q.processor == Processor::Npu) {
      const bool cols_aligned = q.col_begin % rules.npu_col_align == 0 &&
                                (q.col_end % rules.npu_col_align == 0 || q.col_end == p.cols);
      if (!cols_aligned)
        throw InvalidArgument(f + part_text(q, i) + ": NPU columns must be aligned to " +
                              std::to_string(rules.npu_col_align) + " (seed 002 §4.3)");
      if (q.row_begin % rules.npu_row_align != 0)
        throw InvalidArgument(f + part_text(q, i) + ": NPU rows must start aligned to " +
                              std::to_string(rules.npu_row_align));
      if (q.graph_rows < q.rows())
        throw InvalidArgument(f + part_text(q, i) + ": its graph is shorter than its rows");
      const auto& g = rules.npu_graph_rows;
      const bool shape_ok = g.empty() ? q.graph_rows % rules.npu_row_align == 0
                                      : std::find(g.begin(), g.end(), q.graph_rows) != g.end();
      if (!shape_ok)
        throw InvalidArgument(f + part_text(q, i) + ": " + std::to_string(q.graph_rows) +
                              " rows is not a pre-built NPU graph shape");
    } else if (q.processor == Processor::Gpu || q.processor == Processor::Cpu) {
      if (q.graph_rows != q.rows())
        throw InvalidArgument(f + part_text(q, i) + ": a " + soc::processor_name(q.processor) +
                              " part computes its own rows (dynamic shapes)");
      if (partner && *partner != q.processor)
        throw InvalidArgument(f + part_text(q, i) + ": the NPU shares a linear with one " +
                              "processor, here the " + soc::processor_name(*partner));
      partner = q.processor;
    } else {
      throw InvalidArgument(f + part_text(q, i) +
                            ": parts run on the NPU and one partner (gpu or cpu)");
    }
  }
  if (area != static_cast<double>(p.rows) * static_cast<double>(p.cols))
    throw InvalidArgument(f + "the parts cover " + std::to_string(static_cast<int64_t>(area)) +
                          " of the " + std::to_string(p.rows * p.cols) +
                          " output elements (a partition covers the tensor exactly)");
}

MatmulPartition make_partition(int64_t rows, int64_t cols, const std::vector<int64_t>& npu_graphs,
                               int64_t npu_cols, const PartitionRules& rules) {
  MatmulPartition p;
  p.rows = rows;
  p.cols = cols;
  if (!npu_graphs.empty() && (npu_cols <= 0 || npu_cols > cols))
    throw InvalidArgument("[partition] NPU columns " + std::to_string(npu_cols) + " outside (0, " +
                          std::to_string(cols) + "]");
  int64_t r = 0;
  for (int64_t g : npu_graphs) {
    if (r >= rows)
      throw InvalidArgument("[partition] an NPU graph of " + std::to_string(g) +
                            " rows starts beyond the " + std::to_string(rows) + " rows");
    if (g <= 0) throw InvalidArgument("[partition] NPU graph rows " + std::to_string(g));
    p.parts.push_back({Processor::Npu, r, std::min(r + g, rows), 0, npu_cols, g});
    r += g;
  }
  const int64_t covered = std::min(r, rows);
  if (covered > 0 && npu_cols < cols)
    p.parts.push_back({rules.partner, 0, covered, npu_cols, cols, covered});
  if (covered < rows) p.parts.push_back({rules.partner, covered, rows, 0, cols, rows - covered});
  validate(p, rules);
  return p;
}

MatmulPartition partner_all(int64_t rows, int64_t cols, Processor partner) {
  MatmulPartition p;
  p.rows = rows;
  p.cols = cols;
  p.parts.push_back({partner, 0, rows, 0, cols, rows});
  return p;
}

MatmulPartition gpu_all(int64_t rows, int64_t cols) {
  return partner_all(rows, cols, Processor::Gpu);
}

MatmulPartition row_cut(int64_t rows, int64_t cols, int64_t npu_cols, const PartitionRules& rules) {
  return make_partition(rows, cols, padded_graphs(rows, rules), npu_cols, rules);
}

MatmulPartition row_cut_share(int64_t rows, int64_t cols, double npu_share,
                              const PartitionRules& rules) {
  if (!(npu_share >= 0.0 && npu_share <= 1.0))
    throw InvalidArgument("[partition] the NPU's share must be in [0, 1], got " +
                          std::to_string(npu_share));
  const int64_t a = std::max<int64_t>(rules.npu_col_align, 1);
  int64_t npu_cols =
      std::llround(npu_share * static_cast<double>(cols) / static_cast<double>(a)) * a;
  if (npu_share == 1.0) npu_cols = cols;
  npu_cols = std::min(npu_cols, cols);
  if (npu_cols <= 0) return partner_all(rows, cols, rules.partner);
  return row_cut(rows, cols, npu_cols, rules);
}

std::vector<int64_t> padded_graphs(int64_t rows, const PartitionRules& rules) {
  if (rows <= 0) throw InvalidArgument("[partition] rows must be > 0, got " + std::to_string(rows));
  const auto& g = rules.npu_graph_rows;
  if (g.empty()) return {align_up(rows, rules.npu_row_align)};
  std::vector<int64_t> out;
  int64_t left = rows;
  while (left > g.back()) {
    out.push_back(g.back());
    left -= g.back();
  }
  out.push_back(*std::lower_bound(g.begin(), g.end(), left));
  return out;
}

std::vector<int64_t> pipe_graphs(int64_t rows, const PartitionRules& rules) {
  if (rows <= 0) throw InvalidArgument("[partition] rows must be > 0, got " + std::to_string(rows));
  const auto& g = rules.npu_graph_rows;
  int64_t left = align_up(rows, rules.npu_row_align);
  if (g.empty()) return {left};
  std::vector<int64_t> out;
  while (left > 0) {
    auto it = std::upper_bound(g.begin(), g.end(), left);  // largest shape <= left
    const int64_t s = it == g.begin() ? g.front() : *std::prev(it);
    out.push_back(s);
    left -= s;
  }
  return out;
}

soc::OpDesc part_op(const soc::OpDesc& linear, const MatmulPart& part) {
  soc::OpDesc o = linear;
  o.m = part.graph_rows;
  o.n = part.cols();
  const double col_share =
      linear.n > 0 ? static_cast<double>(part.cols()) / static_cast<double>(linear.n) : 0.0;
  o.weight_bytes =
      static_cast<int64_t>(std::llround(static_cast<double>(linear.weight_bytes) * col_share));
  const double per_value = linear.m * (linear.k + linear.n) > 0
                               ? static_cast<double>(linear.activation_bytes) /
                                     static_cast<double>(linear.m * (linear.k + linear.n))
                               : 0.0;
  o.activation_bytes =
      static_cast<int64_t>(std::llround(per_value * static_cast<double>(o.m * (o.k + o.n))));
  return o;
}

PartitionCosts PartitionCosts::of(const soc::CostModel& cost, Processor partner) {
  PartitionCosts c;
  c.time_us = [&cost](const soc::OpDesc& o, Processor p) { return cost.latency_us(o, p); };
  c.sync_us = [&cost](Processor a, Processor b) { return cost.sync_us(a, b); };
  c.shared_gbps =
      cost.has_memory_model() ? cost.shared_bandwidth_gbps({partner, Processor::Npu}) : 0;
  c.partner = partner;
  return c;
}

PartitionTime partition_time(const soc::OpDesc& linear, const MatmulPartition& p,
                             const PartitionCosts& costs) {
  PartitionTime t;
  double bytes_gpu = 0, bytes_npu = 0;
  bool npu = false;
  Processor partner = costs.partner;
  for (const auto& q : p.parts) {
    const soc::OpDesc o = part_op(linear, q);
    const double us = costs.time_us(o, q.processor);
    if (q.processor == Processor::Npu) {
      npu = true;
      t.npu_us += us;
      bytes_npu += soc::dram_bytes(o);
    } else {
      partner = q.processor;
      t.gpu_us += us;
      bytes_gpu += soc::dram_bytes(o);
    }
  }
  t.overlap_us = overlapped_us(t.gpu_us, bytes_gpu, t.npu_us, bytes_npu, costs.shared_gbps * 1e3);
  if (npu)
    t.sync_us = costs.sync_us(partner, Processor::Npu) + costs.sync_us(Processor::Npu, partner);
  t.total_us = t.overlap_us + t.sync_us;
  return t;
}

PartitionChoice solve_partition(const soc::OpDesc& linear, const PartitionRules& rules,
                                const PartitionCosts& costs, PartitionSpace space,
                                int64_t col_step) {
  if (linear.kind != soc::OpKind::MatMul || linear.m <= 0 || linear.n <= 0)
    throw InvalidArgument("[partition] the solver cuts matmuls with rows and columns, got " +
                          json_text(linear.to_json()));
  if (col_step < 0)
    throw InvalidArgument("[partition] col_step must be >= 0, got " + std::to_string(col_step));
  const int64_t rows = linear.m, cols = linear.n;
  PartitionChoice best;
  best.time.total_us = std::numeric_limits<double>::infinity();
  PartitionRules active = rules;  // col_step > 0: a finer column grid
  if (col_step > 0) active.npu_col_align = std::gcd(col_step, rules.npu_col_align);
  auto consider = [&](const std::vector<int64_t>& graphs, int64_t npu_cols) {
    MatmulPartition p = graphs.empty() ? partner_all(rows, cols, rules.partner)
                                       : make_partition(rows, cols, graphs, npu_cols, active);
    const PartitionTime t = partition_time(linear, p, costs);
    ++best.candidates;
    if (t.total_us < best.time.total_us) {
      const int64_t n = best.candidates;
      best = {std::move(p), t, n};
    }
  };
  switch (space) {
    case PartitionSpace::GpuOnly: consider({}, 0); break;
    case PartitionSpace::NpuPadding: consider(padded_graphs(rows, rules), cols); break;
    case PartitionSpace::NpuPipe: consider(pipe_graphs(rows, rules), cols); break;
    case PartitionSpace::NpuOnline: {
      PartitionRules online = rules;
      online.npu_graph_rows.clear();
      const PartitionChoice c = solve_partition(linear, online, costs, PartitionSpace::NpuPipe);
      return c;
    }
    case PartitionSpace::Layer:
      consider({}, 0);
      consider(pipe_graphs(rows, rules), cols);
      break;
    case PartitionSpace::Tensor:
    case PartitionSpace::Row:
    case PartitionSpace::Seq:
    case PartitionSpace::Hybrid: {
      const int64_t step = col_step > 0 ? col_step : rules.npu_col_align;
      const bool any = space == PartitionSpace::Tensor;
      // covers of a prefix of the rows (seq, hybrid) and of all rows (row, npu-all)
      std::vector<std::vector<int64_t>> prefixes,
          whole = {pipe_graphs(rows, rules), padded_graphs(rows, rules)};
      for (int64_t m = rules.npu_row_align; m < rows; m += rules.npu_row_align)
        prefixes.push_back(pipe_graphs(m, rules));
      if (any) consider({}, 0);
      for (const auto& cover : prefixes) {
        if (any || space == PartitionSpace::Hybrid)
          for (int64_t c = step; c < cols; c += step) consider(cover, c);
        if (any || space == PartitionSpace::Seq) consider(cover, cols);
      }
      for (const auto& cover : whole) {
        if (any || space == PartitionSpace::Row)
          for (int64_t c = step; c < cols; c += step) consider(cover, c);
        if (any) consider(cover, cols);
      }
      if (best.candidates == 0) consider(padded_graphs(rows, rules), cols);  // no cut of the kind
      break;
    }
  }
  return best;
}

}  // namespace socllm::sched
