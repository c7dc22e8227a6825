// Orthonormal Hadamard transforms (kernels layer): the rotations QuaRot (Ashkboos et al. 2024)
// and SpinQuant (Liu et al. 2024) fold into a model's weights, or apply online, to spread
// activation outliers over every channel (issue 39). Pure numerics.
//
// H_n / sqrt(n) for n = m · 2^k, H_n = H_m ⊗ H_{2^k}: H_{2^k} by Sylvester's doubling (a fast
// Walsh-Hadamard transform, n log n adds), H_m a small dense Hadamard matrix by Paley's
// constructions from the quadratic residues of a prime q (Paley 1933):
//   I:  q ≡ 3 (mod 4), m = q + 1   (12 from q = 11, 20 from 19, 24 from 23, ...)
//   II: q ≡ 1 (mod 4), m = 2 (q + 1)   (36 from q = 17, 28 from 13, ...)
// m is the smallest order that makes n / m a power of two. Hadamard orders are 1, 2 or multiples
// of 4, so an odd factor needs a larger m: SmolLM2's 576 = 9 · 64 takes m = 36 (Paley II, q = 17)
// ⊗ H_16; its 1536 = 12 · 128 (Paley I, q = 11); Gemma-3's 640 = 20 · 32 (Paley I, q = 19).
// QuaRot does the same with tabulated matrices (its get_hadK: 12, 20, 28, 36, ..., 172).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace socllm::kernels {

class HadamardTransform {
 public:
  // Which loops apply it: plain scalar loops (the reference), or the build's float SIMD.
  enum class Path { Scalar, Vector };

  // InvalidArgument naming n when no construction above reaches it (n <= 0, or an odd part that
  // no Paley order of at most kMaxBaseOrder covers).
  explicit HadamardTransform(int64_t n);
  static constexpr int64_t kMaxBaseOrder = 1024;

  int64_t size() const { return n_; }
  int64_t base_order() const { return m_; }  // m
  // e.g. "sylvester(64)", "paley1(q=11) x sylvester(128)", "paley2(q=13)"
  const std::string& construction() const { return construction_; }

  // Each row of x [rows, n] (row stride ld >= n) replaced by H x / sqrt(n) (transpose: Hᵀ x /
  // sqrt(n), the inverse), in place. Every path gives the same result up to float rounding.
  void apply(float* x, int64_t rows, int64_t ld, bool transpose = false,
             Path path = Path::Vector) const;

  // H / sqrt(n), dense [n, n] row-major (weight folding and tests).
  std::vector<float> matrix() const;
  // H_m's entries (+1 / -1), [m, m] row-major.
  const std::vector<int8_t>& base() const { return base_; }

 private:
  int64_t n_ = 0, m_ = 1, p_ = 1;  // n = m * p, p a power of two
  std::string construction_;
  std::vector<int8_t> base_, base_t_;  // H_m and its transpose
};

}  // namespace socllm::kernels
