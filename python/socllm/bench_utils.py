"""Helpers of the benchmark scripts (scripts/bench_*.py): which CPU a run was on, and the best
wall time of a call. Speed figures are ratios against a peer measured in the same run; these
name the machine they came from."""

from __future__ import annotations

import platform
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
