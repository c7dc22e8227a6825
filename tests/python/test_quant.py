"""Quantizers against an independent numpy reference of the documented rules."""

from __future__ import annotations

import numpy as np
import pytest
import socllm
from socllm import quant


def reference(W, bits, granularity, group_size=32):
    qmax = 127 if bits == 8 else 7
    rows, cols = W.shape
    block = {"per-tensor": rows * cols, "per-channel": cols, "per-group": group_size}[granularity]
    blocks = W.reshape(-1, block)
    scales = (np.abs(blocks).max(axis=1) / np.float32(qmax)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scales[:, None] > 0, np.round(blocks / scales[:, None]), 0)
    q = np.clip(q, -qmax - 1, qmax).astype(np.int8).reshape(rows, cols)
    return q, scales


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel", "per-group"])
def test_matches_reference(bits, granularity):
    rng = np.random.default_rng(bits)
    W = (rng.standard_normal((24, 96)) * rng.uniform(0.01, 3, (24, 1))).astype(np.float32)
    W[3] = 0.0  # an all-zero channel: scale 0, q 0
    q, s = quant.quantize(W, bits, granularity, 32)
    rq, rs = reference(W, bits, granularity)
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_array_equal(s.reshape(-1), rs)
    expected_shape = {"per-tensor": (1,), "per-channel": (24,), "per-group": (24, 3)}
    assert s.shape == expected_shape[granularity]
    deq = quant.dequantize(q, s)
    block = W.size // rs.size
    expected = (rq.reshape(-1, block).astype(np.float32) * rs[:, None]).reshape(W.shape)
    np.testing.assert_array_equal(deq, expected)
    # error bound of round-to-nearest: half a step per element
    step = np.repeat(rs, block).reshape(W.shape)
    assert (np.abs(deq - W) <= step / 2 + 1e-6).all()


def test_round_half_to_even_and_saturation():
    # scale = 127/127 = 1: x/scale are exact halves -> even neighbours
    x = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49]], np.float32)
    q, s = quant.quantize(x, 8, "per-tensor")
    assert s[0] == 1.0
    np.testing.assert_array_equal(q[0], [127, 0, 2, 2, 0, -2, -2, 3])
    a = np.array([0.5, 1.5, 300.0, -300.0, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(quant.quantize_static(a, 1.0, 8), [0, 2, 127, -128, 127, -128])
    np.testing.assert_array_equal(quant.quantize_static(a, 1.0, 4), [0, 2, 7, -8, 7, -8])


def test_group_size_and_bits_change_the_result():
    W = np.random.default_rng(1).standard_normal((8, 128)).astype(np.float32)
    errs = {}
    for bits, g, gs in [
        (8, "per-group", 32),
        (4, "per-group", 32),
        (4, "per-group", 128),
        (4, "per-channel", 32),
        (4, "per-tensor", 32),
    ]:
        errs[(bits, g, gs)] = np.abs(quant.dequantize(*quant.quantize(W, bits, g, gs)) - W).mean()
    assert errs[(8, "per-group", 32)] < errs[(4, "per-group", 32)]
    assert errs[(4, "per-group", 32)] < errs[(4, "per-group", 128)]
    assert errs[(4, "per-channel", 32)] <= errs[(4, "per-tensor", 32)]


def test_bad_input():
    W = np.ones((4, 10), np.float32)
    with pytest.raises(socllm.InvalidArgumentError, match=r"bits must be in 2..8, got 9"):
        quant.quantize(W, 9)
    with pytest.raises(socllm.InvalidArgumentError, match="group_size 4 .* row length 10"):
        quant.quantize(W, 8, "per-group", 4)
    with pytest.raises(socllm.InvalidArgumentError, match="per-row"):
        quant.quantize(W, 8, "per-row")
    bad = W.copy()
    bad[1, 2] = np.nan
    with pytest.raises(socllm.InvalidArgumentError, match="flat index 12"):
        quant.quantize(bad)
    with pytest.raises(socllm.ShapeError, match="2-D"):
        quant.quantize(np.ones(5, np.float32))
    with pytest.raises(socllm.InvalidArgumentError, match="scale"):
        quant.quantize_static(W, 0.0)
    with pytest.raises(socllm.InvalidArgumentError, match="NaN at index 12"):
        quant.quantize_static(bad, 1.0)
    with pytest.raises(socllm.ShapeError, match="scales do not tile"):
        quant.dequantize(np.ones((4, 10), np.int8), np.ones(3, np.float32))
