"""Helpers of the benchmark scripts (scripts/bench_*.py) and the sweep: which CPU and code a run
was on, and the best wall time of a call. Speed figures are ratios against a peer measured in
the same run; these name the machine they came from."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

# The ISA features that decide which kernels can run, as the machine line names them, with the
# /proc/cpuinfo flag of each: x86-64 ("flags") and aarch64 ("Features", named as there).
X86_FEATURES = (
    ("AVX2", "avx2"),
    ("AVX-512", "avx512f"),
    ("VNNI", "avx512_vnni"),  # AVX-512 VNNI: socllm's avx512-vnni INT8 kernels
    ("AVX-VNNI", "avx_vnni"),  # the 256-bit VNNI of CPUs without AVX-512 (Alder Lake)
    ("BF16", "avx512_bf16"),
    ("AMX", "amx_tile"),
)
ARM_FEATURES = tuple((f, f) for f in ("asimd", "asimddp", "i8mm", "bf16", "sve", "sve2"))


def _cpuinfo(text: str | None) -> str:
    from ..blas_core import read_cpuinfo

    return read_cpuinfo() if text is None else text


def _first_cpu(cpuinfo: str | None = None) -> dict[str, str]:
    """The fields of the first CPU of /proc/cpuinfo (or of ``cpuinfo``), by name."""
    info: dict[str, str] = {}
    for line in _cpuinfo(cpuinfo).strip().split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info.setdefault(key.strip(), value.strip())
    return info


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (aarch64, which has none in /proc/cpuinfo: its implementer and
    part numbers)."""
    info = _first_cpu(cpuinfo)
    if "model name" in info:
        return info["model name"]
    if "CPU implementer" in info:
        return f"{platform.machine()} implementer {info['CPU implementer']} part " + info.get(
            "CPU part", "?"
        )
    return platform.processor() or platform.machine() or "unknown"


def cpu_family_model(cpuinfo: str | None = None) -> str | None:
    """'family F model M' from /proc/cpuinfo: tells the micro-architecture when the model name
    is a bare 'AMD EPYC' (a VM)."""
    info = _first_cpu(cpuinfo)
    if "cpu family" not in info:
        return None
    return f"family {info['cpu family']} model {info.get('model', '?')}"


def cpu_features(cpuinfo: str | None = None) -> list[str]:
    """The ISA features of :data:`X86_FEATURES` / :data:`ARM_FEATURES` the CPU has."""
    info = _first_cpu(cpuinfo)
    if "flags" in info:
        flags, table = set(info["flags"].split()), X86_FEATURES
    else:
        flags, table = set(info.get("Features", "").split()), ARM_FEATURES
    return [label for label, flag in table if flag in flags]


def machine_line(
    cpuinfo: str | None = None, blas: dict | None = None, isa: str | None = None
) -> str:
    """The machine a measurement ran on, in one line: CPU model (and family/model), its ISA
    features that matter, its CPU count, the BLAS library with its version and the kernels
    (core) it runs, and whether that core is the best this CPU supports (issue 38: a fallback
    core ran fp32 at 0.38x). Every scripts/bench_*.py prints it first and ``socllm run`` puts it
    in its report. ``cpuinfo``, ``blas`` (:func:`socllm.blas_info`) and ``isa``
    (:func:`socllm.ops.isa`) default to this machine's; given, they describe another."""
    from .. import blas_core

    text = _cpuinfo(cpuinfo)
    if blas is None or isa is None:
        from .. import _core

        blas = _core.blas_info() if blas is None else blas
        isa = _core.ops.isa() if isa is None else isa
    cpu = cpu_model(text)
    fm = cpu_family_model(text)
    if fm:
        cpu += f" ({fm})"
    if cpuinfo is None:
        total, usable = os.cpu_count() or 0, len(os.sched_getaffinity(0))
    else:
        total = usable = sum(line.startswith("processor") for line in text.splitlines())
    cpus = f"{total} CPUs" + (f" ({usable} usable)" if usable != total else "")
    features = " ".join(cpu_features(text)) or "baseline"
    library = " ".join(blas.get("config", "").split()[:2]) or "BLAS"
    core = blas.get("corename", "?")
    best = blas_core.best_core(blas_core.cpu_flags(text))
    if best is None:
        verdict = "OpenBLAS's own choice"
    elif blas_core.rank(core) <= blas_core.rank(best):
        verdict = "the best this CPU supports"
    else:
        verdict = f"NOT the best: this CPU supports {best}"
    return (
        f"CPU {cpu}, {cpus}, ISA {features}; {library} {core} kernels ({verdict}); "
        f"INT8 kernels {isa}"
    )


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
    here = Path(__file__).resolve().parents[1]  # the socllm package (this is socllm/eval/)

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
    kernel ISA and the OpenBLAS kernels, and all of the machine in one line
    (:func:`machine_line`)."""
    from .. import _core
    from .._version import __version__

    return {
        "socllm": __version__,
        "source_commit": source_commit(),
        "cpu_model": cpu_model(),
        "cpu_family_model": cpu_family_model(),
        "isa": _core.ops.isa(),
        "blas": _core.blas_info()["corename"],
        "machine": machine_line(),
    }
