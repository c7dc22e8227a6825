"""OpenBLAS kernel choice (issue 38 item 1): socllm names the best core the CPU's flags support
before OpenBLAS loads, a user's OPENBLAS_CORETYPE wins, and an older core than the CPU supports
is a warning, never silence."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from socllm import blas_core

# /proc/cpuinfo flag sets of machines the project runs on (issue 38's "Why")
SAPPHIRE_RAPIDS = frozenset(
    "sse3 ssse3 avx avx2 fma bmi2 avx512f avx512bw avx512vl avx512dq avx512cd avx512_bf16 "
    "avx512_vnni amx_tile".split()
)
ZEN1 = frozenset("sse3 ssse3 avx avx2 fma bmi2".split())
SKYLAKE_SP = frozenset("avx avx2 fma bmi2 avx512f avx512bw avx512vl avx512dq avx512cd".split())


@pytest.mark.parametrize(
    "flags,core",
    [
        (SAPPHIRE_RAPIDS, "Cooperlake"),
        (SKYLAKE_SP, "SkylakeX"),
        (ZEN1, "Haswell"),
        (frozenset({"avx", "sse3"}), "Sandybridge"),
        (frozenset({"sse3"}), None),
        (frozenset(), None),
    ],
)
def test_best_core_from_flags(flags, core):
    assert blas_core.best_core(flags) == core


def test_cpu_flags_parses_the_first_cpu():
    text = "processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert blas_core.cpu_flags(text) == {"fpu", "avx2", "fma"}
    assert blas_core.cpu_flags("no flags here") == frozenset()


def test_fallback_is_a_warning_text():
    """What the Sapphire Rapids Xeon ran: Debian's OpenBLAS 0.3.21 fell back to Prescott."""
    msg = blas_core.check("Prescott", SAPPHIRE_RAPIDS)
    assert msg and "Prescott" in msg and "Cooperlake" in msg
    assert blas_core.check("Cooperlake", SAPPHIRE_RAPIDS) is None
    assert blas_core.check("Zen", ZEN1) is None  # AMD's name for the Haswell kernels
    assert blas_core.check("Haswell", SKYLAKE_SP) is not None


def test_choice_leaves_a_users_setting():
    assert blas_core.choice({"OPENBLAS_CORETYPE": "Haswell"}) == {}


def _import_socllm(env: dict) -> subprocess.CompletedProcess:
    code = "import socllm; print(socllm.blas_info()['corename'])"
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_running_core_is_the_cpus_best():
    best = blas_core.best_core(blas_core.cpu_flags())
    if best is None:
        pytest.skip("no x86 SIMD flags: OpenBLAS chooses alone")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    r = _import_socllm(env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [best] and "RuntimeWarning" not in r.stderr


def test_an_older_core_given_by_the_user_runs_and_is_said():
    best = blas_core.best_core(blas_core.cpu_flags())
    if best is None or best == "Sandybridge":
        pytest.skip("no core older than this CPU's best to force")
    r = _import_socllm({**os.environ, "OPENBLAS_CORETYPE": "Sandybridge"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["Sandybridge"]  # the user's choice wins
    assert "RuntimeWarning: OpenBLAS runs its Sandybridge kernels" in r.stderr
