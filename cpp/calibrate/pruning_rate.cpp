// Step pruning-rate (shadow-outlier execution's automatic pruning rate; seed 003's reviewers
// asked how seed 001's 85% is chosen): the largest share of linear inputs whose CPU part can be
// pruned while perplexity on validation text from the calibration slice stays within `budget`
// (relative) of pruning nothing, by bisection over the number of pruned inputs. Its loop is
// perplexity evaluations of whole plans, composed in Python (socllm.calibration.steps), so it
// registers no C++ part.
#include "calibrate/steps.h"
#include "plan/plan.h"

namespace socllm::calibrate {

namespace {

const bool kRegistered = register_step({
    "pruning-rate",
    "automatic shadow-outlier pruning rate within a validation perplexity budget",
    30,
    {"outlier_threshold", "outlier_count"},
    {"auto_pruning_rate", "auto_pruning_budget", "auto_pruning_validation"},
    {{"budget", 0.01, "relative perplexity increase allowed over pruning nothing"},
     {"validation_tokens", int64_t{8192}, "validation tokens: the end of the calibration slice"},
     {"validation_context", int64_t{512}, "tokens per validation window"},
     {"hot_share", 0.8, "share of outliers the hot channels cover (seed 001 Fig. 11)"},
     {"pruning_plan", "shadow-outlier",
      "the plan whose pruning rate is chosen (shadow-outlier, with options, e.g. "
      "shadow-outlier:residual=cpu/fp32 for Gemma 3)"}},
    nullptr,
    [](const std::string& step, const nlohmann::json& o) {
      require_option(o["budget"].get<double>() >= 0, step, o, "budget", ">= 0");
      require_option(o["validation_tokens"].get<int64_t>() >= 2, step, o, "validation_tokens",
                     ">= 2");
      require_option(o["validation_context"].get<int64_t>() >= 2, step, o, "validation_context",
                     ">= 2");
      const double hot = o["hot_share"].get<double>();
      require_option(hot > 0 && hot <= 1, step, o, "hot_share", "in (0, 1]");
      const std::string plan = o["pruning_plan"].get<std::string>();
      require_option(Plan::parse(plan).name == "shadow-outlier", step, o, "pruning_plan",
                     "shadow-outlier, with options if needed (e.g. "
                     "'shadow-outlier:residual=cpu/fp32')");
    },
});

}  // namespace

}  // namespace socllm::calibrate
