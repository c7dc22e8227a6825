"""Symmetric int8/int4 quantizers of the C++ core (rules: cpp/quant/quant.h).

- ``quantize(W, bits=8, granularity="per-channel", group_size=32) -> (q, scales)``:
  ``scale = max|x| / qmax`` per tensor, output channel (row) or group of ``group_size``
  consecutive inputs; ``q = saturate(round_half_even(W / scale))`` into ``[-qmax-1, qmax]``.
- ``dequantize(q, scales)``: ``q * scale``.
- ``quantize_static(x, scale, bits=8)``: activations with a calibrated per-tensor scale.
- ``gptq(W, H, bits=8, granularity="per-channel", group_size=32, damp=0.01, block=128,
  act_order=False, row_bits=None) -> (q, scales)``: GPTQ's error-compensating rounding against
  the inputs' Hessian ``H = XᵀX / n`` (cpp/quant/gptq.h; Frantar et al. 2023), the scales of
  ``quantize`` / ``quantize_rows``; ``gptq_objective(W, W_hat, H)``: the loss it minimises.

- EdgeFlow's per-channel bit-widths (seed 004 §4.1, cpp/quant/bitwidth.h): ``quantize_rows``,
  ``error_table`` (a channel's error at 1..8 bits, closed-form or exact), ``allocate_bits``
  (greedy / uniform / int4-int8 / cmpq), ``allocate_bits_greedy``, ``allocate_bits_dp``,
  ``allocate_bits_waterfill``, ``allocate_bits_budgeted``, ``allocation_error``,
  ``allocation_cost``, ``total_bits``.
- ``stored_weight_bytes(scheme, out_features, in_features)``: the bytes a linear of a scheme
  stores (one formula for the engine, the graph and the profiler).
"""

from ._core.quant import (  # noqa: F401
    allocate_bits,
    allocate_bits_budgeted,
    allocate_bits_dp,
    allocate_bits_greedy,
    allocate_bits_waterfill,
    allocation_cost,
    allocation_error,
    dequantize,
    error_table,
    gptq,
    gptq_objective,
    quantize,
    quantize_rows,
    quantize_static,
    stored_weight_bytes,
    total_bits,
)
