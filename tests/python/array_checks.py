"""Comparisons of large arrays (a model's logits) in row blocks.

Whole-array numpy expressions on [544, 262144] float32 logits (Gemma 3's vocabulary) allocate
temporaries of 570 MB each. On the 2-core VMs of CI their first touch was slow and erratic
(``np.abs(a - b).max()``: 0.4-7 s; one ``np.testing.assert_allclose``: 39 s, with numpy's huge
pages on); the same arithmetic in blocks of 16 rows took 0.3-0.6 s.
"""

from __future__ import annotations

import numpy as np

ROWS_PER_BLOCK = 16


def max_abs(a: np.ndarray) -> float:
    """max |a| over all elements, computed in row blocks (NaN anywhere: NaN)."""
    return float(np.max([np.abs(a[i : i + ROWS_PER_BLOCK]).max() for i in _starts(a)]))


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| over all elements (same shapes), computed in row blocks (NaN anywhere: NaN,
    which fails every ``<=`` check; Python's max() would skip it after the first block)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    blocks = [
        np.abs(a[i : i + ROWS_PER_BLOCK] - b[i : i + ROWS_PER_BLOCK]).max() for i in _starts(a)
    ]
    return float(np.max(blocks))


def _starts(a: np.ndarray) -> range:
    return range(0, len(a), ROWS_PER_BLOCK)
