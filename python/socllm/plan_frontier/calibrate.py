"""The calibration a frontier's space needs, made once and cached (``socllm frontier`` without
``--calib``): the union of the steps its plans read (``Plan.calibration_steps``), on
``samples`` windows of the calibration slice, head importance by Taylor's first-order estimate
(Eq. 1-2 by ablation takes minutes per window; issue 38). The file is keyed by the model file's
content, the steps and their options, so a rerun loads it and a changed model makes another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import _core
from .space import build_space


def steps_for(plans: Sequence[str]) -> list[str]:
    """The calibration steps any of ``plans`` reads, in the core registry's order (each step
    after the ones whose statistics it reads)."""
    need = {s for p in plans for s in _core.Plan(p).calibration_steps}
    return [s["name"] for s in _core.calibration_steps() if s["name"] in need]


def step_options(steps: Sequence[str], samples: int, arch: str) -> dict:
    """``samples`` windows for the steps that take them, and head importance by Taylor's
    estimate (the ablation takes minutes a window) when it is among ``steps`` and ``arch`` has
    it (else by the ablation: Gemma 3, calibration/head_importance.py's TAYLOR_ARCHS)."""
    from ..calibration.head_importance import TAYLOR_ARCHS

    options: dict = {}
    if {"act-scales", "qk-scales"} & set(steps):
        options["samples"] = samples
    if "head-importance" in steps:
        method = "taylor" if arch in TAYLOR_ARCHS else "ablation"
        options.update(importance_method=method, importance_samples=samples)
    return options


def calibrate_for(
    model,
    axes: Mapping[str, Sequence[str]],
    cache_dir,
    *,
    presets: Sequence[str] = (),
    plan_options: str = "",
    samples: int = 16,
    progress=False,
) -> Path | None:
    """Loads into ``model`` a calibration with every step the space of ``axes``, ``presets``
    and ``plan_options`` reads (made and cached under ``cache_dir`` if not there yet); None
    when no plan reads one."""
    from ..calibration import run_steps
    from ..calibration.artifact import save_calibration
    from ..registry import file_digest

    steps = steps_for(build_space(axes, presets, plan_options).plans)
    if not steps:
        return None
    options = step_options(steps, samples, model.config["arch"])
    key = json.dumps([file_digest(model.path), steps, options], sort_keys=True)
    path = Path(cache_dir) / f"calib-{hashlib.sha256(key.encode()).hexdigest()[:16]}.h5"
    if not path.exists():
        data = run_steps(model, steps, progress=progress, **options)
        save_calibration(path, data, model)  # atomic: a killed run leaves no partial file
    model.load_calibration(path)
    return path
