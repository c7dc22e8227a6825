// Exact INT8 GEMM (kernels layer): the mobile NPU's INT8 x INT8 -> INT32 arithmetic
// (seed 001 §2.2; seed 004 §3.2), bit-exact on every dispatch path.
//
//   C[M, N] (int32, ldc) = A[M, K] (int8 or uint8, lda) · B[N, K]^T (int8, ldb)
//
// B is in weight layout ([out, in], rows contiguous in K), as linear layers store it.
// Accumulation wraps modulo 2^32 like the hardware's, so results are exact whenever the true
// sum fits in int32 (always for K <= 131072 with int8 operands).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace socllm::kernels {

enum class Isa { Scalar, Avx2, Avx512Vnni };

std::string isa_name(Isa isa);
Isa isa_from_name(const std::string& name);  // InvalidArgument for unknown names
// Best path this CPU supports, and every path it supports (Scalar first).
Isa best_isa();
std::vector<Isa> supported_isas();

// s8 x s8 -> s32. The VNNI path runs as u8 x s8 on A + 128 and subtracts 128 * sum_k B[n, k]
// (the zero-point correction), which is exact in wrapping int32 arithmetic.
void gemm_s8s8s32(const int8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa);
// u8 x s8 -> s32: the form VNNI's vpdpbusd computes natively.
void gemm_u8s8s32(const uint8_t* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C,
                  int64_t ldc, int64_t M, int64_t N, int64_t K, Isa isa);

}  // namespace socllm::kernels
