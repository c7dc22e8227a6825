"""``socllm sweep`` integrity (issue 37): a resumed cell, a finished cell and a cached calibration
are keyed on the content of the model, the calibration and the task data (a changed one starts
over and the sweep says so); the whole grid, calibration options against the model included, and
``--out`` are checked before Ray starts; a failed cell shows its cause; ``kill -9`` of the driver
leaves no Ray process behind.

Most tests run the real driver (:func:`socllm.eval.sweep.run_sweep`) on a fake Ray that runs each
task at once in this process (:class:`FakeRay`), with a tiny model: seconds, not a cluster's
start-up. The kill tests need the real thing."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("socllm")
ray = pytest.importorskip("ray")
import ray.exceptions as ray_exceptions  # noqa: E402  the real ones, also raised by FakeRay
import socllm  # noqa: E402
from socllm.errors import InvalidArgumentError  # noqa: E402
from socllm.eval import sweep as sw  # noqa: E402
from tiny_model import TINY, tiny_weights, write_tiny  # noqa: E402

# lm-eval's requests are character-level on the tiny tokenizer: room for an ARC prompt
TINY_CONTEXT = 1024
FAST = sw.SweepSettings(limit=3, windows=1, context=32, batch_size=8, cpus_per_cell=1, retries=0)
CALIB = "act-scales:samples=2,seqlen=32"
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": "local"}  # as test_sweep.py
KILL_GRACE_SECONDS = 15  # for the session's processes to go once the driver is killed


def tiny(path: Path, seed: int = 0) -> Path:
    """A tiny model file; another ``seed`` gives other weights (a "replaced" model)."""
    c = TINY | {"context_length": TINY_CONTEXT}
    return write_tiny(path, config=c, weights=tiny_weights(c, np.random.default_rng(seed)))


# -- a fake Ray: the driver's logic without a cluster --------------------------------------------


class WorkerDied(BaseException):
    """What os._exit raises here (``_die_mid_cell``): the fake's worker crash."""


class _Ref:
    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error


class _Actor:
    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        method = getattr(self._obj, name)
        return type("Method", (), {"remote": staticmethod(lambda *a: _Ref(method(*a)))})


class _Remote:
    def __init__(self, fn, options):
        self.fn, self.opts = fn, options

    def options(self, **options):
        return _Remote(self.fn, {**self.opts, **options})

    def remote(self, *args):
        if isinstance(self.fn, type):
            return _Actor(self.fn(*args))
        for a in args:  # Ray resolves ObjectRef arguments; a failed one fails the task
            if isinstance(a, _Ref) and a.error is not None:
                return _Ref(error=a.error)
        args = [a.value if isinstance(a, _Ref) else a for a in args]
        error = None
        for _ in range(self.opts.get("max_retries", 0) + 1):
            try:
                return _Ref(self.fn(*args))
            except WorkerDied:
                error = ray_exceptions.WorkerCrashedError()
            except Exception as e:  # what a worker's exception reaches the driver as
                name = self.fn.__name__
                error = ray_exceptions.RayTaskError(
                    name, traceback.format_exc(), e, f"ray::{name}()", os.getpid(), "127.0.0.1"
                ).as_instanceof_cause()
        return _Ref(error=error)


class FakeRay:
    """The part of the ``ray`` module the sweep uses; every task runs when it is submitted."""

    exceptions = ray_exceptions

    def __init__(self):
        self.initialized = False

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.initialized = True

    def shutdown(self):
        self.initialized = False

    def remote(self, *args, **options):
        if args:
            return _Remote(args[0], {})
        return lambda fn: _Remote(fn, options)

    def put(self, value):
        return _Ref(value)

    def get(self, ref):
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]


@pytest.fixture
def fake_ray(monkeypatch):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(sw, "_MODELS", {})
    # a fake cluster has no processes to reap
    monkeypatch.setattr(sw, "_start_ray", lambda ray, address: ray.init() or None)

    def died(_status):
        raise WorkerDied

    monkeypatch.setattr(os, "_exit", died)
    threads, level = socllm.num_threads(), socllm.log_level()
    yield fake
    socllm.set_num_threads(threads)
    socllm.set_log_level(level)


@pytest.fixture
def no_ray_init(monkeypatch):
    """ray.init fails the test: what is checked must be checked before it."""

    def init(*_, **__):
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", init)


def _cell(out: Path, model: Path, calib: str, plan: str, task: str) -> dict:
    return json.loads(
        (out / sw.Cell(str(model), calib, plan, task).relpath()).with_suffix(".json").read_text()
    )


# -- 1. content identity ------------------------------------------------------------------------


def test_resumed_sweep_starts_over_when_the_model_file_was_replaced(fake_ray, tmp_path, capfd):
    """A sweep killed mid-cell keeps the requests it scored; the model file is replaced at the
    same path; the rerun must not use them (nor the cell finished before), and says why."""
    model, out = tiny(tmp_path / "m.h5"), tmp_path / "sweep"
    grid = ([str(model)], ["fp32"], [sw.DISTRIBUTION_TASK, "arc_easy"], out)
    kw = {"calibs": ["none"], "settings": FAST, "progress": False}
    first = sw.run_sweep(*grid, crash_pattern="| arc_easy", **kw)
    (key,) = first.failed
    assert key.endswith("| arc_easy") and len(first.ran) == 1
    (db,) = (out / "partial").rglob(f"*{sw.LMEVAL_CACHE_SUFFIX}")
    assert sw.cached_requests(str(db)[: -len(sw.LMEVAL_CACHE_SUFFIX)]) >= FAST.batch_size
    capfd.readouterr()

    tiny(model, seed=1)  # same path, other weights
    second = sw.run_sweep(*grid, **kw)
    assert not second.failed and len(second.ran) == 2 and second.skipped == []
    rec = _cell(out, model, "none", "fp32", "arc_easy")
    assert rec["resumed_requests"] == 0
    err = capfd.readouterr().err
    for task in (sw.DISTRIBUTION_TASK, "arc_easy"):
        assert f"| fp32 | {task}" in err
    assert "the model changed" in err and "cached requests discarded" in err
    # the rerun's numbers are the new model's: those of a clean run on it (the distribution
    # cell: the same loaded model served both cells)
    sw._MODELS.clear()
    clean = sw.run_cell(sw.Cell(str(model), "none", "fp32", sw.DISTRIBUTION_TASK), FAST, None)
    assert _cell(out, model, "none", "fp32", sw.DISTRIBUTION_TASK)["result"] == clean["result"]
    # and a third run has nothing left to do
    third = sw.run_sweep(*grid, **kw)
    assert third.ran == [] and len(third.skipped) == 2


def test_calibration_cache_is_keyed_on_content(fake_ray, tmp_path, capfd):
    """The calibration of ``calib/`` is reused only for the model (and corpus) it was made from,
    and only as written: a replaced model or an edited file is calibrated again, saying so, and
    the calibrated cells start over."""
    model, out = tiny(tmp_path / "m.h5"), tmp_path / "sweep"
    grid = ([str(model)], ["w8a8"], [sw.DISTRIBUTION_TASK], out)
    kw = {"calibs": [CALIB], "settings": FAST, "progress": False}
    assert len(sw.run_sweep(*grid, **kw).ran) == 2
    (calib,) = (out / "calib").rglob("*.h5")
    original = calib.read_bytes()
    assert sw.run_sweep(*grid, **kw).ran == []  # same content: nothing to do
    capfd.readouterr()

    tiny(model, seed=1)
    r = sw.run_sweep(*grid, **kw)
    assert len(r.ran) == 2
    assert calib.read_bytes() != original  # calibrated again, on the new weights
    err = capfd.readouterr().err
    assert f"calibration {CALIB!r}" in err and "model" in err

    # a calibration file edited after it was written is not used for a cell to run
    calib.write_bytes(original)
    (out / sw.Cell(str(model), CALIB, "w8a8", sw.DISTRIBUTION_TASK).relpath()).with_suffix(
        ".json"
    ).unlink()
    r = sw.run_sweep(*grid, **kw)
    assert [k.split(" | ")[2] for k in r.ran] == ["w8a8"]  # fp32 needs no calibration
    err = capfd.readouterr().err
    assert f"calibration {CALIB!r}" in err and "was changed after it was written" in err


def _run(cmd: list[str], **env) -> subprocess.CompletedProcess:
    env = {**os.environ, **RAY_ENV, **env}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)


def _forget_ray_logs(stderr: str) -> None:
    """The local cluster's folder a failed sweep keeps for its logs, deleted (a test's)."""
    for line in stderr.splitlines():
        if line.startswith("Ray's logs of this run: "):
            shutil.rmtree(line.split(": ", 1)[1], ignore_errors=True)


@pytest.mark.slow
def test_killed_sweep_with_a_replaced_model_starts_over_on_ray(tmp_path):
    """Issue 37's probe on a real cluster: a worker dies mid-cell (its first batch scored and
    cached), the model file is replaced at the same path, the same command again: the cell
    starts over, says so, and answers as a clean sweep of the new model does."""
    model, out, clean = tiny(tmp_path / "m.h5"), tmp_path / "sweep", tmp_path / "clean"
    cmd = [sys.executable, "-m", "socllm", "sweep", "--models", str(model), "--calib", "none"]
    cmd += ["--plans", "fp32", "--tasks", f"{sw.DISTRIBUTION_TASK},arc_easy", "--limit", "3"]
    cmd += ["--windows", "1", "--context", "32", "--cpus-per-cell", "1", "--retries", "0"]
    cmd += ["--quiet"]
    r = _run([*cmd, "--out", str(out), "--inject-crash", "| arc_easy"])
    _forget_ray_logs(r.stderr)
    assert r.returncode == 1 and "| fp32 | arc_easy: WorkerCrashedError" in r.stderr, r.stderr
    assert list((out / "partial").rglob(f"*{sw.LMEVAL_CACHE_SUFFIX}"))

    tiny(model, seed=1)
    r = _run([*cmd, "--out", str(out)])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 ran, 0 already done" in r.stderr
    assert "| fp32 | arc_easy: " in r.stderr and "cached requests discarded" in r.stderr
    assert "the model changed" in r.stderr
    assert _run([*cmd, "--out", str(clean)]).returncode == 0
    for task in (sw.DISTRIBUTION_TASK, "arc_easy"):
        rec, ref = (_cell(d, model, "none", "fp32", task) for d in (out, clean))
        assert rec["result"] == ref["result"]
    assert _cell(out, model, "none", "fp32", "arc_easy")["resumed_requests"] == 0


def test_finished_cell_starts_over_when_its_task_data_changed(
    fake_ray, tmp_path, monkeypatch, capfd
):
    from socllm.data import data_dir

    data = tmp_path / "data"
    data.mkdir()
    for name in ("wikitext-2-raw", "arc_easy"):
        shutil.copytree(data_dir() / name, data / name)
    monkeypatch.setenv("SOCLLM_DATA_DIR", str(data))
    model, out = tiny(tmp_path / "m.h5"), tmp_path / "sweep"
    grid = ([str(model)], ["fp32"], ["arc_easy"], out)
    kw = {"calibs": ["none"], "settings": dataclasses.replace(FAST, limit=1), "progress": False}
    assert len(sw.run_sweep(*grid, **kw).ran) == 1
    assert sw.run_sweep(*grid, **kw).ran == []
    capfd.readouterr()
    info = data / "arc_easy" / "validation" / "dataset_info.json"
    info.write_text(info.read_text() + "\n")
    assert len(sw.run_sweep(*grid, **kw).ran) == 1
    err = capfd.readouterr().err
    assert "| fp32 | arc_easy" in err and "task data" in err


def test_content_hashes_are_computed_once_per_run(fake_ray, tmp_path, monkeypatch):
    """Each input file is read once per run however many cells use it."""
    import hashlib

    model, out = tiny(tmp_path / "m.h5"), tmp_path / "sweep"
    digests = []
    real = hashlib.file_digest

    def counting(f, digest):
        digests.append(getattr(f, "name", "?"))
        return real(f, digest)

    monkeypatch.setattr(hashlib, "file_digest", counting)
    sw.run_sweep(
        [str(model)],
        ["fp32", "w8-group"],
        [sw.DISTRIBUTION_TASK],
        out,
        calibs=["none"],
        settings=FAST,
        progress=False,
        table_only=True,
    )
    assert digests and len(digests) == len(set(digests))


# -- 2. the grid, before Ray -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("calib", "settings", "message"),
    [
        ("act-scales:samples=0", FAST, r"'samples' must be >= 1, got 0"),
        # the model's context is 64: calibration windows of 128 tokens cannot run on it
        ("act-scales:samples=2,seqlen=128", FAST, r"seqlen=128, more than the context length 64"),
        ("act-scales", FAST, r"seqlen=512, more than the context length 64"),  # the default
        (CALIB, sw.SweepSettings(context=128), r"context 128 .*context length 64"),
    ],
)
def test_grid_is_checked_against_the_models_before_ray(
    no_ray_init, tmp_path, calib, settings, message
):
    model = write_tiny(tmp_path / "m.h5")  # context length 64
    with pytest.raises(InvalidArgumentError, match=message):
        sw.run_sweep(
            [str(model)],
            ["w8a8"],
            [sw.DISTRIBUTION_TASK],
            tmp_path / "out",
            calibs=[calib],
            settings=settings,
            progress=False,
        )
    assert not (tmp_path / "out").exists()


def test_calibration_corpus_is_checked_before_ray(no_ray_init, tmp_path):
    """A corpus that is not UTF-8 text used to fail in the calibration's worker, after Ray
    started (shown as "RayTaskError(InvalidArgumentError) ... after 0 attempts")."""
    model = write_tiny(tmp_path / "m.h5")
    corpus = tmp_path / "corpus.bin"
    corpus.write_bytes(bytes(range(128, 256)))
    with pytest.raises(InvalidArgumentError, match=f"corpus={corpus} is not readable UTF-8"):
        sw.run_sweep(
            [str(model)],
            ["w8a8"],
            [sw.DISTRIBUTION_TASK],
            tmp_path / "out",
            calibs=[f"act-scales:corpus={corpus},samples=2,seqlen=32"],
            settings=FAST,
            progress=False,
        )


def test_cli_refuses_bad_calibration_options_before_ray(no_ray_init, tmp_path, capsys):
    from socllm.cli import main

    model = write_tiny(tmp_path / "m.h5")
    argv = ["sweep", "--models", str(model), "--plans", "w8a8", "--tasks", sw.DISTRIBUTION_TASK]
    argv += ["--calib", "act-scales:samples=0", "--out", str(tmp_path / "out"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "act-scales:samples=0" in err and "'samples' must be >= 1, got 0" in err


# -- 3. the cause of a failed cell --------------------------------------------------------------


def test_failed_cell_shows_the_workers_error(fake_ray, tmp_path, monkeypatch):
    """An exception in a worker reaches the driver wrapped in a RayTaskError: the sweep reports
    its own type and message, per cell; a failed calibration is named as the cause of its
    cells, which never started."""
    model, out = tiny(tmp_path / "m.h5"), tmp_path / "sweep"

    def broken(cell, *_args, **_kwargs):
        if cell.plan == "w8-group":
            raise RuntimeError(f"disk on fire under {cell.plan}")
        return real_run_cell(cell, *_args, **_kwargs)

    def bad_calibration(*_):
        raise InvalidArgumentError("calibrate: the corpus is not UTF-8")

    real_run_cell = sw.run_cell
    monkeypatch.setattr(sw, "run_cell", broken)
    monkeypatch.setattr(sw, "calibrate_task", bad_calibration)
    r = sw.run_sweep(
        [str(model)],
        ["w8-group", "w8a8"],
        [sw.DISTRIBUTION_TASK],
        out,
        calibs=[CALIB],
        settings=FAST,
        progress=False,
    )
    prefix = f"{model} | "
    assert set(r.failed) == {
        f"{prefix}none | w8-group | {sw.DISTRIBUTION_TASK}",
        f"{prefix}{CALIB} | w8a8 | {sw.DISTRIBUTION_TASK}",
    }
    group = r.failed[f"{prefix}none | w8-group | {sw.DISTRIBUTION_TASK}"]
    assert group.startswith("RuntimeError: disk on fire under w8-group"), group
    assert "RayTaskError" not in group and "(after 1 attempts)" in group
    calibrated = r.failed[f"{prefix}{CALIB} | w8a8 | {sw.DISTRIBUTION_TASK}"]
    assert f"calibration {CALIB!r}" in calibrated and "RayTaskError" not in calibrated
    assert "InvalidArgumentError: calibrate: the corpus is not UTF-8" in calibrated
    assert "after 0 attempts" not in calibrated


# -- 4. --out ------------------------------------------------------------------------------------


def test_out_naming_a_file_is_refused_before_ray(no_ray_init, tmp_path, capsys):
    from socllm.cli import main

    model = write_tiny(tmp_path / "m.h5")
    out = tmp_path / "results.txt"
    out.write_text("not a folder\n")
    for target in (out, out / "sub"):
        with pytest.raises(InvalidArgumentError, match=f"{out}.* not a directory"):
            sw.run_sweep([str(model)], ["fp32"], [sw.DISTRIBUTION_TASK], target, calibs=["none"])
    argv = ["sweep", "--models", str(model), "--plans", "fp32", "--tasks", sw.DISTRIBUTION_TASK]
    assert main([*argv, "--calib", "none", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "not a directory" in err and "Errno" not in err
    assert out.read_text() == "not a folder\n"


# -- 5. kill -9 of the driver --------------------------------------------------------------------


def _processes_using(root: Path) -> dict[int, str]:
    """{pid: command} of the processes with a file or their working directory under ``root``."""
    root_s, found = str(root), {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        proc = Path("/proc", name)
        try:
            links = [os.readlink(proc / "cwd")]
            links += [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:  # gone, or not ours
            continue
        if any(link == root_s or link.startswith(root_s + "/") for link in links):
            found[int(name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    return found


def _wait_for(predicate, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_the_driver_leaves_no_ray_process(tmp_path):
    """The driver alone is killed (as `kill -9 PID` would): every process of the Ray session it
    started, found by the temp folder they write under, is gone within seconds."""
    model = tiny(tmp_path / "m.h5")
    # Ray's temp folder goes under TMPDIR: a short one, its socket paths have a length limit
    tmp = Path(tempfile.mkdtemp(prefix="sw9-", dir="/tmp"))
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "socllm", "sweep", "--models", str(model), "--calib", "none"]
    cmd += ["--plans", "fp32", "--tasks", f"{sw.DISTRIBUTION_TASK},arc_easy", "--limit", "0"]
    cmd += ["--windows", "1", "--context", "32", "--cpus-per-cell", "1", "--out", str(out)]
    env = {**os.environ, **RAY_ENV, "TMPDIR": str(tmp)}
    p = subprocess.Popen(
        [*cmd, "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # Ray is up and working once the first cell is written (arc_easy, 570 documents, is
        # still running)
        assert _wait_for(lambda: list(out.rglob("cells/**/*.json")) or p.poll() is not None, 120)
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
        assert len(_processes_using(tmp)) >= 3  # gcs, raylet, agents, workers
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        gone = _wait_for(lambda: not _processes_using(tmp), KILL_GRACE_SECONDS)
        assert gone, f"left running: {_processes_using(tmp)}"
        # and the cluster's folder with them (nobody was told where it is)
        folders = lambda: list(tmp.glob(f"{sw.RAY_TEMP_PREFIX}*"))  # noqa: E731
        assert _wait_for(lambda: not folders(), KILL_GRACE_SECONDS), folders()
    finally:
        for pid in _processes_using(tmp):  # never leave them to the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.stderr.close()
        shutil.rmtree(tmp, ignore_errors=True)
