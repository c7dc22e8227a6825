#!/usr/bin/env python3
"""Prefill and decode speed of socllm's fp32 engine next to torch/transformers on the same
model, measured in one run on this machine with the same thread count.

Each implementation runs in its own subprocess (so its peak RSS is its own), one after the
other (so they never share the cores). Prefill = the prompt through the model up to the
next-token logits (transformers: ``logits_to_keep=1``, the same work); decode = one token at a
time with a KV cache after a 128-token prompt, greedy.

    python scripts/bench_engine.py                 # 128/512/2048 prefill, 64 decode steps
    python scripts/bench_engine.py --quick         # smaller, for a smoke run
    python scripts/bench_engine.py --json out.json

OpenBLAS picks its kernels from OPENBLAS_CORETYPE, which this machine kind sets to Haswell
(AVX2) for safety; ``--socllm-coretype SkylakeX`` runs socllm on AVX-512 kernels instead, and
the output then also reports socllm's logits difference against torch as a correctness check.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _prompt_ids(n: int) -> list[int]:
    sys.path.insert(0, str(REPO / "python"))
    import socllm
    import tokenizers  # noqa: F401  (the socllm tokenizer == transformers' on this GGUF, tested)
    from socllm.data import wikitext2_test_text

    m = socllm.load("smollm2-135m", progress=False)
    return m.tokenize(wikitext2_test_text()[:40000])[:n]


def worker(impl: str, lengths: list[int], decode_steps: int, repeats: int, threads: int) -> dict:
    import numpy as np

    ids = _prompt_ids(max(lengths + [128]))
    out: dict = {"impl": impl, "threads": threads, "prefill": {}}
    if impl == "socllm":
        import socllm

        socllm.set_log_level("warn")
        socllm.set_num_threads(threads)
        m = socllm.load("smollm2-135m", progress=False)
        out["blas"] = socllm._core.blas_info()["corename"]

        def prefill(x):
            c = m.new_cache(len(x) + decode_steps + 1)
            return c, m.step(c, x)[0]

        def decode(c, logits):
            for _ in range(decode_steps):
                logits = m.step(c, [int(np.argmax(logits))])[0]
            return logits
    else:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        from socllm.registry import BUILTIN_MODELS

        g = BUILTIN_MODELS["smollm2-135m"].path()
        ref = AutoModelForCausalLM.from_pretrained(
            g.parent, gguf_file=g.name, dtype=torch.float32
        ).eval()
        out["torch"] = torch.__version__

        @torch.no_grad()
        def prefill(x):
            r = ref(torch.tensor([x]), use_cache=True, logits_to_keep=1)
            return r.past_key_values, r.logits[0, -1].numpy()

        @torch.no_grad()
        def decode(pkv, logits):
            for _ in range(decode_steps):
                tok = torch.tensor([[int(np.argmax(logits))]])
                r = ref(tok, past_key_values=pkv, use_cache=True)
                pkv, logits = r.past_key_values, r.logits[0, -1].numpy()
            return logits

    prefill(ids[:16])  # warm-up
    for n in lengths:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, last = prefill(ids[:n])
            times.append(time.perf_counter() - t0)
        out["prefill"][n] = {
            "seconds": statistics.median(times),
            "tokens_per_s": n / statistics.median(times),
        }
        if n == 128:
            out["logits_128"] = last.tolist()
    times = []
    for _ in range(repeats):
        state, logits = prefill(ids[:128])
        t0 = time.perf_counter()
        decode(state, logits)
        times.append(time.perf_counter() - t0)
    out["decode"] = {
        "steps": decode_steps,
        "seconds": statistics.median(times),
        "tokens_per_s": decode_steps / statistics.median(times),
    }
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="lengths 32,128; 8 decode steps; 1 repeat")
    ap.add_argument(
        "--socllm-coretype",
        default=None,
        help="OPENBLAS_CORETYPE for the socllm worker (e.g. SkylakeX)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", choices=["socllm", "torch"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:  # before the work, not after it
        sys.path.insert(0, str(REPO / "python"))
        from socllm.io_utils import check_output_path

        check_output_path(args.json, what="--json")
    if args.quick:
        args.lengths, args.decode_steps, args.repeats = "32,128", 8, 1
    lengths = [int(x) for x in args.lengths.split(",")]

    if args.worker:
        print(
            json.dumps(worker(args.worker, lengths, args.decode_steps, args.repeats, args.threads))
        )
        return 0

    results = {}
    for impl in ["socllm", "torch"]:
        env = dict(os.environ)
        if impl == "socllm" and args.socllm_coretype:
            env["OPENBLAS_CORETYPE"] = args.socllm_coretype
            env.pop("OPENBLAS_L2_SIZE", None)
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            impl,
            "--lengths",
            args.lengths,
            "--decode-steps",
            str(args.decode_steps),
            "--repeats",
            str(args.repeats),
            "--threads",
            str(args.threads),
        ]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            return r.returncode
        results[impl] = json.loads(r.stdout.strip().splitlines()[-1])

    import numpy as np

    s, t = results["socllm"], results["torch"]
    diff = None
    if "logits_128" in s and "logits_128" in t:
        a, b = np.array(s.pop("logits_128")), np.array(t.pop("logits_128"))
        diff = float(np.abs(a - b).max() / np.abs(b).max())
    print(
        f"socllm fp32 (OpenBLAS {s['blas']}) vs torch {t['torch']} + transformers, "
        f"{args.threads} threads, SmolLM2-135M"
    )
    print(f"{'':24}{'socllm':>12}{'torch':>12}{'ratio':>9}")
    for n in lengths:
        a, b = s["prefill"][str(n)], t["prefill"][str(n)]
        print(
            f"prefill {n:>5} tok/s     {a['tokens_per_s']:12.1f}{b['tokens_per_s']:12.1f}"
            f"{a['tokens_per_s'] / b['tokens_per_s']:8.2f}x"
        )
    a, b = s["decode"], t["decode"]
    print(
        f"decode tok/s ({a['steps']} steps) {a['tokens_per_s']:9.1f}{b['tokens_per_s']:12.1f}"
        f"{a['tokens_per_s'] / b['tokens_per_s']:8.2f}x"
    )
    print(
        f"peak RSS MB             {s['peak_rss_mb']:12.0f}{t['peak_rss_mb']:12.0f}"
        f"{s['peak_rss_mb'] / t['peak_rss_mb']:8.2f}x"
    )
    if diff is not None:
        print(f"max |logit diff| / max |logit| at 128 tokens: {diff:.2e}")
    if args.json:
        from socllm.io_utils import emit_json

        emit_json(
            {"socllm": s, "torch": t, "logit_rel_diff_128": diff, "threads": args.threads},
            args.json,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
