"""One execution graph (issue 11): the graph a prefill executes in the engine equals the graph the
block description gives for the config alone, task for task (ids, names, ops, shapes, processors,
dependencies), the measured shadow loads aside; and that graph is the one the timeline times."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import socllm

# golden tier: checked against an independent reference (tests/python/conftest.py)
pytestmark = pytest.mark.golden

# (prompt length, chunk length): whole prompts, exact and padded chunks, a prompt shorter than a
# chunk (runs on the 32-row graph), a one-token prompt whole and chunked.
CASES = [(1, None), (1, 64), (37, None), (100, 32), (130, 64), (20, 256)]
PLANS = socllm.Plan.known() + ["w8a8:attention=gpu,norm=cpu", "shadow-outlier:pruning_rate=0.5"]


@pytest.fixture(scope="module")
def calibrated(smollm, small_calibration):
    smollm.load_calibration(small_calibration)
    yield smollm
    smollm.set_calibration(None)


@pytest.fixture(scope="module")
def ids(smollm, wikitext_text):
    return smollm.tokenize(wikitext_text[50000:70000])[:300]


def without_loads(graph_json: dict) -> dict:
    """The graph with the measured quantities removed: a shadow task's outlier channels (its
    matmul's k), cold-fetch bytes and the working bytes that follow from them."""
    g = copy.deepcopy(graph_json)
    for t in g["tasks"]:
        if t["kind"] == "shadow":
            t.pop("working_bytes")
            for o in t["ops"]:
                o.pop("k", None)
                o.pop("bytes", None)
    return g


@pytest.mark.parametrize("plan", PLANS)
def test_executed_graph_equals_config_graph(calibrated, ids, plan):
    m = calibrated
    for prompt_len, chunk in CASES:
        _, executed = m.prefill(ids[:prompt_len], plan, chunk_len=chunk, return_graph=True)
        from_config = m.task_graph(plan, prompt_len, chunk)
        a, b = executed.to_json(), from_config.to_json()
        assert a["meta"] == b["meta"], (plan, prompt_len, chunk)
        assert len(a["tasks"]) == len(b["tasks"]), (plan, prompt_len, chunk)
        for x, y in zip(without_loads(a)["tasks"], without_loads(b)["tasks"], strict=True):
            assert x == y, (plan, prompt_len, chunk)
        # independent of the block description: chunk rows and KV lengths, by hand
        rows = prompt_len if chunk is None else (chunk if prompt_len >= chunk else 32)
        n_chunks = -(-prompt_len // rows)
        att = [o for t in a["tasks"] for o in t["ops"] if o["op"] == "attention"]
        assert len(att) == n_chunks * m.config["n_layers"]
        for t in a["tasks"]:
            for o in t["ops"]:
                if o["op"] == "attention":
                    assert o["m"] == rows and o["elements"] == (t["chunk"] + 1) * rows
                if o.get("name") == "qkv" and t["name"].endswith(("attn_in", ".qkv")):
                    assert (o["m"], o["k"], o["n"]) == (rows, 576, 576 + 2 * 192)
                elif o.get("name") == "qkv":  # one part of a partitioned qkv (its columns)
                    assert o["k"] == 576 and o["n"] <= 960 and o["m"] >= 1
        # a task waits for the previous task of its chunk and, for attention, the previous
        # chunk's attention of its layer (llm.npu Eq. 3 / Eq. 2)
        holder = {
            (t["chunk"], t["layer"]): t
            for t in a["tasks"]
            if any(o["op"] == "attention" for o in t["ops"])
        }
        if n_chunks > 1:
            assert holder[(0, 2)]["id"] in holder[(1, 2)]["deps"]


def test_placement_shapes_the_graph(calibrated, ids):
    p = socllm.Plan("w8a8").placed("norm", "cpu")
    _, g = calibrated.prefill(ids[:64], p, chunk_len=32, return_graph=True)
    tasks = g.to_json()["tasks"]
    norms = [t for t in tasks if t["name"].endswith("attn_in.attn_norm")]
    assert len(norms) == 2 * 30 and all(t["processor"] == "cpu" for t in norms)
    qkv = [t for t in tasks if t["name"].endswith("attn_in.qkv")]
    assert all(t["processor"] == "npu" and t["ops"][0]["dtype"] == "int8" for t in qkv)


def test_measured_loads_are_the_engines_counters(calibrated, ids):
    m = calibrated
    plan = "shadow-outlier:pruning_rate=0"
    m.shadow_stats(plan, reset=True)
    _, g = m.prefill(ids[:200], plan, chunk_len=64, return_graph=True)
    shadow = [t for t in g.to_json()["tasks"] if t["kind"] == "shadow"]
    st = m.shadow_stats(plan, reset=True)  # the engine's cumulative counters
    assert len(shadow) == 4 * 30 * 4  # no input pruned: one CPU part per input per chunk
    assert sum(t["ops"][0].get("k", 0) for t in shadow) == sum(d["outlier_channels"] for d in st)
    assert sum(t["ops"][0].get("bytes", 0) for t in shadow) == sum(
        d["cold_fetch_bytes"] for d in st
    )
    assert sum(d["outlier_channels"] for d in st) > 0


def test_prefill_logits_and_graph_json(calibrated, ids):
    m = calibrated
    last = m.prefill(ids[:50], "fp32")
    full = m.logits(ids[:50], "fp32")
    np.testing.assert_allclose(last[0], full[-1], rtol=0, atol=1e-4)
    every = m.prefill(ids[:50], "w8a8", chunk_len=32, all_positions=True)
    np.testing.assert_allclose(
        every, m.logits(ids[:50], {"name": "w8a8", "chunk_len": 32}), atol=1e-4
    )
    # TaskGraph JSON round trip, with its documented header
    g = m.task_graph("shadow-outlier", 100, 32)
    j = g.to_json()
    assert j["format"] == "socllm-task-graph" and j["version"] == 1
    assert j["meta"]["plan"]["name"] == "shadow-outlier" and j["meta"]["graph_rows"] == 32
    back = socllm.TaskGraph.from_json(json.loads(json.dumps(j)))
    assert back.to_json() == j
    bad = dict(j, version=99)
    with pytest.raises(socllm.FormatError, match="version 99"):
        socllm.TaskGraph.from_json(bad)


def test_graph_requests_with_bad_sizes(smollm, ids):
    with pytest.raises(socllm.InvalidArgumentError, match="chunk_len must be >= 1, got 0"):
        socllm.task_graph(smollm, "fp32", 100, 0)
    with pytest.raises(socllm.InvalidArgumentError, match="chunk_len must be >= 1, got 0"):
        smollm.prefill(ids[:10], "fp32", chunk_len=0)
    ctx = smollm.config["context_length"]
    with pytest.raises(socllm.InvalidArgumentError, match=f"chunk length {ctx + 1} exceeds"):
        socllm.task_graph(smollm, "fp32", 100, ctx + 1)
    with pytest.raises(socllm.InvalidArgumentError, match=f"chunk length {ctx + 1} exceeds"):
        smollm.prefill(ids[:10], "fp32", chunk_len=ctx + 1)
    with pytest.raises(socllm.ContextOverflowError, match=str(ctx + 5)):
        socllm.task_graph(smollm, "fp32", ctx + 5, 256)
    with pytest.raises(socllm.InvalidArgumentError, match="chunk_len must be an int"):
        socllm.task_graph("qwen1.5-1.8b", "fp32", 100, 1.5)
    with pytest.raises(socllm.InvalidArgumentError, match="'linear' in fp32 cannot run on the npu"):
        socllm.task_graph("qwen1.5-1.8b", socllm.Plan("fp32").all_on("npu"), 100, 32)


def test_gemma3_extras_are_in_the_graph():
    """Gemma 3's QK-norm and post-norms are norm ops of their subgraphs (each one more pass over
    the values, its gains read; placed with the plan's norms), and a sliding-window layer's
    attention and CPU top-k cover the window only; hand-counted on a 2-layer config whose first
    layer is local."""
    base = {"arch": "llama", "vocab_size": 100, "d_model": 64, "n_layers": 2, "n_heads": 4}
    base |= {"n_kv_heads": 2, "head_dim": 16, "d_ff": 128, "context_length": 256}
    gemma = base | {"arch": "gemma3", "qk_norm": True, "post_norms": True}
    gemma |= {"sliding_window": 8, "sliding_window_pattern": 2}
    T, W = 20, 8

    def ops(cfg, plan):
        return {
            (t["layer"], o["name"], t["name"].rsplit(".", 1)[-1]): o
            for t in socllm.task_graph(cfg, plan, T).to_json()["tasks"]
            for o in t["ops"]
        }

    llama, g = ops(base, "fp32"), ops(gemma, "fp32")
    rope = next(k for k in g if k[:2] == (0, "rope"))
    assert g[rope]["elements"] == llama[rope]["elements"] == T * (64 + 32)
    qk = next(k for k in g if k[:2] == (0, "qk_norm"))
    assert g[qk]["elements"] == T * (64 + 32) and g[qk]["op_class"] == "norm"
    assert g[qk]["weight_bytes"] == 2 * 16 * 4  # the q and k norm gains
    assert not any(k[1] == "qk_norm" for k in llama)
    post = [k for k in g if k[1] in ("post_attn_norm", "post_ffn_norm")]
    assert len(post) == 4 and all(g[k]["elements"] == T * 64 for k in post)
    assert all(g[k]["weight_bytes"] == 64 * 4 and g[k]["op_class"] == "norm" for k in post)
    res = [k for k in g if k[1] in ("attn_residual", "ffn_residual")]
    assert len(res) == 4 and all(g[k]["elements"] == T * 64 for k in res)
    # the plan's norm placement moves them: on the GPU the norms leave the CPU's subgraph tasks
    moved = socllm.task_graph(gemma, "fp32:norm=gpu/fp16", T).to_json()["tasks"]
    norms = [t for t in moved if any(o["name"] in ("qk_norm", "post_ffn_norm") for o in t["ops"])]
    assert norms and all(t["processor"] == "gpu" for t in norms)
    att = {k[0]: g[k] for k in g if k[1] == "attention"}
    assert (att[0]["elements"], att[1]["elements"]) == (W, T)  # local layer 0, global layer 1
    sparse = ops(gemma, "fp32:attention=sparse,keep=1")
    kept = {k[0]: o["elements"] for k, o in sparse.items() if k[1] == "sparse_attention"}
    assert kept == {0: sum(min(r + 1, W) for r in range(T)), 1: T * (T + 1) // 2}

    # Block-sparse in blocks of 4 positions: query block i ranks the key blocks from the one
    # holding its first row's first visible key to its own (prefill_attention.cpp), keeps
    # ceil(keep x that many), and each row attends at most the keys it sees.
    B = 4
    for keep in (1, 0.5):
        got = ops(gemma, f"fp32:attention=block-sparse,keep={keep},block={B}")
        for layer, window in ((0, W), (1, T)):
            blocks = [(i, i - max(0, B * i - window + 1) // B + 1) for i in range(T // B)]
            assert got[(layer, "qk_estimate", "h0")]["elements"] == sum(c for _, c in blocks)
            want = sum(
                min(r + 1, window, math.ceil(keep * c) * B)
                for i, c in blocks
                for r in range(B * i, B * i + B)
            )
            assert got[(layer, "sparse_attention", "h0")]["elements"] == want, (keep, layer)
    assert want < T * (T + 1) // 2  # keep=0.5 drops pairs on the global layer too
