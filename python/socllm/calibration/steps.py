"""Calibration steps (DESIGN.md, "What a plan is"; docs/ARCHITECTURE.md).

The steps are registered in the C++ core (``cpp/calibrate/``, one file per step): name, what it
needs (arrays of the calibration artifact, whose schema the core defines, or ``attr:NAME`` root
attributes an earlier step wrote), what it writes, its options with defaults and help, and its
heavy part (every layer, site and grid point in one call). :data:`STEPS` mirrors that registry;
``socllm calibrate``'s flags and the ``calibrate_<step>`` functions' signatures come from it.

Each step has one Python run function here (:func:`step_run`): it draws the calibration windows
(the tokenizer is Python's) and calls the step's C++ part, or, for ``pruning-rate`` and
``attention-clamp``, composes whole-plan evaluations. A new step is one C++ file and one
function here.

Calibration text: WikiText-2 raw test, windows drawn from its first quarter
(:mod:`socllm.calibration.artifact`); the seeds' details are in each step's C++ file:

* ``act-scales`` (``act_scales.cpp``): per-channel max |x| and |x| histograms of every linear
  input (static scales), max |y| of every linear output.
* ``outliers`` (``outliers.cpp``): llm.npu's outlier thresholds and per-channel outlier counts
  (seed 001 §3.3), on the act-scales windows.
* ``pruning-rate``: the automatic pruning rate of shadow-outlier execution (below).
* ``head-importance``, ``qk-scales``: shadowAttn's offline profiling (seed 000 §3.2-3.3);
  ``importance_method=taylor`` estimates head importance to first order in torch
  (:mod:`socllm.calibration.head_importance`) instead of ablating every head.
* ``attention-clamp``: Eq. 3's clamp chosen on calibration text (below).
* ``smoothing``, ``bitwidths``: EdgeFlow's NPU-aware smoothing exponents and bit-widths (seed
  004 §4.1), on ``smoothing_rows`` random rows of each of the first ``smoothing_windows``
  act-scales windows.
* ``gptq`` (``gptq.cpp``): GPTQ's Hessian XᵀX / n of every linear input on the act-scales
  windows, for plans with ``rounding=gptq`` (Frantar et al. 2023; issue 39).
"""

from __future__ import annotations

import inspect
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .. import _core
from ..errors import InvalidArgumentError
from .artifact import (
    CALIB_SLICE_FRACTION,
    CalibrationData,
    calibration_split,
    calibration_windows,
    corpus_tokens,
    using_calibration,
)


@dataclass
class StepContext:
    """What a step's run function works on: the model, the statistics so far, the step's
    options (defaults filled in), progress."""

    model: object
    step: str
    data: CalibrationData | None = None
    options: dict = field(default_factory=dict)
    progress: bool = True

    def ensure_data(self) -> CalibrationData:
        """The statistics, created empty for the model when no earlier step ran."""
        if self.data is None:
            # the statistics record the model's rotation (Calibration.rotation, C++)
            provenance = {"slice": f"first {CALIB_SLICE_FRACTION:g} of the tokenized corpus"}
            self.data = CalibrationData(_core.Calibration.empty_for(self.model._model), provenance)
        return self.data

    def windows(self, samples: int, seqlen: int) -> list[list[int]]:
        """Windows of the step's corpus and seed."""
        toks = corpus_tokens(self.model, self.options["corpus"])
        return calibration_windows(toks, samples, seqlen, self.options["seed"])

    def act_scales_windows(self) -> list[list[int]]:
        """The windows step act-scales observed (its provenance)."""
        p = self.data.provenance
        return calibration_windows(
            corpus_tokens(self.model, p["corpus"]), p["samples"], p["seqlen"], p["seed"]
        )

    def sampled_rows(self) -> tuple[list[list[int]], list[list[int]]]:
        """The first ``smoothing_windows`` act-scales windows and, per window, the sorted
        ``smoothing_rows`` rows drawn from it (numpy default_rng(the act-scales seed))."""
        wins = self.act_scales_windows()[: self.options["smoothing_windows"]]
        rng = np.random.default_rng(self.data.provenance["seed"])
        n = self.options["smoothing_rows"]
        rows = [
            np.sort(rng.choice(len(w), size=min(n, len(w)), replace=False)).tolist() for w in wins
        ]
        return wins, rows

    def run_cpp(self, windows=None, rows=None) -> None:
        """Runs the step's C++ part on the statistics (one call) and records the attributes it
        writes."""
        data = self.ensure_data()
        bar = tqdm(desc=f"calibrate {self.step}", disable=not self.progress)

        def report(done: int, total: int, unit: str) -> None:
            bar.total, bar.unit = total, f" {unit}"
            bar.n = done
            bar.refresh()

        try:
            written = _core.run_calibration_step(
                self.model._engine,
                self.step,
                data.stats,
                windows,
                rows,
                self.options,
                report if self.progress else (lambda *a: None),
            )
        finally:
            bar.close()
        data.provenance.update(written)


@dataclass(frozen=True)
class CalibrationStep:
    """A registered step (``cpp/calibrate/steps.h``) and its Python run function."""

    name: str
    description: str
    needs: tuple[str, ...]  # schema array names, or "attr:NAME" for root attributes
    writes: tuple[str, ...]
    options: dict  # option -> default
    help: dict  # option -> help text
    choices: dict  # option -> allowed values (name options that have a fixed set)
    run: Callable[[StepContext], None]


_RUN: dict[str, Callable[[StepContext], None]] = {}


def step_run(name: str):
    """Registers the Python run function of the C++-registered step ``name``."""

    def register(fn):
        _RUN[name] = fn
        return fn

    return register


@step_run("act-scales")
def _act_scales(ctx: StepContext) -> None:
    o = ctx.options
    windows = ctx.windows(o["samples"], o["seqlen"])
    old, ctx.data = ctx.data, None  # fresh statistics: observing adds to running maxima
    data = ctx.ensure_data()
    if old is not None:  # what steps independent of act-scales wrote is kept
        _keep_independent(old, data)
    data.provenance.update(
        corpus=o["corpus"], samples=o["samples"], seqlen=o["seqlen"], seed=o["seed"]
    )
    ctx.run_cpp(windows)


def _keep_independent(old: CalibrationData, new: CalibrationData) -> None:
    """Copies into ``new`` the arrays, attributes and step names of the steps that do not
    depend (through their needs) on act-scales: re-running act-scales invalidates the others."""
    stale = {"act-scales"}
    changed = True
    while changed:
        writes = {w for n in stale for w in STEPS[n].writes}
        grown = stale | {s.name for s in STEPS.values() if writes & set(s.needs)}
        changed, stale = grown != stale, grown
    for a in _core.Calibration.schema():
        if a["step"] in stale:
            continue
        for site in _core.Calibration.sites() if a["per_site"] else [None]:
            value = old.stats.array(a["name"], site)
            if value is not None:
                new.stats.set_array(a["name"], site, value)
    dropped = {w[5:] for n in stale for w in STEPS[n].writes if w.startswith("attr:")}
    new.provenance.update({k: v for k, v in old.provenance.items() if k not in dropped})
    kept = [n for n in old.provenance.get("steps", "").split(",") if n and n not in stale]
    new.provenance["steps"] = ",".join(kept)


@step_run("outliers")
def _outliers(ctx: StepContext) -> None:
    ctx.run_cpp(ctx.act_scales_windows())


@step_run("gptq")
def _gptq(ctx: StepContext) -> None:
    ctx.run_cpp(ctx.act_scales_windows())


def _record_windows(ctx: StepContext, prefix: str, samples: int, seqlen: int) -> None:
    o = ctx.data.provenance
    o.setdefault("corpus", ctx.options["corpus"])
    for key, value in (
        ("samples", samples),
        ("seqlen", seqlen),
        ("seed", ctx.options["seed"]),
        ("corpus", ctx.options["corpus"]),
    ):
        o[f"{prefix}_{key}"] = value


@step_run("head-importance")
def _head_importance(ctx: StepContext) -> None:
    """Eq. 1-2 by ablation in the C++ part, or (``importance_method=taylor``) their first-order
    estimate from one backward pass per window in torch (:mod:`.head_importance`), written to
    the same arrays."""
    o = ctx.options
    windows = ctx.windows(o["importance_samples"], o["importance_seqlen"])
    if o["importance_method"] == "taylor":
        from .head_importance import taylor_importance

        heads, layers = taylor_importance(ctx.model, windows, progress=ctx.progress)
        data = ctx.ensure_data()
        data.stats.set_array("head_importance", None, heads.astype(np.float32))
        data.stats.set_array("layer_importance", None, layers.astype(np.float32))
    else:
        ctx.run_cpp(windows)
    _record_windows(ctx, "head_importance", o["importance_samples"], o["importance_seqlen"])
    ctx.data.provenance["head_importance_method"] = o["importance_method"]


@step_run("qk-scales")
def _qk_scales(ctx: StepContext) -> None:
    o = ctx.options
    ctx.run_cpp(ctx.windows(o["samples"], o["seqlen"]))
    _record_windows(ctx, "qk_scales", o["samples"], o["seqlen"])


@step_run("smoothing")
def _smoothing(ctx: StepContext) -> None:
    ctx.run_cpp(*ctx.sampled_rows())


@step_run("bitwidths")
def _bitwidths(ctx: StepContext) -> None:
    # global-ttft weighs channel errors by the inputs' statistics; per-tensor needs none
    samples = ctx.sampled_rows() if ctx.options["bit_scope"] == "global-ttft" else (None, None)
    ctx.run_cpp(*samples)


def _validation_windows(ctx: StepContext, tokens: int, context: int) -> list[list[int]]:
    """The last ``tokens`` tokens of the calibration slice in windows of ``context`` (evaluation
    text is never used; calibration windows are drawn from the whole slice, so some overlap)."""
    toks = corpus_tokens(ctx.model, ctx.data.provenance.get("corpus", "wikitext2"))
    end = calibration_split(len(toks))
    val_toks = toks[max(0, end - tokens) : end]
    val = [val_toks[i : i + context] for i in range(0, len(val_toks) - 1, context)]
    return [w for w in val if len(w) > 1]


@step_run("pruning-rate")
def _pruning_rate(ctx: StepContext) -> None:
    """The largest share of linear inputs whose CPU part can be pruned while the perplexity on
    validation text stays within ``budget`` (relative) of pruning nothing under
    ``pruning_plan``; bisection over the number of pruned inputs (accuracy falls as it grows,
    in practice). Validation text: the last ``validation_tokens`` tokens of the calibration
    slice in windows of ``validation_context`` (calibration windows are drawn from the whole
    slice, so some may overlap; evaluation text is never used). Use the result as
    ``shadow-outlier:pruning_rate=<auto_pruning_rate>``."""
    o, m, data = ctx.options, ctx.model, ctx.data
    context = o["validation_context"]
    val = _validation_windows(ctx, o["validation_tokens"], context)
    base, hot = o["pruning_plan"], o["hot_share"]
    sep = "," if ":" in base else ":"
    with using_calibration(m, data.stats):  # the plan evaluated is built from these statistics
        n = int(data.stats.outlier_importance().size)

        def ppl(k: int) -> float:
            lps = m.token_logprobs(val, f"{base}{sep}pruning_rate={k / n!r},hot_share={hot!r}")
            return float(math.exp(-np.concatenate(lps).astype(np.float64).mean()))

        tried = {0: ppl(0)}
        limit = tried[0] * (1 + o["budget"])
        lo, hi = 0, n  # invariant: lo within the budget; hi over it (or untested)
        tried[n] = ppl(n)
        if tried[n] <= limit:
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            tried[mid] = ppl(mid)
            lo, hi = (mid, hi) if tried[mid] <= limit else (lo, mid)
    validation = {
        "tokens": sum(len(w) for w in val),
        "context": context,
        "hot_share": hot,
        "plan": base,
        "tried": [
            {"pruned_inputs": k, "rate": k / n, "perplexity": v} for k, v in sorted(tried.items())
        ],
    }
    data.provenance.update(
        auto_pruning_rate=lo / n,
        auto_pruning_budget=o["budget"],
        auto_pruning_validation=json.dumps(validation),
    )


@step_run("attention-clamp")
def _attention_clamp(ctx: StepContext) -> None:
    """Eq. 3's clamp chosen on calibration text (cpp/calibrate/attention_clamp.cpp): every
    candidate clamp_quantile of ``clamp_plan`` scored on the validation windows by the mean
    KL(fp32 || plan) of the next-token distributions, the lowest kept. Use the result as
    ``...:attention=shadow-attn:keep=0.2,clamp_quantile=<auto_clamp_quantile>``."""
    from ..eval.divergence import summarize, window_stats
    from ..eval.stats import paired_difference

    o, m, data = ctx.options, ctx.model, ctx.data
    val = _validation_windows(ctx, o["clamp_validation_tokens"], o["clamp_validation_context"])
    candidates = list(dict.fromkeys(float(q) for q in o["clamp_candidates"].split(",")))
    base = o["clamp_plan"]
    plans = {q: f"{base},clamp_quantile={q!r}" for q in candidates}  # plan text routes it
    rows: dict[float, list[dict]] = {q: [] for q in candidates}
    bar = tqdm(
        total=len(val) * (len(candidates) + 1), desc="calibrate attention-clamp",
        unit=" plans x windows", disable=not ctx.progress,
    )  # fmt: skip
    with using_calibration(m, data.stats), bar:
        for w in val:  # one window's fp32 logits at a time: [T, V] floats each
            ref = m.logits(w, "fp32")[:-1]
            bar.update()
            targets = np.asarray(w[1:])
            for q, plan in plans.items():
                rows[q].append(window_stats(ref, m.logits(w, plan)[:-1], targets))
                bar.update()
    scored = {q: summarize(r) for q, r in rows.items()}
    best = min(candidates, key=lambda q: (scored[q]["kl"]["value"], q))
    per_window = {q: {str(i): r["kl"] / r["n"] for i, r in enumerate(rows[q])} for q in rows}
    tried = []
    for q in candidates:
        d, se = paired_difference(per_window[best], per_window[q])  # paired by window
        tried.append(
            {
                "clamp_quantile": q,
                "kl": scored[q]["kl"]["value"],
                "kl_se": scored[q]["kl"]["se"],
                "kl_minus_chosen": d,
                "kl_minus_chosen_se": se,
                "top1": scored[q]["top1"]["value"],
                "ppl_ratio": scored[q]["ppl_ratio"]["value"],
            }
        )
    validation = {
        "tokens": sum(len(w) for w in val),
        "context": o["clamp_validation_context"],
        "windows": len(val),
        "plan": base,
        "tried": tried,
    }
    data.provenance.update(auto_clamp_quantile=best, auto_clamp_validation=json.dumps(validation))


def _registered() -> dict[str, CalibrationStep]:
    steps = {}
    for s in _core.calibration_steps():
        if s["name"] not in _RUN:
            raise RuntimeError(f"calibration step {s['name']!r} has no Python run function")
        opts = s["options"]
        steps[s["name"]] = CalibrationStep(
            s["name"],
            s["description"],
            tuple(s["needs"]),
            tuple(s["writes"]),
            {o["name"]: o["default"] for o in opts},
            {o["name"]: o["help"] for o in opts},
            {o["name"]: tuple(o["choices"]) for o in opts if o["choices"]},
            _RUN[s["name"]],
        )
    return steps


STEPS: dict[str, CalibrationStep] = _registered()


def step_options() -> dict:
    """Every step's options with their defaults (the CLI's flags)."""
    out: dict = {}
    for s in STEPS.values():
        out.update(s.options)
    return out


def check_options(names: list[str], options: dict) -> dict:
    """{step: its options}, checked by the core with the defaults filled in: an unknown step or
    option, an option none of ``names`` takes or reads with the other options given (e.g.
    ``percentile`` with ``outlier_threshold=maxmin``) or a bad value is an InvalidArgumentError
    naming it."""
    for n in names:
        if n not in STEPS:
            raise InvalidArgumentError(f"calibrate: unknown step {n!r} (known: {', '.join(STEPS)})")
    known = step_options()
    for k in options:
        if k not in known:
            raise InvalidArgumentError(
                f"calibrate: unknown option {k!r} (known: {', '.join(sorted(known))})"
            )
        if not any(k in STEPS[n].options for n in names):
            takers = [s.name for s in STEPS.values() if k in s.options]
            raise InvalidArgumentError(
                f"calibrate: option {k!r} does not apply to steps {','.join(names)} (it is an "
                f"option of {', '.join(takers)})"
            )
    per_step = {
        n: _core.calibration_step_options(
            n, {k: v for k, v in options.items() if k in STEPS[n].options}
        )
        for n in names
    }
    for k, v in options.items():
        takers = [n for n in names if k in STEPS[n].options]
        if takers and not any(_uses(n, k, per_step[n]) for n in takers):
            why = "; ".join(
                f"step {n} reads it only with option '{o}'={want!r}, not {per_step[n][o]!r}"
                for n in takers
                for _, o, want in [_USED_WHEN[n, k]]
            )
            raise InvalidArgumentError(f"calibrate: option '{k}'={v!r} changes nothing: {why}")
    return per_step


# Options a step reads only under another of its options (issue 37: refused elsewhere, not
# ignored): (step, option) -> (does the step read it, given its options; the option that
# decides; the value under which it does).
_USED_WHEN: dict[tuple[str, str], tuple[Callable[[dict], bool], str, str]] = {
    ("outliers", "percentile"): (
        lambda o: o["outlier_threshold"] == "percentile",
        "outlier_threshold",
        "percentile",
    ),
    **{
        ("bitwidths", k): (lambda o: o["bit_scope"] == "global-ttft", "bit_scope", "global-ttft")
        for k in ("smoothing_windows", "smoothing_rows")
    },
}


def _uses(step: str, option: str, options: dict) -> bool:
    """Whether ``step`` reads ``option`` under its (checked, defaults filled) ``options``."""
    rule = _USED_WHEN.get((step, option))
    return rule is None or rule[0](options)


def check_steps(names: list[str], data: CalibrationData | None, options: dict) -> dict:
    """:func:`check_options`, and every step's needs met by ``data`` or an earlier step (else an
    InvalidArgumentError naming the step to run first): everything a pipeline can get wrong
    before its first step starts."""
    per_step = check_options(names, options)
    have = set()
    if data is not None:
        for need in {x for n in names for x in STEPS[n].needs}:
            if need.startswith("attr:"):
                present = need[5:] in data.provenance
            else:
                present = data.stats.array(need, "attn_in") is not None
            if present:
                have.add(need)
    writer = {w: s.name for s in STEPS.values() for w in s.writes}
    for n in names:
        for need in STEPS[n].needs:
            if need not in have:
                raise InvalidArgumentError(
                    f"calibrate: step {n!r} needs {need!r}, which step {writer.get(need)!r} "
                    f"writes: run it first (e.g. --steps {writer.get(need)},{n})"
                )
        have.update(STEPS[n].writes)
    return per_step


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
    statistics. Everything is checked before the first step starts (:func:`check_steps`).
    ``after_step(data)`` is called after each step (the CLI saves there, so a failing later step
    keeps the earlier ones); if a step fails, the error says which steps finished. With
    ``progress``, each step's wall time is printed (stderr) at its end."""
    names = [s.strip() for s in steps.split(",")] if isinstance(steps, str) else list(steps)
    per_step = check_steps(names, data, options)
    for i, n in enumerate(names):
        ctx = StepContext(model, n, data, per_step[n], progress)
        t0 = time.perf_counter()
        try:
            STEPS[n].run(ctx)
        except Exception as e:
            finished = names[:i]
            e.add_note(
                f"calibrate: step {n!r} failed"
                + (f" after {','.join(finished)} finished" if finished else "")
            )
            raise
        if progress:  # every step's cost, at its end (issue 38)
            print(f"calibrate: step {n} took {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        data = ctx.data
        done = data.provenance.get("steps", "")
        if n not in done.split(","):
            data.provenance["steps"] = ",".join(x for x in (done, n) if x)
        if after_step is not None:
            after_step(data)
    return data


def _step_function(name: str):
    """``calibrate_<step>(model, data=None, *, progress=True, **options)``, its signature and
    documentation from the registry."""
    step = STEPS[name]

    def fn(model, data: CalibrationData | None = None, *, progress: bool = True, **options):
        return run_steps(model, [name], data=data, progress=progress, **options)

    params = [
        inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("data", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=True),
    ] + [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
        for k, v in step.options.items()
    ]
    fn.__signature__ = inspect.Signature(params)
    fn.__name__ = fn.__qualname__ = "calibrate_" + name.replace("-", "_")
    lines = [f"Step {name}: {step.description}.", ""]
    if step.needs:
        lines.append(f"Needs {', '.join(step.needs)} in ``data``. ")
    if name == "act-scales":  # see _act_scales
        ret = "returns new statistics (with what steps independent of act-scales wrote in ``data``)"
    else:
        ret = "updates ``data`` in place (created if None) and returns it"
    lines.append(f"Writes {', '.join(step.writes)}; {ret}.")
    lines += ["", "Options:"] + [
        f"    {k} ({v!r}): {step.help[k]}" for k, v in step.options.items()
    ]
    fn.__doc__ = "\n".join(lines)
    return fn


calibrate_act_scales = _step_function("act-scales")
calibrate_outliers = _step_function("outliers")
calibrate_gptq = _step_function("gptq")
calibrate_pruning_rate = _step_function("pruning-rate")
calibrate_head_importance = _step_function("head-importance")
calibrate_qk_scales = _step_function("qk-scales")
calibrate_attention_clamp = _step_function("attention-clamp")
calibrate_smoothing = _step_function("smoothing")
calibrate_bitwidths = _step_function("bitwidths")
