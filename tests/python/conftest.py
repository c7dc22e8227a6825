"""Shared fixtures: the real default model (converted once into the user cache) and, for
agreement tests, the reference implementation (transformers + torch on the same GGUF)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run long evaluations")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="long evaluation: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm():
    import socllm

    socllm.set_log_level("warn")
    return socllm.load("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def reference_script():
    """scripts/reference_transformers.py as a module (the reference protocol lives there)."""
    spec = importlib.util.spec_from_file_location(
        "reference_transformers", REPO / "scripts" / "reference_transformers.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["reference_transformers"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def hf_reference(reference_script):
    """(tokenizer, model) of transformers for the SmolLM2 GGUF, fp32, 2 threads."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    torch.set_num_threads(2)
    return reference_script.load_reference("smollm2-135m")


@pytest.fixture(scope="session")
def wikitext_text():
    from socllm.data import wikitext2_test_text

    return wikitext2_test_text()
