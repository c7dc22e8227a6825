"""Offline calibration (DESIGN.md, "Offline, then online"): the statistics static plans fix
their constants from, written to one HDF5 artifact whose schema the C++ core owns
(:class:`Calibration`: ``schema()``, ``sites()``, ``format_version``).

- :mod:`socllm.calibration.steps`: the steps (act-scales, outliers, pruning-rate,
  head-importance, qk-scales, smoothing, bitwidths, gptq), registered in the C++ core
  (``cpp/calibrate/``), each with one Python run function; :func:`calibrate` runs a pipeline
  of them, ``calibrate_<step>`` one.
- :mod:`socllm.calibration.artifact`: corpus windows, the artifact's data, saving and loading.
"""

from .. import _core
from .artifact import (
    CALIB_SLICE_FRACTION,
    SMOOTHING_GRID,
    CalibrationData,
    calibration_split,
    calibration_windows,
    corpus_tokens,
    held_out_tokens,
    load_calibration,
    save_calibration,
    using_calibration,
)
from .steps import (
    STEPS,
    calibrate_act_scales,
    calibrate_attention_clamp,
    calibrate_bitwidths,
    calibrate_gptq,
    calibrate_head_importance,
    calibrate_outliers,
    calibrate_pruning_rate,
    calibrate_qk_scales,
    calibrate_smoothing,
    check_options,
    check_steps,
    run_steps,
    step_options,
)

Calibration = _core.Calibration
calibrate = run_steps

__all__ = [
    "CALIB_SLICE_FRACTION",
    "STEPS",
    "SMOOTHING_GRID",
    "Calibration",
    "CalibrationData",
    "calibrate",
    "calibrate_act_scales",
    "calibrate_bitwidths",
    "calibrate_gptq",
    "calibrate_head_importance",
    "calibrate_outliers",
    "calibrate_pruning_rate",
    "calibrate_attention_clamp",
    "calibrate_qk_scales",
    "calibrate_smoothing",
    "calibration_split",
    "calibration_windows",
    "check_options",
    "check_steps",
    "corpus_tokens",
    "held_out_tokens",
    "load_calibration",
    "run_steps",
    "save_calibration",
    "step_options",
    "using_calibration",
]
