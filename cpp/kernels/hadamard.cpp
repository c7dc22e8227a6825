#include "kernels/hadamard.h"

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "core/core.h"
#include "kernels/float_simd.h"

namespace socllm::kernels {

namespace {

using simd::kLanes;
using simd::VecF;

bool is_prime(int64_t q) {
  if (q < 2) return false;
  for (int64_t d = 2; d * d <= q; ++d)
    if (q % d == 0) return false;
  return true;
}

// The quadratic character mod a prime q: 0 for 0, 1 for a nonzero square, -1 otherwise.
std::vector<int> quadratic_character(int64_t q) {
  std::vector<int> chi(static_cast<size_t>(q), -1);
  chi[0] = 0;
  for (int64_t x = 1; x < q; ++x) chi[static_cast<size_t>(x * x % q)] = 1;
  return chi;
}

// Paley's core S of order q + 1 (q prime): [[0, 1ᵀ], [±1, Q]] with the Jacobsthal matrix
// Q[i][j] = chi(j - i); the first column is -1 for q ≡ 3 (mod 4) (S skew), +1 for q ≡ 1 (S
// symmetric).
std::vector<int> paley_core(int64_t q) {
  const auto chi = quadratic_character(q);
  const int64_t s = q + 1;
  const int first_col = q % 4 == 3 ? -1 : 1;
  std::vector<int> S(static_cast<size_t>(s * s), 0);
  for (int64_t j = 1; j < s; ++j) S[j] = 1, S[j * s] = first_col;
  for (int64_t i = 0; i < q; ++i)
    for (int64_t j = 0; j < q; ++j)
      S[(i + 1) * s + j + 1] = chi[static_cast<size_t>(((j - i) % q + q) % q)];
  return S;
}

// H_m by Paley I (m = q + 1, q ≡ 3 mod 4): I + S.
std::vector<int8_t> paley1(int64_t q) {
  const auto S = paley_core(q);
  const int64_t m = q + 1;
  std::vector<int8_t> H(static_cast<size_t>(m * m));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) H[i * m + j] = static_cast<int8_t>((i == j) + S[i * m + j]);
  return H;
}

// H_m by Paley II (m = 2 (q + 1), q ≡ 1 mod 4): each 0 of S becomes [[1, -1], [-1, -1]] and each
// ±1 becomes ±[[1, 1], [1, -1]].
std::vector<int8_t> paley2(int64_t q) {
  const auto S = paley_core(q);
  const int64_t s = q + 1, m = 2 * s;
  std::vector<int8_t> H(static_cast<size_t>(m * m));
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j) {
      const int e = S[i * s + j];
      const int block[2][2] = {{e == 0 ? 1 : e, e == 0 ? -1 : e},
                               {e == 0 ? -1 : e, e == 0 ? -1 : -e}};
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
          H[(2 * i + a) * m + 2 * j + b] = static_cast<int8_t>(block[a][b]);
    }
  return H;
}

// In-place unnormalized Walsh-Hadamard transform of x[p] (p a power of two): butterflies
// (u, v) -> (u + v, u - v) at strides 1, 2, 4, ...; the Vector path runs strides of at least a
// register on whole registers (the same adds in the same order: the same bits).
void fwht(float* x, int64_t p, bool vector) {
  for (int64_t h = 1; h < p; h *= 2) {
    if (vector && h >= kLanes) {
      for (int64_t i = 0; i < p; i += 2 * h)
        for (int64_t j = i; j < i + h; j += kLanes) {
          const VecF u = simd::load(x + j), v = simd::load(x + j + h);
          simd::store(x + j, u + v);
          simd::store(x + j + h, u - v);
        }
    } else {
      for (int64_t i = 0; i < p; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          const float u = x[j], v = x[j + h];
          x[j] = u + v;
          x[j + h] = u - v;
        }
    }
  }
}

}  // namespace

HadamardTransform::HadamardTransform(int64_t n) : n_(n) {
  if (n <= 0)
    throw InvalidArgument("[HadamardTransform] size must be positive, got " + std::to_string(n));
  const int64_t pow2 = int64_t{1} << std::countr_zero(static_cast<uint64_t>(n));
  const int64_t odd = n / pow2;
  for (int64_t m = odd; m <= n && m <= kMaxBaseOrder; m *= 2) {
    if (m <= 2) {  // Sylvester all the way (m = 2 is Sylvester's H_2)
      m_ = 1;
      construction_ = "sylvester(" + std::to_string(n) + ")";
      break;
    }
    if (m % 4 != 0) continue;
    if (is_prime(m - 1) && (m - 1) % 4 == 3) {
      m_ = m, base_ = paley1(m - 1);
      construction_ = "paley1(q=" + std::to_string(m - 1) + ")";
      break;
    }
    if (is_prime(m / 2 - 1) && (m / 2 - 1) % 4 == 1) {
      m_ = m, base_ = paley2(m / 2 - 1);
      construction_ = "paley2(q=" + std::to_string(m / 2 - 1) + ")";
      break;
    }
  }
  if (construction_.empty())
    throw InvalidArgument("[HadamardTransform] no construction for size " + std::to_string(n) +
                          ": it needs n = m * 2^k with m 1, 2 or a Paley order (q + 1 for a prime "
                          "q = 3 mod 4, 2(q + 1) for q = 1 mod 4) of at most " +
                          std::to_string(kMaxBaseOrder));
  p_ = n / m_;
  if (m_ > 1) {
    if (p_ > 1) construction_ += " x sylvester(" + std::to_string(p_) + ")";
    base_t_.resize(base_.size());
    for (int64_t i = 0; i < m_; ++i)
      for (int64_t j = 0; j < m_; ++j) base_t_[j * m_ + i] = base_[i * m_ + j];
  }
}

void HadamardTransform::apply(float* x, int64_t rows, int64_t ld, bool transpose, Path path) const {
  if (rows < 0 || ld < n_)
    throw ShapeError("[HadamardTransform] " + std::to_string(rows) + " rows of " +
                     std::to_string(n_) + " with row stride " + std::to_string(ld));
  if (rows > 0 && !x) throw InvalidArgument("[HadamardTransform] null input");
  const bool vector = path == Path::Vector;
  const float inv = 1.0f / std::sqrt(static_cast<float>(n_));
  const std::vector<int8_t>& H = transpose ? base_t_ : base_;
  thread_local std::vector<float> z;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    // H_n = H_m ⊗ H_p on the row as [m][p]: each block of p by the fast transform, then the
    // blocks mixed by H_m, scaled on the way out
    for (int64_t a = 0; a < m_; ++a) fwht(row + a * p_, p_, vector);
    if (m_ == 1) {
      for (int64_t j = 0; j < n_; ++j) row[j] *= inv;
      continue;
    }
    z.assign(row, row + n_);
    for (int64_t a = 0; a < m_; ++a) {
      float* y = row + a * p_;
      const int8_t* h = H.data() + a * m_;
      int64_t b = 0;
      if (vector)
        for (; b + kLanes <= p_; b += kLanes) {
          VecF acc = {};
          for (int64_t c = 0; c < m_; ++c) {
            const VecF v = simd::load(z.data() + c * p_ + b);
            acc = h[c] > 0 ? acc + v : acc - v;
          }
          simd::store(y + b, acc * inv);
        }
      for (; b < p_; ++b) {
        float acc = 0;
        for (int64_t c = 0; c < m_; ++c) {
          const float v = z[static_cast<size_t>(c * p_ + b)];
          acc = h[c] > 0 ? acc + v : acc - v;
        }
        y[b] = acc * inv;
      }
    }
  }
}

std::vector<float> HadamardTransform::matrix() const {
  const float inv = 1.0f / std::sqrt(static_cast<float>(n_));
  std::vector<float> M(static_cast<size_t>(n_ * n_));
  for (int64_t i = 0; i < n_; ++i)
    for (int64_t j = 0; j < n_; ++j) {
      const int64_t a = i / p_, b = i % p_, c = j / p_, d = j % p_;
      const int hm = m_ == 1 ? 1 : base_[a * m_ + c];
      const int hp = std::popcount(static_cast<uint64_t>(b & d)) % 2 ? -1 : 1;
      M[i * n_ + j] = static_cast<float>(hm * hp) * inv;
    }
  return M;
}

}  // namespace socllm::kernels
