#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>

#include <spdlog/spdlog.h>

#include "calibrate/steps.h"
#include "core/core.h"

namespace socllm::calibrate {

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<StepInfo>> steps;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::string step_list() {
  std::string s;
  for (const StepInfo* x : steps()) s += (s.empty() ? "" : ", ") + x->name;
  return s;
}

// An array the act-scales step writes is allocated with the calibration: present once some
// channel maximum is nonzero.
bool has_array(const Calibration& stats, const std::string& name) {
  const CalibrationArraySpec& spec = Calibration::spec(name);
  if (std::string(spec.step) == "act-scales" && name != "out_absmax") return stats.has_act_scales();
  auto ref = const_cast<Calibration&>(stats).array(name, LinearSite::AttnIn);
  return (ref.f && !ref.f->empty()) || (ref.i && !ref.i->empty());
}

}  // namespace

void StepContext::progress(int64_t done, int64_t total, const std::string& unit) const {
  if (on_progress) on_progress(done, total, unit);
  else spdlog::info("calibrate: {}/{} {}", done, total, unit);
}

void StepContext::for_each_window(const std::function<void(const std::vector<int32_t>&)>& f) const {
  const auto n = static_cast<int64_t>(windows.size());
  for (int64_t i = 0; i < n; ++i) {
    f(windows[static_cast<size_t>(i)]);
    progress(i + 1, n, "windows");
  }
}

std::vector<int64_t> StepContext::rows_of(size_t w) const {
  if (!rows.empty()) return rows.at(w);
  std::vector<int64_t> all(windows.at(w).size());
  std::iota(all.begin(), all.end(), int64_t{0});
  return all;
}

std::vector<StepOption> window_options() {
  return {{"corpus", "wikitext2",
           "calibration text: wikitext2 (WikiText-2 raw test) or the path of a UTF-8 text file; "
           "windows come from its first quarter"},
          {"samples", int64_t{128}, "calibration windows"},
          {"seqlen", int64_t{512}, "tokens per window"},
          {"seed", int64_t{0}, "the windows' starts (numpy default_rng, without replacement)"}};
}

StepOption bits_option() {
  return {"bits", 5.0, "EdgeFlow's average bits per weight (the plan the errors are measured on)"};
}

std::vector<StepOption> sample_options() {
  return {{"smoothing_windows", int64_t{8}, "act-scales windows whose rows are sampled"},
          {"smoothing_rows", int64_t{128}, "rows sampled per window"}};
}

void check_sample_options(const std::string& step, const nlohmann::json& o) {
  const double bits = o["bits"].get<double>();
  require_option(bits >= 1.0 && bits <= 8.0, step, o, "bits", "in [1, 8]");
  require_option(o["smoothing_windows"].get<int64_t>() >= 1, step, o, "smoothing_windows", ">= 1");
  require_option(o["smoothing_rows"].get<int64_t>() >= 1, step, o, "smoothing_rows", ">= 1");
}

void require_option(bool ok, const std::string& step, const nlohmann::json& options,
                    const std::string& name, const std::string& rule) {
  if (!ok)
    throw InvalidArgument("[calibrate] " + step + ": option '" + name + "' must be " + rule +
                          ", got " + json_text(options.at(name)));
}

void check_corpus(const std::string& step, const nlohmann::json& o) {
  const std::string corpus = o["corpus"].get<std::string>();
  require_option(corpus == "wikitext2" || std::filesystem::is_regular_file(corpus), step, o,
                 "corpus", "wikitext2 or the path of a text file");
}

void check_window_options(const std::string& step, const nlohmann::json& o) {
  check_corpus(step, o);
  require_option(o["samples"].get<int64_t>() >= 1, step, o, "samples", ">= 1");
  require_option(o["seqlen"].get<int64_t>() >= 2, step, o, "seqlen", ">= 2");
  require_option(o["seed"].get<int64_t>() >= 0, step, o, "seed", ">= 0");
}

bool register_step(StepInfo info) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  for (const auto& s : r.steps) {
    if (s->name == info.name)
      throw InvalidArgument("[calibrate] step '" + info.name + "' registered twice");
    for (const auto& a : s->options)
      for (const auto& b : info.options)
        if (a.name == b.name && a.default_value != b.default_value)
          throw InvalidArgument("[calibrate] option '" + a.name + "' of steps '" + s->name +
                                "' and '" + info.name + "' has two defaults (" +
                                a.default_value.dump() + ", " + b.default_value.dump() + ")");
  }
  r.steps.push_back(std::make_unique<StepInfo>(std::move(info)));
  std::stable_sort(r.steps.begin(), r.steps.end(),
                   [](const auto& a, const auto& b) { return a->order < b->order; });
  return true;
}

std::vector<const StepInfo*> steps() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<const StepInfo*> out;
  for (const auto& s : r.steps) out.push_back(s.get());
  return out;
}

const StepInfo& step(const std::string& name) {
  for (const StepInfo* s : steps())
    if (s->name == name) return *s;
  throw InvalidArgument("[calibrate] unknown step '" + name + "' (known: " + step_list() + ")");
}

std::vector<std::string> writes(const StepInfo& s) {
  std::vector<std::string> out;
  for (const auto& spec : Calibration::schema())
    if (s.name == spec.step) out.emplace_back(spec.name);
  for (const auto& a : s.attrs) out.push_back("attr:" + a);
  return out;
}

nlohmann::json options_with_defaults(const StepInfo& s, const nlohmann::json& given) {
  if (given.is_null()) return options_with_defaults(s, nlohmann::json::object());
  if (!given.is_object())
    throw InvalidArgument("[calibrate] step '" + s.name + "': options must be an object, got " +
                          json_text(given));
  nlohmann::json out = nlohmann::json::object();
  for (const auto& o : s.options) out[o.name] = o.default_value;
  for (const auto& [k, v] : given.items()) {
    const auto it = std::find_if(s.options.begin(), s.options.end(),
                                 [&](const StepOption& o) { return o.name == k; });
    if (it == s.options.end()) {
      std::string known;
      for (const auto& o : s.options) known += (known.empty() ? "" : ", ") + o.name;
      throw InvalidArgument("[calibrate] step '" + s.name + "' has no option '" + k +
                            "' (its options: " + known + ")");
    }
    const auto& d = it->default_value;
    const bool ok = d.is_string()           ? v.is_string()
                    : d.is_number_integer() ? v.is_number_integer()
                    : d.is_number()         ? v.is_number()
                                            : v.type() == d.type();
    if (!ok)
      throw InvalidArgument("[calibrate] step '" + s.name + "': option '" + k + "' must be " +
                            (d.is_string()           ? "a name"
                             : d.is_number_integer() ? "an integer"
                                                     : "a number") +
                            ", got " + json_text(v));
    if (!it->choices.empty() && std::find(it->choices.begin(), it->choices.end(),
                                          v.get<std::string>()) == it->choices.end()) {
      std::string known;
      for (const auto& c : it->choices) known += (known.empty() ? "" : ", ") + c;
      throw InvalidArgument("[calibrate] step '" + s.name + "': option '" + k +
                            "' must be one of " + known + ", got " + json_text(v));
    }
    out[k] = d.is_number_float() ? nlohmann::json(v.get<double>()) : v;
  }
  if (s.check) s.check(s.name, out);
  return out;
}

void check_needs(const StepInfo& s, const Calibration& stats) {
  for (const auto& need : s.needs) {
    if (need.rfind("attr:", 0) == 0) continue;  // root attributes: the caller's provenance
    if (!has_array(stats, need)) {
      std::string writer = Calibration::spec(need).step;
      throw InvalidArgument("[calibrate] step '" + s.name + "' needs '" + need + "', which step '" +
                            writer + "' writes: run it first (e.g. --steps " + writer + "," +
                            s.name + ")");
    }
  }
}

nlohmann::json run_step(const std::string& name, const Engine& engine, Calibration& stats,
                        const std::vector<std::vector<int32_t>>& windows,
                        const std::vector<std::vector<int64_t>>& rows,
                        const nlohmann::json& options,
                        std::function<void(int64_t, int64_t, const std::string&)> progress) {
  const StepInfo& s = step(name);
  if (!s.run)
    throw InvalidArgument("[calibrate] step '" + name +
                          "' has no C++ part: it is composed in Python (socllm.calibration.steps)");
  stats.check_matches(engine.model().config());
  check_needs(s, stats);
  if (!rows.empty() && rows.size() != windows.size())
    throw ShapeError("[calibrate] step '" + name + "': " + std::to_string(rows.size()) +
                     " row lists for " + std::to_string(windows.size()) + " windows");
  const nlohmann::json opts = options_with_defaults(s, options);
  StepContext ctx{engine, stats, windows, rows, opts, std::move(progress)};
  s.run(ctx);
  return ctx.provenance;
}

}  // namespace socllm::calibrate
