// Calibrate layer: the calibration steps (DESIGN.md, "What a plan is": steps are modules with one
// interface), registered here once: name, what they need (arrays of the artifact's schema,
// calibration/calibration.h, or root attributes "attr:NAME"), what they write (the schema's
// arrays whose writer is the step, and the attributes they declare), their options with
// defaults and help, and their heavy part in C++ (run), one call per step over all layers,
// sites and grid points. The CLI's flags and the Python step functions' options come from this
// registry; Python draws the calibration windows (its tokenizer) and composes the steps
// (socllm.calibration.steps).
//
// A new step is one file here (its StepInfo, registered by a static initializer; the steps are an
// object library, so every file's registration is linked) and one Python run function.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibration/calibration.h"
#include "engine/engine.h"

namespace socllm::calibrate {

struct StepOption {
  std::string name;
  nlohmann::json default_value;  // its JSON type is the option's type
  std::string help;
  std::vector<std::string> choices = {};  // a name option's allowed values (empty: any)
};

// What a step's C++ part works on.
struct StepContext {
  const Engine& engine;
  Calibration& stats;  // the artifact being built: earlier steps' arrays in, this step's out
  // Calibration windows (token ids), drawn by the caller as the step's options say.
  const std::vector<std::vector<int32_t>>& windows;
  // Per window the rows the step samples (smoothing); empty: every row.
  const std::vector<std::vector<int64_t>>& rows;
  const nlohmann::json& options;  // every option of the step, defaults filled in
  // Reports progress (done of total, in `unit`s); null: spdlog at info level.
  std::function<void(int64_t done, int64_t total, const std::string& unit)> on_progress = {};
  nlohmann::json provenance = nlohmann::json::object();  // root attributes the step writes

  void progress(int64_t done, int64_t total, const std::string& unit) const;
  // The rows sampled from window w: rows[w], or every row of the window when rows is empty.
  std::vector<int64_t> rows_of(size_t w) const;
  // Calls f on each window in turn, reporting progress in windows.
  void for_each_window(const std::function<void(const std::vector<int32_t>&)>& f) const;
};

struct StepInfo {
  std::string name;
  std::string description;
  int order = 0;                          // position in listings and pipelines
  std::vector<std::string> needs;         // schema arrays, or "attr:NAME"
  std::vector<std::string> attrs;         // root attributes it writes (besides its schema arrays)
  std::vector<StepOption> options;        // its options (a name shared by two steps: one default)
  std::function<void(StepContext&)> run;  // the heavy part (null: composed in Python)
  // Checks option values beyond their type and choices (ranges), InvalidArgument naming the
  // value: run before any step of a pipeline starts.
  std::function<void(const std::string& step, const nlohmann::json& options)> check = {};
};

// Registers a step (InvalidArgument for a name registered twice, or an option whose default
// differs from another step's option of the same name). Returns true (for static init).
bool register_step(StepInfo info);
// The registered steps in order.
std::vector<const StepInfo*> steps();
// One by name; InvalidArgument listing the steps.
const StepInfo& step(const std::string& name);
// The schema arrays a step writes (the schema's writer column), then "attr:" + its attributes.
std::vector<std::string> writes(const StepInfo& s);
// `given` checked against the step's options (an unknown name, a value of another type or
// outside the choices, or one its check refuses is InvalidArgument naming it) with the defaults
// of the others filled in. null: no option given.
nlohmann::json options_with_defaults(const StepInfo& s, const nlohmann::json& given);
// Runs a step's C++ part; InvalidArgument if it has none, or if an array it needs is absent.
nlohmann::json run_step(const std::string& name, const Engine& engine, Calibration& stats,
                        const std::vector<std::vector<int32_t>>& windows,
                        const std::vector<std::vector<int64_t>>& rows,
                        const nlohmann::json& options,
                        std::function<void(int64_t, int64_t, const std::string&)> progress = {});

// Shared by the steps: the options of the calibration windows' draw (corpus, samples, seqlen,
// seed), and InvalidArgument unless the calibration has the arrays `s` needs.
std::vector<StepOption> window_options();
void check_window_options(const std::string& step, const nlohmann::json& options);
void check_corpus(const std::string& step, const nlohmann::json& options);
// EdgeFlow's steps (smoothing, bitwidths): the average bits, and the linear-input samples (rows
// of the first act-scales windows); the check covers bits too.
StepOption bits_option();
std::vector<StepOption> sample_options();
void check_sample_options(const std::string& step, const nlohmann::json& options);
void check_needs(const StepInfo& s, const Calibration& stats);
// InvalidArgument "[calibrate] <step>: option '<name>' must be <rule>, got <value>" unless ok.
void require_option(bool ok, const std::string& step, const nlohmann::json& options,
                    const std::string& name, const std::string& rule);

}  // namespace socllm::calibrate
