"""``socllm sweep``: a grid of models x calibration settings x plans x tasks, one Ray task per
cell (issue 16 item 3).

* The grid is checked before anything runs: an unknown model, plan, task or calibration
  setting, or a plan that needs calibration on the ``none`` setting, is an
  InvalidArgumentError naming it.
* Plans that use no calibration (``Plan.needs_calibration`` false, e.g. fp32) run once per model
  whatever the calibration axis holds; ``fp32`` is always in the grid, since every other row is
  compared with it.
* Each calibration setting is one Ray task per model that returns the HDF5 file's bytes; the
  driver stores them (``calib/``) and hands them to the cells through the object store, so the
  nodes of a cluster share no file system.
* Only the driver writes results: each cell's result lands in ``cells/.../<task>.json``
  atomically when it arrives, so a sweep killed at any point keeps every finished cell, and a
  rerun skips them (a cell file made with other settings is an error, not a silent mix).
  Deterministic socllm errors (e.g. a plan the model cannot run) are results too (``status:
  error``), rerun only with ``retry_errors``.
* A running lm-eval cell commits each request it scores to its own SQLite file under
  ``partial/`` (lm-eval's per-request cache; the name carries the cell and a digest of the
  settings), so a worker or sweep killed mid-cell loses at most the batch in flight: the next
  attempt, a Ray retry or a rerun, scores only the missing requests (``resumed_requests`` in
  the cell file; its ``seconds`` are the last attempt's). The driver deletes the file once the
  cell's result is written, and the folders left empty when the sweep ends. Resuming needs the
  retry on the same node or a ``--out`` shared by the nodes; elsewhere the cell starts afresh.
* A worker that dies is retried by Ray (``retries`` times; any non-socllm exception as well);
  every attempt is counted by a ledger actor, so retried cells are reported, and a cell that
  failed every attempt is listed and makes the sweep fail, never silently dropped.
* At the end one table (markdown + JSON): lm-eval tasks as score and paired difference from
  the same model's fp32 (standard error and paired bootstrap 95% interval); the
  ``wikitext2-heldout`` task as KL, top-1 agreement and perplexity ratio against fp32; with
  two or more lm-eval tasks, a last column with their unweighted mean (a plan's mean paired
  change ± its standard error, once every task of the row has finished); ``socllm sweep`` also
  draws one forest plot per model of the same numbers (:mod:`socllm.eval.sweep_plot`).

Ray is started locally on demand (``ray.init()``) unless ``address`` names a running cluster.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import _core
from ..errors import InvalidArgumentError, SocllmError
from ..io.files import atomic_path, atomic_write_text
from .bench_utils import run_provenance

# The preset plans of the accuracy tables (docs/RESULTS.md, Issue 3).
PRESET_PLANS = (
    "fp32",
    "w8a8",
    "w8a8-perchannel",
    "smoothquant",
    "llm-int8",
    "w8-group",
    "w4-group",
    "w4a16",
)
REFERENCE_PLAN = "fp32"
DISTRIBUTION_TASK = "wikitext2-heldout"  # socllm.eval.divergence's metrics against fp32
NO_CALIBRATION = "none"
DEFAULT_CALIBRATION = "act-scales"  # socllm calibrate's default: 128 x 512 tokens, seed 0
CELL_FORMAT = 1  # bump when a cell's result changes meaning
# lm-eval's name for the cache file of a use_cache prefix (CachingLM of rank 0)
LMEVAL_CACHE_SUFFIX = "_rank0.db"
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def lmeval_tasks() -> dict[str, str]:
    """{task: the metric it is reported with}."""
    from .lmeval.task_configs import PRIMARY_METRIC

    return dict(PRIMARY_METRIC)


def sweep_tasks() -> tuple[str, ...]:
    return (DISTRIBUTION_TASK, *lmeval_tasks())


@dataclass(frozen=True)
class SweepSettings:
    """What a cell's result depends on besides its coordinates (``identity``), and how cells
    run (threads, retries: not part of the result)."""

    limit: int | None = None  # documents per lm-eval task; None: all (MMLU's spread over 57)
    fewshot: int | None = None
    batch_size: int = 8
    context: int = 512  # wikitext2-heldout window
    windows: int | None = 16  # wikitext2-heldout windows; None: all
    cpus_per_cell: int = 2
    retries: int = 2

    def identity(self) -> dict:
        d = asdict(self)
        for k in ("cpus_per_cell", "retries"):
            d.pop(k)
        return {**d, "format": CELL_FORMAT}


@dataclass(frozen=True)
class Cell:
    model: str
    calib: str
    plan: str
    task: str

    @property
    def key(self) -> str:
        return f"{self.model} | {self.calib} | {self.plan} | {self.task}"

    def relpath(self) -> Path:
        return Path("cells", *(slug(x) for x in (self.model, self.calib, self.plan)), self.task)

    def to_dict(self) -> dict:
        return asdict(self)


def slug(text: str) -> str:
    """A file-name-safe form of ``text``; a hash suffix keeps distinct texts distinct."""
    safe = _SLUG_UNSAFE.sub("_", text).strip("_") or "_"
    if safe == text and len(text) <= 80:
        return text
    return f"{safe[:60]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def parse_calibration(spec: str) -> tuple[list[str], dict]:
    """``"none"`` -> ([], {}); ``"act-scales+outliers:samples=64,seed=1"`` -> (steps, options)
    for :func:`socllm.calibration.run_steps`, checked (unknown step or option, bad
    value)."""
    from ..calibration import STEPS, check_steps, step_options

    spec = spec.strip()
    if spec == NO_CALIBRATION:
        return [], {}
    steps_part, _, opts_part = spec.partition(":")
    steps = [s.strip() for s in steps_part.split("+") if s.strip()]
    if not steps:
        raise InvalidArgumentError(f"sweep: calibration setting {spec!r} names no step")
    for s in steps:
        if s not in STEPS:
            raise InvalidArgumentError(
                f"sweep: unknown calibration step {s!r} in {spec!r} (known: {', '.join(STEPS)})"
            )
    known = step_options()
    opts: dict = {}
    for item in filter(None, (x.strip() for x in opts_part.split(","))):
        k, eq, v = item.partition("=")
        k = k.strip().replace("-", "_")
        if not eq or k not in known:
            raise InvalidArgumentError(
                f"sweep: calibration option {item!r} in {spec!r} is not key=value with a known "
                f"key ({', '.join(sorted(known))})"
            )
        default = known[k]
        try:
            opts[k] = type(default)(v) if isinstance(default, int | float) else v
        except ValueError:
            raise InvalidArgumentError(
                f"sweep: calibration option {k}={v!r} in {spec!r} is not a {type(default).__name__}"
            ) from None
    try:
        check_steps(steps, None, opts)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"sweep: calibration setting {spec!r}: {e}") from None
    return steps, opts


def check_model(name: str) -> None:
    """A built-in name or an existing model path, else InvalidArgumentError naming it."""
    from ..registry import BUILTIN_MODELS

    if name in BUILTIN_MODELS or Path(name).exists():
        return
    raise InvalidArgumentError(
        f"sweep: unknown model {name!r} (built-in: {', '.join(BUILTIN_MODELS)}; or a path to a "
        ".gguf, HF directory or .h5)"
    )


def plan_grid(
    models: Sequence[str],
    calibs: Sequence[str],
    plans: Sequence[str],
    tasks: Sequence[str],
) -> list[Cell]:
    """The cells of the grid, checked; ``fp32`` added to the plans; plans without calibration
    placed on the ``none`` setting once."""
    for axis, values in (("models", models), ("plans", plans), ("tasks", tasks)):
        if not values:
            raise InvalidArgumentError(f"sweep: no {axis} given")
    for m in models:
        check_model(m)
    known_tasks = sweep_tasks()
    for t in tasks:
        if t not in known_tasks:
            raise InvalidArgumentError(
                f"sweep: unknown task {t!r} (known: {', '.join(known_tasks)})"
            )
    calibs = list(dict.fromkeys(c.strip() for c in (calibs or [NO_CALIBRATION])))
    for c in calibs:
        parse_calibration(c)
    plans = list(dict.fromkeys([REFERENCE_PLAN, *plans]))
    needs = {}
    for p in plans:
        try:
            needs[p] = _core.Plan(p).needs_calibration
        except SocllmError as e:
            raise InvalidArgumentError(f"sweep: plan {p!r}: {e}") from None
    real_calibs = [c for c in calibs if c != NO_CALIBRATION]
    for p in plans:
        if needs[p] and not real_calibs:
            raise InvalidArgumentError(
                f"sweep: plan {p!r} needs calibration but the only calibration setting is "
                f"{NO_CALIBRATION!r} (give --calib act-scales, for example)"
            )
    cells = []
    for m in models:
        for p in plans:
            for c in real_calibs if needs[p] else [NO_CALIBRATION]:
                cells.extend(Cell(m, c, p, t) for t in tasks)
    return cells


# -- work done in a Ray worker -----------------------------------------------------------------

_MODELS: dict[tuple[str, str], object] = {}  # (model, calibration digest) -> LanguageModel
_MAX_CACHED_MODELS = 2


def _worker_model(name: str, calib_bytes: bytes | None, threads: int):
    from ..model import load

    _core.set_num_threads(threads)
    _core.set_log_level("warn")
    digest = hashlib.sha256(calib_bytes).hexdigest() if calib_bytes else ""
    key = (name, digest)
    if key not in _MODELS:
        while len(_MODELS) >= _MAX_CACHED_MODELS:
            _MODELS.pop(next(iter(_MODELS)))
        model = load(name, progress=False)
        if calib_bytes:
            # the engine keeps the statistics it loads, so the file lives only while it is read
            with tempfile.TemporaryDirectory(prefix="socllm-sweep-calib-") as d:
                path = Path(d) / "calib.h5"
                path.write_bytes(calib_bytes)
                model.load_calibration(path)
            model.calibration_path = None  # it came through Ray, from the driver's calib/ file
        _MODELS[key] = model
    return _MODELS[key]


def calibrate_task(model: str, spec: str, threads: int) -> bytes:
    """Ray task: the calibration file of ``spec`` for ``model``, as bytes."""
    from ..calibration import run_steps, save_calibration

    steps, opts = parse_calibration(spec)
    m = _worker_model(model, None, threads)
    cal = run_steps(m, steps, progress=False, **opts)
    with tempfile.TemporaryDirectory() as d:
        path = save_calibration(Path(d) / "calib.h5", cal, m)
        return path.read_bytes()


def evaluate_lmeval_cell(
    model, plan: str, task: str, limit, batch_size: int, fewshot, partial=None
) -> dict:
    """One plan on one lm-eval task: the primary metric's score, per-document scores
    (``docs``: {"subtask/doc_id": 0/1}) for pairing, acc and acc_norm. ``partial``: the path
    prefix of the cell's per-request cache (:func:`socllm.eval.lmeval.evaluate`'s ``use_cache``)."""
    import socllm.eval.lmeval as sl

    metric = lmeval_tasks()[task]
    r = sl.evaluate(
        model,
        tasks=[task],
        plan=plan,
        limit=limit,
        batch_size=batch_size,
        num_fewshot=fewshot,
        quiet=True,
        log_samples=True,
        bootstrap_iters=0,
        use_cache=partial,
    )
    docs = {f"{row['task']}/{row['doc_id']}": float(row[metric]) for row in r["predictions"][task]}
    return {
        "metric": metric,
        "n": len(docs),
        "score": sum(docs.values()) / len(docs),
        "acc": r[task]["acc"],
        "acc_norm": r[task]["acc_norm"],
        "docs": docs,
    }


def cached_requests(partial: str | os.PathLike | None) -> int:
    """Requests already scored in the per-request cache at ``partial`` (0 if it has none)."""
    db = Path(f"{partial}{LMEVAL_CACHE_SUFFIX}") if partial else None
    if db is None or not db.exists():
        return 0
    from sqlitedict import SqliteDict

    with SqliteDict(str(db), flag="r") as d:
        return len(d)


def run_cell(
    cell: Cell,
    settings: SweepSettings,
    calib_bytes: bytes | None,
    partial: str | os.PathLike | None = None,
) -> dict:
    """The result of one cell (no attempt bookkeeping): ``status`` ok with ``result``, or
    error with the socllm error's class and message. ``partial``: where an lm-eval cell keeps
    the requests it has scored, so an attempt that dies mid-cell loses none of them
    (``resumed_requests``: how many this attempt found there)."""
    from .divergence import compare_plans

    provenance = run_provenance()  # before the work: the code this process runs it with
    started_unix_s = time.time()
    t0 = time.perf_counter()
    resumed = None
    try:
        model = _worker_model(cell.model, calib_bytes, settings.cpus_per_cell)
        if cell.task == DISTRIBUTION_TASK:
            r = compare_plans(
                model, [cell.plan], context=settings.context, windows=settings.windows
            )[cell.plan]
        else:
            if partial is not None:
                try:  # a node that cannot write there (no shared --out) runs without it
                    Path(partial).parent.mkdir(parents=True, exist_ok=True)
                except OSError:
                    partial = None
            resumed = cached_requests(partial)
            r = evaluate_lmeval_cell(
                model,
                cell.plan,
                cell.task,
                settings.limit,
                settings.batch_size,
                settings.fewshot,
                partial,
            )
        out = {"status": "ok", "result": r}
    except (SocllmError, ValueError) as e:
        # deterministic: the same input fails the same way on any node. lm-eval's backend wraps
        # the engine's refusal (e.g. an fp16 overflow) in a ValueError: the cause is the record
        cause = e if isinstance(e, SocllmError) else e.__cause__
        if not isinstance(cause, SocllmError):
            raise
        out = {"status": "error", "error": f"{type(cause).__name__}: {cause}"}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    out["started_unix_s"] = round(started_unix_s, 3)
    if resumed is not None:
        out["resumed_requests"] = resumed
    out["host"] = socket.gethostname()
    out["provenance"] = provenance
    return out


def _die_mid_cell(cell: Cell, settings: SweepSettings, calib_bytes) -> None:
    """Tests (``crash_pattern``): kill this worker process as an out-of-memory kill would, in
    the middle of an lm-eval cell (on its second engine batch, once the first batch's requests
    are in the per-request cache), at once for any other cell."""
    if cell.task == DISTRIBUTION_TASK:
        os._exit(1)
    model = _worker_model(cell.model, calib_bytes, settings.cpus_per_cell)
    batches = itertools.count()
    logits_batch = model.logits_batch

    def dying(*args, **kwargs):
        if next(batches) == 1:
            os._exit(1)
        return logits_batch(*args, **kwargs)

    model.logits_batch = dying


def cell_task(
    cell: Cell, settings: SweepSettings, calib_bytes, ledger, crash_pattern, partial=None
) -> dict:
    """Ray task: :func:`run_cell` with its attempt number from the ledger. ``crash_pattern``
    (tests only): the first attempt of a cell whose key contains it kills its worker process
    (:func:`_die_mid_cell`)."""
    import ray

    started = ledger.start.remote(cell.key)
    if crash_pattern and crash_pattern in cell.key and ray.get(started) == 1:
        _die_mid_cell(cell, settings, calib_bytes)
    rec = run_cell(cell, settings, calib_bytes, partial)
    # The attempt number is waited for only now: a task blocked in ray.get lends its CPUs to
    # the next queued cell, and both then run to the end (at the start, each cell would start
    # one more than the cluster has CPUs for).
    return {**rec, "attempt": ray.get(started)}


class AttemptLedger:
    """Ray actor: attempts started per cell key (retries are visible to the driver)."""

    def __init__(self):
        self.attempts: dict[str, int] = {}

    def start(self, key: str) -> int:
        self.attempts[key] = self.attempts.get(key, 0) + 1
        return self.attempts[key]

    def counts(self) -> dict[str, int]:
        return dict(self.attempts)


# -- the driver ---------------------------------------------------------------------------------


@dataclass
class SweepReport:
    cells: list[Cell]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    retried: dict[str, int] = field(default_factory=dict)  # key -> attempts
    failed: dict[str, str] = field(default_factory=dict)  # key -> error after all attempts
    seconds: float = 0.0
    table_md: str = ""
    rows: list[dict] = field(default_factory=list)  # the table's rows (sweep.json "rows")


def _cell_file(out: Path, cell: Cell) -> Path:
    return out / cell.relpath().with_suffix(".json")


def _read_cell(out: Path, cell: Cell, identity: dict) -> dict | None:
    """A finished cell's record, None if not run; one made with other settings is an error."""
    path = _cell_file(out, cell)
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"sweep: unreadable cell file {path}: {e}") from None
    if rec.get("config") != identity or rec.get("cell") != cell.to_dict():
        raise InvalidArgumentError(
            f"sweep: {path} was made with other settings ({rec.get('config')}, not {identity}); "
            "use another --out or the same settings"
        )
    return rec


def _partial_prefix(out: Path, cell: Cell, identity: dict) -> Path:
    """The path prefix of a cell's per-request cache: the cell's own, and its settings', so a
    run with other settings (or another cell) never reads it."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return out.resolve() / "partial" / Path(*cell.relpath().parts[1:-1]) / f"{cell.task}-{digest}"


def _remove_partial(prefix: Path) -> None:
    for f in prefix.parent.glob(f"{prefix.name}{LMEVAL_CACHE_SUFFIX}*"):  # with any -journal
        f.unlink(missing_ok=True)


def _remove_empty_partial_folders(out: Path, prefixes: Iterable[Path]) -> None:
    """The cells' cache folders left empty, once none of them runs (a running cell may have
    made its folder and not yet its cache)."""
    root = out.resolve() / "partial"
    folders = {f for p in prefixes for f in p.parents if f.is_relative_to(root) and f != root}
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _calib_file(out: Path, model: str, spec: str) -> Path:
    return out / "calib" / slug(model) / f"{slug(spec)}.h5"


def run_sweep(
    models: Sequence[str],
    plans: Sequence[str],
    tasks: Sequence[str],
    out: str | os.PathLike,
    *,
    calibs: Sequence[str] = (DEFAULT_CALIBRATION,),
    settings: SweepSettings | None = None,
    address: str | None = None,
    retry_errors: bool = False,
    progress: bool = True,
    crash_pattern: str | None = None,
    table_only: bool = False,
) -> SweepReport:
    """Runs the grid's unfinished cells on Ray and writes the table (see the module doc);
    ``table_only``: runs nothing, writes the table of the cells finished so far."""
    import ray
    from tqdm.auto import tqdm

    settings = settings or SweepSettings()
    if settings.cpus_per_cell < 1 or settings.retries < 0:
        raise InvalidArgumentError(
            f"sweep: cpus_per_cell must be >= 1 and retries >= 0, got {settings.cpus_per_cell} "
            f"and {settings.retries}"
        )
    out = Path(out)
    cells = plan_grid(models, calibs, plans, tasks)
    identity = settings.identity()
    report = SweepReport(cells)
    done = {c.key: _read_cell(out, c, identity) for c in cells}
    todo = [
        c for c in cells if done[c.key] is None or (retry_errors and done[c.key]["status"] != "ok")
    ]
    report.skipped = [c.key for c in cells if c not in todo]
    if table_only:
        todo = []
    t0 = time.perf_counter()
    if todo:
        out.mkdir(parents=True, exist_ok=True)
        started_here = not ray.is_initialized()
        if started_here:
            ray.init(
                address=address,
                include_dashboard=False,
                logging_level="warning",
                log_to_driver=False,  # worker output would garble the progress bar
            )
        try:
            _run_cells(ray, tqdm, todo, settings, out, report, progress, crash_pattern)
        finally:
            if started_here:
                ray.shutdown()
    report.seconds = round(time.perf_counter() - t0, 1)
    records = {c.key: _read_cell(out, c, identity) for c in cells}
    table = build_table(cells, records, finished_only=table_only)
    report.table_md = table["markdown"]
    summary = {
        "grid": {
            "models": list(models),
            "calibs": list(calibs),
            "plans": list(dict.fromkeys([REFERENCE_PLAN, *plans])),
            "tasks": list(tasks),
        },
        "settings": identity,
        "ran": report.ran,
        "skipped": report.skipped,
        "retried": report.retried,
        "failed": report.failed,
        "seconds": report.seconds,
        # the code and machines the cells came from (cells written before provenance was
        # recorded have none)
        "provenance": [
            json.loads(p)
            for p in sorted(
                {
                    json.dumps(r["provenance"], sort_keys=True)
                    for r in records.values()
                    if r and "provenance" in r
                }
            )
        ],
        "rows": table["rows"],
    }
    atomic_write_text(out / "sweep.json", json.dumps(summary, indent=1) + "\n")
    atomic_write_text(out / "sweep.md", table["markdown"] + "\n")
    report.rows = table["rows"]
    return report


def _run_cells(ray, tqdm, todo, settings, out, report, progress, crash_pattern) -> None:
    identity = settings.identity()
    ledger = ray.remote(num_cpus=0)(AttemptLedger).remote()
    calib_remote = ray.remote(calibrate_task).options(
        num_cpus=settings.cpus_per_cell, max_retries=settings.retries, retry_exceptions=True
    )
    cell_remote = ray.remote(cell_task).options(
        num_cpus=settings.cpus_per_cell,
        max_retries=settings.retries,
        # socllm errors are results, not exceptions: what reaches Ray is worth another attempt
        retry_exceptions=True,
    )
    calib_refs = {}
    pending: dict = {}  # ObjectRef -> ("calib", (model, spec)) | ("cell", Cell)
    for c in todo:
        if c.calib == NO_CALIBRATION or (c.model, c.calib) in calib_refs:
            continue
        path = _calib_file(out, c.model, c.calib)
        if path.exists():
            calib_refs[(c.model, c.calib)] = ray.put(path.read_bytes())
        else:
            ref = calib_remote.remote(c.model, c.calib, settings.cpus_per_cell)
            calib_refs[(c.model, c.calib)] = ref
            pending[ref] = ("calib", (c.model, c.calib))
    partials = {c: _partial_prefix(out, c, identity) for c in todo}
    for c in todo:
        calib = calib_refs.get((c.model, c.calib))
        partial = str(partials[c])
        pending[cell_remote.remote(c, settings, calib, ledger, crash_pattern, partial)] = (
            "cell",
            c,
        )
    bar = tqdm(total=len(todo), desc="sweep", unit="cell", disable=not progress)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        kind, what = pending.pop(ready[0])
        try:
            value = ray.get(ready[0])
        except ray.exceptions.RayError as e:
            if kind == "cell":
                report.failed[what.key] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                bar.update(1)
            continue
        if kind == "calib":
            with atomic_path(_calib_file(out, *what)) as tmp:
                tmp.write_bytes(value)
            continue
        rec = {"cell": what.to_dict(), "config": identity, **value}
        path = _cell_file(out, what)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(rec) + "\n")
        _remove_partial(partials[what])  # the cell file holds it all now
        report.ran.append(what.key)
        if value["attempt"] > 1:
            report.retried[what.key] = value["attempt"]
        bar.update(1)
        bar.set_postfix(failed=len(report.failed), retried=len(report.retried))
    bar.close()
    _remove_empty_partial_folders(out, partials.values())
    attempts = ray.get(ledger.counts.remote())
    for key in report.failed:
        report.failed[key] += f" (after {attempts.get(key, 0)} attempts)"


# -- the table ----------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def build_table(
    cells: Sequence[Cell], records: dict[str, dict | None], *, finished_only: bool = False
) -> dict:
    """``{"markdown", "rows"}``: one row per (model, calibration, plan); lm-eval cells as score
    (%) with the paired difference from the model's fp32 (points, ± standard error, [bootstrap
    95% interval]); the distribution task as KL / top-1 / perplexity ratio against fp32.
    ``finished_only``: rows without any finished cell are left out (``--table-only`` over a
    grid wider than what ran, e.g. the union of two sweeps' calibration settings)."""
    tasks = list(dict.fromkeys(c.task for c in cells))
    scored = [t for t in tasks if t != DISTRIBUTION_TASK]
    with_mean = len(scored) > 1
    rows: dict[tuple, dict] = {}
    for c in cells:
        rows.setdefault((c.model, c.calib, c.plan), {})[c.task] = records.get(c.key)
    if finished_only:
        rows = {k: v for k, v in rows.items() if any(r is not None for r in v.values())}
    out_rows = []
    lines = []
    for model in dict.fromkeys(c.model for c in cells):
        ref = rows.get((model, NO_CALIBRATION, REFERENCE_PLAN), {})
        lines += [
            f"**{model}**",
            "",
            "| plan | calibration | "
            + " | ".join(_task_header(t) for t in tasks)
            + (" | mean of the lm-eval tasks |" if with_mean else " |"),
            "| --- | --- |" + " ---: |" * (len(tasks) + with_mean),
        ]
        for (m, calib, plan), by_task in rows.items():
            if m != model:
                continue
            row = {"model": m, "calib": calib, "plan": plan, "tasks": {}}
            texts = []
            for t in tasks:
                entry, text = _table_cell(t, plan, by_task.get(t), ref.get(t))
                row["tasks"][t] = entry
                texts.append(text)
            if with_mean:
                row["mean"], text = _task_mean([row["tasks"][t] for t in scored], plan)
                texts.append(text)
            out_rows.append(row)
            lines.append(f"| `{plan}` | {calib} | " + " | ".join(texts) + " |")
        lines.append("")
    return {"markdown": "\n".join(lines).rstrip(), "rows": out_rows}


def _task_header(task: str) -> str:
    if task == DISTRIBUTION_TASK:
        return f"{task} (KL nats / top-1 % / ppl ratio)"
    return f"{task} ({lmeval_tasks()[task]})"


def _task_mean(entries: list[dict | None], plan: str) -> tuple[dict | None, str]:
    """The unweighted mean over lm-eval tasks, as the papers average (seed 001 Table 6 "Avg.
    Degrad."): fp32's mean score; another plan's mean paired change ± its standard error,
    sqrt(sum se_i^2) / n, since the tasks' documents are disjoint and their changes
    independent. Empty unless every task has a result (and, for a plan, a paired change)."""
    if any(e is None or "score" not in e for e in entries):
        return None, ""
    n = len(entries)
    if plan == REFERENCE_PLAN:
        score = sum(e["score"] for e in entries) / n
        return {"score": score, "n_tasks": n}, _pct(score)
    if any("delta" not in e for e in entries):
        return None, ""
    delta = sum(e["delta"] for e in entries) / n
    se = math.sqrt(sum(e["se"] ** 2 for e in entries)) / n
    return {"delta": delta, "se": se, "n_tasks": n}, f"{100 * delta:+.1f}±{100 * se:.1f}"


def _table_cell(task: str, plan: str, rec: dict | None, ref: dict | None):
    """(JSON entry, markdown text) of one cell against the model's fp32 cell ``ref``."""
    if rec is None:
        return None, "not run"
    if rec["status"] != "ok":
        return {"error": rec["error"]}, rec["error"].split(":")[0]
    r = rec["result"]
    if task == DISTRIBUTION_TASK:
        entry = {k: r[k] for k in ("kl", "top1", "ppl_ratio", "ppl", "ppl_ref", "n_scored")}
        if plan == REFERENCE_PLAN:
            return entry, f"ppl {r['ppl']:.3f}"
        return entry, (
            f"{r['kl']['value']:.4f} / {_pct(r['top1']['value'])} / {r['ppl_ratio']['value']:.3f}"
        )
    entry = {"score": r["score"], "n": r["n"], "metric": r["metric"]}
    text = _pct(r["score"])
    if plan != REFERENCE_PLAN and ref is not None and ref["status"] == "ok":
        paired, paired_text = paired_change(ref["result"]["docs"], r["docs"])
        entry.update(paired)
        text += f" ({paired_text})"
    return entry, text


def paired_change(ref_docs: dict, docs: dict) -> tuple[dict, str]:
    """The change from ``ref_docs`` to ``docs`` (per-document scores): ``{"delta", "se",
    "ci95"}`` and its text in points, "+d±se [lo, hi]" (paired bootstrap 95% interval)."""
    from .stats import paired_bootstrap_ci, paired_difference

    delta, se = paired_difference(ref_docs, docs)
    lo, hi = paired_bootstrap_ci(ref_docs, docs)
    text = f"{100 * delta:+.1f}±{100 * se:.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return {"delta": delta, "se": se, "ci95": [lo, hi]}, text
