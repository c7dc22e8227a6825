"""``socllm sweep``: a grid of models x calibration settings x plans x tasks, one Ray task per
cell (issue 16 item 3).

* The grid is checked before anything runs, Ray included: an unknown model, plan, task or
  calibration setting, a calibration option out of range or (sequence lengths, defaults
  included) beyond a model's context, a plan that needs calibration on the ``none`` setting or
  an output folder that is a file, is an InvalidArgumentError naming it.
* Plans that use no calibration (``Plan.needs_calibration`` false, e.g. fp32) run once per model
  whatever the calibration axis holds; ``fp32`` is always in the grid, since every other row is
  compared with it.
* A calibration setting may rotate the model its steps observe with the plan parts of issue 39
  (``act-scales+gptq:rotate=hadamard,rotate_down=hadamard``); it serves the calibrated plans
  with the same parts (``w8a8:rotate=hadamard,rotate_down=hadamard,rounding=gptq``) and only
  those (:func:`calibration_rotation`).
* Each calibration setting is one Ray task per model that returns the HDF5 file's bytes; the
  driver stores them (``calib/``) and hands them to the cells through the object store, so the
  nodes of a cluster share no file system.
* Only the driver writes results: each cell's result lands in ``cells/.../<task>.json``
  atomically when it arrives, so a sweep killed at any point keeps every finished cell, and a
  rerun skips them (a cell file made with other settings is an error, not a silent mix).
  Deterministic socllm errors (e.g. a plan the model cannot run) are results too (``status:
  error``), rerun only with ``retry_errors``.
* What a cell is made from is keyed on content (:func:`cell_inputs`): the SHA-256 of the model's
  files, of the task's data (and lm-eval prompt templates) and, for a calibrated cell, of its
  calibration's making (the setting, the model's and the corpus' digests). A finished cell, a
  cached calibration or a cell's per-request cache made from other content starts over, and
  the sweep says which and what changed; a worker checks that the model and data it reads are
  those the driver hashed. Each file is hashed once per run.
* A running lm-eval cell commits each request it scores to its own SQLite file under
  ``partial/`` (lm-eval's per-request cache; the name carries the cell and a digest of the
  settings), so a worker or sweep killed mid-cell loses at most the batch in flight: the next
  attempt, a Ray retry or a rerun, scores only the missing requests (``resumed_requests`` in
  the cell file; its ``seconds`` are the last attempt's). The driver deletes the file once the
  cell's result is written, and the folders left empty when the sweep ends. Resuming needs the
  retry on the same node or a ``--out`` shared by the nodes; elsewhere the cell starts afresh.
* A worker that dies is retried by Ray (``retries`` times; any non-socllm exception as well);
  every attempt is counted by a ledger actor, so retried cells are reported, and a cell that
  failed every attempt is listed with its worker's own error (unwrapped from Ray's
  RayTaskError; a cell whose calibration failed, as not started, with that error) and makes
  the sweep fail, never silently dropped.
* At the end one table (markdown + JSON): lm-eval tasks as score and paired difference from
  the same model's fp32 (standard error and paired bootstrap 95% interval); the
  ``wikitext2-heldout`` task as KL, top-1 agreement and perplexity ratio against fp32; with
  two or more lm-eval tasks, a last column with their unweighted mean (a plan's mean paired
  change ± its standard error, once every task of the row has finished); ``socllm sweep`` also
  draws one forest plot per model of the same numbers (:mod:`socllm.eval.sweep_plot`).

Ray is started locally on demand (``ray.init()``) unless ``address`` names a running cluster.
A local cluster is started in a temp folder of its own, watched by a reaper process
(:mod:`socllm.eval.sweep_watchdog`) that kills what is left of it once the driver has gone, by
``kill -9`` included.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import _core
from ..errors import InvalidArgumentError, MissingFileError, SocllmError, not_applicable
from ..io.files import atomic_path, atomic_write_text
from .bench_utils import run_provenance
from .ray_session import RAY_TEMP_PREFIX, _error_text, _start_ray  # noqa: F401 (RAY_TEMP_PREFIX: tests)

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
        if eq and k in ROTATION_PARTS:  # the model's rotation, not a step option
            continue
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


# Calibration-setting options that rotate the model the steps observe (the plan parts of
# issue 39): "act-scales+gptq:rotate=hadamard,rotate_down=hadamard" serves the plans with those
# parts, and only those.
ROTATION_PARTS = ("rotate", "rotate_seed", "rotate_down", "rotate_heads")


def calibration_rotation(spec: str) -> str:
    """The rotation (``Plan.rotation`` name) a calibration setting's statistics are made on."""
    _, _, opts_part = spec.strip().partition(":")
    parts = [
        x.strip()
        for x in opts_part.split(",")
        if x.strip().partition("=")[0].strip().replace("-", "_") in ROTATION_PARTS
    ]
    if not parts:
        return "none"
    try:
        return _core.Plan("fp32:" + ",".join(parts)).rotation
    except SocllmError as e:
        raise InvalidArgumentError(f"sweep: calibration setting {spec!r}: {e}") from None


def check_model(name: str) -> Path:
    """The file or folder a model name or path refers to: a built-in name or an existing model
    path, a regular file or a directory (a FIFO would block the hash), else
    InvalidArgumentError naming it."""
    from ..registry import BUILTIN_MODELS, source_path

    if name not in BUILTIN_MODELS and not Path(name).exists():
        raise InvalidArgumentError(
            f"sweep: unknown model {name!r} (built-in: {', '.join(BUILTIN_MODELS)}; or a path to "
            "a .gguf, HF directory or .h5)"
        )
    src = source_path(name)
    mode = src.stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InvalidArgumentError(
            f"sweep: model {name!r}: {src} is not a regular file or a directory"
        )
    return src


# -- what a cell is made from: content digests ----------------------------------------------------

# (path, device, inode, size, mtime, ctime) -> SHA-256: a run hashes each file once (run_sweep
# clears it; a worker keeps it, per process, for the cells it runs)
_DIGESTS: dict[tuple, str] = {}
# Calibration options that are the tokens of one sequence: the model's context bounds them
# (the core's calibration_step_options checks every option's range but knows no model).
_SEQUENCE_OPTIONS = ("seqlen", "importance_seqlen", "validation_context")
_SHORT_DIGEST = 12  # hex digits of a digest in messages


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a regular file's bytes (streamed), once per (path, identity, size,
    timestamps) in this process; anything but a regular file is refused by name."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise MissingFileError(f"sweep: cannot read {p}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgumentError(f"sweep: {p} is not a regular file")
    key = (os.path.realpath(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        with open(p, "rb") as f:
            _DIGESTS[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _DIGESTS[key]


def tree_sha256(folder: str | os.PathLike) -> str:
    """SHA-256 over a folder's regular files: their paths relative to it and their digests."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(f"sweep: folder {folder} not found")
    h = hashlib.sha256()
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            f = Path(root, name)
            if f.is_file():
                h.update(f"{f.relative_to(folder)}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def model_sha256(name: str) -> str:
    """SHA-256 of what loading model ``name`` reads (:func:`socllm.registry.content_digest`:
    the file, or a Hugging Face folder's config, tokenizer and weights; memoized on disk, so a
    rerun does not read a large model again)."""
    from ..io.model_format import source_files
    from ..registry import content_digest

    src = check_model(name)
    # keyed on every file read (a folder's own timestamps miss a file rewritten in place)
    key = ("model", str(src))
    for f in source_files(src):
        st = f.stat()
        key += (os.path.realpath(f), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = content_digest(src)
    return _DIGESTS[key]


def task_data_sha256(task: str) -> str:
    """SHA-256 of what a task reads besides the model: WikiText-2's test file, or an lm-eval
    task's data folder and socllm's prompt templates (they make the requests)."""
    from ..data import data_dir, wikitext2_test_path

    if task == DISTRIBUTION_TASK:
        return file_sha256(wikitext2_test_path(verify=False))
    from .lmeval.task_configs import ALIASES, TEMPLATE_DIR

    folder = data_dir() / ALIASES.get(task, task)
    both = f"{tree_sha256(folder)}\0{tree_sha256(TEMPLATE_DIR)}"
    return hashlib.sha256(both.encode()).hexdigest()


def calibration_source(spec: str, model_digest: str) -> dict:
    """What the calibration ``spec`` of a model is made from: the setting, the model's digest
    and the digest of the corpus its steps read."""
    from ..calibration import step_options
    from ..data import wikitext2_test_path

    _, opts = parse_calibration(spec)
    corpus = opts.get("corpus", step_options()["corpus"])
    corpus_path = wikitext2_test_path(verify=False) if corpus == "wikitext2" else Path(corpus)
    return {"spec": spec, "model": model_digest, "corpus": file_sha256(corpus_path)}


def _digest_of(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def cell_inputs(cells: Sequence[Cell]) -> dict[str, dict]:
    """{cell key: {"model", "calibration", "data"}}: the content digests a cell's result is
    made from ("calibration": None without one)."""
    models = {m: model_sha256(m) for m in dict.fromkeys(c.model for c in cells)}
    data = {t: task_data_sha256(t) for t in dict.fromkeys(c.task for c in cells)}
    calibs = {
        (c.model, c.calib): _digest_of(calibration_source(c.calib, models[c.model]))
        for c in cells
        if c.calib != NO_CALIBRATION
    }
    return {
        c.key: {
            "model": models[c.model],
            "calibration": calibs.get((c.model, c.calib)),
            "data": data[c.task],
        }
        for c in cells
    }


_INPUT_NAMES = {
    "model": "the model",
    "calibration": "the calibration",
    "data": "the task data",
    "spec": "the calibration setting",
    "corpus": "the calibration corpus",
}


def changed_inputs(recorded: dict | None, current: dict) -> str | None:
    """What differs between the ``recorded`` content digests and the ``current`` ones, as
    text ("the model changed (sha256 1a2b... -> 3c4d...)"); None if nothing."""
    if not isinstance(recorded, dict):
        return "no record of the content it was made from"
    changes = [
        f"{_INPUT_NAMES.get(k, k)} changed (sha256 {_short(recorded.get(k))} -> {_short(v)})"
        for k, v in current.items()
        if recorded.get(k) != v
    ]
    return "; ".join(changes) or None


def _short(digest: str | None) -> str:
    return digest[:_SHORT_DIGEST] if isinstance(digest, str) else str(digest)


def _say(message: str) -> None:
    """A line the user must see (progress bar or not): what the sweep starts over and why."""
    print(f"sweep: {message}", file=sys.stderr, flush=True)


def model_context_length(name: str) -> int:
    """The context length in the config of model ``name``'s (converted) file: the conversion
    a worker would make first, made here once."""
    import h5py

    from ..registry import resolve_model_file

    path = resolve_model_file(name, progress=False)
    try:
        with h5py.File(path, "r") as f:
            return int(f["config"].attrs["context_length"])
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise InvalidArgumentError(
            f"sweep: model {name!r}: no context length in {path} ({e})"
        ) from None


def check_corpus(spec: str) -> None:
    """A calibration setting's own corpus (``corpus=PATH``) is UTF-8 text that is not empty, as
    the steps will need it (the core checks only that the path exists)."""
    from ..calibration import step_options

    _, opts = parse_calibration(spec)
    corpus = opts.get("corpus", step_options()["corpus"])
    if corpus == "wikitext2":
        return
    try:
        text = Path(corpus).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(
            f"sweep: calibration setting {spec!r}: corpus={corpus} is not readable UTF-8 text ({e})"
        ) from None
    if not text.strip():
        raise InvalidArgumentError(f"sweep: calibration setting {spec!r}: corpus={corpus} is empty")


def check_against_models(cells: Sequence[Cell], settings: SweepSettings) -> None:
    """What only the model can tell, checked before anything runs: the sequence lengths of the
    calibration settings (defaults included) and the ``wikitext2-heldout`` window fit each
    model's context; and each setting's own corpus, if any (:func:`check_corpus`)."""
    from ..calibration import check_options

    for spec in dict.fromkeys(c.calib for c in cells if c.calib != NO_CALIBRATION):
        check_corpus(spec)
    for model in dict.fromkeys(c.model for c in cells):
        ctx = model_context_length(model)
        mine = [c for c in cells if c.model == model]
        if any(c.task == DISTRIBUTION_TASK for c in mine) and settings.context > ctx:
            raise InvalidArgumentError(
                f"sweep: wikitext2-heldout context {settings.context} exceeds the context "
                f"length {ctx} of model {model!r}"
            )
        for spec in dict.fromkeys(c.calib for c in mine if c.calib != NO_CALIBRATION):
            steps, opts = parse_calibration(spec)
            for step, options in check_options(steps, opts).items():
                for k in _SEQUENCE_OPTIONS:
                    if k in options and options[k] > ctx:
                        raise InvalidArgumentError(
                            f"sweep: calibration setting {spec!r}: step {step!r} has "
                            f"{k}={options[k]}, more than the context length {ctx} of model "
                            f"{model!r}"
                        )


def check_out_dir(out: Path) -> None:
    """``out`` must be a directory or creatable as one (InvalidArgumentError naming it)."""
    for p in (out, *out.parents):
        if os.path.lexists(p):
            if not p.is_dir():
                what = "it is" if p == out else f"{p} is"
                raise InvalidArgumentError(
                    f"sweep: output folder {out} is not a directory ({what} a file)"
                )
            if not os.access(p, os.W_OK | os.X_OK) and p != out:
                raise InvalidArgumentError(
                    f"sweep: output folder {out} cannot be created in {p} (not writable)"
                )
            return


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
    # a calibrated plan runs on the settings made on its rotation only
    rotation = {c: calibration_rotation(c) for c in real_calibs}
    serving = {p: [c for c in real_calibs if rotation[c] == _core.Plan(p).rotation] for p in plans}
    for p in plans:
        if needs[p] and not serving[p]:
            raise InvalidArgumentError(
                f"sweep: plan {p!r} runs with rotation {_core.Plan(p).rotation!r} and no "
                f"calibration setting is made on it (add its parts to one, e.g. "
                f"--calib act-scales:rotate=hadamard)"
            )
    cells = []
    for m in models:
        for p in plans:
            for c in serving[p] if needs[p] else [NO_CALIBRATION]:
                cells.extend(Cell(m, c, p, t) for t in tasks)
    return cells


# -- work done in a Ray worker -----------------------------------------------------------------

# (model, its content digest, calibration digest) -> LanguageModel: a worker that outlives a
# sweep (a cluster's) never serves a model file replaced since
_MODELS: dict[tuple[str, str, str], object] = {}
_MAX_CACHED_MODELS = 2


def _check_model_digest(name: str, expected: str | None) -> str:
    """The model's digest here, which must be ``expected`` (the driver's) when given."""
    here = model_sha256(name)
    if expected is not None and here != expected:
        raise InvalidArgumentError(
            f"sweep: model {name!r} on {socket.gethostname()} is not the one the sweep started "
            f"with (sha256 {_short(here)}, not {_short(expected)}): replaced meanwhile, or "
            "another copy on this node"
        )
    return here


def _worker_model(
    name: str, calib_bytes: bytes | None, threads: int, model_digest: str | None = None
):
    """The model (calibrated with ``calib_bytes``), loaded once per worker; ``model_digest``:
    what the driver hashed, checked before and after loading (:func:`_check_model_digest`)."""
    from ..model import load

    _core.set_num_threads(threads)
    _core.set_log_level("warn")
    here = _check_model_digest(name, model_digest)
    digest = hashlib.sha256(calib_bytes).hexdigest() if calib_bytes else ""
    key = (name, here, digest)
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
        _check_model_digest(name, here)  # the file read is the one hashed
        _MODELS[key] = model
    return _MODELS[key]


def calibrate_task(model: str, spec: str, threads: int) -> bytes:
    """Ray task: the calibration file of ``spec`` for ``model``, as bytes."""
    from ..calibration import run_steps, save_calibration

    steps, opts = parse_calibration(spec)
    m = _worker_model(model, None, threads)
    rotation = calibration_rotation(spec)
    if rotation != "none":  # the statistics of the rotated model (issue 39)
        m = m.rotated(rotation)
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
    inputs: dict | None = None,
) -> dict:
    """The result of one cell (no attempt bookkeeping): ``status`` ok with ``result``, or
    error with the socllm error's class and message. ``partial``: where an lm-eval cell keeps
    the requests it has scored, so an attempt that dies mid-cell loses none of them
    (``resumed_requests``: how many this attempt found there). ``inputs``: the content digests
    the driver recorded (:func:`cell_inputs`); the model and task data read here must match."""
    from .divergence import compare_plans

    provenance = run_provenance()  # before the work: the code this process runs it with
    started_unix_s = time.time()
    t0 = time.perf_counter()
    resumed = None
    try:
        model = _worker_model(
            cell.model, calib_bytes, settings.cpus_per_cell, inputs and inputs["model"]
        )
        if inputs is not None and task_data_sha256(cell.task) != inputs["data"]:
            raise InvalidArgumentError(
                f"sweep: the data of task {cell.task!r} on {socket.gethostname()} are not those "
                f"the sweep started with (sha256 {_short(task_data_sha256(cell.task))}, not "
                f"{_short(inputs['data'])})"
            )
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


def _die_mid_cell(cell: Cell, settings: SweepSettings, calib_bytes, model_digest=None) -> None:
    """Tests (``crash_pattern``): kill this worker process as an out-of-memory kill would, in
    the middle of an lm-eval cell (on its second engine batch, once the first batch's requests
    are in the per-request cache), at once for any other cell."""
    if cell.task == DISTRIBUTION_TASK:
        os._exit(1)
    model = _worker_model(cell.model, calib_bytes, settings.cpus_per_cell, model_digest)
    batches = itertools.count()
    logits_batch = model.logits_batch

    def dying(*args, **kwargs):
        if next(batches) == 1:
            os._exit(1)
        return logits_batch(*args, **kwargs)

    model.logits_batch = dying


def cell_task(
    cell: Cell,
    settings: SweepSettings,
    calib_bytes,
    ledger,
    crash_pattern,
    partial=None,
    inputs: dict | None = None,
) -> dict:
    """Ray task: :func:`run_cell` with its attempt number from the ledger. ``crash_pattern``
    (tests only): the first attempt of a cell whose key contains it kills its worker process
    (:func:`_die_mid_cell`)."""
    import ray

    started = ledger.start.remote(cell.key)
    if crash_pattern and crash_pattern in cell.key and ray.get(started) == 1:
        _die_mid_cell(cell, settings, calib_bytes, inputs and inputs["model"])
    rec = run_cell(cell, settings, calib_bytes, partial, inputs)
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
    # key -> what changed since its cell file or per-request cache was made (it ran again)
    restarted: dict[str, str] = field(default_factory=dict)
    # finished before content digests were recorded: kept, their content not checked
    unchecked: list[str] = field(default_factory=list)
    ray_logs: str | None = None  # the local Ray cluster's folder, kept when a cell failed
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


def _finished_cells(
    out: Path, cells: Sequence[Cell], identity: dict, inputs: dict[str, dict]
) -> tuple[dict[str, dict | None], dict[str, str], list[str]]:
    """({key: record or None}, {key: what changed}, [keys unchecked]): the cells finished with
    the same settings and from the same content. A record made from other content counts as
    not run; one written before content digests were recorded is kept (unchecked), as older
    model files keep loading."""
    done, changed, unchecked = {}, {}, []
    for c in cells:
        rec = _read_cell(out, c, identity)
        if rec is not None and "inputs" not in rec:
            unchecked.append(c.key)
        elif rec is not None and (why := changed_inputs(rec["inputs"], inputs[c.key])):
            changed[c.key] = why
            rec = None
        done[c.key] = rec
    return done, changed, unchecked


def _partial_prefix(out: Path, cell: Cell, identity: dict) -> Path:
    """The path prefix of a cell's per-request cache: the cell's own, and its settings', so a
    run with other settings (or another cell) never reads it."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return out.resolve() / "partial" / Path(*cell.relpath().parts[1:-1]) / f"{cell.task}-{digest}"


def _partial_inputs_file(prefix: Path) -> Path:
    """The content digests a per-request cache was scored from (written by the driver)."""
    return prefix.with_name(f"{prefix.name}.inputs.json")


def _remove_partial(prefix: Path) -> None:
    for f in prefix.parent.glob(f"{prefix.name}{LMEVAL_CACHE_SUFFIX}*"):  # with any -journal
        f.unlink(missing_ok=True)
    _partial_inputs_file(prefix).unlink(missing_ok=True)


def _prepare_partial(prefix: Path, key: str, inputs: dict, report: SweepReport) -> None:
    """Before a cell is submitted: its per-request cache is kept only if it was scored from the
    same content (else it is deleted, saying so); then the content it is scored from now is
    recorded beside it."""
    if Path(f"{prefix}{LMEVAL_CACHE_SUFFIX}").exists():
        try:
            recorded = json.loads(_partial_inputs_file(prefix).read_text())
        except (OSError, ValueError):
            recorded = None
        why = changed_inputs(recorded, inputs)
        if why:
            try:
                n = f"{cached_requests(prefix)} cached requests"
            except Exception:  # a damaged cache is discarded all the same
                n = "its cached requests (unreadable)"
            _remove_partial(prefix)
            report.restarted.setdefault(key, why)
            _say(f"{key}: {n} discarded, {why}; the cell starts over")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(_partial_inputs_file(prefix), json.dumps(inputs) + "\n")


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


def _calib_record(path: Path) -> Path:
    """Beside a calibration file: what it was made from and the digest of its bytes."""
    return path.with_suffix(".json")


def _cached_calibration(
    out: Path, model: str, spec: str, source: dict
) -> tuple[bytes | None, str | None]:
    """(bytes, None) of the calibration in ``calib/`` if it was made from ``source``
    (:func:`calibration_source`) and is as written; else (None, why not), why None when there
    is no file."""
    path = _calib_file(out, model, spec)
    if not path.exists():
        return None, None
    try:
        rec = json.loads(_calib_record(path).read_text())
    except (OSError, ValueError):
        rec = {}
    why = changed_inputs(rec.get("made_from"), source)
    if why:
        return None, why
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != rec.get("sha256"):
        return None, f"{path} was changed after it was written"
    return data, None


def _save_calibration(out: Path, model: str, spec: str, source: dict, data: bytes) -> None:
    path = _calib_file(out, model, spec)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    record = {"made_from": source, "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write_text(_calib_record(path), json.dumps(record) + "\n")


# -- running the grid ---------------------------------------------------------------------------


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
    ``table_only``: runs nothing, writes the table of the cells finished so far. Everything
    that can be checked is checked before Ray starts: the grid, calibration options and
    settings against each model, ``out``, and the content of every input (hashed)."""
    import ray
    from tqdm.auto import tqdm

    settings = settings or SweepSettings()
    if table_only:  # options that only act on cells run would change nothing (issue 37)
        for option, value in (("retry_errors", retry_errors), ("crash_pattern", crash_pattern)):
            if value:
                raise not_applicable(
                    "sweep",
                    f"{option}={value!r}",
                    "cells that run",
                    "table_only runs none (it writes the table of the finished ones)",
                )
    if settings.cpus_per_cell < 1 or settings.retries < 0:
        raise InvalidArgumentError(
            f"sweep: cpus_per_cell must be >= 1 and retries >= 0, got {settings.cpus_per_cell} "
            f"and {settings.retries}"
        )
    out = Path(out)
    cells = plan_grid(models, calibs, plans, tasks)
    check_out_dir(out)
    _DIGESTS.clear()  # a run hashes each file once, and no file of an earlier run is trusted
    check_against_models(cells, settings)
    inputs = cell_inputs(cells)
    identity = settings.identity()
    report = SweepReport(cells)
    done, report.restarted, report.unchecked = _finished_cells(out, cells, identity, inputs)
    for key, why in report.restarted.items():
        _say(f"{key}: {why}; " + ("left out of the table" if table_only else "it runs again"))
    if report.unchecked:
        _say(
            f"{len(report.unchecked)} finished cells were written before content digests were "
            "recorded: kept, their model, calibration and data not checked (delete their files "
            f"under {out / 'cells'} to run them again)"
        )
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
        session = _start_ray(ray, address) if started_here else None
        try:
            _run_cells(ray, tqdm, todo, settings, out, report, progress, crash_pattern, inputs)
        finally:
            if started_here:
                ray.shutdown()
                if session is not None:
                    report.ray_logs = session.close(keep_logs=bool(report.failed))
    report.seconds = round(time.perf_counter() - t0, 1)
    records, _, _ = _finished_cells(out, cells, identity, inputs)
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
        "restarted": report.restarted,
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


def _run_cells(
    ray, tqdm, todo, settings, out, report, progress, crash_pattern, inputs: dict[str, dict]
) -> None:
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
    pending: dict = {}  # ObjectRef -> ("calib", (model, spec, source)) | ("cell", Cell)
    for c in todo:
        if c.calib == NO_CALIBRATION or (c.model, c.calib) in calib_refs:
            continue
        source = calibration_source(c.calib, inputs[c.key]["model"])
        cached, why = _cached_calibration(out, c.model, c.calib, source)
        if cached is not None:
            calib_refs[(c.model, c.calib)] = ray.put(cached)
            continue
        if why:
            _say(f"calibration {c.calib!r} of {c.model}: {why}; calibrating again")
        ref = calib_remote.remote(c.model, c.calib, settings.cpus_per_cell)
        calib_refs[(c.model, c.calib)] = ref
        pending[ref] = ("calib", (c.model, c.calib, source))
    partials = {c: _partial_prefix(out, c, identity) for c in todo}
    for c in todo:
        if c.task != DISTRIBUTION_TASK:
            _prepare_partial(partials[c], c.key, inputs[c.key], report)
        calib = calib_refs.get((c.model, c.calib))
        ref = cell_remote.remote(
            c, settings, calib, ledger, crash_pattern, str(partials[c]), inputs[c.key]
        )
        pending[ref] = ("cell", c)
    failed_calibs: dict[tuple[str, str], str] = {}  # (model, spec) -> its error
    bar = tqdm(total=len(todo), desc="sweep", unit="cell", disable=not progress)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        kind, what = pending.pop(ready[0])
        try:
            value = ray.get(ready[0])
        except ray.exceptions.RayError as e:
            if kind == "calib":
                failed_calibs[what[:2]] = _error_text(ray, e)
            else:
                report.failed[what.key] = _error_text(ray, e)
                bar.update(1)
            continue
        if kind == "calib":
            _save_calibration(out, *what, value)
            continue
        rec = {"cell": what.to_dict(), "config": identity, "inputs": inputs[what.key], **value}
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
    by_key = {c.key: c for c in todo}
    for key in report.failed:
        cell, n = by_key[key], attempts.get(key, 0)
        calib_error = failed_calibs.get((cell.model, cell.calib))
        if calib_error is not None and n == 0:
            report.failed[key] = (
                f"its calibration {cell.calib!r} failed: {calib_error} (the cell did not start)"
            )
        else:
            report.failed[key] += f" (after {n} attempts)"


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
