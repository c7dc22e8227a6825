"""Calibration steps behind one interface (DESIGN.md, "What a plan is"; docs/ARCHITECTURE.md).

A step declares what it needs (arrays of the calibration artifact, whose schema the C++ core
defines: ``socllm._core.Calibration.schema()``, or attributes an earlier step wrote) and what it
writes, and runs on a :class:`StepContext`. ``socllm calibrate --steps a,b`` and the scripts in
``calibration/`` run the same steps through :func:`run_steps`; the next systems' steps
(smoothing, bit-widths) plug in by adding to :data:`STEPS`.

Steps:

* ``act-scales``: per-channel max |x| and |x| histograms of every linear input (static scales).
* ``outliers``: llm.npu's outlier thresholds and per-channel outlier counts (seed 001 §3.3).
* ``pruning-rate``: the automatic pruning rate of shadow-outlier execution (seed 003's reviewers
  asked how 85% is chosen): the largest share of linear inputs whose CPU part can be pruned while
  the perplexity on validation text from the calibration slice stays within ``budget``
  (relative) of pruning nothing under ``pruning_plan`` (``shadow-outlier``, or it with float
  ops moved, e.g. ``shadow-outlier:residual=cpu/fp32`` for Gemma 3, whose residual overflows
  fp16); bisection over the number of pruned inputs (accuracy falls as
  it grows, in practice). Validation text: the last ``validation_tokens`` tokens of the
  calibration slice in windows of ``validation_context`` (calibration windows are drawn from the
  whole slice, so some may overlap; evaluation text is never used). Writes the root attributes
  ``auto_pruning_rate``, ``auto_pruning_budget``, ``auto_pruning_validation`` (JSON of the rates
  tried and their perplexities); use it as ``shadow-outlier:pruning_rate=<rate>``.
* ``head-importance``, ``qk-scales``: shadowAttn's offline profiling (seed 000 §3.2-3.3;
  :mod:`socllm.calibration.attention`).
* ``smoothing``, ``bitwidths``: EdgeFlow's NPU-aware smoothing exponents and per-channel
  bit-widths (seed 004 §4.1; :mod:`socllm.calibration.edgeflow`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError
from .attention import (
    DEFAULT_IMPORTANCE_SAMPLES,
    DEFAULT_IMPORTANCE_SEQLEN,
    calibrate_head_importance,
    calibrate_qk_scales,
)
from .calibrate import (
    CalibrationData,
    calibrate_act_scales,
    calibrate_outliers,
    calibration_split,
    corpus_tokens,
)
from .edgeflow import (
    BITWIDTH_OPTIONS,
    SMOOTHING_OPTIONS,
    calibrate_bitwidths,
    calibrate_smoothing,
    using_calibration,
)


@dataclass
class StepContext:
    """What steps share: the model, the statistics so far, options, progress."""

    model: object
    data: CalibrationData | None = None
    options: dict = field(default_factory=dict)
    progress: bool = True

    def has(self, need: str) -> bool:
        if self.data is None:
            return False
        if need.startswith("attr:"):
            return need[5:] in self.data.provenance
        return self.data.stats.array(need, "attn_in") is not None


@dataclass(frozen=True)
class CalibrationStep:
    name: str
    needs: tuple[str, ...]  # schema array names, or "attr:NAME" for root attributes
    writes: tuple[str, ...]
    options: dict  # option -> default
    description: str
    run: Callable[[StepContext], None]


def _act_scales(ctx: StepContext) -> None:
    o = ctx.options
    ctx.data = calibrate_act_scales(
        ctx.model,
        corpus=o["corpus"],
        samples=o["samples"],
        seqlen=o["seqlen"],
        seed=o["seed"],
        progress=ctx.progress,
    )


def _outliers(ctx: StepContext) -> None:
    o = ctx.options
    calibrate_outliers(
        ctx.model,
        ctx.data,
        method=o["outlier_threshold"],
        percentile=o["percentile"],
        progress=ctx.progress,
    )


def _perplexity(model, windows: list[list[int]], plan: str) -> float:
    lps = model.token_logprobs(windows, plan)
    return float(math.exp(-np.concatenate(lps).astype(np.float64).mean()))


def _pruning_rate(ctx: StepContext) -> None:
    o, m, data = ctx.options, ctx.model, ctx.data
    budget, n_val, context = o["budget"], o["validation_tokens"], o["validation_context"]
    if not budget >= 0:
        raise InvalidArgumentError(f"calibrate pruning-rate: budget must be >= 0, got {budget}")
    toks = corpus_tokens(m, data.provenance.get("corpus", "wikitext2"))
    end = calibration_split(len(toks))
    val_toks = toks[max(0, end - n_val) : end]
    val = [val_toks[i : i + context] for i in range(0, len(val_toks) - 1, context)]
    val = [w for w in val if len(w) > 1]
    base = o["pruning_plan"]
    if _core.Plan(base).name != "shadow-outlier":  # a bad plan is an error before any evaluation
        raise InvalidArgumentError(
            "calibrate pruning-rate: pruning_plan must be shadow-outlier, with options if "
            f"needed (e.g. 'shadow-outlier:residual=cpu/fp32'), got {base!r}"
        )
    with using_calibration(m, data.stats):  # the plan evaluated is built from these statistics
        n = int(data.stats.outlier_importance().size)
        hot = o["hot_share"]
        sep = "," if ":" in base else ":"

        def ppl(k: int) -> float:
            return _perplexity(m, val, f"{base}{sep}pruning_rate={k / n!r},hot_share={hot!r}")

        tried = {0: ppl(0)}
        limit = tried[0] * (1 + budget)
        lo, hi = 0, n  # invariant: lo within the budget; hi over it (or untested)
        tried[n] = ppl(n)
        if tried[n] <= limit:
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            tried[mid] = ppl(mid)
            lo, hi = (mid, hi) if tried[mid] <= limit else (lo, mid)
    p = data.provenance
    p["auto_pruning_rate"] = lo / n
    p["auto_pruning_budget"] = budget
    p["auto_pruning_validation"] = json.dumps(
        {
            "tokens": sum(len(w) for w in val),
            "context": context,
            "hot_share": hot,
            "plan": base,
            "tried": [
                {"pruned_inputs": k, "rate": k / n, "perplexity": v}
                for k, v in sorted(tried.items())
            ],
        }
    )


def _head_importance(ctx: StepContext) -> None:
    o = ctx.options
    ctx.data = calibrate_head_importance(
        ctx.model,
        ctx.data,
        corpus=o["corpus"],
        samples=o["importance_samples"],
        seqlen=o["importance_seqlen"],
        seed=o["seed"],
        progress=ctx.progress,
    )


def _smoothing(ctx: StepContext) -> None:
    calibrate_smoothing(
        ctx.model, ctx.data, progress=ctx.progress, **{k: ctx.options[k] for k in SMOOTHING_OPTIONS}
    )


def _bitwidths(ctx: StepContext) -> None:
    calibrate_bitwidths(
        ctx.model, ctx.data, progress=ctx.progress, **{k: ctx.options[k] for k in BITWIDTH_OPTIONS}
    )


def _qk_scales(ctx: StepContext) -> None:
    o = ctx.options
    ctx.data = calibrate_qk_scales(
        ctx.model,
        ctx.data,
        corpus=o["corpus"],
        samples=o["samples"],
        seqlen=o["seqlen"],
        seed=o["seed"],
        progress=ctx.progress,
    )


_BASE = {"corpus": "wikitext2", "samples": 128, "seqlen": 512, "seed": 0}

STEPS: dict[str, CalibrationStep] = {
    s.name: s
    for s in (
        CalibrationStep(
            "act-scales",
            (),
            ("act_absmax", "abs_hist", "out_absmax"),
            dict(_BASE),
            "per-channel max |x| and |x| histograms of every linear input (static scales), and "
            "max |y| of every linear output channel (EdgeFlow's output smoothing)",
            _act_scales,
        ),
        CalibrationStep(
            "outliers",
            ("act_absmax", "abs_hist"),
            ("outlier_threshold", "outlier_count", "outlier_seq_channels", "outlier_seqs"),
            {"outlier_threshold": "percentile", "percentile": 99.99},
            "llm.npu's outlier thresholds and per-channel outlier counts (seed 001 §3.3)",
            _outliers,
        ),
        CalibrationStep(
            "pruning-rate",
            ("outlier_threshold", "outlier_count"),
            ("attr:auto_pruning_rate", "attr:auto_pruning_budget", "attr:auto_pruning_validation"),
            {
                "budget": 0.01,
                "validation_tokens": 8192,
                "validation_context": 512,
                "hot_share": 0.8,
                "pruning_plan": "shadow-outlier",
            },
            "automatic shadow-outlier pruning rate within a validation perplexity budget",
            _pruning_rate,
        ),
        CalibrationStep(
            "head-importance",
            (),
            ("head_importance", "layer_importance"),
            {
                **_BASE,
                "importance_samples": DEFAULT_IMPORTANCE_SAMPLES,
                "importance_seqlen": DEFAULT_IMPORTANCE_SEQLEN,
            },
            "shadowAttn's head and layer importance: loss increase when a head's / a layer's "
            "attention output is zeroed (seed 000 Eq. 1, 2), for per-head keep ratios (Eq. 3)",
            _head_importance,
        ),
        CalibrationStep(
            "qk-scales",
            (),
            ("q_absmax", "k_absmax", "v_absmax"),
            dict(_BASE),
            "per-window max |Q|, |K|, |V| of every head (shadowAttn's scale buckets, §3.3; "
            "npu-int8's static scales)",
            _qk_scales,
        ),
        CalibrationStep(
            "smoothing",
            ("act_absmax", "out_absmax"),
            ("smooth_alpha", "smooth_alpha_error"),
            dict(SMOOTHING_OPTIONS),
            "EdgeFlow's NPU-aware smoothing: the input exponent alpha of every linear input by "
            "grid search over [0, 1] minimising the quantized output error (seed 004 §4.1)",
            _smoothing,
        ),
        CalibrationStep(
            "bitwidths",
            ("act_absmax", "out_absmax", "smooth_alpha"),
            ("channel_bits", "attr:bitwidth_report"),
            dict(BITWIDTH_OPTIONS),
            "EdgeFlow's per-output-channel bit-widths (Algorithm 1 per tensor at --bits), with "
            "a report: closed-form vs exact metric ranking, heap vs water-filling (seed 004 §4.1)",
            _bitwidths,
        ),
    )
}


def step_options() -> dict:
    """Every step's options with their defaults (the CLI's flags)."""
    out: dict = {}
    for s in STEPS.values():
        out.update(s.options)
    return out


def run_steps(
    model,
    steps: list[str] | str,
    *,
    data: CalibrationData | None = None,
    progress: bool = True,
    after_step: Callable[[CalibrationData], None] | None = None,
    **options,
) -> CalibrationData:
    """Runs ``steps`` in order on ``model`` (continuing ``data`` if given) and returns the
    statistics; an unknown step or option, or a step whose needs no earlier step wrote, is an
    InvalidArgumentError naming it. ``after_step(data)`` is called after each step (the CLI
    saves there, so a failing later step keeps the earlier ones); if a step fails, the error
    says which steps finished."""
    names = [s.strip() for s in steps.split(",")] if isinstance(steps, str) else list(steps)
    for n in names:
        if n not in STEPS:
            raise InvalidArgumentError(f"calibrate: unknown step {n!r} (known: {', '.join(STEPS)})")
    known = step_options()
    for k in options:
        if k not in known:
            raise InvalidArgumentError(
                f"calibrate: unknown option {k!r} (known: {', '.join(sorted(known))})"
            )
    ctx = StepContext(model, data, {**known, **options}, progress)
    writer = {w: s.name for s in STEPS.values() for w in s.writes}
    for n in names:
        step = STEPS[n]
        for need in step.needs:
            if not ctx.has(need):
                raise InvalidArgumentError(
                    f"calibrate: step {n!r} needs {need!r}, which step {writer.get(need)!r} "
                    "writes: run it first (e.g. --steps "
                    f"{writer.get(need)},{n})"
                )
        try:
            step.run(ctx)
        except Exception as e:
            finished = names[: names.index(n)]
            e.add_note(
                f"calibrate: step {n!r} failed"
                + (f" after {','.join(finished)} finished" if finished else "")
            )
            raise
        done = ctx.data.provenance.get("steps", "")
        if n not in done.split(","):
            ctx.data.provenance["steps"] = ",".join(x for x in (done, n) if x)
        if after_step is not None:
            after_step(ctx.data)
    return ctx.data


def check_schema() -> None:
    """Every array a step writes is in the C++ artifact schema, with that step as its writer."""
    schema = {a["name"]: a for a in _core.Calibration.schema()}
    for s in STEPS.values():
        for w in s.writes:
            if w.startswith("attr:"):
                continue
            if w not in schema or schema[w]["step"] != s.name:
                raise AssertionError(
                    f"step {s.name!r} writes {w!r}, which the schema does not give it"
                )
