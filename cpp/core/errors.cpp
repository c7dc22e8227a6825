#include <numeric>
#include <sstream>

#include "socllm/core.h"

namespace socllm {

TensorF32::TensorF32(std::vector<int64_t> shape_) : shape(std::move(shape_)) {
  for (int64_t d : shape)
    if (d < 0) throw ShapeError("[TensorF32] negative dimension in " + shape_str(shape));
  data.assign(static_cast<size_t>(numel()), 0.0f);
}

int64_t TensorF32::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace socllm
