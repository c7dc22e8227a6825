#!/usr/bin/env python3
"""The online scheduler's own cost and its distance to the optimum (seed 001 §3.4; seed 003's
reviewers asked for both).

    python scripts/bench_scheduler.py [--json PATH]

1. Cost per decision: the host time each policy spends choosing the next task, in µs, on the
   prefill graphs of real configs (llm.npu claims "microsecond-level" overhead). FIFO, the
   cheapest rule, is the peer measured in the same run.
2. Gap to the optimum: on small prefill graphs (one decoder layer, 3 chunks, a shadow task on
   the FFN-down input: 22 tasks) with the 8 Gen 3 cost model's durations and with
   durations randomly perturbed (seeded), the makespan of in-order / first-ready /
   npu-stall-first (llm.npu's out-of-order policy) over the exact
   branch-and-bound optimum.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
from socllm.configs import load_config  # noqa: E402
from socllm.devices import load_profile  # noqa: E402
from socllm.eval.bench_utils import machine_line  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402

HEURISTICS = ("in-order", "first-ready", "npu-stall-first")


def graph(cfg: dict, prompt: int, chunk: int, pruning: float):
    return socllm.task_graph(cfg, f"shadow-outlier:pruning_rate={pruning}", prompt, chunk)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="snapdragon-8gen3")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--instances", type=int, default=20, help="perturbed small graphs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    profile = load_profile(args.device)
    cost = socllm.sim.CostModel(socllm.sim.DeviceProfile.from_json(profile, args.device))
    out: dict = {
        "machine": machine_line(),  # the host whose decision costs these are
        "device": args.device,
        "decision_cost": [],
        "optimality_gap": {},
    }
    print(out["machine"])

    print("1. scheduler cost per decision (µs, best of repeats) and whole-simulation time")
    print(f"{'graph':<34} {'tasks':>6} " + " ".join(f"{p:>16}" for p in HEURISTICS))
    for name, prompt in (("qwen1.5-1.8b", 1024), ("llama-2-7b", 1024), ("llama-2-7b", 4096)):
        g = graph(load_config(name), prompt, 256, 0.0)
        row = {"graph": f"{name} prompt {prompt}", "tasks": len(g)}
        cells = []
        for pol in HEURISTICS:
            best_dec, best_wall = float("inf"), float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                tl = socllm.sim.schedule(g, cost, pol)
                wall = time.perf_counter() - t0
                best_dec = min(best_dec, tl.decision_ns_total / 1e3 / max(tl.decisions, 1))
                best_wall = min(best_wall, wall)
            row[pol] = {"us_per_decision": best_dec, "simulation_ms": 1e3 * best_wall}
            cells.append(f"{best_dec:6.2f} ({1e3 * best_wall:5.1f} ms)")
        row["ooe_over_fifo"] = (
            row["npu-stall-first"]["us_per_decision"] / row["first-ready"]["us_per_decision"]
        )
        out["decision_cost"].append(row)
        print(
            f"{row['graph']:<34} {row['tasks']:>6} "
            + " ".join(f"{c:>16}" for c in cells)
            + f"   ooe/fifo {row['ooe_over_fifo']:.1f}x"
        )

    print("\n2. makespan over the exact optimum on small graphs (1 layer, 3 chunks of 256)")
    small = dict(load_config("qwen1.5-1.8b"), n_layers=1)
    g = graph(small, 768, 256, 0.75)
    base = np.array(socllm.sim.task_durations_us(g, cost))
    rng = np.random.default_rng(0)
    ratios = {p: [] for p in HEURISTICS}
    nodes = []
    for i in range(args.instances + 1):
        d = base if i == 0 else base * rng.uniform(0.5, 2.0, size=base.size)
        sync = cost.sync_us("cpu", "npu")
        opt = socllm.sim.simulate_durations(g, d.tolist(), sync, "optimal", 24)
        nodes.append(opt.search_nodes)
        for p in HEURISTICS:
            t = socllm.sim.simulate_durations(g, d.tolist(), sync, p)
            ratios[p].append(t.makespan_us / opt.makespan_us)
    out["optimality_gap"] = {
        "tasks": len(g),
        "instances": args.instances + 1,
        "search_nodes_median": float(np.median(nodes)),
        **{
            p: {"mean": float(np.mean(r)), "max": float(np.max(r)), "cost_model_instance": r[0]}
            for p, r in ratios.items()
        },
    }
    print(
        f"{len(g)} tasks, {args.instances + 1} instances (the first with the cost model's "
        f"durations), median {np.median(nodes):.0f} search nodes"
    )
    for p, r in ratios.items():
        print(
            f"  {p:<15} makespan / optimum: cost-model durations {r[0]:.3f}, "
            f"perturbed mean {np.mean(r):.3f}, worst {np.max(r):.3f}"
        )
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
