"""Paired statistics for comparing two plans on the same documents (scripts/plan_accuracy.py,
socllm sweep): the mean difference, its standard error and a paired bootstrap interval.

When two plans score the same documents, their difference is best judged per document: the
standard error of the mean paired difference is usually far smaller than that of either mean,
since most of the document-to-document variance is shared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def paired_difference(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[float, float]:
    """(mean of ``b[k] - a[k]``, standard error of that mean) over the keys both score; the
    standard error uses the sample variance (n - 1), and is 0 for a single key. Both are NaN
    when no key is shared."""
    keys = sorted(a.keys() & b.keys())
    if not keys:
        return float("nan"), float("nan")
    d = [b[k] - a[k] for k in keys]
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / max(len(d) - 1, 1)
    return mean, math.sqrt(var / len(d))


BOOTSTRAP_RESAMPLES = 10_000
_BOOTSTRAP_BLOCK = 500  # resamples drawn at a time (memory: block x documents indices)


def paired_bootstrap_ci(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean paired difference ``b[k] - a[k]`` over the
    shared keys: documents are resampled with replacement, each keeping its pair together
    (Efron & Tibshirani 1993, ch. 13; the paired design of Koehn 2004 for MT metrics). Unlike
    mean ± 1.96 se it stays inside the possible range and is asymmetric where differences are
    few (0/1 scores with most pairs equal). Deterministic for a given ``seed``. NaN, NaN when no
    key is shared."""
    import numpy as np

    if not 0 < level < 1:
        raise ValueError(f"paired_bootstrap_ci: level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"paired_bootstrap_ci: resamples must be >= 1, got {resamples}")
    keys = sorted(a.keys() & b.keys())
    if not keys:
        return float("nan"), float("nan")
    d = np.array([b[k] - a[k] for k in keys], dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for lo in range(0, resamples, _BOOTSTRAP_BLOCK):
        hi = min(lo + _BOOTSTRAP_BLOCK, resamples)
        means[lo:hi] = d[rng.integers(0, len(d), size=(hi - lo, len(d)))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)
