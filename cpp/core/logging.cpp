#include <spdlog/spdlog.h>

#include "socllm/core.h"

namespace socllm {

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
