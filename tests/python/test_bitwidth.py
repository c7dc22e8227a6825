"""EdgeFlow's per-channel bit-widths and packed format (seed 004 §4.1-4.2) against independent
numpy references: the B-bit row quantizer, the relative-error metric, Algorithm 1 against brute
force, and the weightlet layout decoded from its written definition (weightlet.h)."""

import itertools

import numpy as np
import pytest
import socllm
from socllm import ops, quant


def _rows(rows, cols, seed):
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.standard_normal((rows, 1)))
    return (scale * rng.standard_t(3.0, (rows, cols))).astype(np.float32)


def _quantize_row_ref(w: np.ndarray, bits: int):
    if bits == 1:
        return np.where(w >= 0, 1, -1).astype(np.int8), np.float32(
            np.abs(w.astype(np.float64)).mean()
        )
    qmax = 2 ** (bits - 1) - 1
    scale = np.float32(np.abs(w).max() / np.float32(qmax))
    if scale == 0:
        return np.zeros_like(w, np.int8), scale
    return np.clip(np.round(w / scale), -qmax - 1, qmax).astype(np.int8), scale


def test_row_quantizer_and_metric_match_numpy():
    W = _rows(12, 96, 0)
    for bits in range(1, 9):
        q, s = quant.quantize_rows(W, np.full(12, bits))
        for i in range(12):
            qr, sr = _quantize_row_ref(W[i], bits)
            np.testing.assert_array_equal(q[i], qr)
            assert s[i] == pytest.approx(sr, rel=1e-6)
    closed = quant.error_table(W, "closed-form")
    exact = quant.error_table(W, "exact")
    w64 = W.astype(np.float64)
    ratio = (np.abs(w64).max(1) ** 2) / (w64**2).mean(1)
    for b in range(1, 9):
        np.testing.assert_allclose(closed[:, b - 1], 4.0**-b * ratio, rtol=1e-12)
        q, s = quant.quantize_rows(W, np.full(12, b))
        deq = q.astype(np.float64) * s[:, None].astype(np.float64)
        cos = (w64 * deq).sum(1) / np.linalg.norm(w64, axis=1) / np.linalg.norm(deq, axis=1)
        np.testing.assert_allclose(exact[:, b - 1], 1 - cos, atol=1e-12)


def test_greedy_equals_brute_force_on_the_closed_form():
    W = _rows(4, 64, 1)
    t = quant.error_table(W, "closed-form")
    for total in range(4, 33):
        best = min(
            (sum(t[i, b[i] - 1] for i in range(4)), b)
            for b in itertools.product(range(1, 9), repeat=4)
            if sum(b) == total
        )
        g = quant.allocate_bits_greedy(t, total)
        assert g.sum() == total
        assert t[np.arange(4), g.astype(int) - 1].sum() == pytest.approx(best[0], rel=1e-12)
        d = quant.allocate_bits_dp(t, total)
        assert t[np.arange(4), d.astype(int) - 1].sum() == pytest.approx(best[0], rel=1e-12)


def test_allocation_methods_and_bad_budgets():
    W = _rows(32, 64, 2)
    t = quant.error_table(W)
    assert quant.allocate_bits(t, 5.0).sum() == 160
    assert set(quant.allocate_bits(t, 5.0, "int4-int8").tolist()) == {4, 8}
    assert set(quant.allocate_bits(t, 5.0, "cmpq").tolist()) == {4, 5, 6}
    wf = quant.allocate_bits_waterfill(W, 160)
    assert wf.sum() == 160 and wf.min() >= 1 and wf.max() <= 8
    for bad in (0.0, 8.01, float("nan")):
        with pytest.raises(socllm.InvalidArgumentError, match="budget must be in"):
            quant.allocate_bits(t, bad)
    with pytest.raises(socllm.InvalidArgumentError, match="unknown allocation 'best'"):
        quant.allocate_bits(t, 5.0, "best")
    with pytest.raises(socllm.ShapeError, match=r"\[rows, 8\]"):
        quant.allocate_bits(t[:, :4], 5.0)
    with pytest.raises(socllm.InvalidArgumentError, match="row 1 has bits 9"):
        quant.quantize_rows(W[:2], [4, 9])


def _unpack_ref(data: np.ndarray, bits: np.ndarray, cols: int, group: int) -> np.ndarray:
    """The weightlet layout decoded from its definition in weightlet.h, in numpy."""
    parts = {1: [1], 2: [2], 3: [1, 2], 4: [4], 5: [1, 4], 6: [2, 4], 7: [1, 2, 4], 8: [4, 4]}
    out = np.zeros((len(bits), cols), np.int16)
    off = 0
    for i, b in enumerate(bits.tolist()):
        row = data[off : off + cols * b // 8].astype(np.int32)
        off += cols * b // 8
        for g0 in range(0, cols, group):
            G = min(group, cols - g0)
            bb = G // 8
            blocks = row[g0 * b // 8 : g0 * b // 8 + G * b // 8].reshape(b, bb)
            t = np.arange(G)
            s, k = t // bb, t % bb
            u = np.zeros(G, np.int32)
            first, shift = 0, b
            for w in parts[b]:
                shift -= w
                p = s % (8 // w)
                byte = blocks[first + s // (8 // w), k]
                u |= ((byte >> (8 - w * (p + 1))) & ((1 << w) - 1)) << shift
                first += w
            out[i, g0 : g0 + G] = 2 * u - 1 if b == 1 else u - 2 ** (b - 1)
    assert off == len(data)
    return out.astype(np.int8)


@pytest.mark.parametrize("cols,group", [(576, 128), (576, 64), (1536, 256), (136, 128), (48, 24)])
def test_weightlet_layout_matches_its_definition(cols, group):
    rng = np.random.default_rng(cols + group)
    bits = rng.integers(1, 9, 24).astype(np.uint8)
    W = _rows(24, cols, 3)
    q, _ = quant.quantize_rows(W, bits)
    p = ops.WeightletTensor.pack(q, bits, group)
    assert p.bytes == int((bits.astype(int) * cols // 8).sum()) + (3 * 24 + 7) // 8
    np.testing.assert_array_equal(_unpack_ref(p.data, bits, cols, group), q)
    for isa in ops.supported_unpack_isas():
        np.testing.assert_array_equal(p.unpack(isa), q)
    again = ops.WeightletTensor(24, cols, group, p.bit_metadata, p.data)
    np.testing.assert_array_equal(again.bits, bits)
    with pytest.raises(socllm.FormatError, match="metadata implies"):
        ops.WeightletTensor(24, cols, group, p.bit_metadata, p.data[:-1])


def test_budgeted_allocation_binding():
    """allocate_bits_budgeted with cost = bits is Algorithm 1 (C++ tests hold the rest)."""
    W = _rows(12, 40, 9)
    t = quant.error_table(W, "closed-form")
    cost = np.tile(np.arange(1, 9, dtype=np.float64), (12, 1))
    for total in (12, 40, 61, 96):
        b = quant.allocate_bits_budgeted(t, cost, float(total))
        np.testing.assert_array_equal(b, quant.allocate_bits_greedy(t, total))
        assert quant.allocation_cost(cost, b) == total
        assert quant.allocation_error(t, b) == pytest.approx(t[np.arange(12), b - 1].sum())
    with pytest.raises(socllm.ShapeError, match="cost has 11 rows"):
        quant.allocate_bits_budgeted(t, cost[:11], 40.0)
    with pytest.raises(socllm.InvalidArgumentError, match="below the cheapest"):
        quant.allocate_bits_budgeted(t, cost, 11.0)
    with pytest.raises(socllm.ShapeError, match="bits must be \\[12\\]"):
        quant.allocation_cost(cost, np.ones(5, np.uint8))
