"""Issue 37 (graceful under load): ``import socllm`` makes libgomp's threads sleep after a short
spin unless the user chose a wait policy, and says so when libgomp was loaded too early for that.
Each case is a fresh interpreter (libgomp reads its environment once, when it is loaded); its
OMP_DISPLAY_ENV listing shows what libgomp actually uses. The speed under load is measured by
``scripts/bench_load.py``, not here."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("socllm")

POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with no wait policy in its environment but ``env``, and
    no OpenBLAS kernel choice (a machine that sets one gets blas_core's warning about it, which
    is not this file's subject)."""
    base = {
        k: v for k, v in os.environ.items() if k not in POLICY_VARS and k != "OPENBLAS_CORETYPE"
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "OMP_DISPLAY_ENV": "VERBOSE", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def _libgomp(stderr: str, var: str) -> str | None:
    """The value libgomp lists for ``var`` (OMP_DISPLAY_ENV), or None."""
    m = re.search(rf"^\s*{var}\s*=\s*'([^']*)'", stderr, re.MULTILINE)
    return m.group(1) if m else None


PRINT_ENV = (
    "import os, socllm; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
)


def test_a_short_passive_wait_is_the_default():
    r = _run(PRINT_ENV)
    assert r.stdout.split() == ["PASSIVE", "1000"]
    assert _libgomp(r.stderr, "OMP_WAIT_POLICY") == "PASSIVE"
    assert _libgomp(r.stderr, "GOMP_SPINCOUNT") == "1000"  # not libgomp's 300000
    assert "RuntimeWarning" not in r.stderr


@pytest.mark.parametrize("policy, spins", [("ACTIVE", "30000000000"), ("passive", "0")])
def test_an_explicit_wait_policy_wins(policy, spins):
    r = _run(PRINT_ENV, OMP_WAIT_POLICY=policy)
    assert r.stdout.split() == [policy, "None"]  # socllm adds no spin count to the user's policy
    assert _libgomp(r.stderr, "OMP_WAIT_POLICY") == policy.upper()
    assert _libgomp(r.stderr, "GOMP_SPINCOUNT") == spins


def test_an_explicit_spin_count_wins():
    r = _run(PRINT_ENV, GOMP_SPINCOUNT="300000")
    assert r.stdout.split() == ["None", "300000"]  # and no policy beside the user's spin count
    assert _libgomp(r.stderr, "GOMP_SPINCOUNT") == "300000"


def test_the_default_reaches_child_processes():
    code = (
        "import socllm, subprocess, sys; subprocess.run([sys.executable, '-c', "
        "\"import os; print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])\"], "
        "check=True)"
    )
    assert _run(code).stdout.split() == ["PASSIVE", "1000"]


def test_libgomp_loaded_before_socllm_is_reported():
    # as `import torch` does first: torch ships a libgomp.so.1, initialised with the spinning
    # default, which the core then shares
    code = "import ctypes; ctypes.CDLL('libgomp.so.1'); import socllm"
    r = _run(code)
    assert "RuntimeWarning" in r.stderr and "OMP_WAIT_POLICY=PASSIVE" in r.stderr
    assert _libgomp(r.stderr, "GOMP_SPINCOUNT") == "300000"  # libgomp's default: too late
    # no warning when the user's environment chose
    r = _run(code, OMP_WAIT_POLICY="PASSIVE")
    assert "RuntimeWarning" not in r.stderr
    assert _libgomp(r.stderr, "GOMP_SPINCOUNT") == "0"
