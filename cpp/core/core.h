// socllm core: typed errors, logging, threading, a minimal owning fp32 tensor.
// Everything above this layer throws the errors declared here; the bindings map
// each to a Python exception class (see cpp/bindings/core.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace socllm {

// Base of every error socllm throws. Messages start with "[function] ".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A caller passed a bad value (out-of-vocabulary id, empty input, unknown plan...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};
// Array shapes do not fit together.
class ShapeError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};
// A sequence would exceed the model's (or the cache's) context length.
class ContextOverflow : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};
// A file that should exist does not.
class MissingFile : public Error {
 public:
  using Error::Error;
};
// A file exists but its content is malformed or truncated.
class FormatError : public Error {
 public:
  using Error::Error;
};
// Well-formed input that socllm does not implement (tensor type, architecture...).
class Unsupported : public Error {
 public:
  using Error::Error;
};
// The user interrupted a long call (Ctrl-C): the bindings raise KeyboardInterrupt.
class Interrupted : public Error {
 public:
  using Error::Error;
};

// a * b; ShapeError naming `what` and the operands if the product leaves int64 (sizes read from
// files or callers must not wrap).
int64_t checked_mul(int64_t a, int64_t b, const std::string& what);

// Long calls (prefill, perplexity, generate) call check_interrupt() between layers; it throws
// Interrupted when the hook set by the host reports a pending interrupt (the Python bindings
// check for signals). No hook by default, so C++ callers are never interrupted.
using InterruptHook = bool (*)();
void set_interrupt_hook(InterruptHook hook);
void check_interrupt();

// Owning row-major fp32 tensor. `shape` is outermost-first (numpy order).
struct TensorF32 {
  std::vector<int64_t> shape;
  std::vector<float> data;

  TensorF32() = default;
  // ShapeError for a negative dimension or an element count beyond int64.
  explicit TensorF32(std::vector<int64_t> shape_);
  int64_t numel() const;  // ShapeError if the count does not fit in int64
  int64_t dim(size_t i) const { return shape.at(i); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }
};

std::string shape_str(const std::vector<int64_t>& shape);

// JSON for an error message: at most `max_chars`, bytes that are not UTF-8 replaced (values read
// from files need not be UTF-8, and nlohmann's dump() throws on them).
std::string json_text(const nlohmann::json& j, size_t max_chars = 200);

// "head:key=value,key=value" (plan and attention-scheme text): the head and the key/value pairs
// in order. InvalidArgument (prefixed with `who`) for an item without a key or '='.
struct KeyValueText {
  std::string head;
  std::vector<std::pair<std::string, std::string>> items;
};
KeyValueText split_key_values(const std::string& text, const std::string& who);

// Logging: spdlog underneath; levels "trace".."off". `quiet` == "warn".
void set_log_level(const std::string& level);
std::string log_level();

// Threads used by socllm kernels (OpenMP loops and OpenBLAS). Default 2. At most
// max_num_threads(): more only oversubscribes the cores, and far more makes OpenBLAS spin and
// libgomp abort (issue 12); InvalidArgument beyond it.
void set_num_threads(int64_t n);
int max_num_threads();
int num_threads();

// The BLAS socllm runs on: OpenBLAS core name (the kernel set it dispatched to) and build config.
std::string blas_corename();
std::string blas_config();

}  // namespace socllm
