"""``socllm.eval.lmeval.evaluate``: lm-eval's ``simple_evaluate`` on socllm's local tasks."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ...errors import InvalidArgumentError, not_applicable
from .task_configs import MMLU_SUBJECTS, resolve_task, task_manager

# keys of evaluate()'s result that are not task names
RAW_KEY = "lm_eval"
PREDICTIONS_KEY = "predictions"


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """lm-eval's own output off for the block: every tqdm progress bar (lm-eval makes some it
    gives no way to disable, e.g. the one of ``Task.build_all_requests``; datasets' bars too)
    and records below WARNING of the ``lm_eval`` loggers. ``TQDM_DISABLE=1`` would not do:
    tqdm reads its ``TQDM_*`` settings once, when imported. Not thread-safe: it patches the
    ``tqdm`` class and the ``lm_eval`` logger for the whole process until the block ends."""
    from tqdm.std import tqdm as tqdm_class

    had_own = "__init__" in vars(tqdm_class)
    own = vars(tqdm_class).get("__init__")
    init = tqdm_class.__init__
    # index of ``disable`` among the positional arguments after self
    disable_at = list(inspect.signature(init).parameters).index("disable") - 1

    def silent_init(self, *args, **kwargs):
        if len(args) > disable_at:
            args = (*args[:disable_at], True, *args[disable_at + 1 :])
        else:
            kwargs["disable"] = True
        init(self, *args, **kwargs)

    logger = logging.getLogger("lm_eval")
    level = logger.level
    tqdm_class.__init__ = silent_init
    if logger.getEffectiveLevel() < logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
        if had_own:
            tqdm_class.__init__ = own
        else:
            del tqdm_class.__init__


def _metric(entry: Mapping, name: str) -> float | None:
    v = entry.get(f"{name},none")
    return float(v) if isinstance(v, (int, float)) else None


def _leaf_tasks(raw: Mapping, name: str) -> list[str]:
    """The evaluated tasks under ``name`` (itself if it is a task)."""
    subs = raw.get("group_subtasks", {}).get(name)
    if not subs:
        return [name]
    out: list[str] = []
    for s in subs:
        out.extend(_leaf_tasks(raw, s))
    return out


def summarize(raw: Mapping, names: Mapping[str, str]) -> dict[str, dict]:
    """{short name: {"acc", "acc_norm", "n", other metrics...}} from lm-eval's results;
    ``names`` maps the short names to lm-eval task/group names. ``n`` is the number of
    documents evaluated (summed over subtasks for a group); a metric a task does not have is
    None (acc_norm on MMLU, WinoGrande and LAMBADA)."""
    out: dict[str, dict] = {}
    results = raw.get("results", {})
    nsamples = raw.get("n-samples", {})
    for short, lm_name in names.items():
        entry = results.get(lm_name) or raw.get("groups", {}).get(lm_name) or {}
        row: dict[str, Any] = {"acc": _metric(entry, "acc"), "acc_norm": _metric(entry, "acc_norm")}
        for k, v in entry.items():
            metric, _, filt = k.partition(",")
            if filt == "none" and metric not in row and isinstance(v, (int, float)):
                row[metric] = float(v)
        row["n"] = int(
            sum(nsamples.get(t, {}).get("effective", 0) for t in _leaf_tasks(raw, lm_name))
        )
        row["task"] = lm_name
        out[short] = row
    return out


def _leaf_predictions(raw: Mapping, task: str) -> list[dict]:
    samples = raw.get("samples", {}).get(task)
    if samples is None:
        raise KeyError(
            f"no samples for {task!r} (evaluate with log_samples=True; tasks with samples: "
            f"{sorted(raw.get('samples', {}))})"
        )
    output_type = raw.get("configs", {}).get(task, {}).get("output_type")
    out = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        resps = s["filtered_resps"]
        lls = [float(r[0]) for r in resps]
        if output_type == "loglikelihood":  # LAMBADA: one (logprob, is_greedy)
            pred: Any = bool(resps[0][1])
        else:
            pred = int(max(range(len(lls)), key=lls.__getitem__))
        row = {"task": task, "doc_id": s["doc_id"], "target": s.get("target")}
        row.update(loglikelihoods=lls, pred=pred)
        for m in ("acc", "acc_norm"):
            if m in s:
                row[m] = float(s[m])
        out.append(row)
    return out


def predictions(raw: Mapping, name: str) -> list[dict]:
    """Per-document outcome of an evaluated lm-eval task or group (needs ``log_samples=True``),
    by subtask then ``doc_id``: ``task`` (the lm-eval task), ``doc_id``, ``target``,
    ``loglikelihoods`` (one per choice) and ``pred`` = their argmax, the choice ``acc`` scores;
    for a ``loglikelihood`` task (LAMBADA) ``loglikelihoods`` has one entry and ``pred`` is
    is_greedy. Also the document's ``acc`` (and ``acc_norm``)."""
    rows: list[dict] = []
    for t in _leaf_tasks(raw, name):
        rows.extend(_leaf_predictions(raw, t))
    return rows


def evaluate(
    model: Any = "smollm2-135m",
    tasks: str | Sequence[str] = ("hellaswag",),
    plan: str | Mapping = "fp32",
    calib: str | os.PathLike | None = None,
    limit: int | float | None = None,
    batch_size: int = 8,
    quiet: bool = False,
    *,
    num_fewshot: int | None = None,
    log_samples: bool = False,
    data_dir: str | os.PathLike | None = None,
    threads: int | None = None,
    max_length: int | None = None,
    max_batch_tokens: int | None = None,
    bootstrap_iters: int = 1000,
    limit_per_subject: bool = False,
    use_cache: str | os.PathLike | None = None,
    **plan_options: Any,
) -> dict:
    """Evaluate a socllm model on local lm-eval tasks.

    ``tasks``: short names ("hellaswag", "winogrande", "openbookqa", "arc_easy",
    "arc_challenge", "piqa", "mmlu", "lambada"/"lambada_openai"), ``socllm_*`` names, or a
    comma-separated string. ``model`` is a name/path or a loaded ``socllm.LanguageModel``.
    ``limit`` caps the documents per task; for MMLU it is spread over the 57 subjects
    (``ceil(limit / 57)`` each, so ``limit=200`` evaluates 228 questions) unless
    ``limit_per_subject`` is true (lm-eval's own meaning: ``limit`` per subject). A float
    ``limit`` < 1 is a fraction of every task (lm-eval's meaning). ``quiet``: no progress
    bars, socllm's or lm-eval's, and no lm-eval INFO logs (:func:`quiet_lm_eval`). Extra
    keywords are plan options (``alpha=0.5``...). ``use_cache``: lm-eval's per-request cache
    (SQLite, ``<use_cache>_rank0.db``). The backend commits each request when its batch is
    scored (rolling perplexity: when the whole call ends), so a rerun after an interruption
    computes only the requests missing; entries are keyed by the request alone, so give each
    model, plan and setting its own path.

    Returns ``{task: {"acc", "acc_norm", "n", "task", other metrics}}`` keyed by the names
    given, plus ``"lm_eval"``: the raw ``simple_evaluate`` result (serialize it with
    ``json.dumps(..., default=lm_eval.utils.handle_non_serializable)``) and, when
    ``log_samples`` is true, ``"predictions"``: {task: :func:`predictions` rows} (for a group
    such as MMLU, the rows of all its subtasks).
    """
    from .backend import SocllmLM

    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    tasks = list(tasks)
    if not tasks:
        raise InvalidArgumentError("evaluate: no tasks given")
    names = {t: resolve_task(t) for t in tasks}
    if limit_per_subject and (
        not isinstance(limit, int) or resolve_task("mmlu") not in names.values()
    ):
        raise not_applicable(
            "evaluate",
            "limit_per_subject=True",
            "an integer limit on MMLU (shared by its 57 subjects unless per subject)",
            f"tasks {', '.join(tasks)} have no MMLU"
            if isinstance(limit, int)
            else f"limit={limit!r} is no count of documents",
        )

    lm_args: dict[str, Any] = {"batch_size": batch_size, "quiet": quiet}
    if threads is not None:
        lm_args["threads"] = threads
    if max_length is not None:
        lm_args["max_length"] = max_length
    if max_batch_tokens is not None:
        lm_args["max_batch_tokens"] = max_batch_tokens
    with quiet_lm_eval() if quiet else contextlib.nullcontext():
        lm = SocllmLM(
            model=model,
            plan=plan,
            calib=str(calib) if calib else None,
            **lm_args,
            **plan_options,
        )
        tm = task_manager(data_dir)
        raw = simple_evaluate(
            lm,
            list(dict.fromkeys(names.values())),
            limit=limit,
            limit_per_subject=limit_per_subject,
            task_manager=tm,
            num_fewshot=num_fewshot,
            log_samples=log_samples,
            bootstrap_iters=bootstrap_iters,
            use_cache=None if use_cache is None else os.fspath(use_cache),
        )
    out: dict[str, Any] = summarize(raw, names)
    out[RAW_KEY] = raw
    if log_samples:
        out[PREDICTIONS_KEY] = {s: predictions(raw, lm_name) for s, lm_name in names.items()}
    return out


def simple_evaluate(
    lm: Any,
    lm_names: Sequence[str],
    limit: int | float | None,
    *,
    limit_per_subject: bool = False,
    quiet: bool = False,
    **kwargs: Any,
) -> dict:
    """``lm_eval.simple_evaluate`` of any lm-eval model (socllm's, or lm-eval's ``hf``) on
    lm-eval task names, with :func:`evaluate`'s meaning of ``limit`` (MMLU's shared among its
    subjects). lm-eval applies one limit to every leaf task, so tasks whose per-leaf limit
    differs run in separate calls whose results are merged. ``quiet``: inside
    :func:`quiet_lm_eval` (no progress bars, no lm-eval INFO logs)."""
    import lm_eval

    by_limit: dict[Any, list[str]] = {}
    for lm_name in lm_names:
        by_limit.setdefault(_leaf_limit(lm_name, limit, limit_per_subject), []).append(lm_name)
    raws = []
    with quiet_lm_eval() if quiet else contextlib.nullcontext():
        for leaf_limit, group in by_limit.items():
            raw = lm_eval.simple_evaluate(model=lm, tasks=group, limit=leaf_limit, **kwargs)
            if raw is None:  # only on non-zero ranks of a distributed run
                raise RuntimeError("lm_eval.simple_evaluate returned no results")
            raws.append(raw)
    return _merge_raw(raws)


def _leaf_limit(lm_name: str, limit: int | float | None, per_subject: bool) -> int | float | None:
    """The limit lm-eval applies to each leaf of ``lm_name``: MMLU's subjects share an integer
    ``limit`` unless ``per_subject``."""
    if limit is None or per_subject or isinstance(limit, float) or lm_name != resolve_task("mmlu"):
        return limit
    return max(1, math.ceil(limit / len(MMLU_SUBJECTS)))


def _merge_raw(raws: list[Mapping]) -> dict:
    """One ``simple_evaluate``-shaped result from several: dict-valued entries (results,
    groups, configs, n-samples, samples, ...) merged, the rest taken from the first."""
    out = dict(raws[0])
    for raw in raws[1:]:
        for k, v in raw.items():
            if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
                out[k] = {**out[k], **v}
            elif k not in out:
                out[k] = v
    return out


def task_names(tasks: str | Iterable[str]) -> dict[str, str]:
    """Short name -> lm-eval name for each of ``tasks`` (list or comma-separated string)."""
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    return {t: resolve_task(t) for t in tasks}
