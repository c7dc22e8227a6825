"""Symmetric int8/int4 quantizers of the C++ core (rules: cpp/include/socllm/quant.h).

- ``quantize(W, bits=8, granularity="per-channel", group_size=32) -> (q, scales)``:
  ``scale = max|x| / qmax`` per tensor, output channel (row) or group of ``group_size``
  consecutive inputs; ``q = saturate(round_half_even(W / scale))`` into ``[-qmax-1, qmax]``.
- ``dequantize(q, scales)``: ``q * scale``.
- ``quantize_static(x, scale, bits=8)``: activations with a calibrated per-tensor scale.
"""

from ._core.quant import dequantize, quantize, quantize_static  # noqa: F401
