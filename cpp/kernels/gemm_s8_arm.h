// Private to gemm_s8.cpp: the AArch64 paths of the exact INT8 GEMMs (gemm_s8.h), compiled only
// for AArch64. Arguments arrive checked; every path gives the scalar reference's bits.
#pragma once

#include <cstdint>

#include "kernels/gemm_s8.h"

namespace socllm::kernels::arm {

// Run-time CPU features, from the kernel's hwcaps (HWCAP_ASIMDDP, HWCAP2_I8MM).
bool cpu_has_dotprod();
bool cpu_has_i8mm();

detail::DotprodPack pack_b_dotprod(const int8_t* B, int64_t ldb, int64_t N, int64_t K);
detail::I8mmPack pack_b_i8mm(const int8_t* B, int64_t ldb, int64_t N, int64_t K);

// C[M, N] = A[M, K] · B[N, K]^T on `isa` (Neon, Dotprod or I8mm); int8 or uint8 A.
template <typename TA>
void gemm(const TA* A, int64_t lda, const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc,
          int64_t M, int64_t N, int64_t K, Isa isa);

// The same for the first N columns of W, with its packed layouts; M, N > 0.
void gemm_packed(const int8_t* A, int64_t lda, const PackedWeightsS8& W, int64_t N, int32_t* C,
                 int64_t ldc, int64_t M, Isa isa);

// gemm_grouped_s8s8f32's columns [c0, c1) on `isa`; M > 0, c0 < c1, K > 0.
void gemm_grouped(const int8_t* A, int64_t lda, const float* as, int64_t lds,
                  const PackedGroupedWeightsS8& W, float* C, int64_t ldc, int64_t M, int64_t c0,
                  int64_t c1, Isa isa);

}  // namespace socllm::kernels::arm
