// Step attention-clamp (shadowAttn, seed 000 Eq. 3; issue 40 item 4): Eq. 3's clamp of the
// headImp x layerImp products chosen on calibration text instead of fixed. The paper's example
// clamp is absolute (1e-3 in its loss units) and does not carry over to another model's loss
// scale; our quantile clamp (attention/common.cpp) at 0.95 is too loose for SmolLM2 (issue 13's
// sweep: tighter clamps, toward uniform ratios, score better on held-out text). The step scores
// the plan at each candidate clamp_quantile on validation windows from the end of the
// calibration slice by the mean KL divergence of its next-token distribution from fp32's, and
// keeps the lowest (0.5 makes every ratio uniform, 1 leaves the products unclamped). Its loop
// is whole-plan evaluations, composed in Python (socllm.calibration.steps), so it registers no
// C++ part.
#include <regex>
#include <stdexcept>

#include "calibrate/steps.h"
#include "plan/plan.h"

namespace socllm::calibrate {

namespace {

// "0.5,0.75,1" -> its numbers; every item a plain decimal (Python's float() reads the same),
// no empty item (a trailing comma is one).
std::vector<double> parse_candidates(const std::string& text) {
  static const std::regex kDecimal(R"(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?)");
  std::vector<double> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!std::regex_match(item, kDecimal)) throw std::invalid_argument(item);
    out.push_back(std::stod(item));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

const bool kRegistered = register_step({
    "attention-clamp",
    "shadowAttn's Eq. 3 clamp chosen on calibration text: the clamp_quantile whose plan is "
    "closest to fp32 (mean KL) on validation windows",
    55,
    {"head_importance", "layer_importance", "q_absmax", "k_absmax"},
    {"auto_clamp_quantile", "auto_clamp_validation"},
    {{"clamp_candidates", "0.5,0.6,0.75,0.9,0.95,1.0",
      "clamp_quantile values tried, comma-separated, each in [0.5, 1] (0.5: uniform ratios)"},
     {"clamp_plan", "fp32:attention=shadow-attn:keep=0.2",
      "the plan whose clamp is chosen: calibrated per-head ratios, no clamp_quantile given"},
     {"clamp_validation_tokens", int64_t{8192},
      "validation tokens: the end of the calibration slice"},
     {"clamp_validation_context", int64_t{2048}, "tokens per validation window"}},
    nullptr,
    [](const std::string& step, const nlohmann::json& o) {
      const std::string text = o["clamp_candidates"].get<std::string>();
      bool ok = !text.empty();
      try {
        for (double q : parse_candidates(text)) ok = ok && q >= 0.5 && q <= 1.0;
      } catch (const std::exception&) {
        ok = false;
      }
      require_option(ok, step, o, "clamp_candidates",
                     "comma-separated numbers in [0.5, 1], e.g. 0.5,0.75,0.95");
      // plan text (the step appends ",clamp_quantile=q"), not the JSON form
      const std::string plan = o["clamp_plan"].get<std::string>();
      bool calibrated = false;
      try {
        calibrated = Plan::parse(plan).attention.needs_head_importance();
      } catch (const std::exception&) {
      }
      require_option(
          !plan.empty() && plan.front() != '{' &&
              plan.find("clamp_quantile") == std::string::npos && calibrated,
          step, o, "clamp_plan",
          "plan text whose attention takes calibrated per-head ratios (shadow-attn, "
          "sparse, ...) without clamp_quantile, e.g. fp32:attention=shadow-attn:keep=0.2");
      require_option(o["clamp_validation_tokens"].get<int64_t>() >= 2, step, o,
                     "clamp_validation_tokens", ">= 2");
      require_option(o["clamp_validation_context"].get<int64_t>() >= 2, step, o,
                     "clamp_validation_context", ">= 2");
    },
});

}  // namespace

}  // namespace socllm::calibrate
