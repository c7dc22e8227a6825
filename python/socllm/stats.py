"""Paired statistics for comparing two plans on the same documents (scripts/plan_accuracy.py).

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
