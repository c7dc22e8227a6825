"""Calibration owned by the core (issue 11): the artifact schema is the C++ core's, steps share
one interface, h5py still reads every file."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import socllm
from socllm.calibration import STEPS, load_calibration, run_steps, save_calibration
from socllm.cli import main as cli_main

SMALL = {"samples": 4, "seqlen": 128, "seed": 5}


@pytest.fixture(scope="module")
def outliers(smollm):
    return run_steps(smollm, "act-scales,outliers", progress=False, **SMALL)


def test_schema_is_the_steps_contract():
    schema = {a["name"]: a for a in socllm.calibration.Calibration.schema()}
    assert set(schema) == {
        "act_absmax",
        "abs_hist",
        "outlier_threshold",
        "outlier_count",
        "outlier_seq_channels",
        "outlier_seqs",
        "head_importance",
        "layer_importance",
        "q_absmax",
        "k_absmax",
        "v_absmax",
        "out_absmax",
        "smooth_alpha",
        "smooth_alpha_error",
        "channel_bits",
        "residual_absmax",
        "hessian",
    }
    # every step's arrays are optional: a file holds what its steps wrote
    assert not any(a["required"] for a in schema.values())
    assert socllm.calibration.Calibration.format_version == 4
    assert list(STEPS) == [
        "act-scales",
        "outliers",
        "pruning-rate",
        "head-importance",
        "qk-scales",
        "attention-clamp",
        "smoothing",
        "bitwidths",
        "gptq",
    ]
    for s in STEPS.values():
        assert s.description and s.writes


def test_file_written_by_cpp_reads_with_h5py(smollm, outliers, tmp_path):
    path = save_calibration(tmp_path / "c.h5", outliers, smollm)
    with h5py.File(path) as f:
        assert f.attrs["format"] == "socllm-calibration" and f.attrs["format_version"] == 4
        assert json.loads(f.attrs["model_config"])["d_model"] == 576
        assert f.attrs["steps"] == "act-scales,outliers" and f.attrs["samples"] == 4
        for a in socllm.calibration.Calibration.schema():
            if a["step"] not in ("act-scales", "outliers"):
                assert a["name"] not in f  # their steps did not run
                continue
            if not a["per_site"]:  # the residual stream's maxima, one per layer and the output
                arr = f[a["name"]][()]
                assert arr.shape == (31,) and arr.dtype == np.dtype(a["dtype"])
                np.testing.assert_array_equal(arr, outliers.stats.array(a["name"], None))
                continue
            for site in socllm.calibration.Calibration.sites():
                arr = f[f"{a['name']}/{site}"][()]
                assert arr.dtype == np.dtype(a["dtype"]), (a["name"], site)
                np.testing.assert_array_equal(arr, outliers.stats.array(a["name"], site))
        assert f["shadow_defaults/pruned"].shape == (30, 4)
        assert f["shadow_defaults/pruned"].dtype == bool
    back = load_calibration(path, smollm)
    # a folder that does not exist yet is created
    assert load_calibration(save_calibration(tmp_path / "new" / "c.h5", outliers, smollm), smollm)
    for site in socllm.calibration.Calibration.sites():
        np.testing.assert_array_equal(back.absmax(site), outliers.absmax(site))
    assert back.provenance["outlier_percentile"] == 99.99 and back.tokens == outliers.tokens


def test_steps_declare_their_needs(smollm, outliers):
    with pytest.raises(socllm.InvalidArgumentError, match="step 'outliers' needs 'act_absmax'"):
        run_steps(smollm, "outliers", progress=False)
    with pytest.raises(socllm.InvalidArgumentError, match="unknown step 'blending'"):
        run_steps(smollm, "act-scales,blending", progress=False)
    with pytest.raises(socllm.InvalidArgumentError, match="unknown option 'alpha'"):
        run_steps(smollm, "act-scales", progress=False, alpha=0.5)
    with pytest.raises(socllm.InvalidArgumentError, match="needs 'outlier_threshold'"):
        run_steps(
            smollm, "pruning-rate", data=run_steps(smollm, "act-scales", progress=False, **SMALL)
        )


def test_pruning_rate_step(smollm, outliers, tmp_path):
    """The CLI continues a file with the pruning-rate step (validation text of one window)."""
    path = save_calibration(tmp_path / "o.h5", outliers, smollm)
    dst = tmp_path / "p.h5"
    argv = ["calibrate", "--steps", "pruning-rate", "--calib", str(path), "--out", str(dst)]
    argv += ["--budget", "0.02", "--validation-tokens", "128", "--validation-context", "128"]
    assert cli_main([*argv, "--quiet"]) == 0
    p = load_calibration(dst, smollm).provenance
    rate, val = p["auto_pruning_rate"], json.loads(p["auto_pruning_validation"])
    tried = {t["rate"]: t["perplexity"] for t in val["tried"]}
    limit = tried[0.0] * 1.02
    # the chosen rate is within the budget; every rate tried above it was over it
    assert 0.0 <= rate <= 1.0 and tried[rate] <= limit
    assert all(v > limit for k, v in tried.items() if k > rate)
    assert val["tokens"] == 128 and p["auto_pruning_budget"] == 0.02
    assert p["steps"] == "act-scales,outliers,pruning-rate"
    # the model's own calibration is untouched by the step
    assert smollm.calibration is None
    # an output that is the model file itself is refused
    assert cli_main(["calibrate", "--out", str(smollm.path), "--quiet"]) == 2
    # another shadow-outlier placement (Gemma 3 needs its residual in fp32): the search runs
    # under it and records it; its unpruned perplexity differs from the fp16 residual's. A
    # budget every rate meets ends the search after its two ends (no bisection: 2 evaluations)
    dst2 = tmp_path / "p2.h5"
    argv2 = [*argv, "--out", str(dst2), "--pruning-plan", "shadow-outlier:residual=cpu/fp32"]
    assert cli_main([*argv2, "--budget", "1e6", "--quiet"]) == 0
    p2 = load_calibration(dst2, smollm).provenance
    val2 = json.loads(p2["auto_pruning_validation"])
    assert val["plan"] == "shadow-outlier" and val2["plan"] == "shadow-outlier:residual=cpu/fp32"
    assert [t["rate"] for t in val2["tried"]] == [0.0, 1.0] and p2["auto_pruning_rate"] == 1.0
    assert val2["tried"][0]["perplexity"] != tried[0.0]


def test_a_failing_step_keeps_the_finished_ones(smollm, tmp_path, capsys, monkeypatch):
    """Each finished step is saved before the next starts; the error says how to continue."""
    import dataclasses

    import socllm.calibration.steps as steps

    def boom(ctx):
        raise socllm.InvalidArgumentError("pruning-rate: out of memory (simulated)")

    bad = dataclasses.replace(steps.STEPS["pruning-rate"], run=boom)
    monkeypatch.setitem(steps.STEPS, "pruning-rate", bad)
    out = tmp_path / "c.h5"
    argv = ["calibrate", "--steps", "act-scales,outliers,pruning-rate", "--samples", "2"]
    argv += ["--seqlen", "64", "--out", str(out), "--quiet"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "out of memory (simulated)" in err
    assert f"steps act-scales,outliers are saved in {out}" in err
    assert f"--calib {out} --steps pruning-rate" in err
    back = load_calibration(out, smollm)
    assert back.provenance["steps"] == "act-scales,outliers" and back.tokens == 128


def test_options_are_checked_before_any_step_runs(smollm, tmp_path, capsys):
    """A bad option of a later step fails the pipeline before its first step starts, naming the
    value; an option none of the steps takes is refused."""
    out = tmp_path / "c.h5"
    argv = ["calibrate", "--steps", "act-scales,outliers,pruning-rate", "--samples", "2"]
    argv += ["--seqlen", "64", "--out", str(out), "--quiet"]
    assert cli_main([*argv, "--pruning-plan", "w8a8"]) == 2
    err = capsys.readouterr().err
    assert "--pruning-plan must be shadow-outlier" in err and '"w8a8"' in err
    assert not out.exists()
    for bad, match in (
        ({"percentile": 0.0}, "'percentile' must be in \\(0, 100\\], got 0"),
        ({"seqlen": 1}, "'seqlen' must be >= 2, got 1"),
        ({"outlier_threshold": "median"}, 'must be one of percentile, maxmin, got "median"'),
        ({"samples": 2.5}, "'samples' must be an integer, got 2.5"),
        ({"bits": 5.0}, "'bits' does not apply to steps act-scales,outliers"),
    ):
        with pytest.raises(socllm.InvalidArgumentError, match=match):
            run_steps(smollm, "act-scales,outliers", progress=False, **bad)


def test_cli_flags_and_signatures_come_from_the_registry(capsys):
    """Every option of every registered step is a flag of socllm calibrate and a keyword of its
    calibrate_<step> function, with the registry's default."""
    import inspect

    import socllm.calibration as cal

    with pytest.raises(SystemExit):
        cli_main(["calibrate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for s in STEPS.values():
        fn = getattr(cal, "calibrate_" + s.name.replace("-", "_"))
        sig = inspect.signature(fn)
        for name, default in s.options.items():
            assert "--" + name.replace("_", "-") in help_text
            assert sig.parameters[name].default == default
        assert s.description.split(":")[0] in fn.__doc__


def test_head_importance_by_hand(tmp_path):
    """shadowAttn's Eq. 1 and 2 (seed 000 §3.2) on a tiny model, against a float64 numpy forward
    pass: without ablation it is the engine's fp32 log-probs; the step's number for a head (a
    layer) is the mean over windows of the NLL with that head's (all the layer's heads')
    attention output zeroed minus the NLL without."""
    from socllm.calibration import calibrate_head_importance, calibration_windows, corpus_tokens
    from tiny_model import TINY, numpy_logprobs, tiny_weights, write_tiny

    ws = tiny_weights(TINY, np.random.default_rng(0))
    m = socllm.load(write_tiny(tmp_path / "tiny.h5", weights=ws), progress=False)
    d = calibrate_head_importance(
        m, importance_samples=2, importance_seqlen=24, seed=1, progress=False
    )
    wins = calibration_windows(corpus_tokens(m), 2, 24, 1)
    np.testing.assert_allclose(
        numpy_logprobs(TINY, ws, wins[0]), m.token_logprobs([wins[0]], "fp32")[0], atol=1e-5
    )

    def nll_increase(zero) -> float:
        return np.mean(
            [
                numpy_logprobs(TINY, ws, w).mean() - numpy_logprobs(TINY, ws, w, zero).mean()
                for w in wins
            ]
        )

    L, H = TINY["n_layers"], TINY["n_heads"]
    heads = np.array([[nll_increase({(i, j)}) for j in range(H)] for i in range(L)])
    layers = np.array([nll_increase({(i, j) for j in range(H)}) for i in range(L)])
    np.testing.assert_allclose(d.stats.array("head_importance"), heads, atol=2e-5)
    np.testing.assert_allclose(d.stats.array("layer_importance"), layers, atol=2e-5)
    assert np.abs(heads).max() > 1e-3  # ablations that matter, not zeros on both sides
    assert d.provenance["head_importance_samples"] == 2


def test_act_scales_again_keeps_the_independent_steps(smollm):
    """Re-running act-scales starts its statistics over and drops what depended on them
    (outliers), but keeps what no step depending on it wrote (qk-scales)."""
    from socllm.calibration import calibrate_act_scales

    small = {"samples": 1, "seqlen": 32}
    data = run_steps(smollm, "act-scales,outliers,qk-scales", progress=False, **small)
    q = data.stats.array("q_absmax").copy()
    again = calibrate_act_scales(smollm, data, samples=2, seqlen=32, seed=9, progress=False)
    assert again.provenance["steps"] == "qk-scales,act-scales" and again.tokens == 64
    np.testing.assert_array_equal(again.stats.array("q_absmax"), q)
    assert again.stats.array("outlier_threshold", "attn_in") is None
    assert "outlier_method" not in again.provenance
    assert again.provenance["qk_scales_samples"] == 1


def test_head_masked_logprobs_is_the_numpy_ablation(tmp_path):
    """LanguageModel.head_masked_logprobs (the exact step's kernel, public): mask rows of ones
    and with zeros equal tiny_model's float64 numpy forward with those heads zeroed; a layer
    outside the model is refused by name."""
    from tiny_model import TINY, numpy_logprobs, tiny_weights, write_tiny

    ws = tiny_weights(TINY, np.random.default_rng(0))
    m = socllm.load(write_tiny(tmp_path / "tiny.h5", weights=ws), progress=False)
    H, ids = TINY["n_heads"], list(range(3, 23))
    masks = np.ones((3, H), np.float32)
    masks[1, 2] = 0
    masks[2, :] = 0
    got = m.head_masked_logprobs(ids, 1, masks)
    assert got.shape == (3, len(ids) - 1)
    for row, zero in zip(got, [set(), {(1, 2)}, {(1, j) for j in range(H)}], strict=True):
        np.testing.assert_allclose(row, numpy_logprobs(TINY, ws, ids, zero), atol=1e-5)
    with pytest.raises(socllm.InvalidArgumentError, match="layer 9"):
        m.head_masked_logprobs(ids, 9, masks)


def _kl_by_hand(ref: np.ndarray, got: np.ndarray) -> float:
    """Mean over rows of KL(softmax(ref) || softmax(got)), float64."""
    a = ref.astype(np.float64) - ref.max(1, keepdims=True)
    b = got.astype(np.float64) - got.max(1, keepdims=True)
    la = a - np.log(np.exp(a).sum(1, keepdims=True))
    lb = b - np.log(np.exp(b).sum(1, keepdims=True))
    return float((np.exp(la) * (la - lb)).sum(1).mean())


def test_attention_clamp_step_keeps_the_closest_clamp(tmp_path):
    """Step attention-clamp (issue 40 item 4) on a tiny model: each candidate's KL from fp32,
    recomputed here from the engine's logits under the plan with that clamp, on the last
    validation tokens of the calibration slice; the step keeps the lowest. Clamp 0.5 pins every
    product to the median, so it is exactly the uniform-ratio plan."""
    from socllm.calibration import calibration_split, corpus_tokens
    from tiny_model import TINY, tiny_weights, write_tiny

    ws = tiny_weights(TINY, np.random.default_rng(0))
    m = socllm.load(write_tiny(tmp_path / "tiny.h5", weights=ws), progress=False)
    base = "fp32:attention=shadow-attn:keep=0.3"
    d = run_steps(
        m, "head-importance,qk-scales,attention-clamp", progress=False, samples=2, seqlen=32,
        importance_samples=2, importance_seqlen=32, clamp_candidates="0.5,0.75,1.0",
        clamp_plan=base, clamp_validation_tokens=96, clamp_validation_context=48,
    )  # fmt: skip
    val = json.loads(d.provenance["auto_clamp_validation"])
    toks = corpus_tokens(m)
    end = calibration_split(len(toks))
    wins = [toks[end - 96 : end - 48], toks[end - 48 : end]]
    assert val["windows"] == 2 and val["tokens"] == 96 and val["plan"] == base
    m.set_calibration(d.stats)
    by_hand = {}
    for q in (0.5, 0.75, 1.0):
        kls = [
            _kl_by_hand(m.logits(w, "fp32")[:-1], m.logits(w, f"{base},clamp_quantile={q}")[:-1])
            for w in wins
        ]
        by_hand[q] = float(np.mean(kls))
    tried = {t["clamp_quantile"]: t for t in val["tried"]}
    for q, kl in by_hand.items():
        assert tried[q]["kl"] == pytest.approx(kl, rel=1e-6, abs=1e-12)
    assert d.provenance["auto_clamp_quantile"] == min(by_hand, key=by_hand.get)
    assert len(set(round(v, 9) for v in by_hand.values())) > 1  # the clamp changes the plan
    uniform = np.mean(
        [
            _kl_by_hand(m.logits(w, "fp32")[:-1], m.logits(w, f"{base},ratios=uniform")[:-1])
            for w in wins
        ]
    )
    assert by_hand[0.5] == pytest.approx(uniform, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("clamp_candidates", "0.4,0.9", '"0.4,0.9"'),
        ("clamp_candidates", "0.9,x", '"0.9,x"'),
        ("clamp_candidates", "0.5,0.9,", '"0.5,0.9,"'),
        ("clamp_candidates", "0x1p-1", '"0x1p-1"'),
        ("clamp_plan", '{"name": "fp32"}', "clamp_plan"),
        ("clamp_plan", "no-such-plan", "no-such-plan"),
        ("clamp_plan", "fp32:attention=shadow-attn:clamp_quantile=0.6", "clamp_plan"),
        ("clamp_plan", "fp32:attention=shadow-attn:ratios=uniform", "calibrated per-head"),
    ],
)
def test_attention_clamp_refuses_bad_options(smollm, option, value, says):
    with pytest.raises(socllm.InvalidArgumentError, match=says):
        run_steps(smollm, "attention-clamp", progress=False, **{option: value})
