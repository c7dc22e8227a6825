"""Helpers of the benchmark scripts (scripts/bench_*.py) and the sweep: which CPU and code a run
was on, and the best wall time of a call. Speed figures are ratios against a peer measured in
the same run; these name the machine they came from."""

from __future__ import annotations

import functools
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_family_model() -> str | None:
    """'family F model M' from /proc/cpuinfo: tells the micro-architecture when the model name
    is a bare 'AMD EPYC' (a VM)."""
    try:
        info = dict(
            (k.strip(), v.strip())
            for k, _, v in (
                line.partition(":")
                for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
            )
        )
    except OSError:
        return None
    if "cpu family" not in info:
        return None
    return f"family {info['cpu family']} model {info.get('model', '?')}"


def best_time(fn: Callable[[], object], min_seconds: float = 0.3, min_runs: int = 3) -> float:
    """The fastest of repeated calls (after one warm-up), seconds: at least min_runs calls and
    min_seconds of them."""
    fn()
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < min_seconds or len(times) < min_runs:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


@functools.cache
def source_commit() -> str | None:
    """The git commit of the socllm checkout this package is imported from (``+dirty`` if
    tracked files differ from it), read once per process: a process keeps the code it
    imported, whatever is committed later (callers ask early, e.g. a sweep cell before its
    work). None for an installed wheel (its version is :data:`socllm.__version__`), inside
    another project's repository, or without git."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        r = subprocess.run(
            # no optional locks: never take .git/index.lock from a user's concurrent git command
            ["git", "--no-optional-locks", "-C", str(here), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return r.stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() / "python" / "socllm" != here:
            return None  # e.g. a wheel installed into a virtualenv inside some other repository
        head = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def run_provenance() -> dict:
    """What a result was computed with: socllm's version and source commit, the CPU, the INT8
    kernel ISA and the OpenBLAS kernels."""
    from .. import _core
    from .._version import __version__

    return {
        "socllm": __version__,
        "source_commit": source_commit(),
        "cpu_model": cpu_model(),
        "cpu_family_model": cpu_family_model(),
        "isa": _core.ops.isa(),
        "blas": _core.blas_info()["corename"],
    }
