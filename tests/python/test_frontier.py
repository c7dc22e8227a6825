"""`socllm frontier` on the real default model with short inputs: its accuracy equals the
divergence module's on the same windows, its times the simulator's on the config's graph, the
frontier holds what it must by hand, a recommended plan file runs, a rerun costs nothing, and
bad input is refused (issue 41)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import socllm
from socllm.cli import main
from socllm.eval.divergence import compare_plans
from socllm.plan_frontier.run import frontier, markdown

PLANS = ("fp32", "w8a8", "shadow-outlier:pruning_rate=0.5")
AXES = {"linear": PLANS, "attention": ("fp32",), "partition": ("none",), "chunk_len": ("0",)}
# w8a8 is one of the space's plans; w4-group joins it as a plan of its own
PRESETS = ("w8a8", "w4-group")
SETTINGS = dict(prompt_len=128, decode_tokens=2, windows=3, context=128, presets=PRESETS)


@pytest.fixture(scope="module")
def calibrated(small_calibration):
    socllm.set_log_level("warn")
    return socllm.load("smollm2-135m", calib=small_calibration, progress=False)


@pytest.fixture(scope="module")
def report(calibrated, tmp_path_factory):
    out = tmp_path_factory.mktemp("frontier")
    rep = frontier(calibrated, axes=AXES, cache_dir=out / "cache", out_dir=out, **SETTINGS)
    return rep, out


def test_accuracy_is_the_divergence_modules_on_the_same_windows(report, calibrated):
    rep, _ = report
    rows = {r["plan"]: r for r in rep["plans"]}
    want = compare_plans(calibrated, list(PLANS), context=128, windows=3)
    for plan in PLANS:
        r = rows[plan]
        if r["windows"] == 3:  # the plans scored to the end
            assert r["dnll"] == pytest.approx(math.log(want[plan]["ppl_ratio"]["value"]), abs=1e-9)
            assert r["kl"] == pytest.approx(want[plan]["kl"]["value"], rel=1e-9)
            assert r["top1"] == pytest.approx(want[plan]["top1"]["value"], rel=1e-12)
    assert rows["fp32"]["dnll"] == 0 and rows["fp32"]["kl"] == 0


def test_times_are_the_simulators_on_the_configs_graph(report, calibrated):
    """w8a8 has no data-dependent part, so the graph the engine executed is the config's:
    the simulator on the config gives the same TTFT and memory."""
    rep, _ = report
    from socllm.sim.timeline import simulate_graph

    r = next(r for r in rep["plans"] if r["plan"] == "w8a8")
    graph = calibrated.task_graph("w8a8", 128, decode_tokens=2)  # from the config, not a run
    s = simulate_graph(graph, "snapdragon-8gen3").summary()
    assert r["ttft_ms"] == pytest.approx(s["ttft_ms"], rel=1e-9)
    assert r["memory_mb"] == pytest.approx(s["peak_memory_bytes"] / 1e6, rel=1e-9)
    assert r["energy_mj"] == pytest.approx(s["energy_mj"], rel=1e-9)


def test_the_frontier_by_hand(report):
    """fp32 (ΔNLL 0) and the plan of the least TTFT cannot be dominated; every other frontier
    plan trades accuracy for time against each of them."""
    rep, _ = report
    rows = rep["plans"]
    on = [r for r in rows if r["frontier"]]
    assert next(r for r in rows if r["plan"] == "fp32")["frontier"]
    assert min(rows, key=lambda r: r["ttft_ms"])["frontier"]
    for a in on:
        for b in on:
            if a is not b:
                assert (a["dnll"] < b["dnll"]) != (a["ttft_ms"] < b["ttft_ms"])
    assert rep["recommended"]["most-accurate"] == "fp32"
    assert rep["recommended"]["fastest-ttft"] == min(on, key=lambda r: r["ttft_ms"])["plan"]


def test_outputs_and_a_recommended_plan_file_run(report, capsys):
    rep, out = report
    body = json.loads((out / "frontier.json").read_text())
    for r in body["plans"]:
        for k in ("plan", "dnll", "dnll_se", "ttft_ms", "decode_tokens_per_s", "energy_mj",
                  "memory_mb", "frontier"):  # fmt: skip
            assert k in r
    assert (out / "frontier.png").stat().st_size > 10_000
    assert "| plan | frontier |" in (out / "frontier.md").read_text()
    fastest = out / "plans" / "fastest-ttft.json"
    assert json.loads(fastest.read_text())["_about"].startswith("socllm frontier: fastest-ttft")
    argv = ["simulate", "--config", "qwen2-0.5b", "--prompt-len", "64", "--json", "-", "--quiet"]
    assert main([*argv, "--plan", f"@{fastest}"]) == 0
    assert (
        json.loads(capsys.readouterr().out)["plan"]
        == rep["recommended"]["fastest-ttft"].split(":")[0]
    )


def test_a_rerun_with_a_new_budget_costs_no_evaluation(report, calibrated):
    rep, out = report
    again = frontier(
        calibrated, axes=AXES, cache_dir=out / "cache", budgets={"max_dnll": 1e-9}, **SETTINGS
    )
    assert again["evaluations"]["new_windows"] == 0
    assert again["evaluations"]["new_simulations"] == 0
    assert again["recommended"]["fastest-ttft"] == "fp32"  # the only plan within 0 nats
    none = frontier(
        calibrated, axes=AXES, cache_dir=out / "cache", budgets={"max_ttft_ms": 1e-6}, **SETTINGS
    )
    assert none["recommended"] == {} and none["nearest"]
    assert none["evaluations"]["new_windows"] == 0
    # another scheduler times the plans again and reuses every scored window
    other = frontier(
        calibrated, axes=AXES, cache_dir=out / "cache", policy="first-ready", **SETTINGS
    )
    assert other["evaluations"]["new_windows"] == 0
    assert other["evaluations"]["new_simulations"] == len(PLANS) + 1  # and w4-group


def test_presets_against_the_frontier(report):
    """A preset that is a space plan is that plan's row; one that is not is a row of its own;
    each verdict recomputed from the rows' per-window ΔNLL."""
    rep, out = report
    rows = {r["plan"]: r for r in rep["plans"]}
    assert rows["w8a8"]["presets"] == ["w8a8"]
    assert rows["w4-group"]["parts"] == {"preset": "w4-group"}
    assert [v["preset"] for v in rep["presets"]] == list(PRESETS)
    for v in rep["presets"]:
        p = rows[v["plan"]]
        if v["at_ttft"]:
            a = rows[v["at_ttft"]["plan"]]
            assert a["frontier"] and a["ttft_ms"] <= p["ttft_ms"]
            common = a["window_dnll"].keys() & p["window_dnll"].keys()
            gain = sum(p["window_dnll"][w] - a["window_dnll"][w] for w in common) / len(common)
            assert v["at_ttft"]["gain"] == pytest.approx(gain, rel=1e-12)
            assert gain > rep["z"] * v["at_ttft"]["gain_se"]
        if v["at_dnll"]:
            b = rows[v["at_dnll"]["plan"]]
            assert b["frontier"] and b["ttft_ms"] < p["ttft_ms"]
            assert v["at_dnll"]["speedup"] == pytest.approx(p["ttft_ms"] / b["ttft_ms"])
        assert v["beaten"] == bool(v["at_ttft"] or v["at_dnll"])
    md = (out / "frontier.md").read_text()
    assert "Presets against the frontier" in md and "| w4-group |" in md


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--axis", "speed=fast"], "unknown axis 'speed'"),
        (["--axis", "linear=no-such-plan"], "search space is empty"),
        (["--objectives", "ttft_ms"], "must include dnll"),
        (["--device", "snapdragon-9"], "snapdragon-9"),
        (["--calib", "c.h5", "--calib-samples", "4"], "--calib-samples 4"),
        (["--presets", "w8a8,no-such"], "unknown preset 'no-such'"),
        (["--plan-options", "bogus=1"], "has no option 'bogus'"),
    ],
)
def test_bad_input_is_refused_before_work(tmp_path, capsys, argv, words):
    assert main(["frontier", "--out", str(tmp_path / "o"), "--quiet", *argv]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "o" / "frontier.json").exists()


def _chromium():
    import shutil

    for name in ("chromium-headless-shell", "chromium", "chromium-browser"):
        path = shutil.which(name) or (
            f"/usr/lib/chromium/{name}" if Path(f"/usr/lib/chromium/{name}").exists() else None
        )
        if path:
            return path
    pytest.skip("no Chromium (scripts/setup.sh installs chromium-headless-shell)")


def _render(page: Path, tmp_path: Path) -> tuple[str, str]:
    """(the DOM after load, Chromium's log) of ``page`` in headless Chromium."""
    import subprocess

    r = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, r.stderr


def _console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def test_the_html_report_renders_without_console_errors(report, tmp_path):
    """The report renders in headless Chromium with no console message; its table sorts when a
    header is clicked; a page with a script error is caught by the same check (the control)."""
    _, out = report
    page = out / "frontier.html"
    text = page.read_text()
    assert "data:image/png;base64," in text  # self-contained: nothing fetched
    assert not re.search(r'(src|href)="(https?:)?//', text)
    dom, log = _render(page, tmp_path)
    assert "<table" in dom and not _console_errors(log)
    # click the TTFT header twice (descending), then read the TTFT column
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace(
        "</body>",
        "<script>var h = document.querySelectorAll('th')[6]; h.click(); h.click();"
        "document.body.dataset.ttft = Array.prototype.map.call("
        "document.querySelector('table').tBodies[0].rows,"
        " function (r) { return r.cells[6].textContent; }).join(' ');</script></body>",
    ))  # fmt: skip
    dom, log = _render(probe, tmp_path)
    assert not _console_errors(log)

    ttft = [float(x) for x in re.search(r'data-ttft="([^"]*)"', dom).group(1).split()]
    assert len(ttft) == len(report[0]["plans"]) and ttft == sorted(ttft, reverse=True)
    broken = tmp_path / "broken.html"
    broken.write_text(text.replace("</body>", "<script>undefinedFunction();</script></body>"))
    _, log = _render(broken, tmp_path)
    assert _console_errors(log), "the console check sees no error on a broken page"


def test_calibration_steps_are_what_the_engine_asks_for(calibrated, small_calibration):
    """Plan.calibration_steps (what `socllm frontier` calibrates for a space) against the
    engine: a plan that lists no step runs without calibration; one that lists steps is refused
    without; with a file holding act-scales, outliers, smoothing and qk-scales, the plans whose
    steps it holds run and one that also needs head importance is refused, naming the step."""
    bare = socllm.load("smollm2-135m", progress=False)
    held = {"act-scales", "outliers", "smoothing", "qk-scales"}
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    # one plan of each kind whose weights prepare in milliseconds (group and HeteroLLM-GPU
    # plans quantize every weight again: seconds each)
    plans = ["fp32", "w8a8", "smoothquant", "llm-int8", "shadow-outlier", "edgeflow",
             "hetero-tensor", "fp32:attention=npu-int8", "w8a8:attention=shadow-attn",
             "edgeflow:alpha=0.5", "fp32:attention=sparse:keep=0.5"]  # fmt: skip
    for plan in plans:
        steps = socllm.Plan(plan).calibration_steps
        if not steps:
            bare.logits(ids, plan)
            continue
        with pytest.raises(socllm.InvalidArgumentError):
            bare.logits(ids, plan)
        if set(steps) <= held:
            calibrated.logits(ids, plan)
        else:
            with pytest.raises(socllm.InvalidArgumentError, match="head-importance"):
                calibrated.logits(ids, plan)
    assert socllm.Plan("w8a8:attention=shadow-attn").calibration_steps[-1] == "head-importance"


def test_the_command_calibrates_its_space_and_says_when_no_plan_fits(tmp_path, capsys):
    """`socllm frontier` without --calib makes the calibration its plans read (cached), writes
    its report, and with a budget no plan meets exits 3 naming the nearest plans."""
    out = tmp_path / "fr"
    argv = ["frontier", "--axis", "linear=fp32|w8a8", "--axis", "attention=fp32",
            "--axis", "chunk_len=0", "--axis", "partition=none", "--prompt-len", "64",
            "--decode-tokens", "1",
            "--windows", "2", "--context", "64", "--calib-samples", "2", "--presets", "none",
            "--out", str(out), "--quiet"]  # fmt: skip
    assert main([*argv, "--json", "-"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert {r["plan"] for r in rep["plans"]} == {"fp32", "w8a8"}
    assert len(list((out / "cache").glob("calib-*.h5"))) == 1  # act-scales, for w8a8
    assert (out / "frontier.html").exists() and (out / "plans" / "most-accurate.json").exists()
    assert main([*argv, "--max-ttft-ms", "0.001"]) == 3
    text = capsys.readouterr().out
    assert "No plan meets the budgets" in text and "`w8a8`" in text


def test_validation_on_lm_eval_tasks(report, calibrated):
    """The members' task accuracy is the lm-eval backend's for the same plan; rho is scipy's
    Spearman on the reported means (the same windows as the report, no new one scored)."""
    pytest.importorskip("lm_eval")
    from scipy.stats import spearmanr
    from socllm.eval.lmeval import evaluate

    rep, out = report
    # hetero-layer (the fastest plan, so a member) is partitioned: planned for the device, which
    # the backend loads by name
    again = frontier(
        calibrated, axes=AXES, cache_dir=out / "cache", validate_tasks=("arc_easy",),
        validate_limit=4, **{**SETTINGS, "presets": (*PRESETS, "hetero-layer")},
    )  # fmt: skip
    v = again["validation"]
    assert v["plans"][0] == "fp32" and len(v["plans"]) >= 3 and "hetero-layer" in v["plans"]
    for plan in ("fp32", "hetero-layer"):  # (hetero-layer planned for the 8 Gen 3 by name)
        want = evaluate(
            calibrated, tasks=["arc_easy"], plan=f"{plan}:device=snapdragon-8gen3", limit=4,
            quiet=True,
        )  # fmt: skip
        assert v["per_plan"][plan]["arc_easy"]["acc"] == pytest.approx(want["arc_easy"]["acc"])
    rho = spearmanr(v["dnll"], v["task_loss"]).statistic
    assert v["spearman"] == pytest.approx(rho, nan_ok=True)
    assert "Validation on lm-eval tasks" in markdown(again)


@pytest.mark.slow
def test_ray_tasks_score_as_the_driver_does_and_a_killed_worker_loses_nothing(
    report, calibrated, tmp_path, monkeypatch
):
    """With --ray every window and timing runs as a Ray task; the first task's worker is
    killed (os._exit) and Ray runs it again: the report equals the in-process one."""
    pytest.importorskip("ray")
    from socllm.plan_frontier import ray_evaluate

    marker = tmp_path / "killed"

    class Crashing(ray_evaluate.RayEvaluator):
        def __init__(self, *a, **kw):
            super().__init__(*a, crash_marker=str(marker), **kw)

    monkeypatch.setattr(ray_evaluate, "RayEvaluator", Crashing)
    rep, _ = report
    got = frontier(calibrated, axes=AXES, cache_dir=tmp_path / "cache", ray=True, **SETTINGS)
    assert marker.exists()  # a worker died
    assert got["evaluations"]["new_simulations"] == len(rep["plans"])
    want = {r["plan"]: r for r in rep["plans"]}
    for r in got["plans"]:
        w = want[r["plan"]]
        assert r["window_dnll"].keys() == w["window_dnll"].keys()
        for k, v in r["window_dnll"].items():
            assert v == pytest.approx(w["window_dnll"][k], rel=1e-5, abs=1e-7)
        assert r["ttft_ms"] == pytest.approx(w["ttft_ms"], rel=1e-9)
        assert r["frontier"] == w["frontier"]


def test_a_killed_run_resumes_from_its_cache(small_calibration, tmp_path, capsys):
    """`socllm frontier` killed (SIGKILL) once its first window is cached leaves no report and
    no partial file; the rerun scores only what is missing and reports every plan."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "fr"
    argv = ["frontier", "--axis", f"linear={'|'.join(PLANS)}", "--axis", "attention=fp32",
            "--axis", "chunk_len=0", "--axis", "partition=none", "--presets", "none",
            "--prompt-len", "128",
            "--decode-tokens", "2", "--windows", "3", "--context", "128",
            "--calib", str(small_calibration), "--out", str(out), "--quiet"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    proc = subprocess.Popen([sys.executable, "-m", "socllm.cli", *argv], env=env)
    cached = out / "cache" / "accuracy"
    deadline = time.monotonic() + 300
    while not any(cached.glob("*.json")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no window cached in 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sum(len(json.loads(f.read_text())["entry"]["windows"]) for f in cached.glob("*.json"))
    assert 0 < done
    assert not (out / "frontier.json").exists()
    assert main([*argv, "--json", "-"]) == 0
    # a temp file the kill left is removed by the next write of its file (io/files.py)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    rep = json.loads(capsys.readouterr().out)
    scored = rep["evaluations"]["windows_scored"]
    assert rep["evaluations"]["new_windows"] == scored - done
    assert {r["plan"] for r in rep["plans"]} == set(PLANS)


def test_another_device_reuses_the_windows_and_leaves_out_what_it_cannot_run(report, calibrated):
    """On the 8 Elite (no NPU static graph shapes in its profile) HeteroLLM's partitioned
    preset does not run: it is listed with the engine's reason, not a crash; every other plan is
    timed there and no window is scored again (unpartitioned plans' numerics are the same on
    every device)."""
    rep, out = report
    other = frontier(
        calibrated, "snapdragon-8elite", axes=AXES, cache_dir=out / "cache",
        **{**SETTINGS, "presets": (*PRESETS, "hetero-tensor")},
    )  # fmt: skip
    ((plan, why),) = other["space"]["unrunnable"].items()
    assert plan.startswith("hetero-tensor") and "static_graph_seq_lengths" in why
    assert other["evaluations"]["new_windows"] == 0
    assert [v["preset"] for v in other["presets"]] == list(PRESETS)
    assert {r["plan"] for r in other["plans"]} == {r["plan"] for r in rep["plans"]}
    assert other["evaluations"]["new_simulations"] == len(rep["plans"])  # timed on that phone
