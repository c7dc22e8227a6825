"""Rotations as plan parts on the real model (issue 39, QuaRot §4): in fp32 every rotated plan
gives the plain model's logits (within 1e-4 relative); the rotated model's activations are the
original's times Q; a calibration serves the plans of the rotation it was made on."""

from __future__ import annotations

import numpy as np
import pytest
import socllm

IDS = [1, 504, 3458, 314, 260, 1345, 282, 3821, 30, 378, 2543, 4195]
ROTATED = "rotate=hadamard,rotate_seed=1,rotate_down=hadamard,rotate_heads=hadamard"


@pytest.mark.parametrize(
    "parts", ["rotate=hadamard,rotate_seed=1", "rotate=random,rotate_seed=1", ROTATED]
)
def test_rotated_plans_give_the_same_logits(smollm, parts):
    want = smollm.logits(IDS)
    got = smollm.logits(IDS, f"fp32:{parts}")
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert smollm.rotation == "none"


def test_same_attention_inputs_and_spread_linear_inputs(smollm):
    """Q, K and V of a layer are the original's (the weights absorb Q); the linears' inputs are
    the original's times Q, which spreads their outlier channels: the largest channel's absmax
    against the median channel's falls, at the residual's sites and at the down projection's
    input (rotated online)."""
    rotated = smollm.rotated(socllm.Plan(f"fp32:{ROTATED}").rotation)
    assert rotated.rotation == "hadamard,seed=1,down,heads"
    for a, b in zip(
        smollm.capture(IDS, 7, ("q", "k")).values(),
        rotated.capture(IDS, 7, ("q", "k")).values(),
        strict=True,
    ):
        np.testing.assert_allclose(b, a, atol=2e-4 * np.abs(a).max())
    peak = {}
    for name, m in (("plain", smollm), ("rotated", rotated)):
        cal = m.new_calibration()
        m.observe_activations([IDS * 4], cal)
        for site in ("attn_in", "mlp_act"):
            x = cal.array("act_absmax", site)  # [n_layers, width]
            peak[name, site] = np.median(x.max(1) / np.median(x, 1))
    for site in ("attn_in", "mlp_act"):
        assert peak["rotated", site] < peak["plain", site] / 2, peak


def test_calibrate_records_the_rotation_and_serves_its_plans(tmp_path, capsys):
    """socllm calibrate --rotate ... gathers statistics on the rotated model; loaded into the
    plain model they serve the plans with that rotation, and a plan of another rotation names
    the command that makes its statistics."""
    from socllm.cli import main as cli_main

    out = tmp_path / "rot.h5"
    argv = ["calibrate", "--rotate", "hadamard", "--rotate-seed", "1", "--rotate-down"]
    argv += ["hadamard", "--steps", "act-scales", "--samples", "2", "--seqlen", "32"]
    assert cli_main([*argv, "--out", str(out), "--quiet"]) == 0
    model = socllm.load("smollm2-135m", progress=False, calib=out)
    assert model.calibrated_rotations == ["hadamard,seed=1,down"]
    plan = "w8a8:rotate=hadamard,rotate_seed=1,rotate_down=hadamard"
    want = model.logits(IDS)
    got = model.logits(IDS, plan)
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.5
    with pytest.raises(socllm.InvalidArgumentError, match="none is loaded"):
        model.logits(IDS, "w8a8")
    with pytest.raises(socllm.InvalidArgumentError, match="--rotate hadamard --rotate-seed 2"):
        model.logits(IDS, "w8a8:rotate=hadamard,rotate_seed=2")
    # continuing the file with other rotate flags is refused
    argv = ["calibrate", "--calib", str(out), "--rotate", "random", "--steps", "outliers"]
    assert cli_main([*argv, "--out", str(tmp_path / "x.h5"), "--quiet"]) == 2
    assert "made on rotation 'hadamard,seed=1,down'" in capsys.readouterr().err
    assert not (tmp_path / "x.h5").exists()


def test_bad_rotation_arguments_name_the_value(smollm):
    with pytest.raises(socllm.InvalidArgumentError, match="unknown rotation 'givens'"):
        socllm.Plan("w8a8:rotate=givens")
    with pytest.raises(socllm.InvalidArgumentError, match="rotate_seed must be .* got -1"):
        socllm.Plan("w8a8:rotate=hadamard,rotate_seed=-1")
    with pytest.raises(socllm.InvalidArgumentError, match="unknown part 'givens'"):
        smollm.rotated("givens")


def test_lmeval_and_cli_take_the_parts():
    """The lm-eval backend's model arguments and socllm calibrate's flags give the same plan."""
    from socllm.eval.lmeval import build_plan

    plan = build_plan(
        "w8a8", {"rotate": "hadamard", "rotate_seed": "1", "rotate_down": "hadamard",
                 "rounding": "gptq", "residual_scale": "auto"}
    )  # fmt: skip
    p = socllm.Plan(plan)
    assert p.rotation == "hadamard,seed=1,down"
    assert p.to_json()["ops"]["linear"]["rounding"]["method"] == "gptq"
    assert p.to_json()["residual_scale"] == "auto"
    for part in socllm.Plan.parts():
        assert "(" in socllm.Plan.describe(part), part  # names its source
