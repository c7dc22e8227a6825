#include <spdlog/sinks/stdout_color_sinks.h>  // also declares the stderr sinks
#include <spdlog/spdlog.h>

#include "core/core.h"

namespace socllm {
namespace {
// Logs go to stderr: stdout carries results (`socllm eval --json -`), which a log line would
// corrupt (spdlog's default logger writes to stdout).
const bool g_logs_to_stderr = [] {
  spdlog::set_default_logger(spdlog::stderr_color_mt("socllm"));
  return true;
}();
}  // namespace

void set_log_level(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept that for the literal "off".
  if (lvl == spdlog::level::off && level != "off")
    throw InvalidArgument("[set_log_level] unknown level '" + level +
                          "' (trace, debug, info, warn, error, critical, off)");
  spdlog::set_level(lvl);
}

std::string log_level() {
  auto sv = spdlog::level::to_string_view(spdlog::get_level());
  return std::string(sv.data(), sv.size());
}

}  // namespace socllm
