// Engine layer: a Plan names how each operator class of a decoder runs, and how a prompt is
// fed (whole, or in fixed-length chunks on static graphs, seed 001 §3.2).
//
// JSON form (what to_json writes and from_json reads back):
//   {"name": "smoothquant", "alpha": 0.5, "chunk_len": 0,
//    "ops": {"linear": {LinearScheme}, "attention": "fp32", "norm": "fp32",
//            "embedding": "fp32", "lm_head": "fp32"}}
// A preset name with its options is enough; "ops" may be given with the name "custom" to
// compose a scheme, or with a preset name if it equals the preset's expansion.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "socllm/linear_scheme.h"

namespace socllm {

struct Plan {
  std::string name = "fp32";
  nlohmann::json options = nlohmann::json::object();  // the preset's options, as given/defaulted
  // All linears of every decoder block (q/k/v, o, gate/up, down). Attention, norms, the
  // embedding and the LM head run in fp32 in every plan (seed 001 §2.3: float attention and
  // norms in all the baselines of Table 4).
  quant::LinearScheme linear;
  // > 0: prefill runs in chunks of this many rows on static graphs, the last chunk padded.
  int64_t chunk_len = 0;

  static std::vector<std::string> known();
  static std::string known_list();  // "(known plans: a, b)", for error messages
  static std::string describe(const std::string& name);  // one line, names the source
  // A preset with default options. InvalidArgument naming the plan and listing the known ones.
  static Plan from_name(const std::string& name);
  // "name", "name:key=value,key=value" or a JSON object.
  static Plan parse(const std::string& text);
  static Plan from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  bool needs_calibration() const { return linear.needs_calibration(); }
};

}  // namespace socllm
