"""Plans, calibration, static graphs and chunked prefill (issue 3), against independent numpy
references of each quantization scheme."""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
import socllm
from socllm.calibration import (
    calibrate_act_scales,
    load_calibration,
)
from socllm.configs import graph_census
from tiny_model import seal

PRESETS = [
    "fp32",
    "w8a8",
    "w8a8-perchannel",
    "smoothquant",
    "llm-int8",
    "shadow-outlier",
    "edgeflow",
    "smoothquant-npu",
    "w8-group",
    "w4-group",
    "w4a16",
    # HeteroLLM's engines (seed 002 §5)
    "gpu-only",
    "npu-padding",
    "npu-pipe",
    "npu-online-prepare",
    "hetero-layer",
    "hetero-tensor",
]


@pytest.fixture(scope="module")
def calib_file(smollm, small_calibration):
    smollm.load_calibration(small_calibration)
    yield small_calibration
    smollm.set_calibration(None)


@pytest.fixture(scope="module")
def prompt(smollm, wikitext_text):
    return smollm.tokenize(wikitext_text[100000:120000])[:300]


# -- plans as data ---------------------------------------------------------------------------
def test_presets_round_trip_through_json():
    assert socllm.Plan.known() == PRESETS
    for name in PRESETS:
        p = socllm.Plan(name)
        j = p.to_json()
        assert j["name"] == name and set(j["ops"]) == set(socllm.Plan.op_classes())
        assert set(socllm.Plan.op_classes()) == {
            "norm",
            "linear",
            "rope",
            "attention",
            "activation",
            "residual",
            "shadow",
            "lm_head",
        }
        for entry in j["ops"].values():
            assert entry["processor"] in ("npu", "cpu", "gpu") and entry["format"]
        assert socllm.Plan(j).to_json() == j
        assert socllm.Plan.describe(name)
    sq = socllm.Plan("smoothquant:alpha=0.8,chunk_len=128").to_json()
    assert sq["alpha"] == 0.8 and sq["chunk_len"] == 128
    assert sq["ops"]["linear"]["smoothing_alpha"] == 0.8
    assert socllm.Plan("llm-int8").to_json()["ops"]["linear"]["outlier_threshold"] == 6.0
    assert socllm.Plan("w4-group").to_json()["ops"]["linear"]["weights"] == {
        "format": "int4",
        "granularity": "per-group",
        "group_size": 32,
    }
    pc = socllm.Plan("shadow-outlier:weights=per-channel,pruning_rate=0").to_json()
    assert pc["ops"]["linear"]["weights"]["granularity"] == "per-channel"
    assert pc["weights"] == "per-channel" and pc["pruning_rate"] == 0
    assert (
        socllm.Plan("shadow-outlier").to_json()["ops"]["linear"]["weights"]["granularity"]
        == "per-tensor"
    )
    custom = {"name": "custom", "ops": socllm.Plan("w8a8").to_json()["ops"]}
    assert socllm.Plan(custom).to_json()["ops"] == custom["ops"]


@pytest.mark.parametrize(
    "plan, match",
    [
        ("int3", "unknown plan 'int3'"),
        ("smoothquant:beta=1", "has no option 'beta'"),
        ("w8a8:alpha=0.5", "has no option 'alpha'"),
        ("smoothquant:alpha=x", "must be a number"),
        ("shadow-outlier:weights=per-row", "per-tensor or per-channel, got 'per-row'"),
        ("shadow-outlier:weights=1", "must be a string"),
        ("smoothquant:alpha=1.5", "alpha must be in"),
        ("llm-int8:threshold=-1", "threshold must be > 0"),
        ("w8-group:group_size=2.5", "must be an integer"),
        ("hetero-tensor:weight_bits=5", "must be 4 or 8, got 5"),
        ({"name": "custom"}, "needs 'ops'"),
        ({"name": "custom", "ops": {"conv": "fp32"}}, "unknown op class 'conv'"),
        ({"name": "custom", "ops": {"attention": "int8"}}, "unknown mode"),
        (
            {"name": "custom", "ops": {"linear": {"activations": "int8-static-per-group"}}},
            "unknown activations mode",
        ),
        (
            {"name": "custom", "ops": {"linear": {"weights": {"format": "int3"}}}},
            "unknown weights.format mode",
        ),
        ({"name": "w8a8", "ops": {"linear": {}}}, "differ from what plan 'w8a8' runs"),
        ("{not json", "invalid plan JSON"),
        # a name that is no processor, format or scheme is reported as all it could have been
        (
            "fp32:attention=bogus",
            r"attention=bogus: 'bogus' is not a processor \(npu, cpu, gpu.*\) or a format "
            r"\(int8, fp16, fp32\), nor an attention scheme \(fp32, sparse.*shadow-attn\)",
        ),
        ("fp32:norm=tpu", r"norm=tpu: 'tpu' is not a processor .* or a format"),
        ("fp32:norm=tpu/fp16", r"norm=tpu/fp16: .*unknown processor 'tpu'"),
        ("fp32:attention=npu/int3", r"attention=npu/int3: .*unknown dtype 'int3'"),
        # options that would change nothing under stored bit-widths
        ("edgeflow:bitwidths=stored,allocation=uniform", 'allocation="uniform" does not apply'),
        ("edgeflow:bitwidths=stored,metric=exact", 'metric="exact" does not apply'),
    ],
)
def test_bad_plans_are_clear_errors(plan, match):
    with pytest.raises(socllm.InvalidArgumentError, match=match):
        socllm.Plan(plan)


def test_plan_needing_calibration_without_it(smollm):
    fresh = socllm.LanguageModel(smollm.path)
    for name in ["w8a8", "w8a8-perchannel", "smoothquant", "shadow-outlier"]:
        with pytest.raises(socllm.InvalidArgumentError, match="none is loaded"):
            fresh.logits([1, 2, 3], name)
    # plans with dynamic scales need none
    assert fresh.logits([1, 2, 3], "llm-int8").shape == (3, fresh.config["vocab_size"])


# -- calibration file ------------------------------------------------------------------------
def test_calibration_round_trip_and_provenance(smollm, calib_file):
    cal = load_calibration(calib_file, smollm)
    assert cal.provenance["corpus"] == "wikitext2" and cal.provenance["seed"] == 2
    assert cal.provenance["samples"] == 4 and cal.tokens == 4 * 64
    again = calibrate_act_scales(smollm, samples=4, seqlen=64, seed=2, progress=False)
    for site in socllm.calibration.Calibration.sites():
        np.testing.assert_array_equal(cal.absmax(site), again.absmax(site))  # deterministic
    a = cal.absmax("mlp_act")
    assert a.shape == (30, 1536) and (a >= 0).all() and a.max() > 1


def test_calibration_absmax_matches_a_numpy_observation(smollm):
    """attn_in of layer 0 is RMSNorm(embedding) * w: recompute it in numpy from the weights."""
    ids = [1, 504, 3, 900, 17]
    cal = smollm.new_calibration()
    smollm.observe_activations([ids], cal)
    with h5py.File(smollm.path) as f:
        emb = f["weights/embed_tokens"][()][ids]
        w = f["weights/layers/0/attn_norm"][()]
    x = emb / np.sqrt((emb.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(cal.get("attn_in")[0], np.abs(x).max(0), rtol=1e-5, atol=1e-6)


def test_calibration_from_another_model_is_rejected(smollm, calib_file, tmp_path):
    other = tmp_path / "other.h5"
    other.write_bytes(calib_file.read_bytes())
    with h5py.File(other, "a") as f:
        cfg = json.loads(f.attrs["model_config"])
        f.attrs["model_config"] = json.dumps(dict(cfg, d_model=2048))
        f.attrs["model_name"] = "Qwen1.5-1.8B"
    seal(other)  # as that model's calibration would be written
    with pytest.raises(
        socllm.InvalidArgumentError, match="calibrated on model 'Qwen1.5-1.8B' \\(d_model 2048\\)"
    ):
        load_calibration(other, smollm)
    with h5py.File(other, "a") as f:
        f.attrs["model_config"] = json.dumps(cfg)
        f.attrs["format_version"] = 2
    with pytest.raises(socllm.InvalidArgumentError, match="schema version 2"):
        load_calibration(other, smollm)
    cal = smollm.new_calibration()
    with pytest.raises(socllm.ShapeError, match="needs shape"):
        cal.set("attn_in", np.zeros((24, 2048), np.float32))
    with pytest.raises(socllm.MissingFileError):
        load_calibration(tmp_path / "missing.h5", smollm)
    (tmp_path / "junk.h5").write_bytes(b"junk")
    with pytest.raises(socllm.FormatError):
        load_calibration(tmp_path / "junk.h5", smollm)


# -- each scheme against an independent numpy reference -------------------------------------
def _q(x, scale, qmax=127):
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(scale > 0, np.round(x / scale), 0)
    return np.clip(r, -qmax - 1, qmax)


def _weights(smollm, layer, site):
    name = {"attn_in": None, "attn_out": "wo", "mlp_in": None, "mlp_act": "w_down"}[site]
    with h5py.File(smollm.path) as f:
        g = f[f"weights/layers/{layer}"]
        if site == "attn_in":
            return np.concatenate([g["wq"][()], g["wk"][()], g["wv"][()]])
        if site == "mlp_in":
            return np.concatenate([g["w_gate"][()], g["w_up"][()]])
        return g[name][()]


@pytest.fixture(scope="module")
def site_input(smollm):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 576)).astype(np.float32)
    x[:, 5] *= 20  # an outlier channel
    return x


def test_w8a8_graph_is_exact_int8_arithmetic(smollm, calib_file, site_input):
    W = _weights(smollm, 3, "attn_in")
    g = smollm.linear_graph("w8a8", 3, "attn_in", 37)
    y = g.run(site_input)
    sx = np.float32(smollm.calibration.get("attn_in")[3].max() / np.float32(127))
    assert g.scales == [pytest.approx(float(sx), rel=1e-7)]
    sw = np.float32(np.abs(W).max() / np.float32(127))
    qx = _q(site_input, sx).astype(np.int64)
    qw = _q(W, sw).astype(np.int64)
    ref = (qx @ qw.T).astype(np.float32) * (sx * sw)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(socllm.ShapeError, match="built for input \\[37, 576\\], got \\[36, 576\\]"):
        g.run(site_input[:36])


def test_perchannel_and_smoothquant_graphs(smollm, calib_file, site_input):
    W = _weights(smollm, 2, "mlp_in")
    amax = smollm.calibration.get("mlp_in")[2]
    x = site_input
    # per-channel weights, static per-tensor activations
    sx = np.float32(amax.max() / np.float32(127))
    sw = (np.abs(W).max(1) / np.float32(127)).astype(np.float32)
    ref = (_q(x, sx).astype(np.int64) @ _q(W, sw[:, None]).astype(np.int64).T).astype(
        np.float32
    ) * (sx * sw)
    y = smollm.linear_graph("w8a8-perchannel", 2, "mlp_in", 37).run(x)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # SmoothQuant, alpha 0.5: s = sqrt(amax) / sqrt(wmax) per input channel
    s = (
        np.maximum(amax, 1e-5).astype(np.float64) ** 0.5
        / np.maximum(np.abs(W).max(0), 1e-5).astype(np.float64) ** 0.5
    ).astype(np.float32)
    Ws, xs = W * s, x / s
    sx = np.float32((amax / s).max() / np.float32(127))
    sw = np.float32(np.abs(Ws).max() / np.float32(127))
    ref = (_q(xs, sx).astype(np.int64) @ _q(Ws, sw).astype(np.int64).T).astype(np.float32) * (
        sx * sw
    )
    y = smollm.linear_graph("smoothquant", 2, "mlp_in", 37).run(x)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_llm_int8_graph(smollm, site_input):
    W = _weights(smollm, 1, "attn_in")
    x = site_input.copy()
    x[3, 100] = 9.0  # a column with one outlier
    cols = np.abs(x).max(0) > 6.0
    xi = np.where(cols, 0, x)
    sx = (np.abs(xi).max(1) / np.float32(127)).astype(np.float32)
    sw = (np.abs(W).max(1) / np.float32(127)).astype(np.float32)
    ref = (_q(xi, sx[:, None]).astype(np.int64) @ _q(W, sw[:, None]).astype(np.int64).T).astype(
        np.float32
    ) * (sx[:, None] * sw)
    ref += x[:, cols] @ W[:, cols].T
    assert cols[5] and cols[100]
    y = smollm.linear_graph("llm-int8", 1, "attn_in", 37).run(x)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize(
    "plan, bits",
    [("w8-group", 8), ("w4-group", 4), ("w4a16", 4), ("w4a16:weight_bits=8", 8),
     ("hetero-layer:weight_bits=8", 8)],
)  # fmt: skip
def test_group_graphs(smollm, site_input, plan, bits):
    W = _weights(smollm, 0, "attn_out")
    x = site_input
    G, qmax = 32, 127 if bits == 8 else 7
    Wg = W.reshape(W.shape[0], -1, G)
    sw = (np.abs(Wg).max(2, keepdims=True) / np.float32(qmax)).astype(np.float32)
    w_hat = (_q(Wg, sw, qmax) * sw).reshape(W.shape).astype(np.float32)
    if plan.startswith(("w4a16", "hetero")):  # weight-only: fp16 activations
        x_hat = x.astype(np.float16).astype(np.float32)
    else:
        xg = x.reshape(x.shape[0], -1, G)
        sx = (np.abs(xg).max(2, keepdims=True) / np.float32(127)).astype(np.float32)
        x_hat = (_q(xg, sx) * sx).reshape(x.shape).astype(np.float32)
    ref = x_hat.astype(np.float64) @ w_hat.T.astype(np.float64)
    y = smollm.linear_graph(plan, 0, "attn_out", 37).run(x)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


def test_fp32_graph_equals_the_weights(smollm, site_input):
    W = _weights(smollm, 4, "attn_in")
    y = smollm.linear_graph("fp32", 4, "attn_in", 37).run(site_input)
    np.testing.assert_allclose(y, site_input.astype(np.float64) @ W.T, rtol=1e-4, atol=1e-4)


# -- whole model -----------------------------------------------------------------------------
def test_every_plan_runs_and_the_quantized_ones_differ(smollm, calib_file, prompt):
    ref = smollm.logits(prompt[:64])
    for name in PRESETS[1:]:
        lg = smollm.logits(prompt[:64], name)
        assert np.isfinite(lg).all()
        diff = np.abs(lg - ref).max()
        assert 1e-3 < diff < 100, (name, diff)


@pytest.mark.parametrize("chunk", [64, 100, 300, 512])
def test_chunked_prefill_equals_full_prefill_fp32(smollm, prompt, chunk):
    full = smollm.logits(prompt)
    chunked = smollm.logits(prompt, {"name": "fp32", "chunk_len": chunk})
    np.testing.assert_allclose(chunked, full, atol=1e-4 * np.abs(full).max(), rtol=0)


@pytest.mark.parametrize("plan", PRESETS[1:])
def test_padding_rows_never_reach_real_rows(smollm, calib_file, site_input, plan):
    """Operator level, every plan: a graph's real rows are the same whatever its padding rows
    hold (zeros or other values below llm-int8's threshold: a graph run alone treats all its
    rows as one segment). Up to fp32 GEMM rounding for the float-path schemes."""
    g = smollm.linear_graph(plan, 5, "attn_in", 64)
    a = np.zeros((64, 576), np.float32)
    a[:37] = site_input
    b = a.copy()
    b[37:] = 5.0
    ya, yb = g.run(a)[:37], g.run(b)[:37]
    np.testing.assert_allclose(ya, yb, rtol=0, atol=1e-5 * np.abs(ya).max())


@pytest.mark.parametrize("plan", ["w8a8", "llm-int8", "shadow-outlier", "w8-group", "w4-group"])
def test_padding_never_changes_results(smollm, calib_file, prompt, plan):
    """Whole model: 300 tokens in chunks of 128 (last chunk: 44 real rows + 84 padding) vs the
    same chunks fed without padding (chunk 44 on the tail). For the integer-GEMM plans (the
    per-group ones included) this is exact up to attention rounding; float-GEMM plans (w4a16)
    can differ by fp32 rounding of differently shaped GEMMs, which later quantization steps
    amplify."""
    padded = smollm.logits(prompt, {"name": plan, "chunk_len": 128})
    cache = smollm.new_cache(300)
    parts = [
        smollm.step(cache, prompt[:256], all_positions=True, plan={"name": plan, "chunk_len": 128}),
        smollm.step(cache, prompt[256:], all_positions=True, plan={"name": plan, "chunk_len": 44}),
    ]
    np.testing.assert_allclose(padded, np.concatenate(parts), atol=2e-4, rtol=0)


def test_chunk_sharing_graph_counts(smollm, prompt):
    e = smollm
    e.clear_graphs()
    smollm.logits(prompt, {"name": "fp32", "chunk_len": 128})  # 3 chunks
    s = e.graph_stats()
    L = smollm.config["n_layers"]
    assert s["built_shared"] == 5 * L and s["built_per_chunk"] == 3 * L
    assert s["requests"] == 3 * 6 * L and s["reused"] == s["requests"] - s["built"]
    kinds = {ev["kind"] for ev in e.graph_events()}
    assert kinds == {"attn_in", "attention", "o_proj", "mlp_in", "mlp_act", "down"}
    smollm.logits(prompt[:200], {"name": "fp32", "chunk_len": 128})  # nothing new to build
    assert e.graph_stats()["built"] == s["built"]


def test_qwen_census_matches_llm_npu():
    """seed 001 §3.2: 120 of 144 subgraphs shared for Qwen1.5-1.8B, prompt 1024, chunk 256."""
    shared = graph_census("qwen1.5-1.8b", 1024, 256)
    naive = graph_census("qwen1.5-1.8b", 1024, 256, sharing=False)
    assert shared["subgraphs_per_chunk"] == 144 and shared["shareable_per_chunk"] == 120
    assert shared["built_shared"] == 120 and shared["built_per_chunk"] == 4 * 24
    assert naive["built"] == 4 * 144
    # weights held once instead of once per chunk: 4x less weight memory
    assert naive["weight_bytes"] == 4 * shared["weight_bytes"]
    with pytest.raises(socllm.InvalidArgumentError, match="unknown model config"):
        graph_census("qwen9", 1024, 256)


def test_plan_parts_compose_and_round_trip():
    """Every technique is a part of one plan (issue 36): partition, partner, sync, device,
    characterization, decode placement and the LM head's weights parse from text, show in JSON
    and read back; the partner follows the linears' format."""
    p = socllm.Plan("edgeflow:bits=5,partition=solver,attention=shadow-attn,decode=same")
    j = p.to_json()
    assert j["partition"] == {"mode": "solver"} and p.partner == "cpu"  # INT8: no GPU path
    assert j["attention"]["kind"] == "shadow-attn" and j["bits"] == 5.0
    assert j["decode"] == "same" and socllm.Plan(j).to_json() == j
    w4 = socllm.Plan("w4a16:linear=npu,partition=row,npu_share=0.25,sync=fast")
    assert w4.partner == "gpu" and w4.sync == "fast"
    assert w4.partition == {"mode": "row", "npu_share": 0.25}
    assert socllm.Plan(w4.to_json()).to_json() == w4.to_json()
    # NPU presets decode on the CPU (llm.npu, seed 001 §4); HeteroLLM's keep their placement
    assert socllm.Plan("w8a8").decode == "cpu" and socllm.Plan("fp32").decode == "same"
    assert socllm.Plan("hetero-tensor").decode == "same"
    d = socllm.Plan("w8a8:attention=npu-int8").for_decode()
    assert d.placement["linear"]["processor"] == "cpu" and d.attention["kind"] == "fp32"
    assert d.placement["attention"] == {"processor": "cpu", "format": "fp32"}
    g = socllm.Plan("fp32:decode=gpu").for_decode()
    assert g.placement["norm"] == {"processor": "gpu", "format": "fp16"}
    assert socllm.Plan("hetero-tensor").to_json()["lm_head_weights"] == "linear"


@pytest.mark.parametrize(
    "text, message",
    [
        ("w8a8:partition=solver,partner=gpu", "int8 linears on the gpu"),
        ("w4a16:partition=solver", "places them on the cpu"),
        ("shadow-outlier:partition=row", "shadow outliers"),
        ("w8a8:partition=halves", "unknown partition 'halves'"),
        ("w8a8:partition=solver,npu_share=0.5", "npu_share fixes a row cut"),
        ("w8a8:partition=row,npu_share=1.5", "npu_share must be a number in [0, 1]"),
        ("w8a8:partition=solver,partner=npu", "gpu or the cpu"),
        ("w8a8:decode=gpu", "decode=gpu cannot run its int8 linears"),
        ("w8a8:sync=slow", "sync must be fast or conventional"),
        ("w8a8:lm_head_weights=int3", "lm_head_weights must be fp32 or linear"),
        ("w8a8:decode=tpu", "tpu"),
    ],
)
def test_plan_parts_that_cannot_run_are_refused_by_name(text, message):
    with pytest.raises(socllm.InvalidArgumentError, match=re.escape(message)):
        socllm.Plan(text)


def test_the_solver_writes_its_partitions_into_the_plan(smollm):
    """Plan.solved() writes the solver's choice for each linear and phase into the plan, where
    the JSON shows it and with_partition-style entries replace what `partition` would solve."""
    p = socllm.Plan(
        "w4a16:linear=npu,partition=solver,sync=fast,characterization=heterollm,decode=same"
    )
    s = p.solved(smollm.config, [100], decode=True)
    parts = s.partitions
    assert {(x["op"], x["phase"]) for x in parts} == {
        (op, phase)
        for op in ("qkv", "o_proj", "gate_up", "down")
        for phase in ("prefill", "decode")
    }
    assert all(x["partition"]["rows"] == (100 if x["phase"] == "prefill" else 1) for x in parts)
    assert socllm.Plan(s.to_json()).to_json() == s.to_json()
    meta = socllm.task_graph(smollm, s, 100).meta["partitions"]
    by_site = {x["site"]: x["partition"] for x in meta if x["phase"] == "prefill"}
    assert by_site == {x["op"]: x["partition"] for x in parts if x["phase"] == "prefill"}
    with pytest.raises(socllm.InvalidArgumentError, match="planned for device 'snapdragon-8elite'"):
        socllm.Plan("w8a8:device=snapdragon-8elite").on_device("snapdragon-8gen3")
    with pytest.raises(socllm.InvalidArgumentError, match="unknown device 'pixel-9'"):
        socllm.Plan("w4a16:linear=npu,partition=solver,device=pixel-9").solved(smollm.config, [64])
