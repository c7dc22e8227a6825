"""How far a plan's next-token distribution is from fp32's, on held-out WikiText-2 windows
(``socllm eval --metrics kl,top1,ppl``, issue 16 item 2).

Benchmark accuracy moves in steps of one document; on a 135M model a plan's effect is often
smaller than that noise. Comparing whole distributions token by token sees much smaller
differences:

* ``kl``: KL(p_ref || p_plan) per predicted token, in nats: the expected extra code length when
  the plan's distribution stands in for the reference's (llama.cpp's ``--kl-divergence`` uses the
  same direction);
* ``top1``: the share of positions where the plan's most likely token is the reference's;
* ``ppl``: the plan's perplexity over the reference's on the true next tokens.

Windows are the held-out part of WikiText-2 (after the calibration slice, so a calibrated plan
never scores text it saw), cut into non-overlapping windows of ``context`` tokens; every
position but a window's first is scored. Standard errors are over windows, not tokens: tokens
of one window share their context, so treating them as independent would understate the error.
The ppl ratio's error is that of the paired per-window difference in mean NLL (delta method on
the log).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from ..errors import InvalidArgumentError

METRICS = ("kl", "top1", "ppl")
DEFAULT_CONTEXT = 512  # tokens per window: short enough for Gemma's 262k-token vocabulary
DEFAULT_WINDOWS = 16  # 16 x 511 = 8,176 scored positions
ROW_BLOCK = 64  # logit rows turned into float64 log-probabilities at a time (memory bound)
Z95 = 1.959963984540054  # two-sided 95% normal quantile


def parse_metrics(spec: str | Sequence[str]) -> list[str]:
    """``"kl,top1,ppl"`` (or a list) -> the metric names, checked."""
    names = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    if not names:
        raise InvalidArgumentError(f"metrics: none given (known: {', '.join(METRICS)})")
    for m in names:
        if m not in METRICS:
            raise InvalidArgumentError(
                f"metrics: unknown metric {m!r} (known: {', '.join(METRICS)})"
            )
    return list(dict.fromkeys(names))


def heldout_windows(model, context: int = DEFAULT_CONTEXT, windows: int | None = None):
    """The first ``windows`` (None: all) non-overlapping ``context``-token windows of the
    held-out WikiText-2 tokens of ``model``'s tokenizer."""
    from ..calibration.calibrate import corpus_tokens, held_out_tokens

    if context < 2 or context > model.config["context_length"]:
        raise InvalidArgumentError(
            f"metrics: context {context} must be in [2, {model.config['context_length']}]"
        )
    if windows is not None and windows < 1:
        raise InvalidArgumentError(f"metrics: windows must be >= 1, got {windows}")
    ids = held_out_tokens(corpus_tokens(model))
    n = len(ids) // context
    if windows is not None:
        if windows > n:
            raise InvalidArgumentError(
                f"metrics: {windows} windows of {context} tokens asked, the held-out text has {n}"
            )
        n = windows
    return [ids[i * context : (i + 1) * context] for i in range(n)]


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=1, keepdims=True))
    return z


def window_stats(ref_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> dict:
    """Sums over one window's scored positions: ``kl`` (sum of KL(ref || plan)), ``top1``
    (positions whose argmax agrees), ``nll_ref`` / ``nll`` (NLL of ``targets``), ``n``.
    ``ref_logits`` and ``logits`` are the ``[n, V]`` rows that predict ``targets``."""
    if ref_logits.shape != logits.shape or logits.shape[0] != len(targets):
        raise InvalidArgumentError(
            f"metrics: logits {logits.shape} vs reference {ref_logits.shape} vs "
            f"{len(targets)} targets"
        )
    for what, x in (("plan", logits), ("reference", ref_logits)):
        if not np.isfinite(x).all():
            raise InvalidArgumentError(f"metrics: the {what}'s logits are not all finite")
    kl = top1 = nll_ref = nll = 0.0
    for r0 in range(0, len(targets), ROW_BLOCK):
        rows = slice(r0, r0 + ROW_BLOCK)
        lp_ref = _log_softmax(ref_logits[rows])
        lp = _log_softmax(logits[rows])
        t = targets[rows]
        at = np.arange(len(t))
        kl += float((np.exp(lp_ref) * (lp_ref - lp)).sum())
        top1 += float((ref_logits[rows].argmax(1) == logits[rows].argmax(1)).sum())
        nll_ref -= float(lp_ref[at, t].sum())
        nll -= float(lp[at, t].sum())
    return {"kl": kl, "top1": top1, "nll_ref": nll_ref, "nll": nll, "n": len(targets)}


@dataclass
class Estimate:
    """A mean over windows with its standard error and 95% interval."""

    value: float
    se: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict:
        return {"value": self.value, "se": self.se, "ci95": [self.ci_low, self.ci_high]}


def _window_mean(per_window: np.ndarray) -> Estimate:
    mean = float(per_window.mean())
    se = float(per_window.std(ddof=1) / math.sqrt(len(per_window))) if len(per_window) > 1 else 0.0
    return Estimate(mean, se, mean - Z95 * se, mean + Z95 * se)


def summarize(windows: Sequence[dict]) -> dict:
    """Metrics of one plan from its :func:`window_stats` rows: ``kl`` and ``top1`` (means per
    token, errors over windows), ``ppl_ratio`` (exp of the paired mean NLL difference, error
    and interval from that difference), ``ppl`` and ``ppl_ref``."""
    if not windows:
        raise InvalidArgumentError("metrics: no windows to summarize")
    n = np.array([w["n"] for w in windows], dtype=np.float64)
    per = {k: np.array([w[k] for w in windows]) / n for k in ("kl", "top1", "nll_ref", "nll")}
    log_ratio = _window_mean(per["nll"] - per["nll_ref"])
    tokens = n.sum()
    nll = sum(w["nll"] for w in windows) / tokens
    nll_ref = sum(w["nll_ref"] for w in windows) / tokens
    return {
        "kl": _window_mean(per["kl"]).to_dict(),
        "top1": _window_mean(per["top1"]).to_dict(),
        "ppl_ratio": {
            "value": math.exp(nll - nll_ref),
            "se": math.exp(nll - nll_ref) * log_ratio.se,
            "ci95": [math.exp(log_ratio.ci_low), math.exp(log_ratio.ci_high)],
        },
        "ppl": math.exp(nll),
        "ppl_ref": math.exp(nll_ref),
        "n_windows": len(windows),
        "n_scored": int(tokens),
    }


def compare_plans(
    model,
    plans: Sequence,
    *,
    reference="fp32",
    context: int = DEFAULT_CONTEXT,
    windows: int | None = DEFAULT_WINDOWS,
    progress: bool = False,
) -> dict[str, dict]:
    """Every plan against ``reference`` on the same held-out windows: ``{plan name: summary}``
    (see :func:`summarize`), each with its per-window sums (``"windows"``, for pairing across
    runs) and the seconds spent. The reference's logits are computed once per window."""
    from .. import _core

    names = [p if isinstance(p, str) else _core.Plan(p).name for p in plans]
    if not names:
        raise InvalidArgumentError("metrics: no plans given")
    spans = heldout_windows(model, context, windows)
    rows: dict[str, list[dict]] = {n: [] for n in names}
    seconds = dict.fromkeys(names, 0.0)
    bar = tqdm(total=len(spans) * len(plans), desc="metrics", unit="win", disable=not progress)
    for ids in spans:
        targets = np.asarray(ids[1:], dtype=np.int64)
        ref = model.logits(ids, reference)[:-1]
        for name, plan in zip(names, plans, strict=True):
            t0 = time.perf_counter()
            logits = ref if plan == reference else model.logits(ids, plan)[:-1]
            rows[name].append(window_stats(ref, logits, targets))
            seconds[name] += time.perf_counter() - t0
            bar.update(1)
    bar.close()
    return {
        n: {
            **summarize(rows[n]),
            "plan": n,
            "reference": reference if isinstance(reference, str) else str(reference),
            "context": context,
            "windows": rows[n],
            "seconds": round(seconds[n], 2),
        }
        for n in names
    }


def format_summary(name: str, s: dict, metrics: Sequence[str]) -> str:
    """One line: the requested metrics with their errors."""
    parts = []
    if "kl" in metrics:
        parts.append(f"KL {s['kl']['value']:.5f}±{s['kl']['se']:.5f} nats")
    if "top1" in metrics:
        parts.append(f"top-1 {100 * s['top1']['value']:.2f}±{100 * s['top1']['se']:.2f}%")
    if "ppl" in metrics:
        r = s["ppl_ratio"]
        parts.append(
            f"ppl {s['ppl']:.3f} = {r['value']:.4f}x ref (95% CI {r['ci95'][0]:.4f}-"
            f"{r['ci95'][1]:.4f})"
        )
    return f"plan={name}: " + ", ".join(parts) + f" ({s['n_scored']} tokens, {s['n_windows']} win)"
