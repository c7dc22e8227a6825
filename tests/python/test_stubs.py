"""The type stubs checked in as python/socllm/_core/*.pyi are those of the installed module:
regenerated with cpp/bindings/stubgen.py (as the build does) and compared file by file."""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("socllm._core")
pytest.importorskip(
    "pybind11_stubgen",
    reason="pybind11-stubgen is not installed (the `test` extra pins it): stubs not checked",
)

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "python" / "socllm" / "_core"
STUBGEN = REPO / "cpp" / "bindings" / "stubgen.py"


def _stubs(d: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(d.glob("*.pyi"))}


def test_stubs_are_those_of_the_module(tmp_path):
    r = subprocess.run(
        [sys.executable, str(STUBGEN), str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    generated, checked_in = _stubs(tmp_path), _stubs(CHECKED_IN)
    assert "__init__.pyi" in generated and "sim.pyi" in generated
    if generated == checked_in:
        return
    # The first line names the pybind11 and pybind11-stubgen that wrote the stubs: another
    # version writes other stubs of the same module, which is not a stale stub.
    made_by = {s.partition("\n")[0] for s in checked_in.values()}
    here = next(iter(generated.values())).partition("\n")[0]
    if checked_in and made_by != {here}:
        pytest.skip(f"checked-in stubs: {sorted(made_by)}; this environment: {here!r}")
    diff = "".join(
        line
        for name in sorted(set(generated) | set(checked_in))
        for line in difflib.unified_diff(
            checked_in.get(name, "").splitlines(keepends=True),
            generated.get(name, "").splitlines(keepends=True),
            f"python/socllm/_core/{name}",
            f"generated/{name}",
        )
    )
    pytest.fail(
        "python/socllm/_core/*.pyi are not the stubs of the installed socllm._core; after "
        "rebuilding and installing the module, update them with "
        "`python cpp/bindings/stubgen.py python/socllm/_core`:\n" + diff[:6000]
    )
