"""Residual-stream rotations on the real model (issue 39, QuaRot §4.1): in fp32 the rotated
SmolLM2-135M gives the original's logits (within 1e-4 relative); its activations are the
original's times Q; calibrations of another rotation are refused."""

from __future__ import annotations

import numpy as np
import pytest
import socllm

IDS = [1, 504, 3458, 314, 260, 1345, 282, 3821, 30, 378, 2543, 4195]


@pytest.fixture(scope="module", params=["hadamard", "random"])
def rotated(request):
    return socllm.load("smollm2-135m", progress=False, rotate=request.param, rotate_seed=1)


def test_rotated_model_gives_the_same_logits(smollm, rotated):
    want = smollm.logits(IDS)
    got = rotated.logits(IDS)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert rotated.rotation.endswith(",seed=1") and smollm.rotation == "none"


def test_same_attention_inputs_and_spread_linear_inputs(smollm, rotated):
    """Q, K and V of a layer are the original's (the weights absorb Q); the linears' inputs are
    the original's times Q, which spreads their outlier channels: the largest channel's absmax
    against the median channel's falls."""
    for a, b in zip(
        smollm.capture(IDS, 7, ("q", "k", "v")).values(),
        rotated.capture(IDS, 7, ("q", "k", "v")).values(),
        strict=True,
    ):
        np.testing.assert_allclose(b, a, atol=2e-4 * np.abs(a).max())
    peak = {}
    for name, m in (("plain", smollm), ("rotated", rotated)):
        cal = m.new_calibration()
        m.observe_activations([IDS * 4], cal)
        x = cal.array("act_absmax", "attn_in")  # [n_layers, 576]
        peak[name] = np.median(x.max(1) / np.median(x, 1))
    assert peak["rotated"] < peak["plain"] / 2, peak


def test_a_calibration_of_another_rotation_is_refused(smollm, rotated, small_calibration):
    with pytest.raises(socllm.InvalidArgumentError, match="rotation 'none'"):
        rotated.load_calibration(small_calibration)


def test_calibrate_records_the_rotation_and_others_refuse_the_file(smollm, rotated, tmp_path):
    from socllm.cli import main as cli_main

    kind, seed = rotated.rotation.split(",seed=")
    out = tmp_path / "rot.h5"
    argv = ["calibrate", "--rotate", kind, "--rotate-seed", seed, "--steps", "act-scales"]
    argv += ["--samples", "2", "--seqlen", "32", "--out", str(out), "--quiet"]
    assert cli_main(argv) == 0
    rotated.load_calibration(out)
    assert rotated.calibration_provenance["rotation"] == rotated.rotation
    with pytest.raises(socllm.InvalidArgumentError, match=f"--rotate {kind} --rotate-seed 1"):
        smollm.load_calibration(out)


def test_bad_rotation_arguments_name_the_value():
    with pytest.raises(socllm.InvalidArgumentError, match="unknown rotation 'givens'"):
        socllm.load("smollm2-135m", progress=False, rotate="givens")
    with pytest.raises(socllm.InvalidArgumentError, match="rotate_seed .* got -1"):
        socllm.load("smollm2-135m", progress=False, rotate="hadamard", rotate_seed=-1)
