"""The per-file test time plugin (file_times.py, issue 38 item 5), run by pytester on fake test
files that sleep: times summed per file over setup, call and teardown, the JSON, the summary,
and files over the budget listed without failing the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# before pytester's runs: they drop the modules they imported, and numpy loads once per process
from socllm.eval.bench_utils import cpu_model, machine_line

pytest_plugins = ["pytester"]

SLOW = """
import time
import pytest

@pytest.fixture
def slow_fixture():
    time.sleep(0.05)
    yield
    time.sleep(0.05)

def test_one(slow_fixture):
    time.sleep(0.1)

def test_two():
    time.sleep(0.1)
"""
FAST = """
def test_quick():
    pass
"""


@pytest.fixture(autouse=True)
def no_plugins(monkeypatch):
    """pytester's runs without the installed plugins (hypothesis imports itself again in each)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def fake_suite(pytester):
    pytester.makepyfile(test_slow=SLOW, test_fast=FAST)
    return pytester


def _run(pytester, *args):
    out = pytester.path / "times.json"
    result = pytester.runpytest("-p", "file_times", "--test-times", str(out), *args)
    return result, json.loads(out.read_text())


def test_times_summed_per_file_and_written(fake_suite):
    result, times = _run(fake_suite)
    result.assert_outcomes(passed=3)
    slow, fast = times["files"]["test_slow.py"], times["files"]["test_fast.py"]
    assert list(times["files"]) == ["test_slow.py", "test_fast.py"]  # slowest first
    assert slow["tests"] == 2 and fast["tests"] == 1 and times["tests"] == 3
    # the fixture's sleeps count too: 0.05 in setup, 0.1 + 0.1 in calls, 0.05 in teardown
    assert slow["setup_s"] >= 0.05 and slow["call_s"] >= 0.2 and slow["teardown_s"] >= 0.05
    assert slow["seconds"] >= 0.3 and fast["seconds"] < 0.1
    parts = slow["setup_s"] + slow["call_s"] + slow["teardown_s"]
    assert slow["seconds"] == pytest.approx(parts, abs=2e-3)
    assert times["total_s"] == pytest.approx(slow["seconds"] + fast["seconds"], abs=2e-3)
    assert times["session_s"] >= times["total_s"]
    assert times["cpu"] == cpu_model() and times["machine"] == machine_line()
    # default tier: 60 s per file, nobody over it
    assert times["budget_s"] == 60 and times["over_budget"] == [] and not times["runslow"]
    assert times["workers"] == 0  # one process
    result.stdout.fnmatch_lines(
        [
            "*= time per test file (setup + call + teardown) =*",
            machine_line(),
            "*seconds*tests*file",
            "*0.[3-9]*      2  test_slow.py",
            "*      1  test_fast.py",
            f"*      3  total of 2 files (2 slowest shown; all in {fake_suite.path}/times.json)",
        ]
    )
    result.stdout.no_fnmatch_line("*over budget*")


def test_over_budget_is_listed_not_failed(fake_suite):
    result, times = _run(fake_suite, "--file-time-budget", "0.05")
    assert result.ret == 0
    assert times["budget_s"] == 0.05 and times["over_budget"] == ["test_slow.py"]
    result.stdout.fnmatch_lines(
        [
            "*- over budget: more than 0.05 s per file -*",
            "*0.[3-9]* s  test_slow.py",
            "move their long cases behind --runslow*",
        ]
    )
    result.stdout.no_fnmatch_line("* s  test_fast.py")


def test_no_default_budget_with_runslow(fake_suite):
    fake_suite.makeconftest(
        "def pytest_addoption(parser):\n    parser.addoption('--runslow', action='store_true')\n"
    )
    _, times = _run(fake_suite, "--runslow")
    assert times["runslow"] and times["budget_s"] is None and times["over_budget"] == []
    _, times = _run(fake_suite, "--runslow", "--file-time-budget", "0.05")
    assert times["over_budget"] == ["test_slow.py"]


def test_nothing_written_when_nothing_ran(pytester):
    pytester.makepyfile(test_a=FAST)
    out = pytester.path / "times.json"
    result = pytester.runpytest("-p", "file_times", "--test-times", str(out), "--collect-only")
    assert result.ret == 0 and not out.exists()
    result.stdout.no_fnmatch_line("*time per test file*")


def test_times_collected_from_xdist_workers(fake_suite, monkeypatch):
    """Under pytest-xdist (scripts/test.sh runs two workers) the controller sums the workers'
    reports: every file is there with its own tests, and the record says how many workers ran."""
    pytest.importorskip("xdist")
    out = fake_suite.path / "times.json"
    plugins = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", plugins)  # the workers import file_times too
    args = ["-p", "xdist.plugin", "-p", "file_times", "--test-times", str(out)]
    result = fake_suite.runpytest_subprocess(*args, "-n", "2", "--dist", "loadfile")
    result.assert_outcomes(passed=3)
    times = json.loads(out.read_text())
    assert times["workers"] == 2 and times["tests"] == 3
    slow = times["files"]["test_slow.py"]
    assert slow["tests"] == 2 and slow["seconds"] >= 0.3
    result.stdout.fnmatch_lines(["*= time per test file (*2 workers sharing the cores) =*"])
