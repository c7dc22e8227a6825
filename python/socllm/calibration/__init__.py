"""Offline calibration (DESIGN.md, "Offline, then online"): the statistics static plans fix
their constants from, written to one HDF5 artifact whose schema the C++ core owns
(:class:`Calibration`: ``schema()``, ``sites()``, ``format_version``).

- :mod:`socllm.calibration.steps`: the steps (act-scales, outliers, pruning-rate,
  head-importance, qk-scales, smoothing, bitwidths) behind one interface; ``run_steps``.
- :mod:`socllm.calibration.calibrate`: corpus windows, activation scales and outlier
  statistics, saving and loading artifacts.
- :mod:`socllm.calibration.attention`: shadowAttn's head importance and Q/K scales (seed 000).
- :mod:`socllm.calibration.edgeflow`: EdgeFlow's smoothing exponents and bit-widths (seed 004).
"""

from .. import _core

Calibration = _core.Calibration

__all__ = ["Calibration"]
