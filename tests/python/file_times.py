"""pytest plugin: the time of each test file (issue 38 item 5: a slow file is seen when it lands).

It sums setup + call + teardown of every test per file (a session fixture's setup counts
against the first file that uses it: ``setup_s`` shows it), prints the slowest files at the end
of the run, and writes them all to ``build/test-times.json`` under the rootdir
(``--test-times PATH`` elsewhere) with their test counts, the total and the machine
(:func:`socllm.eval.bench_utils.machine_line`). A file over the budget (60 s in the default
tier; ``--file-time-budget SECONDS`` sets it, also under ``--runslow``, where there is none by
default) is listed under "over budget": it is reported, never failed (a timed test would fail
on a slower CPU). ``tests/python/conftest.py`` loads it; ``-p file_times`` loads it elsewhere.

PYTEST_DONT_REWRITE: it has no asserts, and pytester's runs load it again (-p file_times).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

DEFAULT_BUDGET_S = 60.0  # per file, in the default tier (whose whole budget is about 8 min)
SHOWN = 10  # slowest files in the summary
DEFAULT_PATH = Path("build") / "test-times.json"  # under the rootdir (build/ is git-ignored)
PHASES = ("setup", "call", "teardown")


def pytest_addoption(parser):
    group = parser.getgroup("file-times", "time per test file")
    group.addoption(
        "--test-times",
        metavar="PATH",
        default=None,
        help=f"where the time per test file goes as JSON (default: {DEFAULT_PATH} under the "
        "rootdir)",
    )
    group.addoption(
        "--file-time-budget",
        metavar="SECONDS",
        type=float,
        default=None,
        help=f"list the test files that take longer as over budget, without failing (default: "
        f"{DEFAULT_BUDGET_S:g} s in the default tier, none with --runslow)",
    )


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller gets its reports
        return
    if config.pluginmanager.has_plugin("socllm-file-times"):  # loaded twice (-p file_times)
        return
    config.pluginmanager.register(FileTimes(config), "socllm-file-times")


def _machine() -> tuple[str | None, str | None]:
    """(CPU model, machine line) of socllm's bench_utils; None where socllm does not import."""
    try:
        from socllm.eval.bench_utils import cpu_model, machine_line

        return cpu_model(), machine_line()
    except Exception:  # noqa: BLE001 (an unbuilt checkout still gets its times)
        return None, None


class FileTimes:
    def __init__(self, config) -> None:
        self.config = config
        self.phases: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(PHASES, 0.0))
        self.tests: dict[str, set[str]] = defaultdict(set)
        self.start = time.perf_counter()
        self.result: dict | None = None
        self.path: Path | None = None

    def budget(self) -> float | None:
        given = self.config.getoption("--file-time-budget")
        if given is not None:
            return given
        return None if self.config.getoption("--runslow", default=False) else DEFAULT_BUDGET_S

    def pytest_runtest_logreport(self, report) -> None:
        if report.when not in PHASES:
            return
        path = report.nodeid.split("::", 1)[0]
        self.phases[path][report.when] += report.duration
        self.tests[path].add(report.nodeid)

    def pytest_sessionfinish(self, session) -> None:
        if not self.tests:  # nothing ran (--collect-only, a collection error): keep the last file
            return
        files = {
            path: {
                "seconds": round(sum(p.values()), 3),
                "tests": len(self.tests[path]),
                **{f"{phase}_s": round(p[phase], 3) for phase in PHASES},
            }
            for path, p in self.phases.items()
        }
        files = dict(sorted(files.items(), key=lambda kv: -kv[1]["seconds"]))
        budget = self.budget()
        over = [p for p, f in files.items() if budget is not None and f["seconds"] > budget]
        cpu, machine = _machine()
        self.result = {
            "cpu": cpu,
            "machine": machine,
            "total_s": round(sum(f["seconds"] for f in files.values()), 3),
            "session_s": round(time.perf_counter() - self.start, 3),
            "tests": sum(f["tests"] for f in files.values()),
            # pytest-xdist workers (0: one process); with several, a file's time includes the
            # waits for a core that the other workers' files cause
            "workers": int(getattr(self.config.option, "numprocesses", 0) or 0),
            "runslow": bool(self.config.getoption("--runslow", default=False)),
            "budget_s": budget,
            "over_budget": over,
            "files": files,
        }
        given = self.config.getoption("--test-times")
        self.path = Path(given) if given else self.config.rootpath / DEFAULT_PATH
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.result, indent=1) + "\n")
        tmp.replace(self.path)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        r = self.result
        if r is None:
            return
        tr = terminalreporter
        workers = f", {r['workers']} workers sharing the cores" if r["workers"] > 1 else ""
        tr.write_sep("=", f"time per test file (setup + call + teardown{workers})")
        if r["machine"]:
            tr.write_line(r["machine"])
        tr.write_line(f"{'seconds':>9} {'tests':>6}  file")
        for path, f in list(r["files"].items())[:SHOWN]:
            tr.write_line(f"{f['seconds']:9.2f} {f['tests']:6d}  {path}")
        tr.write_line(
            f"{r['total_s']:9.2f} {r['tests']:6d}  total of {len(r['files'])} files "
            f"({min(SHOWN, len(r['files']))} slowest shown; all in {self.path})"
        )
        if r["over_budget"]:
            tr.write_sep("-", f"over budget: more than {r['budget_s']:g} s per file")
            for path in r["over_budget"]:
                tr.write_line(f"{r['files'][path]['seconds']:9.2f} s  {path}")
            tr.write_line(
                "move their long cases behind --runslow (@pytest.mark.slow), or make them "
                "smaller: the default tier's whole budget is about 8 minutes on 2 cores"
            )
