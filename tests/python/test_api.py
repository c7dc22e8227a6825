"""The public Python API: the documented names exist, arrays have the documented dtype and
layout, and every user-settable parameter changes the result it should."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import socllm


def test_config_is_a_read_only_mapping(smollm):
    c = smollm.config
    assert c["arch"] == "llama" and c["n_layers"] == 30 and c["d_model"] == 576
    assert c["n_heads"] == 9 and c["n_kv_heads"] == 3 and c["vocab_size"] == 49152
    assert c["rope_theta"] == 100000.0 and c["tie_embeddings"] is True
    with pytest.raises(TypeError):
        c["d_model"] = 1


def test_tokenize_detokenize_round_trip(smollm):
    text = "Hello world!\n  Numbers: 12345, émoji 🙂."
    ids = smollm.tokenize(text)
    assert all(isinstance(i, int) for i in ids)
    assert smollm.detokenize(ids) == text
    assert smollm.tokenize("") == []


def test_file_tokenizer_is_the_models_without_its_weights(smollm, tmp_path):
    from socllm.model import FileTokenizer

    tok = FileTokenizer(smollm.path)
    text = "The cold start reads 5-bit weightlets, then prefills."
    assert tok.tokenize(text) == smollm.tokenize(text)
    with pytest.raises(socllm.InvalidArgumentError, match="expects a str"):
        tok.tokenize(b"bytes")
    bad = tmp_path / "no_tokenizer.h5"
    import h5py

    with h5py.File(bad, "w") as f:
        f.attrs["format"] = "socllm"
    with pytest.raises(socllm.FormatError, match="has no tokenizer"):
        FileTokenizer(bad)


def test_logits_array_contract(smollm):
    ids = smollm.tokenize("The capital of France is")
    lg = smollm.logits(ids)
    assert lg.dtype == np.float32 and lg.shape == (len(ids), 49152)
    assert lg.flags["C_CONTIGUOUS"] and lg.flags["OWNDATA"] is False  # owned by a C++ capsule
    assert lg.base is not None
    # numpy int arrays and tuples are accepted as ids, with the same result
    np.testing.assert_array_equal(smollm.logits(np.array(ids, dtype=np.int64)), lg)
    np.testing.assert_array_equal(smollm.logits(tuple(ids)), lg)
    assert smollm.detokenize([int(lg[-1].argmax())]) == " Paris"


def test_generate_parameters_change_the_result(smollm):
    p = "Once upon a time"
    greedy = smollm.generate_ids(p, max_new_tokens=12)
    assert greedy == smollm.generate_ids(p, max_new_tokens=12)  # deterministic
    assert len(smollm.generate_ids(p, max_new_tokens=5)) == 5
    assert smollm.generate_ids(p, max_new_tokens=5) == greedy[:5]
    s1 = smollm.generate_ids(p, max_new_tokens=12, temperature=1.5, seed=1)
    assert s1 == smollm.generate_ids(p, max_new_tokens=12, temperature=1.5, seed=1)
    assert s1 != smollm.generate_ids(p, max_new_tokens=12, temperature=1.5, seed=2)
    assert s1 != greedy
    # top_k=1 sampling is greedy whatever the temperature and seed
    assert smollm.generate_ids(p, max_new_tokens=12, temperature=2.0, top_k=1, seed=3) == greedy
    assert smollm.generate(p, max_new_tokens=12) == smollm.detokenize(greedy)


def test_generate_stops_at_eos(smollm):
    eos = smollm.config["eos_id"]
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    out = smollm.generate_ids(chat, max_new_tokens=64)
    assert out[-1] == eos and eos not in out[:-1]
    longer = smollm.generate_ids(chat, max_new_tokens=64, stop_at_eos=False)
    assert len(longer) == 64 and longer[: len(out)] == out


def test_perplexity_parameters(smollm, wikitext_text):
    text = wikitext_text[:3000]
    base = smollm.perplexity_eval(text, context=256)
    assert base.n_windows == -(-base.n_tokens // 256) >= 3
    assert base.n_scored == base.n_tokens - base.n_windows  # each window's first token unscored
    assert np.isclose(np.exp(base.token_nll.mean()), base.perplexity)
    assert smollm.perplexity(text, context=256) == pytest.approx(base.perplexity, rel=1e-9)
    # more context per prediction: overlapping windows score every token but the first
    strided = smollm.perplexity_eval(text, context=256, stride=128)
    assert strided.n_scored == base.n_tokens - 1
    assert strided.perplexity < base.perplexity
    short = smollm.perplexity_eval(text, context=256, limit_tokens=350)
    assert short.n_tokens == 350 and short.perplexity != base.perplexity
    assert smollm.perplexity(text, context=128) != base.perplexity
    batched = smollm.perplexity_eval(text, context=256, batch_size=3)
    np.testing.assert_allclose(batched.token_nll, base.token_nll, rtol=0, atol=1e-4)


def test_plans_are_named_and_described():
    assert "fp32" in socllm.Plan.known()
    assert "reference" in socllm.Plan.describe("fp32")
    assert socllm.Plan("fp32").name == "fp32"
    j = socllm.Plan({"name": "fp32"}).to_json()
    assert j["name"] == "fp32" and j["chunk_len"] == 0
    assert j["ops"]["linear"]["weights"] == {"format": "fp32"}
    assert j["ops"]["attention"] == {"processor": "cpu", "format": "fp32"}


def test_log_level_round_trip():
    before = socllm.log_level()
    try:
        socllm.set_log_level("error")
        assert socllm.log_level() == "error"
    finally:
        socllm.set_log_level(before)


def _cli(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "socllm.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cli_eval_json(smollm):
    r = _cli(
        "eval",
        "--model",
        "smollm2-135m",
        "--plan",
        "fp32",
        "--task",
        "wikitext2",
        "--limit-tokens",
        "600",
        "--context",
        "300",
        "--json",
        "-",
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    assert res["plan"] == "fp32" and res["n_tokens"] == 600 and res["n_windows"] == 2
    from socllm.data import wikitext2_test_text

    direct = smollm.perplexity(wikitext2_test_text(), context=300, limit_tokens=600)
    assert res["perplexity"] == pytest.approx(direct, rel=1e-6)


def test_cli_run_writes_report(tmp_path):
    out = tmp_path / "report"
    from socllm.plan_files import write_plan

    extra = write_plan(tmp_path / "rec.json", "smoothquant:alpha=0.6,chunk_len=128")
    r = _cli(
        "run", "--out", str(out), "--limit-tokens", "128", "--calib-samples", "2", "--quiet",
        "--plan", f"@{extra}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["generation"]["new_tokens"] > 0 and rep["generation"]["text"]
    # the presets and the plan file given, under its file name (issue 41: a recommended plan)
    assert {e["plan"] for e in rep["wikitext2"]} == {*socllm.Plan.known(), "rec.json"}
    rec = next(e for e in rep["wikitext2"] if e["plan"] == "rec.json")
    assert (
        socllm.Plan(rec["plan_spec"]).to_json()
        == socllm.Plan("smoothquant:alpha=0.6,chunk_len=128").to_json()
    )
    sq = next(e for e in rep["wikitext2"] if e["plan"] == "smoothquant")
    assert rec["perplexity"] != sq["perplexity"]  # alpha 0.6, not the preset's 0.5
    assert 5 < rep["wikitext2"][0]["perplexity"] < 100
    assert (out / "token_loss.png").stat().st_size > 1000
    assert "WikiText-2 perplexity" in (out / "report.md").read_text()
    # the machine (CPU, BLAS kernels; issue 38): first on the console, in both reports
    from socllm.eval.bench_utils import machine_line

    assert rep["machine"]["description"] == machine_line() == r.stdout.splitlines()[0]
    assert f"Machine: {machine_line()};" in (out / "report.md").read_text()
    assert rep["calibration"]["samples"] == 2 and (out / "calib.h5").exists()
    # the engine's chunked prefill timed on the SoC model, one run per policy
    runs = {s["policy"]: s for s in rep["timeline"]["runs"]}
    assert set(runs) == {"in-order", "first-ready", "npu-stall-first"}
    assert runs["npu-stall-first"]["busy_ms"] == pytest.approx(runs["in-order"]["busy_ms"])
    assert (out / "timeline.png").stat().st_size > 1000
    assert json.loads((out / "timeline_trace.json").read_text())["traceEvents"]
    # the presets side by side (issue 41 item 6): ΔNLL from the table, TTFT of each engine run
    front = {p["plan"]: p for p in rep["frontier"]["plans"]}
    assert set(front) == {*socllm.Plan.known(), "rec.json"}
    table = {e["plan"]: e for e in rep["wikitext2"]}
    for name, p in front.items():
        assert p["dnll"] == table[name]["delta_nll"] and p["ttft_ms"] > 0
    fastest = min(front.values(), key=lambda p: p["ttft_ms"])
    assert front["fp32"]["frontier"] and fastest["frontier"]
    assert front["fp32"]["ttft_ms"] > fastest["ttft_ms"]  # fp32 on the phone's CPU
    assert (out / "frontier.png").stat().st_size > 10_000
    assert "Which preset to ship" in (out / "report.md").read_text()


def test_cli_convert(tmp_path):
    from socllm.registry import BUILTIN_MODELS

    dst = tmp_path / "m.h5"
    r = _cli("convert", str(BUILTIN_MODELS["smollm2-135m"].path()), "-o", str(dst), "--quiet")
    assert r.returncode == 0, r.stderr
    import h5py

    with h5py.File(dst) as f:
        assert f.attrs["format"] == "socllm-model"
        assert f["weights/embed_tokens"].shape == (49152, 576)


def test_cli_calibrate_then_eval_static_plan_and_lmeval_task(tmp_path):
    cal = tmp_path / "c.h5"
    r = _cli(
        "calibrate", "--samples", "2", "--seqlen", "32", "--steps", "act-scales,outliers",
        "--out", str(cal), "--quiet",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    import h5py

    with h5py.File(cal) as f:
        assert (
            f.attrs["samples"] == 2
            and f.attrs["seed"] == 0
            and f["act_absmax/mlp_act"].shape
            == (
                30,
                1536,
            )
        )
        assert f.attrs["steps"] == "act-scales,outliers" and f.attrs["outlier_percentile"] == 99.99
        assert f["outlier_count/mlp_act"].shape == (30, 1536)
    args = ["eval", "--task", "wikitext2-heldout,piqa", "--limit-tokens", "300", "--limit", "2"]
    r = _cli(
        *args, "--context", "300", "--plan", "w8a8", "--calib", str(cal), "--json", "-", "--quiet"
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"]
    assert [x["task"] for x in res] == ["wikitext2-heldout", "piqa"]
    assert res[0]["plan"] == "w8a8" and res[0]["n_tokens"] == 300
    assert res[1]["n"] == 2 and 0 <= res[1]["acc"] <= 1
    r = _cli(*args, "--plan", "w8a8", "--quiet")  # no calibration: a clear error, exit code 2
    assert r.returncode == 2 and "none is loaded" in r.stderr
    r = _cli(*args, "--plan", "shadow-outlier", "--calib", str(cal), "--json", "-", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["perplexity"] > 1
    r = _cli("calibrate", "--steps", "head-importances", "--out", str(cal), "--quiet")
    assert r.returncode != 0 and "unknown step" in r.stderr and "head-importances" in r.stderr


def test_measure_handoff_binding():
    """The thread-handoff benchmark (handoff.h, scripts/bench_sync.py) from Python."""

    assert socllm.ops.wait_methods() == ["condvar", "futex", "spin", "sleep-poll"]
    r = socllm.ops.measure_handoff("sleep-poll", 20, 40.0, sleep_margin_us=20.0, warmup=1)
    assert {k: v.shape for k, v in r.items()} == {k: (20,) for k in r}
    assert (r["wait_us"] >= 40.0).all() and (r["latency_us"] >= 0).all()
    with pytest.raises(socllm.InvalidArgumentError, match="unknown wait method 'mutex'"):
        socllm.ops.measure_handoff("mutex")
    with pytest.raises(socllm.InvalidArgumentError, match="iterations must be >= 1, got 0"):
        socllm.ops.measure_handoff("spin", 0)
    with pytest.raises(socllm.InvalidArgumentError, match="work_us must be finite"):
        socllm.ops.measure_handoff("spin", 5, float("inf"))
