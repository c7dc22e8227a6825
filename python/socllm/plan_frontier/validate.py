"""The frontier's accuracy order checked on data it never saw (issue 41 item 5): its members'
held-out WikiText ΔNLL against their accuracy on lm-eval tasks (the local task configs,
eval/lmeval), as planned for the same device.

* Per plan and task, the accuracy change from fp32, paired over the documents both answered
  (mean and SE of acc(plan) - acc(fp32) per document); ``loss`` pools the tasks' documents.
* The rank correlation (Spearman's rho, ties at average ranks) between the plans' ΔNLL and
  their task accuracy loss (fp32 - plan): +1 when the frontier's order is the tasks' order.
  Its interval is a percentile bootstrap that resamples both sides' units at once, the scored
  WikiText windows and the task documents (a plan's numbers move together in a resample, as
  they share text).
* Disagreements: pairs the two orders rank differently, each with the paired difference of
  their task accuracy and its SE (``beyond_noise`` past ``z`` SE), so a swap inside the noise
  is told apart from one the tasks see clearly.

lm-eval's request cache keeps every plan's answers (one SQLite file per plan, model and
calibration under ``cache_dir``), so a rerun scores nothing again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError, SocllmError
from ..eval.stats import paired_difference

DEFAULT_TASKS = ("hellaswag", "arc_easy", "piqa")
DEFAULT_LIMIT = 200  # documents per task
BOOTSTRAP_RESAMPLES = 2000
LEVEL = 0.95


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x, axis=-1)


def spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho of the last axis of ``a`` and ``b`` (rows of a batch), NaN where one side
    is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (ra * rb).sum(-1) / den, np.nan)


def rank_agreement(
    dnll_windows: Mapping[str, Mapping[str, float]],
    acc_docs: Mapping[str, Mapping[str, float]],
    reference: str,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = LEVEL,
    z: float = 2.0,
    seed: int = 0,
) -> dict:
    """Spearman's rho between the plans' mean ΔNLL (``dnll_windows``: plan -> window -> ΔNLL)
    and their task accuracy loss from ``reference`` (``acc_docs``: plan -> document -> 0/1),
    its bootstrap interval, and the pairs the two orders disagree on (module doc)."""
    plans = [p for p in dnll_windows if p in acc_docs]
    if len(plans) < 3:
        raise InvalidArgumentError(
            f"frontier validation: a rank correlation needs 3 plans or more, got {plans}"
        )
    windows = sorted(set.intersection(*(set(dnll_windows[p]) for p in plans)))
    docs = sorted(set.intersection(*(set(acc_docs[p]) for p in [*plans, reference])))
    if len(windows) < 2 or len(docs) < 2:
        raise InvalidArgumentError(
            f"frontier validation: {len(windows)} windows and {len(docs)} documents scored by "
            f"every plan (2 or more of each needed)"
        )
    d = np.array([[dnll_windows[p][w] for w in windows] for p in plans])  # [plans, windows]
    ref = np.array([acc_docs[reference][k] for k in docs])
    loss = np.array([[ref[i] - acc_docs[p][k] for i, k in enumerate(docs)] for p in plans])
    rho = float(spearman(d.mean(1), loss.mean(1)))
    rng = np.random.default_rng(seed)
    wi = rng.integers(0, len(windows), size=(resamples, len(windows)))
    di = rng.integers(0, len(docs), size=(resamples, len(docs)))
    boot = spearman(d[:, wi].mean(-1).T, loss[:, di].mean(-1).T)
    boot = boot[np.isfinite(boot)]
    tail = (1 - level) / 2
    lo, hi = np.quantile(boot, [tail, 1 - tail]) if len(boot) else (math.nan, math.nan)
    disagree = []
    for i, a in enumerate(plans):
        for j, b in enumerate(plans):
            if d[i].mean() < d[j].mean() and loss[i].mean() > loss[j].mean():
                # a is the more accurate on WikiText, b on the tasks
                diff, se = paired_difference(
                    dict(zip(docs, loss[j], strict=True)), dict(zip(docs, loss[i], strict=True))
                )
                disagree.append(
                    {
                        "wikitext_better": a, "tasks_better": b,
                        "dnll": [float(d[i].mean()), float(d[j].mean())],
                        "task_loss": [float(loss[i].mean()), float(loss[j].mean())],
                        "task_loss_diff": diff, "task_loss_diff_se": se,
                        "beyond_noise": bool(se > 0 and diff > z * se),
                    }
                )  # fmt: skip
    return {
        "plans": plans,
        "dnll": [float(x) for x in d.mean(1)],
        "task_loss": [float(x) for x in loss.mean(1)],
        "windows": len(windows),
        "documents": len(docs),
        "spearman": rho,
        "interval": [float(lo), float(hi)],
        "level": level,
        "resamples": resamples,
        "disagreements": disagree,
    }


def task_answers(
    model,
    plan_json: Mapping,
    tasks: Sequence[str],
    limit: int,
    cache_file: Path | None,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """Per task, per document (``task/doc_id``): acc (0/1) of ``plan_json`` through the lm-eval
    backend."""
    from ..eval.lmeval import evaluate

    r = evaluate(
        model, tasks=list(tasks), plan=dict(plan_json), limit=limit, log_samples=True,
        quiet=not progress, use_cache=cache_file,
    )  # fmt: skip
    return {
        t: {f"{row['task']}/{row['doc_id']}": float(row["acc"]) for row in r["predictions"][t]}
        for t in tasks
    }


def validate(
    evaluator,
    rows: Sequence[Mapping],
    plans: Sequence[str],
    *,
    tasks: Sequence[str] = DEFAULT_TASKS,
    limit: int = DEFAULT_LIMIT,
    reference: str = "fp32",
    progress: bool = False,
) -> dict:
    """Scores ``plans`` (report rows' plan texts, scored on the same windows; ``reference``
    among them or added) on ``tasks`` as planned for ``evaluator``'s device and compares their
    order with the rows' ΔNLL: ``{"tasks", "limit", "per_plan": {plan: {task: {"acc", "diff",
    "diff_se"}}}, **rank_agreement(...)}``."""
    from tqdm.auto import tqdm

    from .evaluate import _digest, planned_key

    if not tasks:
        raise InvalidArgumentError("frontier validation: no tasks given")
    by_plan = {r["plan"]: r for r in rows}
    if reference not in by_plan or not by_plan[reference]["window_dnll"]:
        raise InvalidArgumentError(
            f"frontier validation: the reference plan {reference!r} is not among the scored "
            "plans (the space needs fp32)"
        )
    plans = list(dict.fromkeys([reference, *plans]))
    answers: dict[str, dict[str, dict[str, float]]] = {}
    cache = None if evaluator.cache_dir is None else evaluator.cache_dir / "lmeval"
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    # the backend plans a plan for a device it loads by name: the evaluator's must be that one
    from ..sim.timeline import _profile

    try:
        stock = _digest(_profile(evaluator.device)) == _digest(evaluator.profile)
    except SocllmError:
        stock = False
    if not stock:
        raise InvalidArgumentError(
            f"frontier validation: the device profile is not the stock {evaluator.device!r} "
            "(e.g. --device-params or a profile file), and lm-eval's backend loads a device by name"
        )
    for plan in tqdm(plans, desc="frontier: lm-eval", disable=not progress):
        planned = {**_core.Plan(plan).to_json(), "device": evaluator.device}
        key = _digest([evaluator.settings["accuracy"], planned_key(plan, evaluator.profile),
                       list(tasks)])  # fmt: skip
        answers[plan] = task_answers(
            evaluator.model, planned, tasks, limit,
            None if cache is None else cache / key[:24], progress=False,
        )  # fmt: skip

    def accuracy(mine: Mapping[str, float], ref: Mapping[str, float]) -> dict:
        diff, se = paired_difference(ref, mine)
        return {"acc": sum(mine.values()) / len(mine), "diff": diff, "diff_se": se, "n": len(mine)}

    # (document keys are "task/doc_id": unique across tasks)
    pooled = {p: {k: v for t in tasks for k, v in answers[p][t].items()} for p in plans}
    per_plan = {
        plan: {
            **{t: accuracy(answers[plan][t], answers[reference][t]) for t in tasks},
            "all": accuracy(pooled[plan], pooled[reference]),
        }
        for plan in plans
    }
    dnll = {p: by_plan[p]["window_dnll"] for p in plans}
    return {
        "tasks": list(tasks),
        "limit": limit,
        "per_plan": per_plan,
        **rank_agreement(dnll, pooled, reference),
    }
