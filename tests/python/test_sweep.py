"""``socllm sweep`` (socllm.eval.sweep): the grid is checked before anything runs, the paired
bootstrap interval against an exact enumeration, the table against hand-made records, and a tiny
grid on a local Ray cluster: a sweep killed mid-way resumes without losing a finished cell, a
worker that dies is retried and reported (or listed as failed), a cell interrupted mid-way
resumes from the requests it had scored, and the cells reproduce the per-document scores of the
existing accuracy table (docs/results/plan_accuracy.json)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("socllm")

import socllm
from socllm.errors import InvalidArgumentError
from socllm.eval import sweep as sw
from socllm.eval.stats import paired_bootstrap_ci

ROOT = Path(__file__).resolve().parents[2]
PLAN_ACCURACY = ROOT / "docs" / "results" / "plan_accuracy.json"


# -- the grid -----------------------------------------------------------------------------------


def test_grid_adds_fp32_and_runs_uncalibrated_plans_once():
    cells = sw.plan_grid(
        ["smollm2-135m"], ["act-scales", "act-scales:samples=8"], ["w8-group", "w8a8"], ["piqa"]
    )
    assert [(c.calib, c.plan) for c in cells] == [
        ("none", "fp32"),
        ("none", "w8-group"),
        ("act-scales", "w8a8"),
        ("act-scales:samples=8", "w8a8"),
    ]
    assert cells[2].key == "smollm2-135m | act-scales | w8a8 | piqa"
    # a calibration spec is not a safe file name: the slug keeps it distinct and safe
    rel = cells[3].relpath()
    assert rel.parts[2].startswith("act-scales_samples_8-") and "/" not in rel.parts[2]


def test_rotated_plans_pair_with_the_settings_of_their_rotation():
    """Issue 39: a calibration setting with rotate parts is made on the rotated model and serves
    the plans with the same parts; a rotated plan without such a setting is an error."""
    calibs = ["act-scales", "act-scales+gptq:rotate=hadamard,rotate_down=hadamard"]
    plans = ["w8a8", "w8a8:rotate=hadamard,rotate_down=hadamard,rounding=gptq"]
    cells = sw.plan_grid(["smollm2-135m"], calibs, plans, ["piqa"])
    assert [(c.calib, c.plan) for c in cells][1:] == [
        ("act-scales", "w8a8"),
        (calibs[1], plans[1]),
    ]
    assert sw.calibration_rotation(calibs[1]) == "hadamard,seed=0,down"
    assert sw.parse_calibration(calibs[1]) == (["act-scales", "gptq"], {})
    with pytest.raises(socllm.InvalidArgumentError, match="no calibration setting is made on it"):
        sw.plan_grid(["smollm2-135m"], ["act-scales"], ["w8a8:rotate=random"], ["piqa"])


@pytest.mark.parametrize(
    ("models", "calibs", "plans", "tasks", "message"),
    [
        (["no-such-model"], ["none"], ["fp32"], ["piqa"], "unknown model 'no-such-model'"),
        (["smollm2-135m"], ["none"], ["w9a9"], ["piqa"], "plan 'w9a9'"),
        (["smollm2-135m"], ["none"], ["fp32"], ["piqa", "squad"], "unknown task 'squad'"),
        (
            ["smollm2-135m"],
            ["act-scale"],
            ["fp32"],
            ["piqa"],
            "unknown calibration step 'act-scale'",
        ),
        (["smollm2-135m"], ["act-scales:samples"], ["fp32"], ["piqa"], "'samples' .* key=value"),
        (
            ["smollm2-135m"],
            ["act-scales:samples=x"],
            ["fp32"],
            ["piqa"],
            "samples='x' .* not a int",
        ),
        (["smollm2-135m"], ["none"], ["w8a8"], ["piqa"], "'w8a8' needs calibration"),
        (["smollm2-135m"], ["none"], [], ["piqa"], "no plans given"),
    ],
)
def test_grid_rejects_bad_axes_before_running(models, calibs, plans, tasks, message):
    with pytest.raises(InvalidArgumentError, match=message):
        sw.plan_grid(models, calibs, plans, tasks)


def test_parse_calibration():
    assert sw.parse_calibration("none") == ([], {})
    steps, opts = sw.parse_calibration("act-scales+outliers:samples=16,percentile=99.9,seed=3")
    assert steps == ["act-scales", "outliers"]
    assert opts == {"samples": 16, "percentile": 99.9, "seed": 3}


# -- statistics ---------------------------------------------------------------------------------


def test_paired_bootstrap_ci_against_exact_enumeration():
    # three documents, differences 0, 0, 1: the exact bootstrap distribution of the mean puts
    # 8/27 on 0 and 1/27 on 1, so the 2.5% and 97.5% quantiles are exactly 0 and 1
    a = {"x": 0.0, "y": 1.0, "z": 0.0}
    b = {"x": 0.0, "y": 1.0, "z": 1.0}
    means = [np.mean(s) for s in itertools.product([0, 0, 1], repeat=3)]
    assert np.mean(np.array(means) == 0) == pytest.approx(8 / 27)
    assert paired_bootstrap_ci(a, b) == (0.0, 1.0)
    assert paired_bootstrap_ci(b, a) == (-1.0, 0.0)
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0)
    assert np.isnan(paired_bootstrap_ci(a, {"other": 1.0})[0])


def test_paired_bootstrap_ci_approaches_the_normal_interval():
    # many documents: the percentile interval is close to mean ± 1.96 sd/sqrt(n)
    rng = np.random.default_rng(1)
    a = {str(i): float(v) for i, v in enumerate(rng.integers(0, 2, 2000))}
    b = {k: float(v if rng.random() < 0.8 else 1 - v) for k, v in a.items()}
    d = np.array([b[k] - a[k] for k in a])
    half = 1.96 * d.std() / np.sqrt(len(d))
    lo, hi = paired_bootstrap_ci(a, b, seed=7)
    assert lo == pytest.approx(d.mean() - half, abs=0.004)
    assert hi == pytest.approx(d.mean() + half, abs=0.004)
    assert paired_bootstrap_ci(a, b, seed=7) == (lo, hi)  # deterministic per seed
    with pytest.raises(ValueError, match="level must be in"):
        paired_bootstrap_ci(a, b, level=1.0)


def _record(cell, result=None, error=None):
    rec = {"cell": cell.to_dict(), "config": sw.SweepSettings().identity()}
    return (
        {**rec, "status": "ok", "result": result}
        if error is None
        else {
            **rec,
            "status": "error",
            "error": error,
        }
    )


def test_table_pairs_every_row_with_the_models_fp32():
    ref_docs = {f"piqa/{i}": float(i < 6) for i in range(10)}  # 60%
    docs = {**ref_docs, "piqa/0": 0.0, "piqa/1": 0.0, "piqa/9": 1.0}  # 50%: -2 +1
    cells = sw.plan_grid(["smollm2-135m"], ["none"], ["w8-group", "llm-int8", "w4a16"], ["piqa"])
    lm = lambda d: {"metric": "acc", "n": 10, "score": sum(d.values()) / 10, "docs": d}  # noqa: E731
    records = {
        cells[0].key: _record(cells[0], lm(ref_docs)),
        cells[1].key: _record(cells[1], lm(docs)),
        cells[2].key: _record(cells[2], error="PlanError: no"),
    }
    t = sw.build_table(cells, records)
    rows = {r["plan"]: r["tasks"]["piqa"] for r in t["rows"]}
    assert rows["w8-group"]["delta"] == pytest.approx(-0.1)
    # se of the paired differences (-1, -1, +1, 0 x 7): sd 0.5676 / sqrt(10)
    assert rows["w8-group"]["se"] == pytest.approx(np.std([-1, -1, 1] + [0] * 7, ddof=1) / 10**0.5)
    lo, hi = rows["w8-group"]["ci95"]
    assert -0.4 <= lo < -0.1 < hi <= 0.2
    assert rows["llm-int8"] == {"error": "PlanError: no"} and rows["w4a16"] is None
    assert "| `w8-group` | none | 50.0 (-10.0±" in t["markdown"]
    assert "| `w4a16` | none | not run |" in t["markdown"]
    # --table-only: a row with no finished cell is not part of what ran
    t = sw.build_table(cells, records, finished_only=True)
    assert [r["plan"] for r in t["rows"]] == ["fp32", "w8-group", "llm-int8"]
    assert "w4a16" not in t["markdown"]


def test_table_mean_over_tasks_is_the_mean_change_with_independent_errors():
    """Two lm-eval tasks of disjoint documents: the mean column is the mean of the two paired
    changes, its error sqrt(se1^2 + se2^2) / 2 (hand-computed here); a row with a task not
    finished has no mean, and the distribution task is not averaged."""
    cells = sw.plan_grid(
        ["smollm2-135m"],
        ["none"],
        ["w8-group", "llm-int8"],
        ["wikitext2-heldout", "piqa", "arc_easy"],
    )
    lm = lambda d: {"metric": "acc", "n": len(d), "score": sum(d.values()) / len(d), "docs": d}  # noqa: E731
    ref = {
        "piqa": {f"p/{i}": float(i < 2) for i in range(4)},
        "arc_easy": {f"a/{i}": 1.0 for i in range(5)},
    }
    # piqa: changes (-1, 0, +1, +1) -> +0.25, se sd/sqrt(4); arc_easy: (-1, 0 x 4) -> -0.2
    plan = {
        "piqa": {"p/0": 0.0, "p/1": 1.0, "p/2": 1.0, "p/3": 1.0},
        "arc_easy": {**ref["arc_easy"], "a/0": 0.0},
    }
    records = {}
    for c in cells:
        if c.task == "wikitext2-heldout":
            continue
        docs = ref[c.task] if c.plan == "fp32" else plan[c.task]
        if c.plan == "llm-int8" and c.task == "arc_easy":
            continue  # not finished
        records[c.key] = _record(c, lm(docs))
    t = sw.build_table(cells, records)
    rows = {r["plan"]: r for r in t["rows"]}
    se_p = np.std([-1, 0, 1, 1], ddof=1) / 2
    se_a = np.std([-1, 0, 0, 0, 0], ddof=1) / 5**0.5
    assert rows["w8-group"]["mean"] == pytest.approx(
        {"delta": (0.25 - 0.2) / 2, "se": (se_p**2 + se_a**2) ** 0.5 / 2, "n_tasks": 2}
    )
    assert rows["fp32"]["mean"] == pytest.approx({"score": (0.5 + 1.0) / 2, "n_tasks": 2})
    assert rows["llm-int8"]["mean"] is None
    assert "| mean of the lm-eval tasks |" in t["markdown"]
    assert f"| +2.5±{100 * (se_p**2 + se_a**2) ** 0.5 / 2:.1f} |" in t["markdown"]
    assert "| 75.0 |" in t["markdown"]  # fp32's mean score


def test_forest_plot_draws_the_tables_numbers(tmp_path):
    """The plot's panels carry the table's paired changes and intervals in points, the KL with
    its interval, errors by name, blanks for cells not run, and the mean's ±1.96 se."""
    import matplotlib.pyplot as plt
    from socllm.eval.sweep_plot import forest_figure, forest_panels, plot_forest

    cells = sw.plan_grid(
        ["smollm2-135m"],
        ["none"],
        ["w8-group", "llm-int8", "w4a16"],
        ["wikitext2-heldout", "piqa", "arc_easy"],
    )
    lm = lambda d: {"metric": "acc", "n": len(d), "score": sum(d.values()) / len(d), "docs": d}  # noqa: E731
    ref = {f"d/{i}": float(i % 2) for i in range(40)}
    worse = {**ref, **{f"d/{i}": 0.0 for i in range(1, 40, 2)}}  # every right answer lost
    kl = {"value": 0.02, "se": 0.001, "ci95": [0.018, 0.022]}
    dist = {"kl": kl, "top1": kl, "ppl_ratio": kl, "ppl": 20.0, "ppl_ref": 19.0, "n_scored": 9}
    records = {}
    for c in cells:
        if c.task == "wikitext2-heldout":
            records[c.key] = _record(
                c, {**dist, "kl": {**kl, "value": 0.0}} if c.plan == "fp32" else dist
            )
        elif c.plan == "llm-int8":
            records[c.key] = _record(c, error="UnsupportedError: fp16 overflow")
        elif c.plan == "w8-group" and c.task == "arc_easy":
            records[c.key] = _record(c, lm({**ref, "d/1": 0.0}))  # one right answer lost
        elif c.plan != "w4a16" or c.task == "piqa":
            records[c.key] = _record(c, lm(worse if c.plan == "w4a16" else ref))
    rows = sw.build_table(cells, records)["rows"]
    panels = {p.task: p for p in forest_panels(rows, "smollm2-135m")}
    assert list(panels) == ["wikitext2-heldout", "piqa", "arc_easy", "mean"]
    w8, int8, w4 = panels["piqa"].points
    assert [p.label for p in (w8, int8, w4)] == ["w8-group", "llm-int8", "w4a16"]
    assert (w8.value, w8.resolved) == (0.0, False) and int8.error == "UnsupportedError"
    assert w4.value == pytest.approx(-50.0) and w4.resolved and w4.hi < 0
    table_w4 = next(r for r in rows if r["plan"] == "w4a16")["tasks"]["piqa"]
    assert (w4.lo, w4.hi) == pytest.approx([100 * x for x in table_w4["ci95"]])
    assert panels["arc_easy"].points[2].value is None  # not run: blank
    assert (
        panels["wikitext2-heldout"].points[0].lo,
        panels["wikitext2-heldout"].points[0].value,
    ) == (0.018, 0.02)
    (mean_w8, mean_int8, mean_w4) = panels["mean"].points
    table_mean = next(r for r in rows if r["plan"] == "w8-group")["mean"]
    assert mean_w8.value == pytest.approx(-1.25) and table_mean["se"] > 0
    assert mean_w8.hi - mean_w8.value == pytest.approx(100 * 1.959964 * table_mean["se"])
    assert mean_int8.value is None and mean_w4.value is None
    assert "fp32 50.0%, n=40" in panels["piqa"].title
    dest = plot_forest(rows, "smollm2-135m", tmp_path / "f.png")
    assert dest.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob(".*"))
    # the figure title stays above every panel title on a tall figure (tight_layout drew a
    # 24-plan figure's first-row titles over it)
    tall = [
        dataclasses.replace(p, points=p.points * 8) for p in forest_panels(rows, "smollm2-135m")
    ]
    fig = forest_figure(tall, "smollm2-135m", columns=2)
    fig.canvas.draw()  # the layout runs at draw time
    renderer = fig.canvas.get_renderer()
    title_bottom = fig._suptitle.get_window_extent(renderer).y0
    assert all(ax.title.get_window_extent(renderer).y1 <= title_bottom for ax in fig.axes)
    plt.close(fig)
    with pytest.raises(ValueError, match="no finished non-fp32 cell of 'gemma3-270m'"):
        plot_forest(rows, "gemma3-270m", tmp_path / "g.png")


def test_engine_refusals_are_results_other_errors_are_raised(monkeypatch, smollm):
    """A plan the model cannot run (Gemma 3's fp16 overflow, say) is a deterministic result,
    also when lm-eval's backend wraps it in a ValueError; anything else reaches Ray's retry."""
    from socllm.errors import UnsupportedError

    cell = sw.Cell(str(smollm.path), "none", "fp32", "piqa")

    def wrapped(*_):
        try:
            raise UnsupportedError("residual in fp16 overflows")
        except UnsupportedError as e:
            raise ValueError("socllm: plan cannot run") from e

    monkeypatch.setattr(sw, "evaluate_lmeval_cell", wrapped)
    rec = sw.run_cell(cell, sw.SweepSettings(), None)
    assert rec["status"] == "error"
    assert rec["error"] == "UnsupportedError: residual in fp16 overflows"
    # every record names the code and machine it came from
    prov = rec["provenance"]
    assert prov["socllm"] == socllm.__version__ and prov["isa"] == socllm.ops.isa()
    assert prov["blas"] == socllm.blas_info()["corename"] and prov["cpu_model"]

    def plain(*_):
        raise ValueError("not the engine")

    monkeypatch.setattr(sw, "evaluate_lmeval_cell", plain)
    with pytest.raises(ValueError, match="not the engine"):
        sw.run_cell(cell, sw.SweepSettings(), None)


def test_worker_loads_the_calibration_and_leaves_no_file(monkeypatch, tmp_path, smollm):
    """A cell's calibration arrives as bytes (through Ray): the worker loads it into the engine
    and deletes the file it read it from (they used to pile up in /tmp)."""
    threads, level = socllm.num_threads(), socllm.log_level()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sw, "_MODELS", {})
    try:
        calib = sw.calibrate_task(str(smollm.path), "act-scales:samples=2,seqlen=32", threads)
        m = sw._worker_model(str(smollm.path), calib, threads)
        assert sw._worker_model(str(smollm.path), calib, threads) is m  # cached by content
    finally:
        socllm.set_num_threads(threads)
        socllm.set_log_level(level)
    assert list(tmp_path.iterdir()) == []
    assert m.calibration is not None and m.calibration_path is None
    m.logits([1, 2, 3], "w8a8")  # a static plan: it needs the loaded scales


def test_cell_killed_mid_way_resumes_from_its_scored_requests(monkeypatch, tmp_path, smollm):
    """An lm-eval cell interrupted after its first engine batch keeps that batch's requests in
    its per-request cache; the next attempt runs only the other inputs and gives the result of
    an uninterrupted run, document for document."""
    threads, level = socllm.num_threads(), socllm.log_level()
    key = (str(smollm.path), sw.model_sha256(str(smollm.path)), "")  # no calibration
    monkeypatch.setattr(sw, "_MODELS", {key: smollm})
    cell = sw.Cell(str(smollm.path), "none", "w8-group", "arc_easy")
    settings = sw.SweepSettings(limit=5, cpus_per_cell=threads)
    engine_batch = smollm.logits_batch
    batches: list[int] = []  # inputs per engine call

    def counting(seqs, *args, **kwargs):
        batches.append(len(seqs))
        if len(batches) == 2 and interrupt:
            raise KeyboardInterrupt  # what Ctrl-C or a kill would end the attempt with
        return engine_batch(seqs, *args, **kwargs)

    monkeypatch.setattr(smollm, "logits_batch", counting)
    try:
        interrupt = False
        whole = sw.run_cell(cell, settings, None)
        assert "resumed_requests" in whole and len(batches) >= 3
        uninterrupted, batches[:] = list(batches), []

        partial = tmp_path / "partial" / "arc_easy-x"
        interrupt = True
        with pytest.raises(KeyboardInterrupt):
            sw.run_cell(cell, settings, None, partial)
        first = sw.cached_requests(partial)
        assert first >= uninterrupted[0]  # the first batch's inputs, one request or more each
        interrupt, batches[:] = False, []
        rec = sw.run_cell(cell, settings, None, partial)
    finally:
        socllm.set_num_threads(threads)
        socllm.set_log_level(level)
    assert rec["resumed_requests"] == first
    assert sum(batches) == sum(uninterrupted) - uninterrupted[0]
    assert rec["result"] == whole["result"] and rec["result"]["n"] == 5
    assert sw.cached_requests(tmp_path / "none") == 0


# -- a tiny grid on a local Ray cluster ----------------------------------------------------------

pytest.importorskip("ray")

GRID = [
    "--plans",
    "fp32,w8-group,w8a8",
    "--tasks",
    "arc_easy,wikitext2-heldout",
    "--calib",
    "act-scales:samples=4,seqlen=64",
    "--limit",
    "5",
    "--windows",
    "2",
    "--context",
    "64",
    "--cpus-per-cell",
    "2",
]
CELLS = 6  # fp32 and w8-group on "none", w8a8 on the one calibration; two tasks each
# Every sweep here starts its own local Ray cluster: ray.init() would otherwise join a cluster
# that `ray start` left running on the machine (a real sweep's), where these cells may wait for
# CPUs forever.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": "local"}


def _sweep(model_path, out, *extra, wait=True):
    cmd = [sys.executable, "-m", "socllm", "sweep", "--models", str(model_path), *GRID]
    cmd += ["--out", str(out), "--quiet", *extra]
    env = {**os.environ, **RAY_ENV}
    if not wait:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env
        )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)


def _cell_files(out: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("*.json")}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, smollm):
    """A sweep killed after its first cell, then rerun with a worker crash injected."""
    out = tmp_path_factory.mktemp("sweep")
    p = _sweep(smollm.path, out, wait=False)
    deadline = time.monotonic() + 300
    while not _cell_files(out) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert p.poll() is None, p.communicate()[1].decode()[-2000:]
    os.killpg(p.pid, signal.SIGKILL)  # the driver and the local Ray cluster it started
    p.wait()
    first = _cell_files(out)
    assert 1 <= len(first) < CELLS
    r = _sweep(smollm.path, out, "--inject-crash", "| w8-group | arc_easy")
    return out, first, r


def test_killed_sweep_resumes_without_losing_a_cell(sweep_dir):
    out, first, r = sweep_dir
    assert r.returncode == 0, r.stderr[-3000:]
    cells = _cell_files(out)
    assert len(cells) == CELLS
    assert all(cells[p] == t for p, t in first.items())  # finished before the kill: kept as is
    assert f"{CELLS - len(first)} ran, {len(first)} already done" in r.stderr
    assert len(list((out / "calib").rglob("*.h5"))) == 1  # the one calibration, kept


def test_dead_worker_is_retried_and_reported(sweep_dir):
    """The worker dies in the middle of the cell (after its first engine batch): the retry
    resumes from the requests already scored (test_cells_reproduce_the_accuracy_table checks
    its documents), and the per-request caches are gone once the cells are written."""
    out, _, r = sweep_dir
    assert "retried: " in r.stderr and "| w8-group | arc_easy (2 attempts)" in r.stderr
    summary = json.loads((out / "sweep.json").read_text())
    assert list(summary["retried"].values()) == [2] and summary["failed"] == {}
    model_dir = next((out / "cells").iterdir())
    resumed = json.loads((model_dir / "none" / "w8-group" / "arc_easy.json").read_text())
    assert resumed["attempt"] == 2 and resumed["resumed_requests"] >= 8  # one batch of 8 inputs
    assert list((out / "partial").rglob("*")) == []  # no cache, no emptied folder


def test_cells_reproduce_the_accuracy_table(sweep_dir):
    """The sweep's per-document scores are those of plan_accuracy.py's 100-document run (its
    first five documents; same engine, same lm-eval requests)."""
    out, _, _ = sweep_dir
    table = json.loads(PLAN_ACCURACY.read_text())["results"]
    summary = json.loads((out / "sweep.json").read_text())
    rows = {(r["calib"], r["plan"]): r["tasks"] for r in summary["rows"]}
    calib = "act-scales:samples=4,seqlen=64"
    assert set(rows) == {("none", "fp32"), ("none", "w8-group"), (calib, "w8a8")}
    model_dir = next((out / "cells").iterdir())
    for plan in ("fp32", "w8-group"):
        rec = json.loads((model_dir / "none" / plan / "arc_easy.json").read_text())
        docs = rec["result"]["docs"]
        assert docs == {k: table[f"{plan}/arc_easy"]["docs"][k] for k in docs} and len(docs) == 5
    heldout = rows[("none", "w8-group")]["wikitext2-heldout"]
    assert 0 < heldout["kl"]["value"] < 0.05 and heldout["n_scored"] == 126
    assert rows[("none", "fp32")]["wikitext2-heldout"]["kl"]["value"] == 0.0
    assert f"| `w8a8` | {calib} |" in (out / "sweep.md").read_text()
    (png,) = out.glob("sweep-*.png")  # the forest plot of the one model
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one machine and one build ran every cell
    (prov,) = summary["provenance"]
    assert prov["socllm"] == socllm.__version__ and prov["isa"] == socllm.ops.isa()


def test_cells_run_no_more_at_once_than_the_cluster_has_cpus_for(sweep_dir):
    """The local cluster has os.cpu_count() CPUs and each cell asks for 2: no more cells ran at
    once (a cell blocked in ray.get at its start used to lend its CPUs to the next one). The
    crashed cell is left out: its first attempt waits for its attempt number."""
    out, _, _ = sweep_dir
    spans = []
    for path in (out / "cells").rglob("*.json"):
        rec = json.loads(path.read_text())
        if rec["cell"]["plan"] != "w8-group" or rec["cell"]["task"] != "arc_easy":
            spans.append((rec["started_unix_s"], rec["started_unix_s"] + rec["seconds"]))
    assert len(spans) == CELLS - 1
    most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert most <= max(1, (os.cpu_count() or 1) // 2), sorted(spans)


def test_rerun_skips_everything_and_other_settings_are_refused(sweep_dir, smollm):
    out, _, _ = sweep_dir
    before = _cell_files(out)
    r = _sweep(smollm.path, out)
    assert r.returncode == 0 and f"0 ran, {CELLS} already done" in r.stderr
    assert _cell_files(out) == before
    # --table-only on a larger grid: the finished cells' table; the new plan, with no finished
    # cell, is left out
    table = (out / "sweep.md").read_text()
    cmd = [sys.executable, "-m", "socllm", "sweep", "--models", str(smollm.path), *GRID]
    cmd[cmd.index("fp32,w8-group,w8a8")] = "fp32,w8-group,w8a8,w4a16"
    r = subprocess.run(
        [*cmd, "--out", str(out), "--quiet", "--table-only"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0 and "0 ran" in r.stderr and _cell_files(out) == before
    assert "w4a16" not in r.stdout and "| `w8-group` | none |" in r.stdout
    assert table.splitlines()[4] in r.stdout  # the fp32 row as before
    r = _sweep(smollm.path, out, "--fewshot", "1")
    assert r.returncode == 2 and "made with other settings" in r.stderr


def test_worker_dying_on_every_attempt_fails_the_sweep(tmp_path, smollm):
    cmd = [sys.executable, "-m", "socllm", "sweep", "--models", str(smollm.path), "--plans", "fp32"]
    cmd += ["--tasks", "wikitext2-heldout", "--windows", "1", "--context", "32", "--retries", "0"]
    cmd += ["--out", str(tmp_path), "--quiet", "--inject-crash", "fp32"]
    env = {**os.environ, **RAY_ENV}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    # the local cluster's folder is kept for its worker logs, and named
    (logs,) = (x for x in r.stderr.splitlines() if x.startswith("Ray's logs of this run: "))
    logs = Path(logs.split(": ", 1)[1])
    assert list(logs.rglob("python-core-worker-*.log"))
    shutil.rmtree(logs)
    assert r.returncode == 1
    assert "FAILED: " in r.stderr and "| fp32 | wikitext2-heldout: WorkerCrashedError" in r.stderr
    assert "(after 1 attempts)" in r.stderr
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"][0]["tasks"] == {
        "wikitext2-heldout": None
    }


@pytest.mark.slow
def test_sweep_reproduces_full_cells_of_the_accuracy_table(tmp_path, monkeypatch):
    """Whole cells of docs/results/plan_accuracy.json (100 documents each), document by
    document: fp32 and w4a16 (weight-only: no calibration, so nothing but the engine and the
    lm-eval path can change them)."""
    for name, value in RAY_ENV.items():
        monkeypatch.setenv(name, value)
    table = json.loads(PLAN_ACCURACY.read_text())["results"]
    report = sw.run_sweep(
        ["smollm2-135m"],
        ["w4a16"],
        ["arc_easy"],
        tmp_path,
        settings=sw.SweepSettings(limit=100),
        progress=False,
    )
    assert not report.failed and len(report.ran) == 2
    for plan in ("fp32", "w4a16"):
        path = tmp_path / "cells" / "smollm2-135m" / "none" / plan / "arc_easy.json"
        rec = json.loads(path.read_text())
        assert rec["result"]["docs"] == table[f"{plan}/arc_easy"]["docs"]
