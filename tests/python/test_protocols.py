"""The shared evaluation pieces against brute force: the perplexity windows
(socllm.eval.perplexity.sliding_windows) and paired differences (socllm.eval.stats)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from socllm.eval.perplexity import sliding_windows
from socllm.eval.stats import paired_difference


@pytest.mark.parametrize(
    "n,context,stride",
    [(2, 2, 2), (10, 4, 4), (10, 4, 1), (10, 4, 3), (11, 4, 4), (9, 4, 4), (5, 8, 8), (100, 7, 5)],
)
def test_windows_score_each_token_once_in_its_first_window(n, context, stride):
    spans = sliding_windows(n, context, stride)
    scored = []
    for begin, end, keep in spans:
        assert 0 <= begin < end <= n and end - begin <= context and 1 <= keep <= end - begin - 1
        scored.extend(range(end - keep, end))  # targets of the window's last `keep` predictions
    # brute force: token t is scored by the first window that reaches past it, if that window
    # also holds t - 1 (a window's first token has no prediction)
    first_begin = {t: next(b for b in range(0, n, stride) if b + context > t) for t in range(n)}
    assert scored == [t for t in range(1, n) if first_begin[t] < t]
    if stride < context:  # overlapping windows: every token but the first is scored
        assert scored == list(range(1, n))


def test_windows_non_overlapping_score_n_minus_windows():
    assert sliding_windows(10, 4, 4) == [(0, 4, 3), (4, 8, 3), (8, 10, 1)]  # 10 - 3 scored
    assert sliding_windows(9, 4, 4) == [(0, 4, 3), (4, 8, 3)]  # [8, 9) predicts nothing
    assert sliding_windows(10, 4, 3) == [(0, 4, 3), (3, 7, 3), (6, 10, 3)]
    assert sliding_windows(1, 4, 4) == []


def test_paired_difference_matches_numpy():
    rng = np.random.default_rng(0)
    a = {f"d{i}": float(rng.integers(0, 2)) for i in range(50)}
    b = {f"d{i}": float(rng.integers(0, 2)) for i in range(10, 60)}  # 40 shared keys
    mean, se = paired_difference(a, b)
    d = np.array([b[k] - a[k] for k in sorted(a.keys() & b.keys())])
    assert mean == pytest.approx(d.mean()) and se == pytest.approx(d.std(ddof=1) / math.sqrt(40))
    assert paired_difference(a, a) == (0.0, 0.0)
    assert paired_difference({"x": 1.0}, {"x": 0.0}) == (-1.0, 0.0)
    assert all(math.isnan(v) for v in paired_difference({"x": 1.0}, {"y": 1.0}))
