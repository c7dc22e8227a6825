"""Every socllm module imports, and the modules' imports point one way: the graph of
``import``/``from`` statements over python/socllm (function-local imports included) has no
cycle."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("socllm")

import socllm

PKG_DIR = Path(socllm.__file__).resolve().parent
# need optional dependencies; imported only if those are installed
OPTIONAL = {"socllm.eval.lmeval": "lm_eval", "socllm.reference": "transformers"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}


def _is_module(name: str, sources: dict[str, Path]) -> bool:
    if name in sources:
        return True
    try:  # compiled submodules (the C++ extension)
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_graph() -> dict[str, set[str]]:
    """{module: socllm source modules it imports}; ``from a import b`` counts as importing
    ``a.b`` when that is a module, else ``a``."""
    sources = _sources()
    graph: dict[str, set[str]] = {}
    for name, path in sources.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.add(sub if a.name != "*" and _is_module(sub, sources) else base)
        graph[name] = {t for t in targets if t in sources and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [m0, m1, ..., m0], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t) :] + [t]
            if t not in state and (c := visit(t)):
                return c
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_every_module_imports():
    for name in _sources():
        if name.endswith(".__main__"):  # importing it runs the command
            continue
        extra = next((dep for pkg, dep in OPTIONAL.items() if name.startswith(pkg)), None)
        if extra is not None and importlib.util.find_spec(extra) is None:
            continue
        importlib.import_module(name)


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_graph_sees_local_and_relative_imports():
    g = import_graph()
    assert "socllm.calibration.artifact" in g["socllm.model"]  # function-local, relative
    assert "socllm.model" in g["socllm.cli"]
    assert "socllm.data" in g["socllm.eval.lmeval.task_configs"]  # from ..data import ...
    assert "socllm.model" in g["socllm.eval.lmeval.backend"]  # from ...model, in a method


def test_find_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
