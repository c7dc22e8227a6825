"""The Hadamard transform of issue 39's rotations against scipy's Sylvester matrices and the
defining property of Paley's; errors name the offending value."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import socllm

ops = socllm.ops


@pytest.mark.parametrize("n", [1, 2, 16, 64, 256])
def test_sylvester_sizes_equal_scipys_hadamard(n):
    t = ops.HadamardTransform(n)
    assert t.construction == f"sylvester({n})"
    np.testing.assert_allclose(t.matrix() * np.sqrt(n), scipy.linalg.hadamard(n), atol=1e-5)


@pytest.mark.parametrize("n", [12, 576, 640, 1536])
def test_the_models_sizes_are_orthonormal_and_apply_is_the_matrix(n):
    t = ops.HadamardTransform(n)
    M = t.matrix().astype(np.float64)
    np.testing.assert_allclose(M @ M.T, np.eye(n), atol=1e-5)
    x = np.random.default_rng(n).standard_normal((2, 3, n)).astype(np.float32)
    for path in ("vector", "scalar"):
        y = t.apply(x, path=path)
        assert y.shape == x.shape
        np.testing.assert_allclose(y, x @ M.T, atol=3e-5)
        np.testing.assert_allclose(t.apply(y, transpose=True, path=path), x, atol=3e-5)
    np.testing.assert_array_equal(t.apply(x, path="scalar"), t.apply(x))


def test_bad_sizes_shapes_and_paths_are_errors():
    with pytest.raises(socllm.InvalidArgumentError, match="no construction for size 9"):
        ops.HadamardTransform(9)
    t = ops.HadamardTransform(12)
    with pytest.raises(socllm.ShapeError, match=r"end in 12 values, got shape \[3, 5\]"):
        t.apply(np.zeros((3, 5), np.float32))
    with pytest.raises(socllm.InvalidArgumentError, match="path must be vector or scalar, got avx"):
        t.apply(np.zeros(12, np.float32), path="avx")
