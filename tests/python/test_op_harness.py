"""The op-by-op harness (issue 36): every op of the block both computes (`run`) and records what
it computes for the timing graph (`tasks`), in one loop. Here an engine call returns both what
each op's run did (its records: rows, widths, values transformed, the format it stored, the
processor whose numerics it computed, the weight bytes its prepared linear holds, the blocks a
partitioned linear computed, the keys sparse attention kept, the outlier channels a shadow
linear gathered) and the graph its ops recorded; this file checks, op by op, that the two say
the same, for every preset plan, a plan composing every technique, decoding steps, and Gemma 3.

The checks are written here from the records alone (not from the C++ builder), so a run that
computes something its tasks do not say fails: a partition executed but not timed, a linear's
weight bytes that differ from what its prepared weights hold, a decode step timed on another
processor than the one whose numerics ran, Gemma's norms missing from the graph."""

from __future__ import annotations

from collections import defaultdict

import pytest
import socllm
from socllm.calibration import (
    calibrate_act_scales,
    calibrate_outliers,
    calibrate_qk_scales,
    calibrate_smoothing,
    save_calibration,
)

pytestmark = pytest.mark.golden

# Every technique in one plan: EdgeFlow's 5-bit linears cut between the NPU and the CPU by the
# partition solver, shadowAttn's attention (uniform keep: head importance is a long step).
COMPOSED = "edgeflow:bits=5,partition=solver,attention=shadow-attn,ratios=uniform"
EXTRA = [
    COMPOSED,
    "w8a8:attention=gpu,norm=cpu",
    "shadow-outlier:pruning_rate=0",
    "fp32:attention=sparse,keep=0.3",
    "fp32:attention=block-sparse,keep=1,block=16",
    "w8a8:attention=npu-int8",
    "w4a16:linear=npu,partition=row,npu_share=0.5",
    "w4a16:linear=npu,partition=seq,decode=gpu",
    "w8a8:partition=hybrid",
    "w8-group:partition=solver,partner=cpu",
]


@pytest.fixture(scope="module")
def calibrated(smollm, small_calibration):
    smollm.load_calibration(small_calibration)
    yield smollm
    smollm.set_calibration(None)


@pytest.fixture(scope="module")
def ids(smollm, wikitext_text):
    return smollm.tokenize(wikitext_text[30000:40000])[:200]


def check(records: list[dict], graph, config: dict) -> int:
    """Asserts that every op a run did is what the graph recorded for it, and that the graph
    records no op of the block that did not run. Returns the ops checked."""
    tasks = graph.to_json()["tasks"]
    recorded = defaultdict(list)  # (chunk, layer, op) -> [(task, op desc)]
    for t in tasks:
        for o in t["ops"]:
            if t["layer"] >= 0 and t["kind"] not in ("shadow", "lm_head"):
                recorded[(t["chunk"], t["layer"], o["name"])].append((t, o))
    heads = config["n_heads"]
    ran = set()
    for r in records:
        key = (r["chunk"], r["layer"], r["op"])
        ran.add(key)
        where = f"{key}{' decode' if r['decode'] else ''}"
        got = recorded.get(key)
        if r["op"] == "attention" and not got:
            # a head-wise scheme: its tasks are per head (and per fused launch)
            att = [(t, o) for k, v in recorded.items() if k[:2] == key[:2] for t, o in v]
            att = [
                (t, o)
                for t, o in att
                if ".attention." in t["name"] and all(x["name"] != "rope" for x in t["ops"])
            ]
            assert att, f"{where}: the run computed attention, no task recorded it"
            if not r["kept"]:  # npu-int8: one NPU graph of the layer's attention
                assert {t["processor"] for t, o in att} == {r["processor"]}, where
                assert {o["dtype"] for t, o in att if o["name"] in ("qk", "pv")} == {"int8"}
                continue
            kept = [
                o for t, o in att if o["name"] in ("sparse_attention", "fused_sparse_attention")
            ]
            assert len(kept) == heads, where
            # the CPU stages run where the attention is placed (estimates: the NPU's launches)
            cpu_side = {t["processor"] for t, o in att if ".estimate." not in t["name"]}
            assert cpu_side == {r["processor"]}, where
            if r["real_rows"] == r["rows"]:  # padded chunks time the padding's keys too
                assert [o["elements"] for o in kept] == r["kept"], where
            continue
        assert got, f"{where}: the run computed {r['op']}, no task recorded it"
        if r["parts"]:
            assert len(got) == len(r["parts"]), f"{where}: parts run {r['parts']}, tasks {got}"
            for (t, o), p in zip(got, r["parts"], strict=True):
                assert t["processor"] == p["processor"], where
                assert o["n"] == p["cols"][1] - p["cols"][0], where
                assert o["m"] >= p["rows"][1] - p["rows"][0], where  # NPU graphs pad rows
                assert o["k"] == r["in_width"] and o["dtype"] == r["format"], where
            # the parts tile the output exactly
            area = sum(
                (p["rows"][1] - p["rows"][0]) * (p["cols"][1] - p["cols"][0]) for p in r["parts"]
            )
            assert area == r["rows"] * r["out_width"], where
            continue
        assert len(got) == 1, f"{where}: {len(got)} tasks hold the op"
        t, o = got[0]
        assert t["processor"] == r["processor"], f"{where}: ran on {r['processor']}, timed {t}"
        if o["op"] == "matmul":
            assert (o["m"], o["k"], o["n"]) == (r["rows"], r["in_width"], r["out_width"]), where
            assert o["dtype"] == r["format"], where
            assert o.get("weight_bytes", 0) == r["weight_bytes"], (where, o, r)
            shadow = [
                x
                for x in tasks
                if x["kind"] == "shadow"
                and x["name"].endswith(f".shadow.{r['op']}")
                and (x["chunk"], x["layer"]) == key[:2]
            ]
            if r["shadow_channels"] >= 0:
                assert len(shadow) == 1, where
                assert shadow[0]["ops"][0].get("k", 0) == r["shadow_channels"], where
            else:
                assert not shadow, where
        elif o["op"] == "attention":
            assert (o["m"], o["n"], o["elements"]) == (r["rows"], heads, r["kv_len"]), where
            assert o["dtype"] == r["format"], where
        else:  # element-wise
            assert o["elements"] == r["elements"], where
            assert o["dtype"] == r["format"], where
            assert o.get("weight_bytes", 0) == r["weight_bytes"], where
    block_ops = {op["name"] for op in socllm.decoder_block(config)}
    timed = {k for k in recorded if k[2] in block_ops}
    assert timed <= ran | {k[:2] + ("attention",) for k in ran}, sorted(timed - ran)[:5]
    return len(records)


def run_and_check(model, ids, plan, chunk, decode):
    r = model.prefill(
        ids, plan, chunk_len=chunk, return_graph=True, decode_tokens=decode, return_records=True
    )
    n = check(r["records"], r["graph"], model.config)
    steps = {x["chunk"] for x in r["records"] if x["decode"]}
    assert len(steps) == decode
    return n


@pytest.mark.parametrize("plan", socllm.Plan.known() + EXTRA)
def test_every_op_ran_as_its_tasks_say(calibrated, ids, plan):
    for prompt_len, chunk, decode in ((40, None, 2), (40, 32, 1)):
        assert run_and_check(calibrated, ids[:prompt_len], plan, chunk, decode) > 0


def test_composed_plan_partitions_and_sparse_attention(calibrated, ids):
    """The composed plan runs its INT8 linears as the solver's partitions (NPU parts and, for
    INT8, the CPU as partner: the GPU has no INT8 path), shadowAttn's head-wise tasks, and
    decodes on the CPU; the partitions are in the graph's meta. A forced row cut puts columns
    on the CPU in the numerics and in the graph alike."""
    r = calibrated.prefill(
        ids[:64], COMPOSED, return_graph=True, decode_tokens=1, return_records=True
    )
    cut = [x for x in r["records"] if x["parts"]]
    assert cut and {p["processor"] for x in cut for p in x["parts"]} <= {"npu", "cpu"}
    names = {t["name"] for t in r["graph"].to_json()["tasks"]}
    assert any(".attention.estimate." in n for n in names)
    decode = [x for x in r["records"] if x["decode"]]
    assert decode and {x["processor"] for x in decode} == {"cpu"}
    meta = r["graph"].meta["partitions"]
    assert {p["site"] for p in meta} == {"qkv", "o_proj", "gate_up", "down"}
    row = "edgeflow:bits=5,partition=row,npu_share=0.5,attention=shadow-attn,ratios=uniform"
    r = calibrated.prefill(ids[:64], row, return_graph=True, return_records=True)
    check(r["records"], r["graph"], calibrated.config)
    assert {p["processor"] for x in r["records"] for p in x["parts"]} == {"npu", "cpu"}


def test_a_harness_that_can_fail(calibrated, ids):
    """The checks catch a run and a graph that disagree: the records of a partitioned plan
    against the graph of the same plan without its partition."""
    r = calibrated.prefill(
        ids[:40],
        "w4a16:linear=npu,partition=row,npu_share=0.5",
        return_records=True,
        decode_tokens=0,
    )
    other = calibrated.task_graph("w4a16:linear=npu", 40, None)
    with pytest.raises(AssertionError, match="parts run"):
        check(r["records"], other, calibrated.config)


def test_gemma3_norms_and_window(gemma, wikitext_text):
    """Gemma 3's q/k norms and post-norms are norm ops (timed where the plan puts norms), and a
    sliding-window layer's attention covers its window."""
    ids = gemma.tokenize(wikitext_text[:4000])[:48]
    floats = "norm=fp32,activation=fp32,residual=fp32,rope=fp32,attention=fp32,lm_head=cpu/fp32"
    for plan in ("fp32", "fp32:attention=sparse,keep=0.5", f"hetero-tensor:{floats}"):
        r = gemma.prefill(ids, plan, return_graph=True, decode_tokens=1, return_records=True)
        check(r["records"], r["graph"], gemma.config)
        ops = {x["op"] for x in r["records"]}
        assert {"qk_norm", "post_attn_norm", "post_ffn_norm"} <= ops
    # a prompt past the sliding window: local layers attend over the window, global ones over
    # the whole prompt (Gemma 3: five local layers, then a global one)
    window = gemma.config["sliding_window"]
    long_ids = gemma.tokenize(wikitext_text[:20000])[: window + 40]
    assert len(long_ids) == window + 40
    r = gemma.prefill(
        long_ids, "fp32:norm=cpu/fp16,attention=cpu/fp32", return_graph=True, return_records=True
    )
    check(r["records"], r["graph"], gemma.config)
    qk = [x for x in r["records"] if x["op"] == "qk_norm"]
    assert qk and all(x["format"] == "fp16" for x in qk)
    att = {x["layer"]: x["kv_len"] for x in r["records"] if x["op"] == "attention"}
    assert att[0] == window and att[5] == len(long_ids)


@pytest.mark.parametrize("plan", ["w8a8", "w8a8-perchannel", "smoothquant", "edgeflow:bits=5"])
def test_partitioned_integer_linears_are_bit_identical(calibrated, ids, plan):
    """A linear cut between the NPU and the CPU computes its INT8 blocks exactly (integer
    products, per-column epilogues): the partitioned plan's logits equal the whole linears' bit
    for bit, prompt and decoding step alike (PreparedLinear::forward_block)."""
    sep = "," if ":" in plan else ":"
    cut = f"{plan}{sep}partition=row,npu_share=0.5,decode=same"
    whole = f"{plan}{sep}decode=same"
    a = calibrated.prefill(ids[:70], whole, all_positions=True, decode_tokens=2)
    b = calibrated.prefill(ids[:70], cut, all_positions=True, decode_tokens=2, return_records=True)
    assert any(r["parts"] and r["decode"] for r in b["records"])  # decoding steps cut too
    assert any(p["processor"] == "cpu" for r in b["records"] for p in r["parts"])
    import numpy as np

    np.testing.assert_array_equal(a["logits"], b["logits"])
    assert a["decoded"] == b["decoded"]


# Gemma 3's residual stream overflows fp16 (docs/RESULTS.md, issue 16): it stays fp32 on the CPU,
# as does the LM head (the plans' other placements are kept).
GEMMA_FLOATS = "residual=cpu/fp32,lm_head=cpu/fp32"


@pytest.mark.slow
@pytest.mark.parametrize("plan", socllm.Plan.known() + EXTRA)
def test_every_op_ran_as_its_tasks_say_on_gemma3(gemma, wikitext_text, tmp_path_factory, plan):
    """The same harness on Gemma 3 (QK-norm, post-norms, sliding windows, GeGLU) for every
    preset and the composed plan, with its residual in fp32."""
    path = tmp_path_factory.getbasetemp() / "gemma-harness.h5"
    if not path.exists():
        cal = calibrate_act_scales(gemma, samples=2, seqlen=64, seed=2, progress=False)
        calibrate_outliers(gemma, cal, progress=False)
        calibrate_smoothing(gemma, cal, smoothing_windows=1, smoothing_rows=32, progress=False)
        calibrate_qk_scales(gemma, cal, samples=2, seqlen=64, progress=False)
        save_calibration(path, cal, gemma)
    gemma.load_calibration(path)
    try:
        ids = gemma.tokenize(wikitext_text[:4000])[:40]
        sep = "," if ":" in plan else ":"
        for chunk, decode in ((None, 1), (32, 1)):
            assert run_and_check(gemma, ids, f"{plan}{sep}{GEMMA_FLOATS}", chunk, decode) > 0
    finally:
        gemma.set_calibration(None)
