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

from ..errors import InvalidArgumentError, int_arg, not_applicable, str_arg

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
    from ..calibration.artifact import corpus_tokens, held_out_tokens

    context = int_arg("metrics", "context", context)
    if windows is not None:
        windows = int_arg("metrics", "windows", windows)
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
    device=None,
    decode_tokens: int = 0,
    policy: str | None = None,
) -> dict[str, dict]:
    """Every plan against ``reference`` on the same held-out windows: ``{plan name: summary}``
    (see :func:`summarize`), each with its per-window sums (``"windows"``, for pairing across
    runs) and the seconds spent. The reference's logits are computed once per window.

    With ``device`` (a profile name, .json path or profile dict), every plan is planned for that
    device (its partitions solved there) and the first window's engine run also returns the
    task graph it executed, prompt then ``decode_tokens`` greedy decoding steps, which is
    simulated (``"simulated"``: prefill and decode times, energy): accuracy and time of the same
    numerics from one call per plan, under ``policy`` (default npu-stall-first; refused
    without a device)."""
    from .. import _core
    from ..sim.timeline import Timeline, _profile

    names = [p if isinstance(p, str) else _core.Plan(p).name for p in plans]
    if not names:
        raise InvalidArgumentError("metrics: no plans given")
    decode_tokens = int_arg("metrics", "decode_tokens", decode_tokens, 0)
    if decode_tokens and device is None:
        raise InvalidArgumentError("metrics: decode_tokens times a session: give a device")
    if policy is not None:
        str_arg("metrics", "policy", policy)
        if device is None:
            raise not_applicable(
                "metrics",
                f"policy={policy!r}",
                "the timing of the first window on a device",
                "no device is given",
            )
    policy = policy or "npu-stall-first"
    profile = _profile(device) if device is not None else None
    planned = [
        (_core.Plan(p) if not isinstance(p, _core.Plan) else p).on_device(profile)
        if profile is not None
        else p
        for p in plans
    ]
    spans = heldout_windows(model, context, windows)
    rows: dict[str, list[dict]] = {n: [] for n in names}
    seconds = dict.fromkeys(names, 0.0)
    simulated: dict[str, dict] = {}
    bar = tqdm(total=len(spans) * len(plans), desc="metrics", unit="win", disable=not progress)
    for w, ids in enumerate(spans):
        targets = np.asarray(ids[1:], dtype=np.int64)
        ref = model.logits(ids, reference)[:-1]
        for name, plan, given in zip(names, planned, plans, strict=True):
            t0 = time.perf_counter()
            if profile is not None and w == 0:  # the numerics scored and the graph timed
                r = model.prefill(
                    ids, plan, all_positions=True, return_graph=True, decode_tokens=decode_tokens
                )
                logits = r["logits"][:-1] if isinstance(r, dict) else r[0][:-1]
                graph = r["graph"] if isinstance(r, dict) else r[1]
                res = _core.sim.simulate_graph(graph, profile, policy, 24)
                simulated[name] = _timing(Timeline(res, profile, 24, {}).summary())
            elif given == reference:
                logits = ref
            else:
                logits = model.logits(ids, plan)[:-1]
            rows[name].append(window_stats(ref, logits, targets))
            seconds[name] += time.perf_counter() - t0
            bar.update(1)
    bar.close()
    out = {
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
    for n, t in simulated.items():
        out[n]["simulated"] = t
    return out


def _timing(s: dict) -> dict:
    """The simulated request's headline numbers."""
    keys = ("device", "prompt_len", "prefill_ms", "prefill_tokens_per_s", "energy_mj")
    out = {k: s[k] for k in keys if k in s}
    for k in ("decode_tokens", "tpot_ms", "decode_tokens_per_s", "total_ms"):
        if s.get(k) is not None:
            out[k] = s[k]
    return out


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
    line = f"plan={name}: " + ", ".join(parts) + f" ({s['n_scored']} tokens, {s['n_windows']} win)"
    if "simulated" in s:
        t = s["simulated"]
        line += f"; {t['device']}: prefill {t['prompt_len']} tokens {t['prefill_ms']:.1f} ms"
        if "tpot_ms" in t:
            line += f", {t['decode_tokens']} decode steps at {t['tpot_ms']:.2f} ms/token"
    return line
