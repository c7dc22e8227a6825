"""HeteroLLM's profiler and solver (seed 002 §4.3; issue 15 items 3-4).

    python scripts/heterollm_profiler.py [--train 3000] [--test 1000] [--json PATH]

1. Prediction mode: a decision tree per processor trained on sampled linear shapes (real times
   from the `heterollm` characterization of the 8 Gen 3), and the GPU's fixed-rate estimate;
   mean absolute percentage error and the share within ±10% on held-out shapes, by training size.
   The same for the host CPU, with measured times of this machine's sgemm (real execution).
2. The solver's regret: its partition chosen on predicted times, timed with the real ones,
   against the real optimum, over the linears of the four models at aligned and misaligned
   lengths and in decode; and its sensitivity to a predictor with a log-normal error of sigma.
3. The aligned grid (256 columns, 32 rows) against a finer one (32 columns): what the pruning
   of §4.3 loses.
4. End to end: Hetero-tensor's prefill with the tree's partitions against the cost model's.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import socllm
from socllm.configs import load_config
from socllm.eval.bench_utils import cpu_family_model, cpu_model
from socllm.io.files import atomic_write_text
from socllm.sim.hetero import (
    PartitionProfiler,
    grid_regret,
    linear_shapes,
    matmul,
    noisy,
    sample_shapes,
    solver_regret,
)
from tqdm import tqdm

MODELS = ("llama-3-8b", "llama-2-7b", "llama-3.2-3b", "internlm-1.8b")
LENGTHS = (64, 135, 256, 300, 525, 1024)


def summary(rows: list[dict]) -> dict:
    r = np.array([x["regret"] for x in rows])
    return {
        "ops": len(rows),
        "mean_regret": float(r.mean()),
        "p95_regret": float(np.quantile(r, 0.95)),
        "max_regret": float(r.max()),
        "share_optimal": float((r <= 1e-9).mean()),
    }


def host_shapes(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    widths = (576, 960, 1536, 2048, 3072)
    return [
        matmul(int(rng.integers(1, 257)), int(rng.choice(widths)), int(rng.choice(widths)))
        for _ in range(count)
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=3000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--host-shapes", type=int, default=300)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    out: dict = {
        "machine": {
            "cpu": f"{cpu_model()} ({cpu_family_model()}), ISA {socllm.ops.isa()}",
            "python": platform.python_version(),
        }
    }

    test = sample_shapes(args.test, seed=2)
    out["accuracy"] = []
    for n in sorted({max(100, args.train // 10), args.train // 3, args.train}):
        p = PartitionProfiler().fit(sample_shapes(n, seed=1))
        for proc in ("npu", "gpu"):
            out["accuracy"].append({"train": n, **p.accuracy(test, proc)})
        out["accuracy"].append({"train": n, **p.accuracy(test, "gpu", gpu_rate=True)})
    prof = PartitionProfiler().fit(sample_shapes(args.train, seed=1))
    print("prediction mode on held-out shapes (8 Gen 3, heterollm characterization)")
    for a in out["accuracy"]:
        print(
            f"  train {a['train']:>5}  {a['processor']} {a['model']:<13}: MAPE "
            f"{100 * a['mape']:5.1f}%, within ±10% {100 * a['within_10pct']:5.1f}%"
        )

    host = PartitionProfiler(mode="host")
    tr, te = host_shapes(args.host_shapes, 3), host_shapes(args.host_shapes // 3, 4)
    t0 = time.perf_counter()
    host.fit(tr, processors=("cpu",))
    out["host"] = {
        **host.accuracy(te, "cpu"),
        "train": len(tr),
        "measure_s": time.perf_counter() - t0,
    }
    print(
        f"host CPU ({out['machine']['cpu']}), measured sgemm: MAPE "
        f"{100 * out['host']['mape']:.1f}%, within ±10% {100 * out['host']['within_10pct']:.1f}%"
    )

    prefill_ops = [o for c in MODELS for n in LENGTHS for o in linear_shapes(load_config(c), n)]
    decode_ops = [o for c in MODELS for o in linear_shapes(load_config(c), 1)]
    dec_prof = PartitionProfiler(decode=True)
    dec_prof.models, dec_prof.gpu_gflops = prof.models, prof.gpu_gflops
    out["regret"] = {}
    predictors = {
        "tree": prof.predict,
        **{f"sigma {s}": noisy(prof, s) for s in (0.05, 0.1, 0.2, 0.4)},
    }
    for name, pred in tqdm(predictors.items(), disable=args.quiet, desc="solver regret"):
        dec_pred = dec_prof.predict if name == "tree" else noisy(dec_prof, float(name.split()[1]))
        out["regret"][name] = {
            "prefill": summary(solver_regret(prof, prefill_ops, pred)),
            "decode": summary(solver_regret(dec_prof, decode_ops, dec_pred)),
        }
    print("solver regret (chosen on predictions, timed with real times, vs the real optimum)")
    for name, r in out["regret"].items():
        pf, dc = r["prefill"], r["decode"]
        print(
            f"  {name:<10} prefill mean {100 * pf['mean_regret']:5.2f}% "
            f"p95 {100 * pf['p95_regret']:5.2f}% max {100 * pf['max_regret']:5.1f}%"
            f" optimal {100 * pf['share_optimal']:4.0f}% | decode mean "
            f"{100 * dc['mean_regret']:5.2f}% max {100 * dc['max_regret']:5.1f}%"
        )
    g = grid_regret(prof, prefill_ops)
    out["grid"] = {
        **summary(g),
        "candidates_aligned_vs_fine": [
            int(np.mean([x["candidates"][0] for x in g])),
            int(np.mean([x["candidates"][1] for x in g])),
        ],
    }
    gr = out["grid"]
    print(
        f"aligned grid vs 32-column grid: mean regret {100 * gr['mean_regret']:.3f}%, max "
        f"{100 * gr['max_regret']:.3f}%, candidates {gr['candidates_aligned_vs_fine']}"
    )
    out["end_to_end"] = []
    for n in (256, 525, 1024):
        real = socllm.simulate_hetero("llama-3-8b", prof.profile, "hetero-tensor", n)
        pred = socllm.simulate_hetero(
            "llama-3-8b", prof.profile, "hetero-tensor", n, predictor=prof.predict
        )
        a, b = real.summary()["prefill_tokens_per_s"], pred.summary()["prefill_tokens_per_s"]
        out["end_to_end"].append({"prompt_len": n, "cost_model_tok_s": a, "tree_tok_s": b})
        print(
            f"Llama-8B {n}: Hetero-tensor {a:.1f} tok/s (real-time solver), {b:.1f} (tree solver)"
        )
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
