"""shadowAttn's sparse attention (seed 000) against numpy references, the engine and
transformers: kernels, bucket choice, plans on the real model, capture, the calibration steps."""

from __future__ import annotations

from collections import defaultdict

import h5py
import numpy as np
import pytest
import socllm
from socllm.calibration import load_calibration, run_steps, save_calibration
from socllm.sim import head_pipeline as hp

ops = socllm.ops
RNG = np.random.default_rng(0)


def _inputs(H=6, G=2, T=45, hd=16, past=0, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((H, T, hd)).astype(np.float32)
    k = rng.standard_normal((G, past + T, hd)).astype(np.float32)
    v = rng.standard_normal((G, past + T, hd)).astype(np.float32)
    return q, k, v


def _np_attention(q, k, v, keep_mask, past=0):
    """fp32-in-float64 attention of each row over the keys keep_mask [H, T, L] allows."""
    H, T, hd = q.shape
    g = H // k.shape[0]
    out = np.zeros(q.shape, np.float64)
    for h in range(H):
        s = q[h].astype(np.float64) @ k[h // g].T.astype(np.float64) / np.sqrt(hd)
        s = np.where(keep_mask[h] > 0, s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        out[h] = (p / p.sum(1, keepdims=True)) @ v[h // g]
    return out


def _causal(H, T, L, past):
    return np.broadcast_to(np.arange(L)[None, :] <= past + np.arange(T)[:, None], (H, T, L))


def _np_topk(scores, k):
    """Indices of the k largest, ties to the earlier index (a stable sort of -scores)."""
    return np.sort(np.argsort(-scores, kind="stable")[:k])


@pytest.mark.parametrize("past", [0, 17])
def test_sparse_selects_numpy_topk_and_attends_exactly(past):
    q, k, v = _inputs(past=past)
    H, T, hd = q.shape
    r = ops.prefill_attention(q, k, v, "sparse:keep=0.3", past=past, trace=True)
    sel = r["selected"].astype(bool)
    g = H // k.shape[0]
    for h in range(H):
        s = q[h] @ k[h // g].T
        for t in range(T):
            vis = past + t + 1
            want = _np_topk(s[t, :vis], ops.keys_kept(vis, 0.3))
            np.testing.assert_array_equal(np.flatnonzero(sel[h, t]), want)
    np.testing.assert_allclose(r["out"], _np_attention(q, k, v, sel, past), atol=2e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_topk_rows_equals_numpy_topk_row_by_row(dtype):
    """The engine's row-after-row selection (each row's band predicted from the previous row)
    against numpy's stable top-k: correlated causal rows as a prefill block has them, a jump in
    the scores' scale half-way (the prediction misses), ties, and rows shorter than the band
    path takes."""
    rng = np.random.default_rng(3)
    rows, n = 300, 900
    base = rng.standard_normal(n) * 1000
    s = base[None, :] + rng.standard_normal((rows, n)) * 150
    s[rows // 2 :] *= 7  # the scale jumps: the predicted band misses
    s = np.round(s / 40) * 40 if dtype == np.int32 else s  # ties at the threshold
    s = s.astype(dtype)
    visible = np.minimum(np.arange(rows) * 3 + 1, n)
    k = np.maximum(1, (visible * 0.2).round().astype(np.int64))
    idx, offs = ops.topk_rows(s, visible, k)
    assert offs[0] == 0 and offs[-1] == len(idx) and np.all(np.diff(offs) == k)
    for i in range(rows):
        want = _np_topk(s[i, : visible[i]], int(k[i]))
        np.testing.assert_array_equal(idx[offs[i] : offs[i + 1]], want, err_msg=f"row {i}")
    with pytest.raises(socllm.ShapeError, match="one entry per row"):
        ops.topk_rows(s, visible[:-1], k)
    with pytest.raises(socllm.InvalidArgumentError, match=r"visible\[0\] = 901"):
        ops.topk_rows(s, np.full(rows, n + 1), k)
    with pytest.raises(socllm.ShapeError, match="2-D"):
        ops.topk_rows(s[0], visible[:1], k[:1])


def test_keep_one_gives_full_attention_for_every_kind():
    q, k, v = _inputs(past=9)
    full = ops.prefill_attention(q, k, v, "fp32", past=9)
    H, T, _ = q.shape
    np.testing.assert_allclose(
        full, _np_attention(q, k, v, _causal(H, T, k.shape[1], 9), 9), atol=2e-6
    )
    for scheme in (
        "sparse:keep=1",
        "block-sparse:keep=1,block=16",
        "shadow-attn:keep=1,scales=dynamic,ratios=uniform",
    ):
        np.testing.assert_allclose(
            ops.prefill_attention(q, k, v, scheme, past=9), full, atol=2e-6, err_msg=scheme
        )


def _window(H, T, L, past, window):
    """Gemma 3's sliding window: the query at position p sees keys p - window + 1 .. p."""
    pos, key = past + np.arange(T)[:, None], np.arange(L)[None, :]
    return np.broadcast_to((key <= pos) & (key > pos - window), (H, T, L))


@pytest.mark.parametrize("past", [0, 23])
def test_every_kind_respects_the_sliding_window(past):
    """On a sliding-window layer every scheme selects among, keeps a ratio of and normalizes
    over the window's keys only: fp32 equals numpy's windowed attention, the keep=1 schemes
    equal fp32, and the sparse kinds' selections lie inside the window with the window's
    count of keys."""
    W = 12
    q, k, v = _inputs(T=40, past=past)
    H, T, _ = q.shape
    L = k.shape[1]
    mask = _window(H, T, L, past, W)
    full = ops.prefill_attention(q, k, v, "fp32", past=past, window=W)
    np.testing.assert_allclose(full, _np_attention(q, k, v, mask, past), atol=2e-6)
    for scheme in (
        "sparse:keep=1",
        "block-sparse:keep=1,block=8",
        "shadow-attn:keep=1,scales=dynamic,ratios=uniform",
    ):
        got = ops.prefill_attention(q, k, v, scheme, past=past, window=W)
        np.testing.assert_allclose(got, full, atol=2e-6, err_msg=scheme)
    visible = mask[0].sum(1)
    for scheme in ("sparse:keep=0.3", "shadow-attn:keep=0.3,scales=dynamic,ratios=uniform"):
        sel = ops.prefill_attention(q, k, v, scheme, past=past, window=W, trace=True)["selected"]
        assert not (sel.astype(bool) & ~mask).any(), scheme
        want = [ops.keys_kept(int(n), 0.3) for n in visible]
        np.testing.assert_array_equal(sel.sum(2), np.broadcast_to(want, (H, T)), err_msg=scheme)
    # certified shadow-attn rescored inside the window: exactly fp32's top-k of the window
    picks = [
        ops.prefill_attention(q, k, v, sch, past=past, window=W, trace=True)["selected"]
        for sch in ("sparse:keep=0.3", "shadow-attn:keep=0.3,scales=dynamic,certified=1")
    ]
    np.testing.assert_array_equal(picks[0], picks[1])
    # block-sparse: inside the window, the diagonal block always kept
    sel = ops.prefill_attention(
        q, k, v, "block-sparse:keep=0.3,block=8", past=past, window=W, trace=True
    )["selected"].astype(bool)
    assert not (sel & ~mask).any() and sel[:, np.arange(T), past + np.arange(T)].all()
    # npu-int8 near the windowed fp32 (its own rounding), far from the unwindowed result
    scales = [float(np.abs(x).max() / 127) for x in (q, k)] + [float(np.abs(v).max() / 127)]
    npu = ops.prefill_attention(q, k, v, "npu-int8", past=past, window=W, static_qkv=scales)
    err = np.abs(npu - full).max()
    assert err < 0.1 < np.abs(npu - ops.prefill_attention(q, k, v, "fp32", past=past)).max()
    with pytest.raises(socllm.ShapeError, match="window -1"):
        ops.prefill_attention(q, k, v, "fp32", past=past, window=-1)


def test_shadow_attn_bucket_and_int8_estimate_match_numpy():
    q, k, v = _inputs(seed=3)
    H, T, hd = q.shape
    g = H // k.shape[0]
    offsets = np.array(ops.bucket_offsets(9))
    lam_q = np.abs(q).max(axis=(1, 2)) / 127 * 0.8  # calibration means off the input's own
    lam_k = np.abs(k).max(axis=(1, 2)) / 127 * 1.7
    bq = (lam_q[:, None] * 0.5 ** offsets[None, :, 0]).astype(np.float32)
    bk = (lam_k[np.arange(H) // g][:, None] * 0.5 ** offsets[None, :, 1]).astype(np.float32)
    r = ops.prefill_attention(
        q, k, v, "shadow-attn:keep=0.25,ratios=uniform", bucket_q=bq.ravel(),
        bucket_k=bk.ravel(), trace=True,
    )  # fmt: skip
    for h in range(H):
        own = np.array([np.abs(q[h]).max() / 127, np.abs(k[h // g]).max() / 127])
        mse = ((np.stack([bq[h], bk[h]], 1) - own) ** 2).mean(1)
        b = int(np.argmin(mse))
        assert r["bucket"][h] == b
        q8 = np.clip(np.round(q[h] / bq[h, b]), -127, 127).astype(np.int64)
        k8 = np.clip(np.round(k[h // g] / bk[h, b]), -127, 127).astype(np.int64)
        s = q8 @ k8.T
        for t in range(T):
            want = _np_topk(s[t, : t + 1], ops.keys_kept(t + 1, 0.25))
            np.testing.assert_array_equal(np.flatnonzero(r["selected"][h, t]), want)
    np.testing.assert_allclose(r["out"], _np_attention(q, k, v, r["selected"]), atol=2e-6)


@pytest.mark.parametrize("past,window", [(0, 0), (30, 0), (0, 150)])
def test_shadow_attn_fused_topk_selects_the_numpy_int8_top_k(past, window):
    """topk=fused (the top-k fused into the estimate's key tiles) selects what the INT8 scores'
    stable top-k selects, and what topk=rows does, on rows long enough for its bands."""
    rng = np.random.default_rng(8)
    H, G, T, hd = 3, 1, 420, 32
    # queries drifting slowly, as consecutive positions do: the fused band holds for most rows
    q = np.cumsum(rng.standard_normal((H, T, hd)), 1) * 0.2 + rng.standard_normal((H, T, hd))
    q = q.astype(np.float32)
    k = rng.standard_normal((G, past + T, hd)).astype(np.float32) + 0.5
    v = rng.standard_normal((G, past + T, hd)).astype(np.float32)
    scheme = "shadow-attn:keep=0.2,ratios=uniform,scales=dynamic"
    kw = {"past": past, "window": window, "trace": True}
    fused = ops.prefill_attention(q, k, v, scheme + ",topk=fused", **kw)
    rows = ops.prefill_attention(q, k, v, scheme, **kw)
    np.testing.assert_array_equal(fused["selected"], rows["selected"])
    np.testing.assert_array_equal(fused["out"], rows["out"])
    k8 = np.clip(np.round(k[0] / (np.abs(k[0]).max() / 127)), -127, 127).astype(np.int64)
    for h in range(H):
        q8 = np.clip(np.round(q[h] / (np.abs(q[h]).max() / 127)), -127, 127).astype(np.int64)
        s = q8 @ k8.T
        for t in range(0, T, 7):
            vis = past + t + 1
            lo = max(0, vis - window) if window else 0
            want = lo + _np_topk(s[t, lo:vis], ops.keys_kept(vis - lo, 0.2))
            np.testing.assert_array_equal(np.flatnonzero(fused["selected"][h, t]), want)
    assert all(f > T // 2 for f in fused["fused_rows"])  # most rows ran fused
    assert all(0 <= m < f for m, f in zip(fused["missed_rows"], fused["fused_rows"], strict=True))
    assert rows["fused_rows"] == [0] * H
    with pytest.raises(socllm.InvalidArgumentError, match="topk=fused keeps no row's scores"):
        ops.prefill_attention(q, k, v, scheme + ",topk=fused,certified=1", past=past)


@pytest.mark.parametrize("scale", [1.0, 0.3, 4.0])  # own, clamping (too fine), too coarse
def test_certified_shadow_attn_selects_the_fp32_top_k(scale):
    q, k, v = _inputs(T=96, hd=32, past=20, seed=5)
    q[:, ::7] *= 6  # rows with large values: with scale 0.3 they clamp
    H, T, hd = q.shape
    g = H // k.shape[0]
    bq = np.abs(q).max(axis=(1, 2)) / 127 * scale
    bk = np.abs(k).max(axis=(1, 2))[np.arange(H) // g] / 127 * scale
    kw = {"past": 20, "bucket_q": bq, "bucket_k": bk, "trace": True}
    scheme = "shadow-attn:keep=0.2,ratios=uniform,buckets=1"
    est = ops.prefill_attention(q, k, v, scheme, **kw)
    cert = ops.prefill_attention(q, k, v, scheme + ",certified=1", **kw)
    want = np.zeros_like(cert["selected"])
    for h in range(H):
        s = q[h].astype(np.float64) @ k[h // g].T.astype(np.float64)
        for t in range(T):
            vis = 20 + t + 1
            want[h, t, _np_topk(s[t, :vis], ops.keys_kept(vis, 0.2))] = 1
    np.testing.assert_array_equal(cert["selected"], want)
    assert (est["selected"] != want).any()  # the plain INT8 estimate misses some keys
    causal = T * 20 + T * (T + 1) // 2
    assert all(want[h].sum() < r <= causal for h, r in enumerate(cert["rescored"]))
    # the x6 rows score up to ~25: fp32 rounding of the score (~1e-6, more with the BLAS's
    # summation order on some CPUs) goes through exp into the output, so a looser bound
    np.testing.assert_allclose(cert["out"], _np_attention(q, k, v, want, 20), atol=5e-6)


def test_block_sparse_keeps_the_diagonal_and_the_best_pooled_blocks():
    q, k, v = _inputs(T=64, seed=4)
    H, T, hd = q.shape
    B, keep = 8, 0.4
    r = ops.prefill_attention(q, k, v, f"block-sparse:keep={keep},block={B}", trace=True)
    g = H // k.shape[0]
    kp = k.reshape(k.shape[0], T // B, B, hd).mean(2)
    for h in range(H):
        for qb in range(T // B):
            qp = q[h, qb * B : (qb + 1) * B].mean(0)
            kept = ops.keys_kept(qb + 1, keep, 1)
            blocks = set(_np_topk(kp[h // g, :qb] @ qp, kept - 1)) | {qb}
            for t in range(qb * B, (qb + 1) * B):
                want = [j for j in range(t + 1) if j // B in blocks]
                np.testing.assert_array_equal(np.flatnonzero(r["selected"][h, t]), want)


def test_npu_int8_is_close_to_fp32_and_degrades_with_coarse_scales():
    q, k, v = _inputs(seed=5)
    full = ops.prefill_attention(q, k, v, "fp32")
    scales = [np.abs(x).max() / 127 for x in (q, k, v)]
    out = ops.prefill_attention(q, k, v, "npu-int8", static_qkv=scales)
    err = np.linalg.norm(out - full) / np.linalg.norm(full)
    coarse = ops.prefill_attention(q, k, v, "npu-int8", static_qkv=[s * 8 for s in scales])
    assert err < 0.06
    assert np.linalg.norm(coarse - full) / np.linalg.norm(full) > 2 * err


def test_head_ratios_mean_is_keep(smollm):
    h = RNG.random((30, 9)).astype(np.float32) - 0.1
    layer = RNG.random(30).astype(np.float32)
    r = ops.head_keep_ratios(h, layer, 0.2)
    assert r.shape == (30, 9) and np.all((r >= 0) & (r <= 1))
    assert abs(r.mean() - 0.2) < 1e-9
    # a head whose removal did not hurt gets the clamp's floor, the smallest ratio
    assert np.allclose(r[h <= 0], r.min())


# -- the engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_ids(smollm, wikitext_text):
    return smollm.tokenize(wikitext_text[:6000])[:300]


def test_keep_one_plans_equal_fp32_and_decode_stays_full(smollm, text_ids):
    ref = smollm.logits(text_ids, "fp32")
    for plan in (
        "fp32:attention=sparse,keep=1.0",
        "fp32:attention=shadow-attn,keep=1.0,scales=dynamic,ratios=uniform",
        "fp32:attention=block-sparse:keep=1.0",
    ):
        np.testing.assert_allclose(smollm.logits(text_ids, plan), ref, atol=2e-3, err_msg=plan)
    sparse = "fp32:attention=sparse,keep=0.1"
    assert np.abs(smollm.logits(text_ids, sparse) - ref).max() > 0.1  # it does change prefill
    # decode (one token on a filled cache) runs full attention whatever the scheme
    outs = []
    for plan in ("fp32", sparse):
        cache = smollm.new_cache(len(text_ids) + 1)
        smollm.step(cache, text_ids, plan="fp32")
        outs.append(smollm.step(cache, [text_ids[0]], plan=plan))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_chunked_prefill_sees_all_keys_so_far(smollm, text_ids):
    # sparse selection is per row over its causal keys, so chunking changes nothing
    whole = smollm.logits(text_ids[:256], "fp32:attention=sparse,keep=0.2")
    chunked = smollm.prefill(
        text_ids[:256], "fp32:attention=sparse,keep=0.2,chunk_len=64", all_positions=True
    )
    np.testing.assert_allclose(chunked, whole, atol=2e-3)


def test_capture_and_calibration_steps_round_trip(smollm, text_ids, tmp_path):
    got = smollm.capture(text_ids[:40], 2, what=("q", "k", "v"))
    assert got["q"].shape == (9, 40, 64) and got["k"].shape == (3, 40, 64)
    # fp32 attention from the captured tensors equals the kernel's
    out = ops.prefill_attention(got["q"], got["k"], got["v"], "fp32")
    np.testing.assert_allclose(
        out, _np_attention(got["q"], got["k"], got["v"], _causal(9, 40, 40, 0)), atol=1e-5
    )
    data = run_steps(smollm, "qk-scales", progress=False, samples=3, seqlen=64, seed=1)
    qa = data.stats.array("q_absmax")
    assert qa.shape == (3, 30, 9) and data.stats.array("k_absmax").shape == (3, 30, 3)
    # the first window's layer-2 scales equal the captured tensors' own
    from socllm.calibration import calibration_windows, corpus_tokens

    w0 = calibration_windows(corpus_tokens(smollm, "wikitext2"), 3, 64, 1)[0]
    c0 = smollm.capture(w0, 2, what=("q", "k"))
    np.testing.assert_allclose(qa[0, 2], np.abs(c0["q"]).max(axis=(1, 2)), rtol=1e-6)
    data = run_steps(
        smollm, "head-importance", data=data, progress=False, importance_samples=1,
        importance_seqlen=24,
    )  # fmt: skip
    hi = data.stats.array("head_importance")
    assert hi.shape == (30, 9) and np.isfinite(hi).all()
    path = save_calibration(tmp_path / "attn.h5", data, smollm)
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["head_importance"][()], hi)
        assert f["q_absmax"].shape == (3, 30, 9) and "act_absmax" not in f
    back = load_calibration(path, smollm)
    np.testing.assert_array_equal(back.stats.array("layer_importance"), data.stats.array(
        "layer_importance"))  # fmt: skip
    smollm.set_calibration(back.stats)
    try:
        consts = smollm.attention_constants("fp32:attention=shadow-attn,keep=0.2")
        assert len(consts) == 30 and len(consts[0]["bucket_q"]) == 9 * 9
        ratios = np.array([c["head_ratio"] for c in consts])
        np.testing.assert_allclose(ratios.mean(), 0.2, atol=1e-9)
        lq = (qa / 127).mean(0)  # bucket 0 is the mean scale of each head
        np.testing.assert_allclose([c["bucket_q"][0] for c in consts], lq[:, 0], rtol=1e-5)
        npu = smollm.attention_constants("fp32:attention=npu-int8")[4]
        assert npu["static_q"] == pytest.approx(qa[:, 4].max() / 127, rel=1e-6)
        smollm.logits(text_ids[:50], "fp32:attention=shadow-attn")  # runs end to end
        # the graph a prefill records is timed with what the engine ran: Eq. 3's ratio of each
        # head (its sparse-attention pairs) and the bucket each head's input chose (launches)
        ids = text_ids[:48]
        plan = "fp32:attention=shadow-attn,keep=0.2"
        scaled = back.stats.array("q_absmax")
        scaled[:, 0, :3] *= 8  # layer 0's heads 0-2 now choose another bucket than the rest
        back.stats.set_array("q_absmax", None, scaled)
        smollm.set_calibration(back.stats)
        consts = smollm.attention_constants(plan)
        _, graph = smollm.prefill(ids, plan, return_graph=True)
        _, certified = smollm.prefill(ids, plan + ",certified=1", return_graph=True)
        tasks = graph.to_json()["tasks"]
        caps = smollm.capture(ids, list(range(30)), what=("q", "k", "v"))
        rescored, rescored_l0 = 0, 0
        for layer, (c, cap) in enumerate(zip(consts, caps, strict=True)):
            chosen, rescore = (
                ops.prefill_attention(
                    cap["q"], cap["k"], cap["v"], f"shadow-attn:keep=0.2,certified={cert}",
                    head_ratio=c["head_ratio"], bucket_q=c["bucket_q"], bucket_k=c["bucket_k"],
                    trace=True,
                )[key]
                for cert, key in ((0, "bucket"), (1, "rescored"))
            )  # fmt: skip
            rescored += sum(rescore)
            if layer == 0:  # later layers' inputs differ from fp32's under the sparse plan
                rescored_l0 = sum(rescore)
                est = [t for t in tasks if t["layer"] == 0 and t["kind"] == "estimate"]
                assert [t["heads"] for t in est] == hp.fuse_launches(chosen, 4)
                assert len(set(chosen[:3]) | {chosen[3]}) == 2
            for t in tasks:
                if t["layer"] == layer and t["kind"] == "sparse_attention":
                    r = c["head_ratio"][t["heads"][0]]
                    kept = sum(ops.keys_kept(v, r, 1) for v in range(1, len(ids) + 1))
                    assert t["ops"][0]["elements"] == kept
        # certified: each layer's top-k tasks rescore the share of causal pairs the engine
        # rescored in that layer: layer 0 as on fp32's inputs, the mean over layers near the
        # share on fp32's (the plan's own inputs differ a little after layer 0)
        causal = len(ids) * (len(ids) + 1) // 2
        share = rescored / (30 * 9 * causal)
        per_layer = defaultdict(set)
        for t in certified.to_json()["tasks"]:
            if t["kind"] == "topk":
                per_layer[t["layer"]].add(t["ops"][1]["elements"])
        assert all(len(v) == 1 for v in per_layer.values())  # one share per layer
        got = {layer: v.pop() for layer, v in per_layer.items()}
        assert got[0] == round(rescored_l0 / 9)
        mean = sum(got.values()) / (30 * causal)
        assert 0 < mean == pytest.approx(share, rel=0.2)
        assert all(
            t["ops"][1]["name"] == "rescore"
            for t in certified.to_json()["tasks"]
            if t["kind"] == "topk"
        )
    finally:
        smollm.set_calibration(None)


def test_bad_input_is_a_clear_error(smollm, text_ids):
    bad = [
        ("fp32:attention=sparse,keep=0", "keep must be in"),
        ("fp32:attention=sparse,keep=1.2", "1.2"),
        ("fp32:attention=shadow-attn,buckets=0", "buckets must be"),
        ("fp32:attention=shadow-attn,step=0", "step must be"),
        ("fp32:attention=sparse,buckets=3", "no option 'buckets'"),
        ("fp32:keep=0.2", "attention scheme"),
    ]
    for plan, match in bad:
        with pytest.raises(socllm.InvalidArgumentError, match=match):
            smollm.logits(text_ids[:8], plan)
    smollm.set_calibration(None)
    with pytest.raises(socllm.InvalidArgumentError, match="--steps head-importance"):
        smollm.logits(text_ids[:8], "fp32:attention=shadow-attn,scales=dynamic")
    with pytest.raises(socllm.InvalidArgumentError, match="--steps qk-scales"):
        smollm.logits(text_ids[:8], "fp32:attention=npu-int8")
    with pytest.raises(socllm.InvalidArgumentError, match="layer 30 outside"):
        smollm.capture(text_ids[:8], 30)
    with pytest.raises(socllm.InvalidArgumentError, match="what must name"):
        smollm.capture(text_ids[:8], 0, what=("x",))
    q, k, v = _inputs()
    with pytest.raises(socllm.ShapeError, match="keys for past"):
        ops.prefill_attention(q, k, v, "fp32", past=3)
