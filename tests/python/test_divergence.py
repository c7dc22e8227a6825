"""socllm.eval.divergence (``socllm eval --metrics kl,top1,ppl``): the per-window sums against
torch's own KL and cross-entropy, the summary against hand computations, and the engine path on
the real model (fp32 against itself is exactly zero; a quantized plan against logits computed
here)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import socllm

pytest.importorskip("socllm")

from socllm.cli import main as cli_main
from socllm.errors import InvalidArgumentError
from socllm.eval import divergence as dv


def _torch_reference(ref, logits, targets):
    """(sum KL(ref || plan), sum NLL ref, sum NLL plan, top-1 matches) with torch in float64."""
    torch = pytest.importorskip("torch")
    f = torch.nn.functional
    r = torch.from_numpy(ref.astype(np.float64))
    p = torch.from_numpy(logits.astype(np.float64))
    t = torch.from_numpy(targets)
    lr, lp = f.log_softmax(r, -1), f.log_softmax(p, -1)
    kl = f.kl_div(lp, lr, log_target=True, reduction="sum").item()
    nll_ref = f.cross_entropy(r, t, reduction="sum").item()
    nll = f.cross_entropy(p, t, reduction="sum").item()
    top1 = (r.argmax(-1) == p.argmax(-1)).sum().item()
    return kl, nll_ref, nll, top1


def test_window_stats_match_torch_over_row_blocks():
    rng = np.random.default_rng(3)
    n, vocab = dv.ROW_BLOCK * 2 + 7, 300  # three row blocks, the last partial
    ref = (rng.standard_normal((n, vocab)) * 4).astype(np.float32)
    logits = ref + rng.standard_normal((n, vocab)).astype(np.float32) * 0.5
    targets = rng.integers(0, vocab, n)
    s = dv.window_stats(ref, logits, targets)
    kl, nll_ref, nll, top1 = _torch_reference(ref, logits, targets)
    assert s["n"] == n
    assert s["kl"] == pytest.approx(kl, rel=1e-9)
    assert s["nll_ref"] == pytest.approx(nll_ref, rel=1e-9)
    assert s["nll"] == pytest.approx(nll, rel=1e-9)
    assert s["top1"] == top1
    same = dv.window_stats(ref, ref, targets)
    assert same["kl"] == 0.0 and same["top1"] == n and same["nll"] == same["nll_ref"]


def test_window_stats_rejects_bad_input():
    a = np.zeros((4, 5), np.float32)
    t = np.zeros(4, np.int64)
    with pytest.raises(InvalidArgumentError, match=r"\(3, 5\)"):
        dv.window_stats(a, a[:3], t)
    with pytest.raises(InvalidArgumentError, match="3 targets"):
        dv.window_stats(a, a, t[:3])
    bad = a.copy()
    bad[1, 2] = np.nan
    with pytest.raises(InvalidArgumentError, match="plan's logits are not all finite"):
        dv.window_stats(a, bad, t)
    with pytest.raises(InvalidArgumentError, match="reference's logits"):
        dv.window_stats(bad, a, t)


def test_summarize_by_hand():
    # two windows: per-token KL 0.1 and 0.3, top-1 0.5 and 1.0, NLL differences 0.2 and 0.4
    w = [
        {"kl": 0.2, "top1": 1, "nll_ref": 2.0, "nll": 2.4, "n": 2},
        {"kl": 1.2, "top1": 4, "nll_ref": 8.0, "nll": 9.6, "n": 4},
    ]
    s = dv.summarize(w)
    assert s["kl"]["value"] == pytest.approx(0.2)
    assert s["kl"]["se"] == pytest.approx(math.sqrt(0.02) / math.sqrt(2))  # sd of {0.1, 0.3}
    assert s["top1"]["value"] == pytest.approx(0.75)
    # ppl over all tokens: exp(12/6) vs exp(10/6); the ratio's error from the per-window
    # differences {0.2, 0.4} (sd 0.1414, se 0.1) through the delta method
    assert s["ppl"] == pytest.approx(math.exp(2.0))
    assert s["ppl_ref"] == pytest.approx(math.exp(10 / 6))
    ratio = math.exp(2.0 - 10 / 6)
    assert s["ppl_ratio"]["value"] == pytest.approx(ratio)
    assert s["ppl_ratio"]["se"] == pytest.approx(ratio * 0.1)
    assert s["ppl_ratio"]["ci95"] == pytest.approx(
        [math.exp(0.3 - dv.Z95 * 0.1), math.exp(0.3 + dv.Z95 * 0.1)]
    )
    assert s["n_scored"] == 6 and s["n_windows"] == 2
    with pytest.raises(InvalidArgumentError, match="no windows"):
        dv.summarize([])


def test_parse_metrics():
    assert dv.parse_metrics("ppl, kl,kl") == ["ppl", "kl"]
    with pytest.raises(InvalidArgumentError, match="'entropy'"):
        dv.parse_metrics("kl,entropy")
    with pytest.raises(InvalidArgumentError, match="none given"):
        dv.parse_metrics(" , ")


def test_heldout_windows_are_disjoint_and_after_calibration(smollm):
    from socllm.calibration import calibration_split, corpus_tokens

    ids = corpus_tokens(smollm)
    wins = dv.heldout_windows(smollm, context=64, windows=3)
    start = calibration_split(len(ids))
    assert wins == [ids[start + 64 * i : start + 64 * (i + 1)] for i in range(3)]
    with pytest.raises(InvalidArgumentError, match="context 1 "):
        dv.heldout_windows(smollm, context=1)
    with pytest.raises(InvalidArgumentError, match="windows must be >= 1, got 0"):
        dv.heldout_windows(smollm, windows=0)
    with pytest.raises(InvalidArgumentError, match="100000 windows"):
        dv.heldout_windows(smollm, context=512, windows=100_000)


def test_compare_plans_on_the_engine(smollm):
    r = dv.compare_plans(smollm, ["fp32", "w8-group"], context=96, windows=2)
    assert r["fp32"]["kl"]["value"] == 0.0 and r["fp32"]["top1"]["value"] == 1.0
    assert r["fp32"]["ppl_ratio"]["value"] == 1.0
    q = r["w8-group"]
    assert 0 < q["kl"]["value"] < 0.05 and 0.8 < q["top1"]["value"] < 1.0
    # the same numbers from the engine's logits, summed here
    rows = []
    for ids in dv.heldout_windows(smollm, context=96, windows=2):
        ref = smollm.logits(ids, "fp32")[:-1]
        got = smollm.logits(ids, "w8-group")[:-1]
        rows.append(_torch_reference(ref, got, np.asarray(ids[1:])))
    assert [w["kl"] for w in q["windows"]] == pytest.approx([x[0] for x in rows], rel=1e-6)
    nll_ref, nll = sum(x[1] for x in rows), sum(x[2] for x in rows)
    assert q["ppl_ratio"]["value"] == pytest.approx(math.exp((nll - nll_ref) / 190), rel=1e-6)
    assert q["n_scored"] == 190


def test_cli_eval_metrics_json(tmp_path, smollm):
    out = tmp_path / "m.json"
    argv = ["eval", "--model", str(smollm.path), "--metrics", "kl,top1", "--plan", "fp32,w8-group"]
    argv += ["--context", "64", "--windows", "1", "--json", str(out), "--quiet"]
    assert cli_main(argv) == 0
    rows = {r["plan"]: r for r in json.loads(out.read_text())["results"]}
    assert rows.keys() == {"fp32", "w8-group"} and rows["w8-group"]["n_scored"] == 63
    assert rows["w8-group"]["kl"]["value"] > 0
    assert cli_main(["eval", "--model", str(smollm.path), "--metrics", "kl,bogus", "--quiet"]) == 2


def test_accuracy_and_simulated_time_of_the_same_run(smollm):
    """With a device, a plan's first window is scored from the engine run whose task graph is
    timed (prompt then decoding steps): its accuracy is what the plain path gives, and its time
    is that run's graph on the device."""
    plans = ["fp32", "w8-group:decode=same"]
    timed = dv.compare_plans(
        smollm, plans, context=64, windows=1, device="snapdragon-8gen3", decode_tokens=2
    )
    plain = dv.compare_plans(smollm, plans, context=64, windows=1)
    for p in plans:
        assert timed[p]["kl"]["value"] == pytest.approx(plain[p]["kl"]["value"], abs=1e-9)
        t = timed[p]["simulated"]
        assert t["prompt_len"] == 64 and t["decode_tokens"] == 2 and t["tpot_ms"] > 0
    ids = dv.heldout_windows(smollm, context=64, windows=1)[0]
    direct = socllm.sim.simulate_model(
        smollm, ids, "snapdragon-8gen3", "w8-group:decode=same", chunk=None, decode_tokens=2
    ).summary()
    assert timed["w8-group:decode=same"]["simulated"]["prefill_ms"] == pytest.approx(
        direct["prefill_ms"]
    )
    with pytest.raises(InvalidArgumentError, match="give a device"):
        dv.compare_plans(smollm, plans, context=64, windows=1, decode_tokens=2)
    argv = ["eval", "--model", str(smollm.path), "--device", "snapdragon-8gen3", "--quiet"]
    assert cli_main(argv) == 2  # --device without --metrics
    argv = ["eval", "--model", str(smollm.path), "--metrics", "kl", "--policy", "in-order"]
    assert cli_main([*argv, "--quiet"]) == 2  # --policy without --device
    # the timing's policy is the one asked for
    in_order = dv.compare_plans(
        smollm, plans[1:], context=64, windows=1, device="snapdragon-8gen3", policy="in-order"
    )["w8-group:decode=same"]["simulated"]
    direct = socllm.sim.simulate_model(
        smollm, ids, "snapdragon-8gen3", "w8-group:decode=same", chunk=None, policy="in-order"
    ).summary()
    assert in_order["prefill_ms"] == pytest.approx(direct["prefill_ms"])
