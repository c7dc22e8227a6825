#!/usr/bin/env python3
"""Host speed of the sparse prefill attention next to the engine's dense fp32 attention, in one
run on this machine (issue 13 item 6; seed 000 §5 keeps 20% of the keys).

One layer of SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64) on real post-RoPE Q/K/V: one
fp32 run over a WikiText-2 held-out window of the longest length (``m.capture``), its prefixes
for the shorter lengths (causal attention: a prefix's Q/K/V are the prefix run's). Each variant is
``ops.prefill_attention`` on the same arrays; the variants are interleaved within every
repetition, in a rotated order, so load on the shared cores hits them alike:

* ``fp32``: C/G-Full, the engine's dense kernel (the peer; flash-style blocks, register-tiled
  Q·Kᵀ and P·V micro-kernels, online softmax);
* ``sparse``: C/G-Sparse, fp32 Q·Kᵀ estimate, per-row top-k, attention over the kept keys;
* ``shadow-attn``: INT8 Q·Kᵀ estimate (each head's own scale: ``scales=dynamic``, same work as
  the bucketed plan), top-k on the int32 scores, fp32 attention over the kept keys (§3.2);
* ``shadow-fused``: shadow-attn with ``topk=fused``, the top-k fused into the estimate's key
  tiles (same selection, host execution only);
* ``certified``: shadow-attn with certified top-k (the uncertain band rescored in fp32);
* ``block-sparse``: C/G-Block-Sparse, 64x64 mean-pooled estimate, block top-k;
* ``npu-int8``: NPU-Full, dense INT8 Q·Kᵀ and P·V with static scales (here the tensors' own
  absmax/127, as calibration would give);
* ``torch-sdpa`` (if torch is installed; ``--no-torch`` leaves it out): torch's
  ``scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` on the same arrays with the
  same thread count, the outside peer of ``fp32`` (issue 16 item 6). Each row also gives
  ``fp32``'s GFLOP/s over the T (T + 1) / 2 causal pairs.

Speed-up = fp32 time / variant time of the same repetition (median over repetitions); above 1
is faster. The binding copies the head-major arrays into the engine's row layout and back on
every call, in every socllm variant alike (its cost is estimated and printed; torch-sdpa has
none, so its ratio slightly favours torch).

The shadow-attn breakdown (``--breakdown``, on by default) is a separate measurement on ONE
thread: the engine's shadow-attn total, then its INT8 GEMMs and its top-k issued block by block
from Python on the same shapes, net of the measured per-call Python overhead. The GEMMs: the
engine's 128-row blocks against their causal keys, each KV head's INT8 keys packed once as the
engine packs them (the packing is not timed; ``n_cols`` computes the causal prefix). The top-k:
``ops.topk_rows``, the row-after-row hinted selection the engine runs. The remainder (sparse
attention over the kept keys, quantization and packing, layout copies) is the total minus those
two.

    python scripts/bench_attention.py --json docs/results/bench_attention.json
    python scripts/bench_attention.py --quick --synthetic     # seconds, random tensors
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# Before the import of socllm: its OpenMP runtime reads this once (socllm.set_num_threads then
# sets OpenMP and OpenBLAS alike, as scripts/bench_engine.py does).
os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import socllm  # noqa: E402
from socllm.eval.bench_utils import cpu_family_model, cpu_model, machine_line  # noqa: E402
from socllm.io.files import check_output_path, emit_json  # noqa: E402

ops = socllm.ops
# SmolLM2-135M's attention shape (the default model's config; --synthetic uses it too).
N_HEADS, N_KV_HEADS, HEAD_DIM = 9, 3, 64
TORCH = "torch-sdpa"  # the peer of the engine's dense kernel
ROW_BLOCK = 128  # shadow-attn's query rows per estimation GEMM (attention/common.h kSelectRowBlock)


def variants(keep: float) -> dict[str, str]:
    return {
        "fp32": "fp32",
        "sparse": f"sparse:keep={keep}",
        "shadow-attn": f"shadow-attn:keep={keep},scales=dynamic,ratios=uniform",
        "shadow-fused": f"shadow-attn:keep={keep},scales=dynamic,ratios=uniform,topk=fused",
        "certified": f"shadow-attn:keep={keep},scales=dynamic,ratios=uniform,certified=1",
        "block-sparse": f"block-sparse:keep={keep}",
        "npu-int8": "npu-int8",
    }


def real_qkv(model: str, layer: int, tokens: int, quiet: bool):
    """A layer's Q [H, T, hd], K/V [Hkv, T, hd] of one fp32 run over a WikiText-2 held-out
    window (the text evaluation never calibrates on)."""
    from socllm.calibration import corpus_tokens, held_out_tokens

    m = socllm.load(model, progress=not quiet)
    cfg = m.config
    shape = (cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"])
    if tokens > cfg["context_length"]:
        raise SystemExit(f"bench_attention: {tokens} tokens exceed the model's context")
    ids = held_out_tokens(corpus_tokens(m, "wikitext2"))[:tokens]
    if len(ids) < tokens:
        raise SystemExit(f"bench_attention: only {len(ids)} held-out WikiText-2 tokens")
    c = m.capture(ids, layer, what=("q", "k", "v"))
    return c["q"], c["k"], c["v"], shape, f"WikiText-2 held-out, layer {layer}"


def synthetic_qkv(tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((N_HEADS, tokens, HEAD_DIM), dtype=np.float32)
    k = rng.standard_normal((N_KV_HEADS, tokens, HEAD_DIM), dtype=np.float32)
    v = rng.standard_normal((N_KV_HEADS, tokens, HEAD_DIM), dtype=np.float32)
    return q, k, v, (N_HEADS, N_KV_HEADS, HEAD_DIM), "synthetic N(0, 1)"


def static_qkv(q, k, v) -> list[float]:
    """npu-int8's per-tensor scales: absmax/127, what calibration gives for this very input."""
    return [float(np.abs(x).max()) / 127.0 for x in (q, k, v)]


def relayout_ms(q, k, v) -> float:
    """The binding's copies (head-major -> rows in, rows -> head-major out), by numpy on one
    thread: an estimate of the fixed cost every variant's time includes."""

    def run():
        np.ascontiguousarray(q.transpose(1, 0, 2))
        np.ascontiguousarray(k.transpose(1, 0, 2))
        np.ascontiguousarray(v.transpose(1, 0, 2))
        np.ascontiguousarray(q.transpose(1, 0, 2))  # the output, as large as q

    run()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def torch_sdpa(q, k, v, threads: int):
    """torch's fused causal attention on the same head-major arrays (the peer of ``fp32``), or
    None without torch. One call, as the engine's kernel: GQA by ``enable_gqa``."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    tq, tk, tv = (torch.from_numpy(x)[None] for x in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run():
        with torch.no_grad():
            return sdpa(tq, tk, tv, is_causal=True, enable_gqa=True)

    return run


def time_variants(
    q, k, v, specs: dict[str, str], repeats: int, peers=None
) -> dict[str, list[float]]:
    """Seconds of each variant (and each peer: name -> callable) per repetition; the order
    rotates every repetition."""
    kw = {"npu-int8": {"static_qkv": static_qkv(q, k, v)}}
    run = {n: (lambda s=s, n=n: ops.prefill_attention(q, k, v, s, **kw.get(n, {})))
           for n, s in specs.items()}  # fmt: skip
    run.update(peers or {})
    names = list(run)
    for name in names:  # warm-up (first-touch of buffers, thread pools)
        run[name]()
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            run[name]()
            out[name].append(time.perf_counter() - t0)
    return out


def _call_overhead_s(fn, n: int = 500, batches: int = 7) -> float:
    """Seconds per call of ``fn`` (median over batches: robust to a busy neighbour)."""
    fn()
    per_call = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per_call.append((time.perf_counter() - t0) / n)
    return statistics.median(per_call)


def shadow_breakdown(q, k, v, keep: float, spec: str, repeats: int) -> dict:
    """One thread: the engine's shadow-attn total and, measured separately from Python on the
    same shapes, its INT8 estimation GEMMs and its per-row top-k (net of call overhead)."""
    H, T, hd = q.shape
    group = H // k.shape[0]
    # INT8 operands as the engine makes them with scales=dynamic: per head λQ = absmax/127 of its
    # rows, λK = absmax/127 of its KV head's keys (§3.3's per-tensor scale of the head).
    q8 = [np.clip(np.rint(q[h] / (np.abs(q[h]).max() / 127)), -127, 127).astype(np.int8)
          for h in range(H)]  # fmt: skip
    k8 = [np.clip(np.rint(x / (np.abs(x).max() / 127)), -127, 127).astype(np.int8) for x in k]
    # each KV head's keys packed once, as the engine packs them per (KV head, K scale)
    k8_packed = [ops.PackedWeightsS8(x.T) for x in k8]
    kept = np.array([ops.keys_kept(vis, keep, 1) for vis in range(1, T + 1)])
    blocks = [(r0, min(ROW_BLOCK, T - r0)) for r0 in range(0, T, ROW_BLOCK)]
    # Per-call Python cost (argument conversion, result allocation, the loop) on tiny inputs.
    tiny_s = np.zeros((1, 8), np.int32)
    gemm_call_s = _call_overhead_s(lambda: ops.gemm_s8s8s32(q8[0][:1], k8_packed[0], n_cols=1))
    one = np.ones(1, np.int64)
    topk_call_s = _call_overhead_s(lambda: ops.topk_rows(tiny_s[:, :1], one, one))
    n_gemm = n_topk = H * len(blocks)
    total, dense, gemm, topk = [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ops.prefill_attention(q, k, v, spec)
        t1 = time.perf_counter()
        ops.prefill_attention(q, k, v, "fp32")  # the peer on the same single thread
        total.append(t1 - t0)
        dense.append(time.perf_counter() - t1)
        g_s = t_s = 0.0
        for h in range(H):
            kt = k8_packed[h // group]
            for r0, rows in blocks:
                keys = r0 + rows
                vis = np.arange(r0 + 1, keys + 1)
                kk = kept[vis - 1]
                t0 = time.perf_counter()
                S = ops.gemm_s8s8s32(q8[h][r0 : r0 + rows], kt, n_cols=keys)  # [rows, keys] int32
                t1 = time.perf_counter()
                ops.topk_rows(S, vis, kk)
                t2 = time.perf_counter()
                g_s += t1 - t0
                t_s += t2 - t1
        gemm.append(g_s)
        topk.append(t_s)
    total_ms = 1e3 * statistics.median(total)
    gemm_ms = 1e3 * (statistics.median(gemm) - n_gemm * gemm_call_s)
    topk_ms = 1e3 * (statistics.median(topk) - n_topk * topk_call_s)
    return {
        "threads": 1,
        "engine_total_ms": total_ms,
        "engine_fp32_ms": 1e3 * statistics.median(dense),
        "estimation_int8_gemm_ms": gemm_ms,
        "topk_ms": topk_ms,
        "remainder_ms": total_ms - gemm_ms - topk_ms,
        "gemm_calls": n_gemm,
        "topk_calls": n_topk,
        "gemm_call_overhead_us": 1e6 * gemm_call_s,
        "topk_call_overhead_us": 1e6 * topk_call_s,
        "gemm_raw_ms": 1e3 * statistics.median(gemm),
        "topk_raw_ms": 1e3 * statistics.median(topk),
        "int8_gemm_gops": 2.0
        * hd
        * sum(rows * (r0 + rows) for r0, rows in blocks)
        * H
        / gemm_ms
        / 1e6,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="1024,2048,4096", help="prompt tokens (comma list)")
    ap.add_argument("--layer", type=int, default=12, help="layer whose Q/K/V are captured")
    ap.add_argument("--keep", type=float, default=0.2, help="global share of keys kept (§5)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--breakdown-repeats", type=int, default=3, help="0: skip the shadow-attn breakdown"
    )
    ap.add_argument("--synthetic", action="store_true", help="random Q/K/V, no model load")
    ap.add_argument("--no-torch", action="store_true", help=f"leave out the {TORCH} peer")
    ap.add_argument("--quick", action="store_true", help="lengths 128,256; 2 repeats; 1 breakdown")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.json:  # before the work, not after it
        check_output_path(a.json, what="--json")
    if a.quick:
        a.lengths, a.repeats, a.breakdown_repeats = "128,256", 2, min(a.breakdown_repeats, 1)
    lengths = sorted(int(x) for x in a.lengths.split(","))
    socllm.set_log_level("warn")
    socllm.set_num_threads(a.threads)
    say = (lambda *_: None) if a.quiet else print
    machine = machine_line()
    say(machine)

    t_max = lengths[-1]
    q, k, v, shape, source = (
        synthetic_qkv(t_max) if a.synthetic else real_qkv(a.model, a.layer, t_max, a.quiet)
    )
    specs = variants(a.keep)
    meta = {
        "machine": machine,
        "cpu_model": cpu_model(),
        "cpu_family_model": cpu_family_model(),
        "logical_cpus": os.cpu_count(),
        "isa": ops.isa(),
        "supported_isas": ops.supported_isas(),
        "threads": a.threads,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "blas": socllm.blas_info()["corename"],
        "socllm_version": socllm.__version__ if hasattr(socllm, "__version__") else None,
        "source": source,
        "model": None if a.synthetic else a.model,
        "shape": {"n_heads": shape[0], "n_kv_heads": shape[1], "head_dim": shape[2]},
        "keep": a.keep,
        "repeats": a.repeats,
        "variants": specs,
        "load_avg_before": os.getloadavg()[0],
    }
    say(
        f"INT8 paths {', '.join(meta['supported_isas'])}, {a.threads} threads; {source}; "
        f"keep {a.keep}; median of {a.repeats}"
    )
    rows = []
    for T in tqdm(lengths, desc="lengths", disable=a.quiet):
        qt = np.ascontiguousarray(q[:, :T])
        kt = np.ascontiguousarray(k[:, :T])
        vt = np.ascontiguousarray(v[:, :T])
        sdpa = None if a.no_torch else torch_sdpa(qt, kt, vt, a.threads)
        times = time_variants(qt, kt, vt, specs, a.repeats, {TORCH: sdpa} if sdpa else None)
        row = {"tokens": T, "relayout_ms_estimate": relayout_ms(qt, kt, vt), "variants": {}}
        # causal exact attention: Q·Kᵀ and P·V over the T (T + 1) / 2 visible pairs
        flop = 4.0 * shape[0] * shape[2] * T * (T + 1) / 2
        row["fp32_gflops"] = flop / statistics.median(times["fp32"]) / 1e9
        for name, ts in times.items():
            paired = [f / t for f, t in zip(times["fp32"], ts, strict=True)]
            row["variants"][name] = {
                "gflops": flop / statistics.median(ts) / 1e9,
                "median_ms": 1e3 * statistics.median(ts),
                "min_ms": 1e3 * min(ts),
                "times_ms": [1e3 * t for t in ts],
                "speedup_vs_fp32": statistics.median(paired),
            }
        if a.breakdown_repeats > 0:
            socllm.set_num_threads(1)
            try:
                row["shadow_attn_breakdown_1thread"] = shadow_breakdown(
                    qt, kt, vt, a.keep, specs["shadow-attn"], a.breakdown_repeats
                )
            finally:
                socllm.set_num_threads(a.threads)
        rows.append(row)
    meta["load_avg_after"] = os.getloadavg()[0]

    say("\nprefill attention of one layer, ms (speed-up vs fp32 in the same repetition)")
    say(
        f"{'tokens':>7}"
        + "".join(f"{n:>22}" for n in rows[0]["variants"])
        + f"{'fp32 GFLOP/s':>14}"
    )
    for row in rows:
        cells = "".join(
            f"{c['median_ms']:12.1f} ({c['speedup_vs_fp32']:5.2f}x)"
            for c in row["variants"].values()
        )
        say(f"{row['tokens']:>7}{cells}{row['fp32_gflops']:14.0f}")
    say(
        "binding relayout copies (in every variant, numpy estimate): "
        + ", ".join(f"{r['tokens']}: {r['relayout_ms_estimate']:.1f} ms" for r in rows)
    )
    if any("shadow_attn_breakdown_1thread" in r for r in rows):
        say(
            "\nshadow-attn on ONE thread, separate measurements (GEMM and top-k called from Python"
            " per block on the engine's shapes, net of per-call overhead; remainder = total - both)"
        )
        say(
            f"{'tokens':>7}{'fp32':>8}{'engine total':>14}{'INT8 Q·Kᵀ':>12}{'(GOPS)':>8}"
            f"{'top-k':>10}{'remainder':>11}   per-call overhead removed"
        )
        for r in rows:
            b = r.get("shadow_attn_breakdown_1thread")
            if b:
                say(
                    f"{r['tokens']:>7}{b['engine_fp32_ms']:8.1f}{b['engine_total_ms']:14.1f}"
                    f"{b['estimation_int8_gemm_ms']:12.1f}{b['int8_gemm_gops']:8.0f}"
                    f"{b['topk_ms']:10.1f}{b['remainder_ms']:11.1f}   "
                    f"{b['gemm_calls']} x {b['gemm_call_overhead_us']:.1f} us, "
                    f"{b['topk_calls']} x {b['topk_call_overhead_us']:.1f} us"
                )
    top = rows[-1]["variants"]
    say(
        f"\ngoal (issue 13 item 6): the sparse path >= 2x faster than fp32 at 4096 tokens; at "
        f"{rows[-1]['tokens']}: shadow-attn {top['shadow-attn']['speedup_vs_fp32']:.2f}x, sparse "
        f"{top['sparse']['speedup_vs_fp32']:.2f}x, block-sparse "
        f"{top['block-sparse']['speedup_vs_fp32']:.2f}x"
    )
    say(f"load average (1 min): {meta['load_avg_before']:.1f} before, "
        f"{meta['load_avg_after']:.1f} after")  # fmt: skip
    emit_json({"meta": meta, "rows": rows}, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
