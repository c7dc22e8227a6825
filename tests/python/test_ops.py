"""socllm.ops.gemm_*: exact against numpy's int64 matmul on every dispatch path this CPU has."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import socllm
from socllm import ops

ISAS = ops.supported_isas()
# (16, 16, 64), (48, 40, 128) and (33, 31, 1000)'s first 32 rows are whole AMX tiles.
SIZES = [
    (1, 1, 1),
    (3, 5, 7),
    (4, 4, 64),
    (7, 13, 65),
    (17, 9, 127),
    (16, 16, 64),
    (48, 40, 128),
    (33, 31, 1000),
    (2, 3, 0),
]


def ref(A, B):
    return (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32)


def test_isa_names():
    assert ISAS[0] == "scalar" and set(ISAS) <= {"scalar", "avx2", "avx512-vnni", "amx-int8"}
    if not os.environ.get("SOCLLM_MAX_ISA"):
        assert ops.isa() == ISAS[-1]


def _isa_with_cap(cap: str) -> subprocess.CompletedProcess:
    code = "import socllm.ops as o; print(o.isa())"
    env = {**os.environ, "SOCLLM_MAX_ISA": cap}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )


def test_max_isa_caps_the_dispatch():
    for cap in ISAS:  # every path the CPU has is reachable; a wider cap changes nothing
        assert _isa_with_cap(cap).stdout.strip() == cap
    r = _isa_with_cap("avx1024")
    assert (
        r.returncode != 0 and "SOCLLM_MAX_ISA: [isa] unknown instruction set 'avx1024'" in r.stderr
    )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k", SIZES)
def test_s8s8_random(isa, m, n, k):
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    A = rng.integers(-128, 128, (m, k), dtype=np.int8)
    B = rng.integers(-128, 128, (k, n), dtype=np.int8)
    A0, B0 = A.copy(), B.copy()
    C = ops.gemm_s8s8s32(A, B, isa=isa)
    assert C.dtype == np.int32 and C.shape == (m, n) and C.flags.c_contiguous
    np.testing.assert_array_equal(C, ref(A, B))
    np.testing.assert_array_equal(A, A0)  # inputs untouched
    np.testing.assert_array_equal(B, B0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k", SIZES)
def test_u8s8_random(isa, m, n, k):
    rng = np.random.default_rng(m + n + k)
    A = rng.integers(0, 256, (m, k), dtype=np.uint8)
    B = rng.integers(-128, 128, (k, n), dtype=np.int8)
    np.testing.assert_array_equal(ops.gemm_u8s8s32(A, B, isa=isa), ref(A, B))


@pytest.mark.parametrize("isa", ISAS)
def test_extremes_and_views(isa):
    k = 4099  # not a multiple of any vector width; -128*-128 products everywhere
    A = np.full((5, k), -128, np.int8)
    B = np.full((k, 6), -128, np.int8)
    C = ops.gemm_s8s8s32(A, B, isa=isa)
    assert (C == 128 * 128 * k).all()
    rng = np.random.default_rng(3)
    big = rng.integers(-128, 128, (40, 300), dtype=np.int8)
    A, B = big[::2, 1:201], big[1::3, 50:250].T  # strided and transposed views
    np.testing.assert_array_equal(ops.gemm_s8s8s32(A, B, isa=isa), ref(A, B))
    U = np.full((3, 70), 255, np.uint8)
    W = np.full((70, 2), -128, np.int8)
    assert (ops.gemm_u8s8s32(U, W, isa=isa) == -255 * 128 * 70).all()


def test_bad_arguments():
    A = np.zeros((2, 3), np.int8)
    with pytest.raises(socllm.ShapeError, match=r"\[2, 3\].*\[4, 5\]"):
        ops.gemm_s8s8s32(A, np.zeros((4, 5), np.int8))
    with pytest.raises(socllm.InvalidArgumentError, match="int16"):
        ops.gemm_s8s8s32(A.astype(np.int16), np.zeros((3, 5), np.int8))
    with pytest.raises(socllm.InvalidArgumentError, match="uint8"):
        ops.gemm_s8s8s32(A, np.zeros((3, 5), np.uint8))
    with pytest.raises(socllm.InvalidArgumentError, match="uint8 array"):
        ops.gemm_u8s8s32(A, np.zeros((3, 5), np.int8))
    with pytest.raises(socllm.ShapeError, match="2-D"):
        ops.gemm_s8s8s32(np.zeros(3, np.int8), np.zeros((3, 5), np.int8))
    with pytest.raises(socllm.InvalidArgumentError, match="sse9"):
        ops.gemm_s8s8s32(A, np.zeros((3, 5), np.int8), isa="sse9")


def test_linear_f32_matches_numpy():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 33), dtype=np.float32)
    W = rng.standard_normal((17, 33), dtype=np.float32)
    np.testing.assert_allclose(ops.linear_f32(x, W), x @ W.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(socllm.ShapeError, match=r"\[9, 33\] and \[33, 17\]"):
        ops.linear_f32(x, W.T)


@pytest.mark.parametrize("isa", ISAS)
def test_threaded_large_problem(isa):
    """Large enough for the multi-threaded column split, with an odd N tail."""
    rng = np.random.default_rng(9)
    A = rng.integers(-128, 128, (70, 515), dtype=np.int8)
    B = rng.integers(-128, 128, (515, 203), dtype=np.int8)
    np.testing.assert_array_equal(ops.gemm_s8s8s32(A, B, isa=isa), ref(A, B))


@pytest.mark.parametrize("isa", ISAS)
def test_prepacked_weights(isa):
    rng = np.random.default_rng(12)
    B = rng.integers(-128, 128, (300, 70), dtype=np.int8)
    W = ops.PackedWeightsS8(B)
    assert W.shape == (300, 70) and W.bytes >= B.nbytes
    for m in (1, 13):
        A = rng.integers(-128, 128, (m, 300), dtype=np.int8)
        np.testing.assert_array_equal(ops.gemm_s8s8s32(A, W, isa=isa), ref(A, B))
        for n_cols in (0, 17, 70):  # a causal block's visible prefix of the columns
            C = ops.gemm_s8s8s32(A, W, isa=isa, n_cols=n_cols)
            np.testing.assert_array_equal(C, ref(A, B)[:, :n_cols])
    with pytest.raises(socllm.ShapeError, match="300"):
        ops.gemm_s8s8s32(np.zeros((2, 299), np.int8), W)
    with pytest.raises(socllm.InvalidArgumentError, match=r"n_cols must be in \[0, 70\], got 71"):
        ops.gemm_s8s8s32(A, W, n_cols=71)
    with pytest.raises(socllm.InvalidArgumentError, match="int8"):
        ops.PackedWeightsS8(B.astype(np.int16))


def test_grouped_gemm_matches_numpy_and_every_path_gives_the_same_bits():
    """Q8_0 x Q8_0 on real quantizer output: numpy's per-group int64 dots scaled and summed in
    float64 agree to float32 rounding, and every path returns the same bits (gemm_s8.h)."""
    rng = np.random.default_rng(5)
    M, K, N, G = 37, 192, 70, 32
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    A, sa = socllm.quant.quantize(x, 8, "per-group", G)
    B, sw = socllm.quant.quantize(w, 8, "per-group", G)
    W = ops.PackedGroupedWeightsS8(np.asfortranarray(B.T), sw, G)
    assert W.shape == (K, N) and W.group_size == G
    dots = np.einsum("mgk,ngk->mng", A.reshape(M, -1, G).astype(np.int64), B.reshape(N, -1, G))
    want = (dots * (sa[:, None, :].astype(np.float64) * sw[None, :, :])).sum(-1)
    outs = [ops.gemm_grouped_s8s8f32(A, sa, W, isa=isa) for isa in ISAS]
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    for isa, out in zip(ISAS[1:], outs[1:], strict=True):
        np.testing.assert_array_equal(out, outs[0], err_msg=isa)
    with pytest.raises(socllm.ShapeError, match=r"\[37, 5\]"):
        ops.gemm_grouped_s8s8f32(A, sa[:, :5], W)
    with pytest.raises(socllm.ShapeError, match="group_size=5"):
        ops.PackedGroupedWeightsS8(np.asfortranarray(B.T), sw, 5)
