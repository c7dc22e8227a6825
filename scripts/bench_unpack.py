#!/usr/bin/env python3
"""EdgeFlow's weightlet unpacking (seed 004 §4.2, §5.4.2) against its peers, in one run.

Weights: the linears of the model (default SmolLM2-135M, read from its socllm file), each tensor
allocated per output channel with Algorithm 1 on the closed-form metric at --bits (5, 6, 7;
without smoothing: this measures the format, not accuracy) and packed at --group (R, default
128). One thread unpacks, as in the paper's Fig. 4. Reported per budget:

* throughput of every unpacking path (scalar, sse128, avx2) in INT8 output bytes per second, and
  its ratio to a memcpy (numpy copyto, one thread) of the same INT8 bytes (goal: >= 50%);
* SIMD instructions per weight: the 128-bit path's operations counted by an instrumented
  instance of the same kernel template (loads, shifts, and/or, add/sub, stores; vector constants
  not counted: they stay in registers), divided by the weights (paper, NEON: 0.48);
* vs K-quant: the same tensors as Q4_K and Q6_K blocks turned into INT8 rows by our GGUF
  dequantizer and a per-row int8 quantizer (what an NPU needs from a K-quant file: sub-block
  scales do not survive otherwise), on the tensors whose rows are whole 256-weight K-quant
  blocks (the down projections of SmolLM2). The blocks are random with valid fp16 scales:
  unpacking time does not depend on the values (paper: ours 6.17x faster);
* bytes read vs the INT4/INT8 mix (each channel padded to 4 or 8 bits, 1 bit of metadata per
  channel) for the same allocation, both as a byte ratio and as a measured read of the two
  files after evicting them from the page cache (posix_fadvise DONTNEED; paper: 1.42x faster
  loading).

With --per-bits, instead: every tensor at one uniform bit-width B = 1..8 in turn, the unpacking
time per weight of each path and its SIMD operations per weight, relative to B = 5. This is
the per-bit-width unpack cost the TTFT-budgeted allocation uses (the device profile's
/processors/cpu_all/unpack_weightlet_relative_time_by_bits takes the sse128 column: the NEON
analogue).

    python scripts/bench_unpack.py [--model smollm2-135m] [--bits 5 6 7] [--group 128]
                                   [--json docs/results/bench_unpack.json]
    python scripts/bench_unpack.py --per-bits [--json docs/results/bench_unpack_per_bits.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import socllm
from socllm import ops, quant
from socllm.eval.bench_utils import best_time, cpu_family_model, cpu_model, machine_line
from socllm.io.files import check_output_path, emit_json
from socllm.io.model_format import linear_weights
from tqdm.auto import tqdm

QK_BLOCK = 256  # weights per K-quant block


def model_linears(model) -> list[tuple[str, np.ndarray]]:
    return [
        (f"layers/{i}/{n}", W) for (i, n), W in linear_weights(model.path, model.config).items()
    ]


def allocate_and_pack(weights, bits: float, group: int, progress: bool, method: str = "greedy"):
    packed, qs = [], []
    for name, W in tqdm(weights, desc=f"allocate + pack {bits:g} bits", disable=not progress):
        alloc = quant.allocate_bits(quant.error_table(W, "closed-form"), bits, method)
        q, _ = quant.quantize_rows(W, alloc)
        packed.append((name, ops.WeightletTensor.pack(q, alloc, group)))
        qs.append(q)
    return packed, qs


def unpack_all(packed, out: np.ndarray, isa: str) -> None:
    pos = 0
    for _, p in packed:
        n = p.shape[0] * p.shape[1]
        p.unpack_into(out[pos : pos + n], isa)
        pos += n


def random_kquant_blocks(kind: str, rows: int, cols: int, rng) -> np.ndarray:
    """Valid Q4_K / Q6_K rows: random quants and sub-block scales, fp16 d (and dmin) in range."""
    nblk = rows * cols // QK_BLOCK
    size = {"Q4_K": 144, "Q6_K": 210}[kind]
    blocks = rng.integers(0, 256, (nblk, size), dtype=np.uint8)
    d = np.full(nblk, 0.01, np.float16).view(np.uint8).reshape(nblk, 2)
    if kind == "Q4_K":  # d, dmin first
        blocks[:, 0:2] = d
        blocks[:, 2:4] = d
    else:  # d last
        blocks[:, -2:] = d
    return blocks.reshape(-1)


def cold_read_seconds(path: str) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        while os.read(fd, 1 << 22):
            pass
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def measure(weights, bits: float, group: int, tmpdir: str, progress: bool) -> dict:
    packed, qs = allocate_and_pack(weights, bits, group, progress)
    n_weights = sum(q.size for q in qs)
    src = np.concatenate([q.reshape(-1) for q in qs])
    dst = np.empty_like(src)
    row = {"bits": bits, "weights": int(n_weights)}
    t_copy = best_time(lambda: np.copyto(dst, src))
    row["memcpy_gb_s"] = n_weights / t_copy / 1e9
    row["paths"] = {}
    for isa in ops.supported_unpack_isas():
        unpack_all(packed, dst, isa)
        if not np.array_equal(dst, src):
            raise AssertionError(f"{isa} unpacking differs from the packed codes")
        t = best_time(lambda isa=isa: unpack_all(packed, dst, isa))
        row["paths"][isa] = {
            "gb_s": n_weights / t / 1e9,
            "vs_memcpy": t_copy / t,
            "ns_per_weight": t / n_weights * 1e9,
        }
    counts = {"total": 0, "weights": 0}
    hist = np.zeros(9, np.int64)
    for _, p in packed:
        _, c = p.unpack_counted()
        counts["total"] += c["total"]
        counts["weights"] += c["weights"]
        np.add.at(hist, p.bits.astype(int), p.shape[1])
    row["simd_instructions_per_weight"] = counts["total"] / counts["weights"]
    row["weights_per_bits"] = {str(b): int(hist[b]) for b in range(1, 9)}

    # Bytes vs the INT4/INT8 mix of the same allocation (§3.2, §5.4.2).
    ours = sum(p.bytes for _, p in packed)
    mix = sum(
        int(((np.where(p.bits <= 4, 4, 8).astype(np.int64) * p.shape[1]) // 8).sum())
        + (p.shape[0] + 7) // 8
        for _, p in packed
    )
    row["bytes"] = {"weightlet": int(ours), "int4_int8_mix": int(mix), "ratio": mix / ours}
    paths = {}
    for name, size in (("weightlet", ours), ("int4_int8_mix", mix)):
        paths[name] = os.path.join(tmpdir, f"{name}.bin")
        with open(paths[name], "wb") as f:
            f.write(os.urandom(size))
    reads = {k: min(cold_read_seconds(p) for _ in range(3)) for k, p in paths.items()}
    row["cold_read"] = {
        "weightlet_s": reads["weightlet"],
        "int4_int8_mix_s": reads["int4_int8_mix"],
        "speedup": reads["int4_int8_mix"] / reads["weightlet"],
        "weightlet_gb_s": ours / reads["weightlet"] / 1e9,
    }
    for p in paths.values():
        os.remove(p)

    # vs K-quant: tensors whose rows are whole 256-weight blocks.
    kq = [(n, W) for n, W in weights if W.shape[1] % QK_BLOCK == 0]
    if kq:
        sel = [i for i, (n, W) in enumerate(weights) if W.shape[1] % QK_BLOCK == 0]
        sub = [packed[i] for i in sel]
        kn = sum(W.size for _, W in kq)
        out = np.empty(kn, np.int8)
        t_ours = best_time(lambda: unpack_all(sub, out, ops.supported_unpack_isas()[-1]))
        row["vs_kquant"] = {"tensors": len(kq), "weights": int(kn), "ours_s": t_ours}
        rng = np.random.default_rng(0)
        for kind in ("Q4_K", "Q6_K"):
            blocks = [random_kquant_blocks(kind, *W.shape, rng) for _, W in kq]
            scales = [np.empty(W.shape[0], np.float32) for _, W in kq]

            def run(blocks=blocks, scales=scales, kind=kind):
                pos = 0
                for (_, W), b, s in zip(kq, blocks, scales, strict=True):
                    n = W.size
                    socllm.io.dequantize_to_int8_rows(kind, b, *W.shape, out[pos : pos + n], s)
                    pos += n

            t = best_time(run)
            row["vs_kquant"][kind] = {"seconds": t, "ours_faster": t / t_ours}
    return row


def measure_per_bits(weights, group: int, progress: bool) -> list[dict]:
    """Unpack time per weight of every path with every tensor at one uniform bit-width."""
    rows = []
    for b in range(1, 9):
        packed, qs = allocate_and_pack(weights, float(b), group, progress, method="uniform")
        n = sum(q.size for q in qs)
        src = np.concatenate([q.reshape(-1) for q in qs])
        dst = np.empty_like(src)
        row = {"bits": b, "weights": int(n), "ns_per_weight": {}}
        for isa in ops.supported_unpack_isas():
            unpack_all(packed, dst, isa)
            if not np.array_equal(dst, src):
                raise AssertionError(f"{isa} unpacking differs from the packed codes at {b} bits")
            t = best_time(lambda isa=isa, p=packed, d=dst: unpack_all(p, d, isa))
            row["ns_per_weight"][isa] = t / n * 1e9
        ops_total = sum(p.unpack_counted()[1]["total"] for _, p in packed)
        row["simd_instructions_per_weight"] = ops_total / n
        rows.append(row)
    ref = next(r for r in rows if r["bits"] == 5)
    for r in rows:
        r["relative_to_5_bits"] = {
            isa: v / ref["ns_per_weight"][isa] for isa, v in r["ns_per_weight"].items()
        }
    return rows


def print_per_bits(rows: list[dict]) -> None:
    isas = [i for i in rows[0]["ns_per_weight"] if i != "scalar"]
    print(
        f"{'bits':>4} " + " ".join(f"{i + ' ns/w (rel. 5 b)':>24}" for i in isas) + "  SIMD ops/w"
    )
    for r in rows:
        cells = " ".join(
            f"{r['ns_per_weight'][i]:>15.4f} ({r['relative_to_5_bits'][i]:.2f})".rjust(24)
            for i in isas
        )
        print(f"{r['bits']:>4} {cells} {r['simd_instructions_per_weight']:>10.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--bits", type=float, nargs="+", default=[5.0, 6.0, 7.0])
    ap.add_argument("--group", type=int, default=128, help="R: weights per group")
    ap.add_argument("--tmpdir", default=None, help="where the cold-read files go (a disk)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--per-bits", action="store_true", help="unpack cost per uniform bit-width 1..8 instead"
    )
    args = ap.parse_args(argv)
    if args.json:
        check_output_path(args.json, what="--json")
    machine = machine_line()
    print(machine, flush=True)
    model = socllm.load(args.model, progress=not args.quiet)
    weights = model_linears(model)
    meta = {
        "model": args.model,
        "group": args.group,
        "machine": machine,
        "cpu_model": cpu_model(),
        "cpu_family_model": cpu_family_model(),
        "unpack_isas": ops.supported_unpack_isas(),
        "threads": 1,
    }
    print(f"{args.model}: {len(weights)} linears, R = {args.group}; one thread")
    if args.per_bits:
        rows = measure_per_bits(weights, args.group, not args.quiet)
        print_per_bits(rows)
        emit_json({"meta": meta, "per_bits": rows}, args.json)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmpdir) as tmp:
        for b in args.bits:
            rows.append(measure(weights, b, args.group, tmp, not args.quiet))
    isas = ops.supported_unpack_isas()
    hdr = f"{'bits':>5} {'memcpy GB/s':>11} " + " ".join(
        f"{i + ' GB/s (x memcpy)':>24}" for i in isas
    )
    print(
        hdr + f" {'SIMD ins/w':>10} {'mix/ours bytes':>14} {'cold read x':>11}"
        f" {'vs Q4_K':>8} {'vs Q6_K':>8}"
    )
    for r in rows:
        cells = " ".join(
            f"{r['paths'][i]['gb_s']:>14.2f} ({r['paths'][i]['vs_memcpy']:.2f}x)".rjust(24)
            for i in isas
        )
        kq = r.get("vs_kquant", {})
        print(
            f"{r['bits']:>5g} {r['memcpy_gb_s']:>11.2f} {cells} "
            f"{r['simd_instructions_per_weight']:>10.3f} {r['bytes']['ratio']:>14.3f} "
            f"{r['cold_read']['speedup']:>11.2f} "
            f"{kq.get('Q4_K', {}).get('ours_faster', float('nan')):>7.2f}x "
            f"{kq.get('Q6_K', {}).get('ours_faster', float('nan')):>7.2f}x"
        )
    emit_json({"meta": meta, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
