"""Plan ``edgeflow`` on the real model (seed 004 §4.1): the folded smoothing is the fp32
identity, the allocation spends the budget per tensor, the static output quantization puts
every output on its grid, the calibration steps and their bad input."""

from __future__ import annotations

import heapq
import json

import numpy as np
import pytest
import socllm
from socllm.calibration import (
    SMOOTHING_GRID,
    calibration_windows,
    corpus_tokens,
    held_out_tokens,
    load_calibration,
    run_steps,
    save_calibration,
    using_calibration,
)
from socllm.io.model_format import linear_weights, site_tensors

SMALL = {"samples": 4, "seqlen": 128, "seed": 3}
SITES = [op["site"] for op in socllm.decoder_block() if op["site"] is not None]
STEP_SMALL = {"smoothing_windows": 2, "smoothing_rows": 32}


@pytest.fixture(scope="module")
def calib(smollm):
    data = run_steps(
        smollm, "act-scales,smoothing,bitwidths", progress=False, **SMALL, **STEP_SMALL
    )
    with using_calibration(smollm, data.stats):
        yield data


@pytest.fixture(scope="module")
def tokens(smollm):
    return held_out_tokens(corpus_tokens(smollm))[:160]


def _custom_fp32(fold: bool) -> dict:
    return {
        "name": "custom",
        "ops": {
            "linear": {
                "weights": {"format": "fp32"},
                "activations": "fp32",
                "npu_smoothing": {"alpha": "calibrated", "beta": 1.0, "fold": fold},
            }
        },
    }


def test_folded_smoothing_is_the_fp32_identity(smollm, calib, tokens):
    """Input divisors folded into the norms and the v/up rows (GQA-tied for o_proj), output
    factors into the dequantization: in fp32 the model computes what it computed before."""
    ref = smollm.logits(tokens)
    scale = np.abs(ref).max()
    for fold in (True, False):
        lg = smollm.logits(tokens, _custom_fp32(fold))
        np.testing.assert_allclose(lg, ref, rtol=0, atol=2e-5 * scale)


def test_allocation_spends_each_tensors_budget(smollm, calib):
    cfg = smollm.config
    for bits, method in [(5.0, "greedy"), (4.5, "greedy"), (5.0, "cmpq"), (6.0, "int4-int8")]:
        plan = f"edgeflow:bits={bits},allocation={method}"
        for layer in (0, 17):
            for site, names in site_tensors(cfg).items():
                info = smollm.linear_info(plan, layer, site)
                b = info["bits"].astype(int)
                rows = {
                    "wq": cfg["n_heads"] * cfg["head_dim"],
                    "wk": cfg["n_kv_heads"] * cfg["head_dim"],
                    "wv": cfg["n_kv_heads"] * cfg["head_dim"],
                    "w_gate": cfg["d_ff"],
                    "w_up": cfg["d_ff"],
                    "wo": cfg["d_model"],
                    "w_down": cfg["d_model"],
                }
                start = 0
                for n in names:
                    part = b[start : start + rows[n]]
                    start += rows[n]
                    assert part.sum() == int(np.floor(rows[n] * bits + 1e-9)), (plan, n)
                    if method == "int4-int8":
                        assert set(part.tolist()) <= {4, 8}
                assert start == len(b)
                # stored bits: data, a 32-bit scale and the bit-width metadata per row
                meta = {"greedy": 3, "cmpq": 3, "int4-int8": 1}[method]
                width = info["weight_bytes"] * 8 / info["bits_per_weight"] / len(b)
                want = (b.sum() * width + len(b) * meta + 7) // 8 + 4 * len(b)
                assert info["weight_bytes"] == want


def _algorithm1(W: np.ndarray, avg_bits: float) -> np.ndarray:
    """Algorithm 1 of seed 004 by hand: every row starts at 1 bit, each further bit goes to the
    row whose closed-form error 2^-2B max|w|^2 / E[w^2] drops most (ties: lower row)."""
    W = W.astype(np.float64)
    c = (np.abs(W).max(1) ** 2) / np.maximum((W * W).mean(1), 1e-300)
    bits = np.ones(len(W), np.int64)
    heap = [(-c[i] * (4.0**-1 - 4.0**-2), i) for i in range(len(W)) if c[i] > 0]
    heapq.heapify(heap)
    for _ in range(int(np.floor(len(W) * avg_bits)) - len(W)):
        _, i = heapq.heappop(heap)
        bits[i] += 1
        if bits[i] < 8:
            heapq.heappush(heap, (-c[i] * (4.0 ** -bits[i] - 4.0 ** -(bits[i] + 1)), i))
    return bits


def test_per_tensor_bits_are_algorithm_1(smollm, calib, tokens):
    """The plan allocates each tensor's bits itself (the per-tensor step stores none): Algorithm
    1 computed by hand on the smoothed weights of three tensors gives the plan's bits."""
    assert all(calib.stats.array("channel_bits", site) is None for site in SITES)
    weights = linear_weights(smollm.path, smollm.config)
    fused = site_tensors(smollm.config)  # the tensors of a site's linear, in row order
    for layer, site, tensor in (
        (0, "attn_in", "wk"),
        (13, "mlp_in", "w_up"),
        (29, "mlp_act", "w_down"),
    ):
        info = smollm.linear_info("edgeflow", layer, site)
        W = weights[(layer, tensor)] * np.asarray(info["input_smoothing"])[None, :]
        start = sum(len(weights[(layer, t)]) for t in fused[site][: fused[site].index(tensor)])
        np.testing.assert_array_equal(info["bits"][start : start + len(W)], _algorithm1(W, 5.0))


def test_output_quantization_puts_outputs_on_the_calibrated_grid(smollm, calib, tokens):
    """output_quant=int8 with beta = 1: each smoothed output channel spans [-1, 1], so one
    per-tensor scale of 1/127 and y_c = q * out_absmax_c / 127 with integer q in [-127, 127]."""
    x = smollm.linear_inputs(tokens[:64], list(range(64)))[3]["attn_out"]
    y = smollm.linear_forward("edgeflow:output_quant=int8", 3, "attn_out", x)
    amax = calib.stats.array("out_absmax", "attn_out")[3]
    q = y * 127.0 / amax[None, :]
    np.testing.assert_allclose(q, np.round(q), atol=2e-3)
    assert np.abs(np.round(q)).max() <= 127
    y16 = smollm.linear_forward("edgeflow:output_quant=int16", 3, "attn_out", x)
    y0 = smollm.linear_forward("edgeflow:output_quant=none", 3, "attn_out", x)
    inside = np.abs(np.round(q)) < 127  # saturated outputs are clipped on both grids
    assert inside.mean() > 0.99
    # int16's grid is 258x finer than int8's
    assert np.abs(y16 - y0)[inside].mean() < np.abs(y - y0)[inside].mean() / 50


def test_smoothing_errors_recomputed_by_hand(smollm, calib):
    """The C++ grid search's errors, recomputed one linear at a time from Python on the rows the
    step samples (the first smoothing_windows act-scales windows, smoothing_rows rows of each
    drawn by default_rng(seed)): ||Y_q(a) - Y||^2 / ||Y||^2 at every grid point."""
    p = calib.provenance
    wins = calibration_windows(corpus_tokens(smollm), p["samples"], p["seqlen"], p["seed"])
    rng = np.random.default_rng(p["seed"])
    picks = []
    for w in wins[: STEP_SMALL["smoothing_windows"]]:
        picks.append((w, np.sort(rng.choice(len(w), STEP_SMALL["smoothing_rows"], replace=False))))
    for layer, site in ((4, "mlp_act"), (17, "attn_in")):
        x = np.concatenate([smollm.linear_inputs(w, r.tolist())[layer][site] for w, r in picks])
        y = smollm.linear_forward("fp32", layer, site, x).astype(np.float64)
        plan = "edgeflow:bits=5.0,output_quant=int8,alpha=0"
        err = [
            ((smollm.linear_forward(plan, layer, site, x, alpha=float(a)) - y) ** 2).sum()
            / (y * y).sum()
            for a in SMOOTHING_GRID
        ]
        stored = calib.stats.array("smooth_alpha_error", site)[layer]
        np.testing.assert_allclose(stored, err, rtol=1e-5)
        best = SMOOTHING_GRID[np.argmin(err)]
        assert calib.stats.array("smooth_alpha", site)[layer] == np.float32(best)
    assert json.loads(calib.provenance["smoothing_grid"]) == SMOOTHING_GRID.tolist()


def test_bitwidth_report(calib):
    rep = json.loads(calib.provenance["bitwidth_report"])
    assert rep["tensors"] == 30 * 7
    # the closed form ranks channels nearly as the exact cosine distance does
    assert rep["spearman_median"] > 0.9
    assert all(abs(r["mean_bits"] - 5.0) < 0.01 for r in rep["per_tensor"])


def test_new_arrays_survive_a_file_round_trip(smollm, calib, tmp_path):
    path = save_calibration(tmp_path / "ef.h5", calib, smollm)
    back = load_calibration(path, smollm)
    for name in ("out_absmax", "smooth_alpha", "smooth_alpha_error", "channel_bits"):
        for site in SITES:
            np.testing.assert_array_equal(
                back.stats.array(name, site), calib.stats.array(name, site)
            )


def test_bad_input(smollm, calib):
    for bad in ("edgeflow:bits=0.5", "edgeflow:bits=9"):
        with pytest.raises(socllm.InvalidArgumentError, match="must be in \\[1, 8\\]"):
            socllm.Plan(bad)
    with pytest.raises(socllm.InvalidArgumentError, match="output_quant must be none, int8"):
        socllm.Plan("edgeflow:output_quant=int4")
    with pytest.raises(socllm.InvalidArgumentError, match="alpha must be a number"):
        socllm.Plan("edgeflow:alpha=auto")
    for bits in (1, 9, 2**32 + 5):  # no wrap-around into 2..8
        with pytest.raises(
            socllm.InvalidArgumentError, match=f"weight_bits must be in 2..8, got {bits}"
        ):
            socllm.Plan(f"shadow-outlier:weight_bits={bits}")
    with pytest.raises(socllm.InvalidArgumentError, match="integer average"):
        smollm.logits([1, 2, 3], "edgeflow:bits=4.5,allocation=uniform")
    with pytest.raises(socllm.InvalidArgumentError, match="'bits' must be in \\[1, 8\\], got 9"):
        run_steps(smollm, "bitwidths", data=calib, bits=9.0, progress=False)
    # A calibration without the smoothing step: the plan names the step to run.
    bare = run_steps(smollm, "act-scales", progress=False, **SMALL)
    with using_calibration(smollm, bare.stats):
        with pytest.raises(socllm.InvalidArgumentError, match="--steps act-scales,smoothing"):
            smollm.logits([1, 2, 3], "edgeflow")
        smollm.logits([1, 2, 3], "edgeflow:alpha=0.5")  # a fixed alpha needs no step
        # stored bit-widths that were never calibrated: whole plan and one linear alike
        stored = "edgeflow:alpha=0.5,bitwidths=stored"
        with pytest.raises(socllm.InvalidArgumentError, match="--steps ...,bitwidths"):
            smollm.logits([1, 2, 3], stored)
        with pytest.raises(socllm.InvalidArgumentError, match="prepare_linear.*stored bit-widths"):
            smollm.linear_info(stored, 0, "attn_in")
    with pytest.raises(socllm.InvalidArgumentError, match="needs 'smooth_alpha'"):
        run_steps(smollm, "bitwidths", data=bare, progress=False)
    # Statistics from before out_absmax existed: the plan says to recalibrate.
    old = smollm.new_calibration()
    old.set_array("act_absmax", "attn_in", bare.stats.array("act_absmax", "attn_in"))
    for site in SITES:
        old.set_array("act_absmax", site, bare.stats.array("act_absmax", site))
    with using_calibration(smollm, old):
        with pytest.raises(socllm.InvalidArgumentError, match="act-scales again"):
            smollm.logits([1, 2, 3], "edgeflow:alpha=0.5")


def test_global_ttft_allocation_spends_the_per_tensor_time(smollm, calib, tmp_path):
    """bit_scope global-ttft (issue 14 item 6): one heap over every channel of the model at the
    per-tensor allocation's modelled cold-start time; the plan runs its stored bits."""
    from socllm.devices import load_profile
    from socllm.sim import channel_cold_start_cost

    data = load_calibration(save_calibration(tmp_path / "g.h5", calib, smollm), smollm)
    run_steps(
        smollm,
        "bitwidths",
        data=data,
        progress=False,
        bits=5.0,
        bit_scope="global-ttft",
        **STEP_SMALL,
    )
    rep = json.loads(data.provenance["bitwidth_report"])["global_ttft"]
    assert rep["global_s"] <= rep["budget_s"] * (1 + 1e-12)
    assert rep["global_s"] > rep["budget_s"] * 0.999  # the budget is spent, not left over
    # the heap minimises the weighted error; the per-tensor allocation is one feasible point
    assert rep["global_weighted_error"] < rep["per_tensor_weighted_error"]
    assert abs(sum(rep["weight_share_by_bits"]["global"]) - 1) < 1e-9
    moved = 0
    for site in SITES:
        g = data.stats.array("channel_bits", site)
        moved += int((g[7] != smollm.linear_info("edgeflow", 7, site)["bits"]).sum())
        with using_calibration(smollm, data.stats):
            np.testing.assert_array_equal(
                g[7], smollm.linear_info("edgeflow:bitwidths=stored", 7, site)["bits"]
            )
    assert moved > 0
    # one entry of the cost table by hand from the profile's numbers
    p = load_profile("snapdragon-8elite")
    flash = p["cost_model"]["memory"]["flash_gbps"]["value"] * 1e9
    rate = p["cost_model"]["cpu"]["unpack_weightlet_gweights_s"]["value"] * 1e9
    rel5 = p["processors"]["cpu_all"]["unpack_weightlet_relative_time_by_bits"]["value"][4]
    table, _ = channel_cold_start_cost("snapdragon-8elite", [1536])
    want = 1536 * (5 / 8) / flash + 1536 * rel5 / rate + (4 + 3 / 8) / flash
    assert table[0, 4] == pytest.approx(want, rel=1e-12)
    with pytest.raises(socllm.InvalidArgumentError, match="'bit_scope' must be one of"):
        run_steps(smollm, "bitwidths", data=data, progress=False, bit_scope="model")
    with pytest.raises(socllm.InvalidArgumentError, match="'bit_importance' must be one of"):
        run_steps(
            smollm,
            "bitwidths",
            data=data,
            progress=False,
            bit_scope="global-ttft",
            bit_importance="fisher",
        )
    with pytest.raises(socllm.InvalidArgumentError, match="pixel-9"):
        run_steps(
            smollm,
            "bitwidths",
            data=data,
            progress=False,
            bit_scope="global-ttft",
            cost_device="pixel-9",
        )
    with pytest.raises(socllm.InvalidArgumentError, match="snapdragon-8gen3.* has no"):
        channel_cold_start_cost("snapdragon-8gen3", [8])
    # Issue 37: options only the global heap reads were silently ignored per tensor.
    for option in ({"cost_device": "snapdragon-8gen3"}, {"bit_importance": "none"}):
        (key,) = option
        with pytest.raises(socllm.InvalidArgumentError, match=f"{key}=.*applies with bit_scope"):
            run_steps(smollm, "bitwidths", data=data, progress=False, **option)


def _linear_weight_bytes(model, plan: str) -> int:
    graph = model.task_graph(plan, 64).to_json()
    return sum(
        o["weight_bytes"] for t in graph["tasks"] for o in t["ops"] if o["op_class"] == "linear"
    )


def test_stored_bitwidths_decide_the_timing_and_bits_is_refused(smollm, calib, tmp_path):
    """Issue 37: under bitwidths=stored, `bits` used to be accepted and ignored by the numerics
    while the timing modelled the weights at it; now the calibration's widths set both, and a
    `bits` off its default is refused by name."""
    four = load_calibration(save_calibration(tmp_path / "c.h5", calib, smollm), smollm).stats
    layers = smollm.config["n_layers"]
    for site in SITES:
        rows = len(smollm.linear_info("edgeflow:alpha=0.5", 0, site)["bits"])
        four.set_array("channel_bits", site, np.full((layers, rows), 4, np.int64))
    with using_calibration(smollm, four):
        stored = _linear_weight_bytes(smollm, "edgeflow:alpha=0.5,bitwidths=stored")
        at4 = _linear_weight_bytes(smollm, "edgeflow:alpha=0.5,bits=4")
        at5 = _linear_weight_bytes(smollm, "edgeflow:alpha=0.5,bits=5")
    assert stored == at4 < at5
    with pytest.raises(socllm.InvalidArgumentError, match="bits=3 does not apply"):
        socllm.Plan("edgeflow:bitwidths=stored,bits=3")
    with pytest.raises(socllm.InvalidArgumentError, match="shape-only config has none"):
        socllm.simulate("qwen2-0.5b", plan="edgeflow:bitwidths=stored", prompt_len=64)
