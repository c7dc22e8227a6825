"""Which OpenBLAS kernels run (issue 38 item 1: never a fallback kernel in silence).

Debian's OpenBLAS 0.3.21 is a DYNAMIC_ARCH build that picks its kernels from the CPU model it
recognises; a CPU newer than the library (a Sapphire Rapids Xeon) falls back to its Prescott
(SSE3) kernels, which ran fp32 prefill at 0.38x the SkylakeX kernels' speed on that machine
(docs/RESULTS.md, issue 38's "Why"). So, before the library loads, socllm names the best core
the CPU's own flags support (OPENBLAS_CORETYPE, read once at load), unless the user chose one;
after loading, :func:`check` warns if the core running is older than that.

Imports nothing of socllm: ``socllm/__init__.py`` applies :func:`choice` before the core loads.
"""

from __future__ import annotations

import os
import warnings

# OpenBLAS DYNAMIC_ARCH x86-64 core names, best first, with the /proc/cpuinfo flags each one's
# kernels need (OpenBLAS driver/others/dynamic.c, support_avx512_bf16 / support_avx512 /
# support_avx2 / support_avx). AMD's "Zen" core runs the Haswell kernels.
CORES: tuple[tuple[str, frozenset[str]], ...] = (
    ("Cooperlake", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"})),
    ("SkylakeX", frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"})),
    ("Haswell", frozenset({"avx2", "fma", "bmi2"})),
    ("Sandybridge", frozenset({"avx"})),
)
# Cores the table ranks as one of its own (what OpenBLAS reports for an AMD CPU it knows).
SAME_AS = {"Zen": "Haswell"}
ENV = "OPENBLAS_CORETYPE"


def read_cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The flags of the first CPU in /proc/cpuinfo, or in ``cpuinfo`` (empty where none)."""
    if cpuinfo is None:
        cpuinfo = read_cpuinfo()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def best_core(flags: frozenset[str]) -> str | None:
    """The best core of :data:`CORES` whose kernels ``flags`` support (None: none of them)."""
    return next((name for name, needs in CORES if needs <= flags), None)


def rank(core: str) -> int:
    """Position in :data:`CORES` (0 best); an unlisted core (Prescott, Nehalem, ...) ranks last."""
    core = SAME_AS.get(core, core)
    names = [name for name, _ in CORES]
    return names.index(core) if core in names else len(names)


def choice(environ=os.environ) -> dict[str, str]:
    """{OPENBLAS_CORETYPE: :func:`best_core` of this CPU}, or nothing when the user set it or no
    listed core fits (OpenBLAS then chooses)."""
    core = best_core(cpu_flags())
    return {} if ENV in environ or core is None else {ENV: core}


def check(running: str, flags: frozenset[str] | None = None) -> str | None:
    """A warning text when the running core is older than the CPU supports, else None."""
    best = best_core(cpu_flags() if flags is None else flags)
    if best is None or rank(running) <= rank(best):
        return None
    return (
        f"OpenBLAS runs its {running} kernels on a CPU that supports {best}: fp32 linears "
        f"(and every benchmark's fp32 peer) run slower than they should"
        + (
            f" ({ENV}={os.environ[ENV]} was set before socllm loaded)"
            if ENV in os.environ
            else f"; set {ENV}={best} before Python starts"
        )
    )


def warn_if_fallback(running: str) -> None:
    message = check(running)
    if message:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
