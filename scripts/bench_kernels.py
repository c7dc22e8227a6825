#!/usr/bin/env python3
"""Exact INT8 GEMM (s8 x s8 -> s32) throughput next to OpenBLAS sgemm, in one run.

Shapes: the default model's prefill linears (SmolLM2-135M at --tokens, default 512) and a
2048x2048 and a 2048x8192 layer. Both sides use the same threads (default 2) and the same
[tokens, in] x [out, in]^T layout; INT8 counts 2*M*N*K integer ops, sgemm 2*M*N*K flops.
The "prepacked" column packs the weights once (ops.PackedWeightsS8), as a static graph does;
the other INT8 columns pack them on every call. The "grouped" column is the per-group form of
the w8-group / w4-group plans (llama.cpp's Q8_0 x Q8_0, groups of 32 along K, float sum over
groups; ops.gemm_grouped_s8s8f32), its weights prepacked.

    python scripts/bench_kernels.py [--tokens 512] [--threads 2] [--isa all] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import socllm
from socllm import ops
from socllm.eval.bench_utils import best_time, machine_line
from socllm.io.files import check_output_path, emit_json

GROUP = 32  # the per-group plans' group size along K
SHAPES = [  # (name, in, out)
    ("smollm2 qkv", 576, 960),
    ("smollm2 o_proj", 576, 576),
    ("smollm2 gate+up", 576, 3072),
    ("smollm2 down", 1536, 576),
    ("2048x2048 layer", 2048, 2048),
    ("2048x8192 layer", 2048, 8192),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512, help="M: rows of activations")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--isa", default="best", help="best, all, or one of socllm.ops.supported_isas()"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.json:  # before the work, not after it
        check_output_path(args.json, what="--json")
    socllm.set_num_threads(args.threads)
    machine = machine_line()
    print(machine)
    isas = {"best": [ops.isa()], "all": ops.supported_isas()}.get(args.isa, [args.isa])
    rng = np.random.default_rng(0)
    M = args.tokens
    rows = []
    print(f"M={M} tokens, {args.threads} threads")
    header = f"{'shape':18}{'K':>6}{'N':>6}{'sgemm GFLOPS':>14}"
    header += "".join(f"{i + ' GOPS':>18}{'ratio':>7}" for i in isas)
    header += f"{'prepacked ' + ops.isa():>24}{'ratio':>7}"
    header += f"{'grouped ' + ops.isa():>22}{'ratio':>7}"
    print(header)
    for name, k, n in SHAPES:
        x = rng.standard_normal((M, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        a = rng.integers(-128, 128, (M, k), dtype=np.int8)
        b = np.asfortranarray(rng.integers(-128, 128, (n, k), dtype=np.int8).T)  # [k, n] view
        ops_count = 2.0 * M * n * k
        sg = ops_count / best_time(lambda x=x, w=w: ops.linear_f32(x, w)) / 1e9
        row = {"shape": name, "M": M, "K": k, "N": n, "sgemm_gflops": sg}
        line = f"{name:18}{k:>6}{n:>6}{sg:>14.1f}"
        for isa in isas:
            g = (
                ops_count
                / best_time(lambda isa=isa, a=a, b=b: ops.gemm_s8s8s32(a, b, isa=isa))
                / 1e9
            )
            row[f"{isa}_gops"] = g
            line += f"{g:>18.1f}{g / sg:>6.2f}x"
        # Weights packed once, as a static graph holds them; only the activations vary.
        packed = ops.PackedWeightsS8(b)
        g = ops_count / best_time(lambda a=a, p=packed: ops.gemm_s8s8s32(a, p)) / 1e9
        row[f"prepacked_{ops.isa()}_gops"] = g
        line += f"{g:>24.1f}{g / sg:>6.2f}x"
        scales_a = rng.uniform(0.01, 0.1, (M, k // GROUP)).astype(np.float32)
        scales_w = rng.uniform(0.01, 0.1, (n, k // GROUP)).astype(np.float32)
        grouped = ops.PackedGroupedWeightsS8(b, scales_w, GROUP)
        g = (
            ops_count
            / best_time(lambda a=a, s=scales_a, w=grouped: ops.gemm_grouped_s8s8f32(a, s, w))
            / 1e9
        )
        row[f"grouped_{ops.isa()}_gops"] = g
        line += f"{g:>22.1f}{g / sg:>6.2f}x"
        rows.append(row)
        print(line)
    if args.json:
        emit_json({"machine": machine, "threads": args.threads, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
