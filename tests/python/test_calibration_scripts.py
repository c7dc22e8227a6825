"""The scripts in calibration/ (DESIGN.md, "Offline, then online"): each runs as is and writes
what the plans read; the driver puts every output into one file (end to end with --runslow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import socllm
from socllm.calibration import Calibration, load_calibration

SCRIPTS = Path(__file__).resolve().parents[2] / "calibration"
TINY = ["--samples", "2", "--seqlen", "64", "--quiet"]


@pytest.fixture(autouse=True)
def scripts_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))


@pytest.mark.parametrize(
    "script",
    sorted(p.name for p in SCRIPTS.glob("*.py") if not p.name.startswith("_")),
)
def test_every_script_runs_as_is(script):
    """python calibration/<script> --help: its imports and command line work from a shell."""
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--help"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "--out" in r.stdout


def test_outlier_thresholds_script(smollm, tmp_path, capsys):
    import outlier_thresholds

    out = tmp_path / "o.h5"
    assert outlier_thresholds.main([*TINY, "--percentile", "99.9", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    data = load_calibration(out, smollm)
    assert data.provenance["steps"] == "act-scales,outliers"
    assert data.provenance["outlier_percentile"] == 99.9 and data.tokens == 128
    for site in Calibration.sites():
        t = data.stats.array("outlier_threshold", site)
        # the printed median is the file's
        assert f"{np.median(t):.3f}" in table
        # a 99.9th percentile: at most 0.1% of the 128 x width values exceed it (histogram bins
        # are 1.1% wide, so allow the bin edge)
        beyond = data.stats.array("outlier_count", site).sum(axis=1)
        width = data.stats.array("act_absmax", site).shape[1]
        assert (beyond <= 0.0011 * 128 * width + 1).all()


@pytest.mark.slow
def test_driver_writes_every_output_into_one_file(smollm, tmp_path):
    import calibrate_all

    out = tmp_path / "all.h5"
    argv = [*TINY, "--importance-samples", "1", "--importance-seqlen", "32", "--out", str(out)]
    assert calibrate_all.main(argv) == 0
    with h5py.File(out) as f:
        for name in ("outlier_threshold", "head_importance", "q_absmax", "smooth_alpha"):
            assert name in f
    data = load_calibration(out, smollm)
    steps = "act-scales,outliers,head-importance,qk-scales,smoothing,bitwidths"
    assert data.provenance["steps"] == steps
    smollm.load_calibration(out)
    try:
        for plan in ("shadow-outlier", "w8a8:attention=shadow-attn", "edgeflow"):
            assert np.isfinite(smollm.logits([1, 2, 3, 4], plan)).all()
    finally:
        smollm.set_calibration(None)


def test_a_corpus_of_your_own(smollm, tmp_path):
    """corpus= a text file: tokenized by the model's tokenizer, recorded in the provenance."""
    from socllm.calibration import calibrate_act_scales, corpus_tokens

    text = tmp_path / "mine.txt"
    text.write_text(" = My corpus = \n" + "The cat sat on the mat. " * 200, encoding="utf-8")
    data = calibrate_act_scales(smollm, corpus=str(text), samples=2, seqlen=32, progress=False)
    assert data.provenance["corpus"] == str(text) and data.tokens == 64
    toks = corpus_tokens(smollm, str(text))
    assert toks == smollm.tokenize(text.read_text(encoding="utf-8"))
    with pytest.raises(socllm.InvalidArgumentError, match="'corpus' must be wikitext2 or"):
        calibrate_act_scales(smollm, corpus=str(tmp_path / "none.txt"), progress=False)
