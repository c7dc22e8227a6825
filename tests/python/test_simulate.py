"""The SoC simulator from Python and the CLI: device profiles as sourced data, the cost model
fit staying in sync with its data, timelines, traces, engine-executed graphs, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import socllm
from socllm.calibration import (
    calibrate_act_scales,
    calibrate_outliers,
    corpus_tokens,
    held_out_tokens,
    save_calibration,
)
from socllm.cli import main as cli_main
from socllm.configs import graph_census, load_config
from socllm.configs import known as known_configs
from socllm.devices import known as known_devices
from socllm.devices import load_profile
from socllm.sim.timeline import simulate, simulate_model

REPO = Path(__file__).resolve().parents[2]


def _numbers(node, path=""):
    """Every {value, ...} leaf under node, with its JSON pointer."""
    if isinstance(node, dict):
        if "value" in node:
            yield path, node
            return
        for k, v in node.items():
            if not k.startswith("_"):
                yield from _numbers(v, f"{path}/{k}")


@pytest.mark.parametrize("device", known_devices())
def test_profiles_are_sourced_data(device):
    p = load_profile(device)
    assert {"snapdragon-8gen3", "snapdragon-8gen2", "snapdragon-8elite"} <= set(known_devices())
    leaves = list(_numbers(p["cost_model"]))
    assert len(leaves) > 20
    for ptr, n in leaves:
        assert isinstance(n["value"], (int, float)) and math.isfinite(n["value"]), ptr
        assert n.get("unit") and n.get("source"), f"{device}{ptr} lacks unit or source"
    for ptr, n in _numbers(p["processors"]):
        assert n.get("source"), f"{device}/processors{ptr} lacks a source"


def test_cost_model_in_profiles_is_the_current_fit():
    """The fitted numbers stored in the 8 Gen 3 profile are what the fit script computes from
    Table 3 now, and held-out rows are predicted through the C++ cost model."""
    from socllm.devices import fit as mod

    table = json.loads(mod.TABLE.read_text())["rows"]
    fitted = mod.fit(table, [1, 2, 4, 5])
    cm = load_profile("snapdragon-8gen3")["cost_model"]
    for group, nums in fitted.items():
        proc = group.split("_")[0]
        for key, n in nums.items():
            assert cm[proc][key]["value"] == pytest.approx(n["value"], rel=1e-9), (proc, key)
    preds = mod.predict(table, load_profile("snapdragon-8gen3"))
    # the training rows of NPU INT8 are fitted within 15%; every prediction is positive
    for p in preds:
        assert p["predicted_ms"] > 0
        if p["column"] == "npu_int8_ms" and p["row"] in (1, 2, 4, 5):
            assert abs(p["error"]) < 0.15, p


def test_mid_core_attention_rates_are_the_current_derivation():
    """The mid core's attention rates stored in the profiles are what fit.py derives from the
    raw entries now; shadowAttn's fused kernel runs at the vanilla sparse rate times the raw
    speedup (seed 000 §4)."""
    from socllm.devices import fit as mod

    raw = load_profile("snapdragon-8gen3")
    _, derived = mod.attention_cost_model(raw)
    speedup = raw["processors"]["cpu_mid"]["fused_sparse_attention_speedup"]["value"]
    mid = derived["mid"]
    assert mid["fp32_fused_sparse_attention_gops"]["value"] == pytest.approx(
        speedup * mid["fp32_sparse_attention_gops"]["value"], rel=1e-12
    )
    for device in known_devices():
        stored = load_profile(device)["cost_model"]["cpu_core"]["mid"]
        assert set(stored) == set(mid), device
        for key, n in mid.items():
            assert stored[key]["value"] == pytest.approx(n["value"], rel=1e-9), (device, key)


def test_configs_build_graphs():
    """Every shape-only config works everywhere a config is accepted (one config type)."""
    for name in known_configs():
        cfg = load_config(name)
        t = simulate(cfg, "snapdragon-8gen3", "shadow-outlier", 300, chunk=128)
        s = t.summary()
        # 3 chunks x n_layers x 6 subgraphs + shadow tasks + LM head
        n_sub = sum(1 for task in t.tasks if task["kind"] not in ("shadow", "lm_head"))
        assert n_sub == 3 * cfg["n_layers"] * 6, name
        assert s["prefill_ms"] > 0 and s["energy_mj"] > 0
        census = graph_census(name, 300, 128)
        assert census["built_shared"] == 5 * cfg["n_layers"], name
        g = socllm.task_graph(name, "w8a8", 300, 128)
        assert len(g) == 3 * cfg["n_layers"] * 6 + 1, name
        gated = cfg.get("mlp", "gated") == "gated"
        gate_up = g.to_json()["tasks"][3]["ops"][1]  # c0.L0.mlp_in: ffn_norm, gate_up
        assert gate_up["n"] == (2 if gated else 1) * cfg["d_ff"], name


def test_summary_trace_and_policies(tmp_path):
    runs = {
        p: simulate("qwen1.5-1.8b", "snapdragon-8gen3", "shadow-outlier", 1024, policy=p)
        for p in ("in-order", "first-ready", "npu-stall-first")
    }
    runs["ooe"] = runs["npu-stall-first"]
    runs["inorder"] = runs["in-order"]
    s = runs["ooe"].summary()
    assert s["policy"] == "npu-stall-first"
    # the earlier short names are aliases
    alias = simulate("qwen1.5-1.8b", "snapdragon-8gen3", "shadow-outlier", 1024, policy="ooe")
    assert alias.summary()["prefill_ms"] == s["prefill_ms"]
    assert {p["name"] for p in socllm.policies()} == {
        "in-order",
        "first-ready",
        "npu-stall-first",
        "position-first",
        "position-steal",
        "optimal",
        "mllm-executor",
    }
    assert all(p["description"] for p in socllm.policies())
    for key in (
        "prefill_ms",
        "prefill_tokens_per_s",
        "ttft_ms",
        "energy_mj",
        "bubble_rate",
        "peak_memory_bytes",
        "graph_build_ms",
    ):
        assert key in s
    assert set(s["bubble_rate"]) == {"npu", "cpu"}
    assert s["prefill_tokens_per_s"] == pytest.approx(1024 / (s["prefill_ms"] / 1e3))
    # the same work under every policy; out-of-order fills the in-order NPU bubbles
    busy = {p: t.summary()["busy_ms"] for p, t in runs.items()}
    assert busy["inorder"] == pytest.approx(busy["ooe"])
    assert runs["ooe"].summary()["prefill_ms"] < runs["inorder"].summary()["prefill_ms"]
    assert s["bubble_rate"]["npu"] < runs["inorder"].summary()["bubble_rate"]["npu"]
    path = runs["ooe"].to_perfetto(tmp_path / "t.json")
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == s["tasks"]
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {"npu", "cpu", "gpu"}
    spans = runs["ooe"].spans_us
    for e in complete[:50]:
        assert e["ts"] == pytest.approx(spans[e["args"]["task"], 0])
    # the same graph under another policy
    again = runs["ooe"].with_policy("in-order").summary()
    assert again["prefill_ms"] == pytest.approx(runs["inorder"].summary()["prefill_ms"])
    # optimal refuses a graph this large
    with pytest.raises(socllm.InvalidArgumentError, match="optimal"):
        simulate("qwen1.5-1.8b", "snapdragon-8gen3", "w8a8", 1024, policy="optimal")


def test_placement_lives_in_the_plan():
    w8 = socllm.Plan("w8a8").placement
    assert w8["linear"] == {"processor": "npu", "format": "int8"}
    assert w8["attention"]["processor"] == "cpu" and w8["norm"] == {
        "processor": "npu",
        "format": "fp16",
    }
    assert socllm.Plan("fp32").placement["linear"] == {"processor": "cpu", "format": "fp32"}
    assert socllm.Plan("llm-int8").placement["linear"]["processor"] == "cpu"
    assert socllm.Plan("w8a8").to_json()["ops"]["attention"] == {
        "processor": "cpu",
        "format": "fp16",
    }
    # moving attention to the GPU: the timeline follows
    base = simulate("qwen1.5-1.8b", "snapdragon-8gen3", "w8a8", 512)
    moved_plan = socllm.Plan("w8a8").placed("attention", "gpu")
    moved = simulate("qwen1.5-1.8b", "snapdragon-8gen3", moved_plan, 512)
    att = [t for t in moved.tasks if any(o["op_class"] == "attention" for o in t["ops"])]
    assert len(att) == 2 * 24 and all(t["processor"] == "gpu" for t in att)
    # RoPE stays on the CPU: the attention subgraph splits into two tasks
    rope = [t for t in moved.tasks if t["name"].endswith("attention.rope")]
    assert len(rope) == 2 * 24 and all(t["processor"] == "cpu" for t in rope)
    assert moved.summary()["busy_ms"]["gpu"] > 0 and "gpu" not in base.summary()["busy_ms"]
    assert moved.summary()["busy_ms"]["npu"] == pytest.approx(base.summary()["busy_ms"]["npu"])
    # the string form does the same
    same = simulate("qwen1.5-1.8b", "snapdragon-8gen3", "w8a8:attention=gpu", 512)
    assert same.summary()["prefill_ms"] == moved.summary()["prefill_ms"]
    with pytest.raises(socllm.InvalidArgumentError, match="processor"):
        simulate("qwen1.5-1.8b", "snapdragon-8gen3", "w8a8", 512, processor="tpu")
    # "processor/format" sets both; a bare format on `attention` is its format, as for every
    # other class (not the dense scheme "fp32", the default), a kind name is a scheme
    p = socllm.Plan("shadow-outlier:norm=cpu/fp32,attention=fp32,rope=gpu/fp16")
    assert p.placement["norm"] == {"processor": "cpu", "format": "fp32"}
    assert p.placement["attention"] == {"processor": "cpu", "format": "fp32"}
    assert p.placement["rope"] == {"processor": "gpu", "format": "fp16"}
    assert p.attention == {"kind": "fp32"}
    assert socllm.Plan("w8a8:attention=sparse,keep=0.5").placement["attention"]["format"] == "fp16"
    for bad, msg in (("cpu/fp64", "unknown dtype 'fp64'"), ("tpu/fp32", "unknown processor 'tpu'")):
        with pytest.raises(socllm.InvalidArgumentError, match=msg):
            socllm.Plan(f"w8a8:norm={bad}")
    with pytest.raises(socllm.InvalidArgumentError, match="'norm' in fp32 cannot run on the npu"):
        socllm.Plan("w8a8:norm=npu/fp32")
    with pytest.raises(socllm.InvalidArgumentError, match="'norm' in fp32 cannot run on the npu"):
        socllm.Plan("fp32").placed("norm", "npu")
    with pytest.raises(socllm.InvalidArgumentError, match="no option 'softmax'.*attention"):
        socllm.Plan("w8a8:softmax=npu")
    with pytest.raises(socllm.InvalidArgumentError, match="cannot run on the npu"):
        simulate("qwen1.5-1.8b", "snapdragon-8gen3", "llm-int8", 512, processor="npu")
    # expected shadow loads of a shape-only config: FFN-down inputs kept first
    g = socllm.task_graph("qwen1.5-1.8b", "shadow-outlier", 256, 256)
    shadow = [t for t in g.to_json()["tasks"] if t["kind"] == "shadow"]
    assert len(shadow) == 96 - round(0.85 * 96)
    assert all(t["name"].endswith("shadow.down") for t in shadow)
    assert all(t["ops"][0]["k"] == 10 for t in shadow)  # 10 channels (seed 001 Fig. 10)
    rows = socllm.sim.prefill_graph_rows
    assert rows(64, 256) == 64 and rows(20, 256) == 32 and rows(1000, 256) == 256
    assert rows(1000, 0) == 1000


def test_runtime_graph_build_is_on_the_timeline():
    naive = simulate(
        "gemma-2b", "snapdragon-8gen3", "w8-group", 256, chunk=0, runtime_graph_build=True
    )
    s = naive.summary()
    profile = load_profile("snapdragon-8gen3")["cost_model"]["graph"]
    # Gemma-2B is the measured model: its full build + optimize time, exactly
    assert s["graph_build_ms"] == pytest.approx(
        profile["build_ms"]["value"] + profile["optimize_ms"]["value"]
    )
    assert s["prefill_ms"] > s["graph_build_ms"]


def test_engine_graph_is_the_timeline_graph(smollm):
    """Every static-graph execution of the engine's chunked run is a task of the timeline."""
    smollm.clear_graphs()
    ids = held_out_tokens(corpus_tokens(smollm))[:300]
    t = simulate_model(smollm, ids, "snapdragon-8gen3", "w8-group", chunk=128)
    s = t.summary()
    assert s["engine_graphs"]["requests"] == 3 * smollm.config["n_layers"] * 6
    assert (
        sum(1 for x in t.tasks if x["kind"] not in ("lm_head",)) == s["engine_graphs"]["requests"]
    )


def test_engine_shadow_loads_reach_the_graph(smollm, tmp_path):
    cal = calibrate_act_scales(smollm, samples=4, seqlen=64, seed=3, progress=False)
    calibrate_outliers(smollm, cal, progress=False)
    smollm.load_calibration(save_calibration(tmp_path / "c.h5", cal, smollm))
    try:
        ids = held_out_tokens(corpus_tokens(smollm))[:256]
        plan = "shadow-outlier:pruning_rate=0"
        t = simulate_model(smollm, ids, "snapdragon-8gen3", plan, chunk=128)
        shadow = [x for x in t.tasks if x["kind"] == "shadow"]
        # independent count: run the same chunks again and read the engine's counters
        p = socllm.Plan({**socllm.Plan(plan).to_json(), "chunk_len": 128})
        smollm.shadow_stats(p, reset=True)
        cache = smollm.new_cache(len(ids))
        smollm.step(cache, ids, plan=p)
        st = smollm.shadow_stats(p, reset=True)
        assert sum(x["ops"][0].get("k", 0) for x in shadow) == sum(
            d["outlier_channels"] for d in st
        )
        assert sum(x["ops"][0].get("bytes", 0) for x in shadow) == sum(
            d["cold_fetch_bytes"] for d in st
        )
        assert len(shadow) > 0 and all(x["processor"] == "cpu" for x in shadow)
    finally:
        smollm.set_calibration(None)


def test_cli_simulate(tmp_path, capsys):
    out = tmp_path / "s.json"
    trace = tmp_path / "trace.json"
    rc = cli_main(
        [
            "simulate",
            "--config",
            "qwen1.5-1.8b",
            "--device",
            "snapdragon-8gen3",
            "--plan",
            "shadow-outlier",
            "--prompt-len",
            "512",
            "--policy",
            "fifo",
            "--trace",
            str(trace),
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    j = json.loads(out.read_text())
    for key in ("prefill_ms", "prefill_tokens_per_s", "ttft_ms", "energy_mj", "bubble_rate"):
        assert key in j
    assert j["policy"] == "first-ready" and j["prompt_len"] == 512
    assert json.loads(trace.read_text())["traceEvents"]
    # a real model: the engine runs the held-out prompt in chunks and the timeline times it
    rc = cli_main(
        [
            "simulate",
            "--model",
            "smollm2-135m",
            "--plan",
            "w8-group",
            "--prompt-len",
            "200",
            "--chunk",
            "128",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    j = json.loads(out.read_text())
    assert j["config"].startswith("Smollm2") and j["prompt_len"] == 200 and j["chunk_len"] == 128
    assert j["tasks"] == 2 * 30 * 6 + 1
    assert cli_main(["simulate", "--config", "qwen1.5-1.8b", "--model", "smollm2-135m"]) == 2
    assert "exactly one of --config" in capsys.readouterr().err
    assert cli_main(["simulate", "--config", "no-such-model"]) == 2
    assert "unknown model config 'no-such-model'" in capsys.readouterr().err
    assert cli_main(["simulate", "--config", "qwen1.5-1.8b", "--device", "pixel-9"]) == 2
    assert "unknown device 'pixel-9'" in capsys.readouterr().err


def test_profile_missing_a_number(tmp_path, capsys):
    p = load_profile("snapdragon-8gen3")
    del p["cost_model"]["npu"]["int8_weight_gbps"]
    with pytest.raises(socllm.InvalidArgumentError, match="/cost_model/npu/int8_weight_gbps"):
        simulate("qwen1.5-1.8b", p, "w8a8", 256)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(p))
    assert (
        cli_main(["simulate", "--config", "qwen1.5-1.8b", "--device", str(path), "--plan", "w8a8"])
        == 2
    )
    assert "int8_weight_gbps" in capsys.readouterr().err
    path.write_text("{not json")
    with pytest.raises(socllm.FormatError, match="not valid JSON"):
        load_profile(path)
    with pytest.raises(socllm.InvalidArgumentError, match="prompt_len must be >= 1, got 0"):
        simulate("qwen1.5-1.8b", "snapdragon-8gen3", "w8a8", 0)
    with pytest.raises(socllm.InvalidArgumentError, match="policy"):
        simulate("qwen1.5-1.8b", "snapdragon-8gen3", "w8a8", 64, policy="random")
    with pytest.raises(socllm.InvalidArgumentError, match="n_heads"):
        simulate({"d_model": 64, "n_layers": 1}, "snapdragon-8gen3", "w8a8", 64)


def test_small_graph_optimum_and_heuristics():
    cfg = dict(load_config("qwen1.5-1.8b"), n_layers=1)
    res = {
        p: simulate(
            cfg, "snapdragon-8gen3", "shadow-outlier:pruning_rate=0.75", 512, chunk=256, policy=p
        ).summary()["prefill_ms"]
        for p in ("in-order", "first-ready", "npu-stall-first", "optimal")
    }
    assert res["optimal"] <= min(res.values()) + 1e-9
    assert np.isfinite(list(res.values())).all()
