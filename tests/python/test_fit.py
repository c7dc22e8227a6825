"""The dense fits on Eigen (cpp/soc/fit.h) against numpy and scipy on the same data."""

from __future__ import annotations

import numpy as np
import pytest
import socllm
from scipy.optimize import least_squares
from socllm.sim import fit_roofline, least_squares_bounded, linear_least_squares, polyfit


def test_linear_least_squares_is_numpys():
    rng = np.random.default_rng(0)
    A, b, w = rng.normal(size=(40, 5)), rng.normal(size=40), rng.uniform(0.1, 2, 40)
    np.testing.assert_allclose(linear_least_squares(A, b), np.linalg.lstsq(A, b)[0], atol=1e-12)
    sw = np.sqrt(w)
    want = np.linalg.lstsq(A * sw[:, None], b * sw)[0]
    np.testing.assert_allclose(linear_least_squares(A, b, w), want, atol=1e-12)
    # a repeated column (rank 4): still a least-squares solution, with numpy's residual
    A[:, 4] = A[:, 3]
    x = np.asarray(linear_least_squares(A, b))
    r_np = b - A @ np.linalg.lstsq(A, b)[0]
    assert np.linalg.norm(b - A @ x) == pytest.approx(np.linalg.norm(r_np), rel=1e-10)


def test_polyfit_is_numpys():
    x = np.array([1.0, 2.0, 4.0])
    y = np.array([2.0, 3.0, 4.0])  # seed 000 §3.4's NPU Q·K latencies, ms by heads
    np.testing.assert_allclose(polyfit(x, y, 1), np.polyfit(x, y, 1), atol=1e-12)
    rng = np.random.default_rng(1)
    x, y = rng.uniform(-2, 2, 30), rng.normal(size=30)
    np.testing.assert_allclose(polyfit(x, y, 3), np.polyfit(x, y, 3), atol=1e-10)


def test_roofline_fit_is_the_numpy_search():
    """The grid search of the profile fit, written again in numpy on Table 3-like rows."""
    flops = np.array([2 * 64 * 2048 * 2048, 2 * 256 * 2048 * 5632, 2 * 1024 * 4096 * 4096.0])
    wbytes = np.array([2048 * 2048, 2048 * 5632, 4096 * 4096.0])
    t_us = np.array([1200.0, 5400.0, 38000.0])
    gops = 900.0
    best = None
    for gbps in np.logspace(-3, 3, 6001):
        roof = np.maximum(flops / (gops * 1e3), wbytes / (gbps * 1e3))
        w = 1.0 / t_us**2
        a = max(0.0, float(np.sum(w * (t_us - roof)) / np.sum(w)))
        err = float(np.sum(((a + roof) / t_us - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, a, gbps)
    r = fit_roofline(flops, wbytes, t_us, gops)
    assert r["weight_gbps"] == pytest.approx(best[2], rel=1e-12)
    assert r["overhead_us"] == pytest.approx(best[1], rel=1e-9)
    assert r["squared_relative_error"] == pytest.approx(best[0], rel=1e-9)


def _decay(x, t, y):
    return x[0] * np.exp(-x[1] * t) + x[2] - y


@pytest.mark.parametrize("bounded", [False, True])
def test_bounded_least_squares_matches_scipy(bounded):
    """An exponential decay fitted to noisy points, free and with a bound that binds: the same
    optimum as scipy.optimize.least_squares."""
    rng = np.random.default_rng(2)
    t = np.linspace(0, 4, 25)
    y = 2.5 * np.exp(-1.3 * t) + 0.4 + rng.normal(0, 0.02, t.size)
    lo, hi = ([0.0, 0.0, 0.0], [10.0, 1.0, 1.0]) if bounded else (None, None)
    ours = least_squares_bounded(lambda x: _decay(np.asarray(x), t, y), [1.0, 0.5, 0.0], lo, hi)
    ref = least_squares(
        _decay, [1.0, 0.5, 0.0], args=(t, y), bounds=(lo, hi) if bounded else (-np.inf, np.inf)
    )
    assert ours["converged"]
    np.testing.assert_allclose(ours["x"], ref.x, rtol=1e-5, atol=1e-6)
    assert ours["cost"] == pytest.approx(ref.cost, rel=1e-8)
    if bounded:
        assert ours["x"][1] == 1.0  # the rate sits on its bound


def test_fit_bad_input():
    with pytest.raises(socllm.ShapeError, match="b has 3 values, expected 4"):
        linear_least_squares(np.ones((4, 2)), np.ones(3))
    with pytest.raises(socllm.InvalidArgumentError, match=r"b\[1\] = nan is not finite"):
        linear_least_squares(np.ones((2, 1)), [1.0, np.nan])
    with pytest.raises(socllm.InvalidArgumentError, match="degree 2 needs more than 2 points"):
        polyfit([1.0, 2.0], [1.0, 2.0], 2)
    with pytest.raises(socllm.InvalidArgumentError, match=r"t_us\[0\] = 0.000000 must be > 0"):
        fit_roofline([1.0], [1.0], [0.0], 10.0)
    with pytest.raises(socllm.InvalidArgumentError, match=r"residuals\[0\] = inf"):
        least_squares_bounded(lambda x: [np.inf], [1.0])
    with pytest.raises(socllm.InvalidArgumentError, match="bounds of parameter 0 are empty"):
        least_squares_bounded(lambda x: [x[0]], [1.0], [2.0], [1.0])
