"""Exact kernels of the C++ core, for tests and experiments.

- ``gemm_s8s8s32(A, B, isa=None)``: int32 ``A @ B`` for int8 ``A [M, K]``, int8 ``B [K, N]``.
  ``B`` may also be a ``PackedWeightsS8(B)``: weights prepared once for many calls.
- ``gemm_u8s8s32(A, B, isa=None)``: the same with uint8 ``A`` (the form VNNI computes).
- ``gemm_grouped_s8s8f32(A, a_scales, W, isa=None)``: float32 per-group product (llama.cpp's
  Q8_0 x Q8_0) of int8 ``A [M, K]`` with scales ``[M, K / G]`` and
  ``W = PackedGroupedWeightsS8(B [K, N], scales [N, K / G], G)``: exact int32 dots per group,
  summed over groups in order with one fma each (the w8-group and w4-group plans' linears).
- ``isa()``: the path used by default on this CPU (``amx-int8``, ``avx512-vnni``, ``avx2`` or
  ``scalar``; ``amx-int8`` runs whole 16-row blocks on AMX tiles when K is a multiple of 64,
  or for the grouped GEMM a group 4..64 k or a multiple of 64, and the rest on VNNI);
  ``supported_isas()``: every path this CPU can run (``isa=`` forces one).
- ``linear_f32(x, W)``: fp32 ``x @ W.T`` with the engine's OpenBLAS sgemm (the benchmarks' peer).

Inputs are not modified; A is used in place when C-contiguous (else copied), B is copied once
into the kernels' [N, K] layout. The result is a new C-contiguous int32 array.

- Sparse attention (seed 000; cpp/attention/): ``attention_schemes()`` (each scheme's
  options), ``prefill_attention(q, k, v, scheme, ...)`` (one layer, head-major arrays),
  ``topk_indices``, ``topk_rows`` (the row-after-row selection of a prefill block),
  ``keys_kept``, ``bucket_offsets``, ``nearest_bucket``, ``head_keep_ratios``.
- EdgeFlow's packed weights: ``WeightletTensor``, ``weightlet_parts``,
  ``supported_unpack_isas``.
- Rotations (issue 39): ``HadamardTransform(n)`` (H_n / sqrt(n) by Paley x Sylvester:
  ``apply``, ``matrix``, ``construction``), ``rotation_matrix(rotate, d, seed)`` (the Q of
  ``socllm.load(..., rotate=...)``).
- Host synchronization (cpp/core/handoff.h): ``measure_handoff(method, ...)``,
  ``wait_methods()``.
"""

from ._core import measure_handoff, wait_methods  # noqa: F401
from ._core.ops import (  # noqa: F401
    HadamardTransform,
    PackedGroupedWeightsS8,
    PackedWeightsS8,
    WeightletTensor,
    attention_schemes,
    bucket_offsets,
    gemm_grouped_s8s8f32,
    gemm_s8s8s32,
    gemm_u8s8s32,
    head_keep_ratios,
    isa,
    keys_kept,
    linear_f32,
    max_exact_k,
    nearest_bucket,
    prefill_attention,
    rotation_matrix,
    supported_isas,
    supported_unpack_isas,
    topk_indices,
    topk_rows,
    weightlet_parts,
)
