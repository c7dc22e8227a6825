// Which kind runs and times each op of the block (model/decoder_block.h).
#include "block/ops/ops.h"

namespace socllm {

namespace block_ops {

namespace {
// What every op's description carries: its name, class, kind and format.
soc::OpDesc op_desc(const BlockOpInfo& op, soc::OpKind kind, soc::DType format) {
  soc::OpDesc o;
  o.kind = kind;
  o.name = op.name;
  o.op_class = op_class_name(op.op_class);
  o.dtype = format;
  return o;
}
}  // namespace

soc::OpDesc matmul(const BlockOpInfo& op, soc::DType format, int64_t m, int64_t k, int64_t n) {
  soc::OpDesc o = op_desc(op, soc::OpKind::MatMul, format);
  o.m = m;
  o.k = k;
  o.n = n;
  o.weight_bytes = k * n * soc::dtype_bytes(format);
  o.activation_bytes = m * (k + n) * soc::dtype_bytes(format);
  return o;
}

soc::OpDesc elementwise(const BlockOpInfo& op, soc::DType format, int64_t elements,
                        int64_t weight_bytes, int64_t activation_values) {
  soc::OpDesc o = op_desc(op, soc::OpKind::Elementwise, format);
  o.elements = elements;
  o.weight_bytes = weight_bytes;
  o.activation_bytes = activation_values * soc::dtype_bytes(format);
  return o;
}

}  // namespace block_ops

const BlockOpKind& block_op_kind(BlockOp op) {
  using namespace block_ops;
  switch (op) {
    case BlockOp::AttnNorm:
    case BlockOp::QkNorm:
    case BlockOp::PostAttnNorm:
    case BlockOp::FfnNorm:
    case BlockOp::PostFfnNorm: return norm_kind();
    case BlockOp::Qkv:
    case BlockOp::OProj:
    case BlockOp::GateUp:
    case BlockOp::Down: return linear_kind();
    case BlockOp::Rope: return rope_kind();
    case BlockOp::Attention: return attention_kind();
    case BlockOp::Act: return activation_kind();
    case BlockOp::DownRotate: return down_rotate_kind();
    case BlockOp::AttnResidual:
    case BlockOp::FfnResidual: return residual_kind();
  }
  throw InvalidArgument("[block] no kind for op " + std::to_string(static_cast<int>(op)));
}

}  // namespace socllm
