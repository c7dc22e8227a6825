#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/core.h"

namespace socllm {

TensorF32::TensorF32(std::vector<int64_t> shape_) : shape(std::move(shape_)) {
  for (int64_t d : shape)
    if (d < 0) throw ShapeError("[TensorF32] negative dimension in " + shape_str(shape));
  data.assign(static_cast<size_t>(numel()), 0.0f);
}

int64_t TensorF32::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n = checked_mul(n, d, "[TensorF32] element count of " + shape_str(shape));
  return n;
}

KeyValueText split_key_values(const std::string& text, const std::string& who) {
  KeyValueText out;
  const size_t colon = text.find(':');
  out.head = text.substr(0, colon);
  if (colon == std::string::npos) return out;
  const std::string rest = text.substr(colon + 1);
  for (size_t start = 0; start <= rest.size();) {
    const size_t comma = std::min(rest.find(',', start), rest.size());
    const std::string kv = rest.substr(start, comma - start);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InvalidArgument(who + " expected key=value in '" + text + "', got '" + kv + "'");
    out.items.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    start = comma + 1;
  }
  return out;
}

std::string json_text(const nlohmann::json& j, size_t max_chars) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    throw ShapeError(what + ": " + std::to_string(a) + " x " + std::to_string(b) +
                     " does not fit in 64 bits");
  return out;
}

namespace {
std::atomic<InterruptHook> g_interrupt_hook{nullptr};
}

void set_interrupt_hook(InterruptHook hook) { g_interrupt_hook = hook; }

void check_interrupt() {
  const InterruptHook hook = g_interrupt_hook.load();
  if (hook && hook()) throw Interrupted("[socllm] interrupted");
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace socllm
