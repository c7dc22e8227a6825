"""GPTQ's rounding (quant/gptq.h; Frantar et al. 2023, Algorithm 1) against a small numpy
implementation of the same algorithm on the same data, and against round-to-nearest: the
layer-output loss tr((W - Ŵ) H (W - Ŵ)ᵀ) it minimises must fall, at every width 2-8, for
per-tensor, per-channel and per-group scales and EdgeFlow's per-row widths."""

from __future__ import annotations

import numpy as np
import pytest
import socllm
from socllm import quant


def gptq_reference(W, H, bits, granularity, group_size, damp, block, act_order, row_bits=None):
    """GPTQ in float64 numpy, written from the paper: per column, quantize, divide the error by
    the inverse Hessian's Cholesky diagonal, spread it over the later columns; lazy blocks.
    Scales as quant/gptq.h documents them. Returns (codes, scales)."""
    W = W.astype(np.float64).copy()
    H = H.astype(np.float64).copy()
    out, n = W.shape
    bits_of = np.full(out, bits) if row_bits is None else np.asarray(row_bits)
    qmax = np.where(bits_of == 1, 1, 2.0 ** (bits_of - 1) - 1)
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(n)
    W0 = W.copy()
    W, H = W[:, perm], H[perm][:, perm]
    dead = np.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += damp * np.mean(np.diag(H)) * np.eye(n)
    U = np.linalg.cholesky(np.linalg.inv(H)).T  # upper: H⁻¹ = Uᵀ U

    def grid(v, b):
        return np.mean(np.abs(v)) if b == 1 else np.max(np.abs(v)) / (2.0 ** (b - 1) - 1)

    groups = n // group_size
    if granularity == "per-tensor":
        scale = np.full((out, n), grid(W0.astype(np.float32), bits))
    elif granularity == "per-channel":
        scale = np.array([[grid(W0[r].astype(np.float32), bits_of[r])] * n for r in range(out)])
    else:
        scale = np.zeros((out, n))
        if act_order:  # static groups from the original weights
            for g in range(groups):
                cols = slice(g * group_size, (g + 1) * group_size)
                scale[:, cols] = np.max(np.abs(W0[:, cols]), 1, keepdims=True) / qmax[:, None]
    if granularity == "per-group" and not act_order:
        block = max(group_size, block // group_size * group_size)
    Q = np.zeros((out, n))
    for i1 in range(0, n, block):
        i2 = min(i1 + block, n)
        err = np.zeros((out, i2 - i1))
        for i in range(i1, i2):
            col = perm[i]
            if granularity == "per-group" and not act_order and col % group_size == 0:
                cols = slice(i, i + group_size)
                scale[:, col : col + group_size] = (
                    np.max(np.abs(W[:, cols]), 1, keepdims=True) / (qmax[:, None])
                )
            s = scale[:, col]
            w = W[:, i]
            with np.errstate(divide="ignore", invalid="ignore"):
                q = np.where(s > 0, np.clip(np.round(w / s), -qmax - 1, qmax), 0)
            q = np.where(bits_of == 1, np.where(w >= 0, 1, -1), q)
            Q[:, col] = q
            e = (w - q * s) / U[i, i]
            W[:, i + 1 : i2] -= np.outer(e, U[i, i + 1 : i2])
            err[:, i - i1] = e
        W[:, i2:] -= err @ U[i1:i2, i2:]
    if granularity == "per-tensor":
        scales = scale[:1, 0]
    elif granularity == "per-channel":
        scales = scale[:, 0]
    else:
        scales = scale[:, ::group_size]
    return Q.astype(np.int8), scales


@pytest.fixture(scope="module")
def layer():
    """A [24, 64] weight and the Hessian of correlated inputs with an outlier channel."""
    rng = np.random.default_rng(4)
    X = 0.5 * rng.standard_normal((512, 64)) + 0.7 * rng.standard_normal((512, 1))
    X[:, 9] *= 8.0
    H = (X.T @ X / len(X)).astype(np.float32)
    return rng.standard_normal((24, 64)).astype(np.float32), H


def objective(W, Wh, H):
    return quant.gptq_objective(W, Wh.astype(np.float32), H)


@pytest.mark.parametrize("granularity", ["per-tensor", "per-channel", "per-group"])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_matches_numpy_and_beats_round_to_nearest(layer, granularity, act_order):
    W, H = layer
    for bits in range(2, 9):
        args = dict(bits=bits, granularity=granularity, group_size=16, damp=0.01, block=32)
        q, scales = quant.gptq(W, H, act_order=act_order, **args)
        q_ref, scales_ref = gptq_reference(W, H, act_order=act_order, **args)
        np.testing.assert_allclose(scales, scales_ref.reshape(scales.shape), rtol=1e-5)
        # float32 against float64: a code may flip where a value sits on a rounding edge
        assert (q == q_ref).mean() >= 0.98, (bits, (q != q_ref).sum())
        loss = objective(W, quant.dequantize(q, scales), H)
        ref_loss = objective(W, quant.dequantize(q_ref, scales_ref.astype(np.float32)), H)
        assert loss == pytest.approx(ref_loss, rel=0.02)
        q_rtn, s_rtn = quant.quantize(W, bits, granularity, 16)
        assert loss < objective(W, quant.dequantize(q_rtn, s_rtn), H), bits


def test_per_row_widths_keep_each_rows_grid(layer):
    W, H = layer
    row_bits = np.array([1 + r % 8 for r in range(W.shape[0])], dtype=np.uint8)
    q, scales = quant.gptq(W, H, granularity="per-channel", row_bits=row_bits)
    q_ref, scales_ref = gptq_reference(W, H, 8, "per-channel", 16, 0.01, 128, False, row_bits)
    np.testing.assert_allclose(scales, scales_ref, rtol=1e-5)
    assert (q == q_ref).mean() >= 0.98
    q_rtn, s_rtn = quant.quantize_rows(W, row_bits)
    rtn = (q_rtn * s_rtn[:, None]).astype(np.float32)
    assert objective(W, q * scales[:, None], H) < objective(W, rtn, H)


def test_bad_arguments_name_the_value(layer):
    W, H = layer
    with pytest.raises(socllm.ShapeError, match=r"H must be \[64, 64\]"):
        quant.gptq(W, H[:10, :10])
    with pytest.raises(socllm.InvalidArgumentError, match="damp"):
        quant.gptq(W, H, damp=0.0)
    with pytest.raises(socllm.InvalidArgumentError, match="per-channel"):
        quant.gptq(W, H, granularity="per-group", row_bits=np.full(24, 4, np.uint8))
