// Block layer, internal: what the op kinds (ops/*.cpp) share. Not a public header.
#pragma once

#include <cstdint>

#include "block/block.h"

namespace socllm::block_ops {

// An element-wise op of `elements` values in `format`, reading `weight_bytes` of constants and
// rows x (in + out) values of activations at the format's width.
soc::OpDesc elementwise(const BlockOpInfo& op, soc::DType format, int64_t elements,
                        int64_t weight_bytes, int64_t activation_values);

// A matmul [m, k] x [k, n] in `format` whose [k, n] operand is a constant (a weight).
soc::OpDesc matmul(const BlockOpInfo& op, soc::DType format, int64_t m, int64_t k, int64_t n);

// The op kinds, one per file.
const BlockOpKind& norm_kind();         // norm.cpp
const BlockOpKind& linear_kind();       // linear.cpp
const BlockOpKind& rope_kind();         // rope.cpp
const BlockOpKind& attention_kind();    // attention.cpp
const BlockOpKind& activation_kind();   // activation.cpp
const BlockOpKind& residual_kind();     // residual.cpp
const BlockOpKind& down_rotate_kind();  // rotation.cpp

}  // namespace socllm::block_ops
