#include <atomic>
#include <nlohmann/json.hpp>
#include <sstream>

#include "socllm/core.h"

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
