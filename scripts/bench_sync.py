#!/usr/bin/env python3
"""Host synchronization on this machine (issue 15 item 5; seed 002 §4.2 "fast synchronization").

Two threads hand work over (cpp/core/handoff.h): a device thread busy-works for
--work-us and raises a completion flag, as a GPU kernel fills its output tensor and flag; the
host thread waits for the flag with a condition variable, a futex, a spinning flag, or
HeteroLLM's sleep-then-poll (sleep for the predicted wait minus a margin, then poll). Per method
and work size: the latency from the flag being raised to the host seeing it (p50, p99), and the
host's CPU time per handoff as a share of its wait (spin burns a whole core; the point of
sleep-then-poll is a spin's latency at a sleeper's CPU cost). Ratios are against the condition
variable measured in the same run. Sleep-then-poll also runs with a prediction 30% short and
30% long, to show what a wrong guess costs.

    python scripts/bench_sync.py [--work-us 50 200 1000] [--iterations 2000]
                                 [--json docs/results/bench_sync.json]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import socllm
from socllm.eval.bench_utils import cpu_family_model, cpu_model, machine_line
from socllm.io.files import check_output_path, emit_json
from tqdm.auto import tqdm

MARGIN_US = 100.0  # seed 002 §4.2: usleep's granularity on mobile SoCs is 80-100 µs


def runs(work_us: float) -> list[tuple[str, str, float]]:
    """(label, method, predicted_us) for one work size."""
    out = [(m, m, -1.0) for m in socllm.ops.wait_methods()]
    out += [
        ("sleep-poll, predicted -30%", "sleep-poll", 0.7 * work_us),
        ("sleep-poll, predicted +30%", "sleep-poll", 1.3 * work_us),
    ]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-us", type=float, nargs="+", default=[50.0, 200.0, 1000.0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.json:
        check_output_path(args.json, what="--json")
    meta = {
        "machine": machine_line(),
        "cpu_model": cpu_model(),
        "cpu_family_model": cpu_family_model(),
        "iterations": args.iterations,
        "sleep_margin_us": MARGIN_US,
        "threads": 2,
    }
    print(meta["machine"])
    print(f"{args.iterations} handoffs each")
    rows = []
    todo = [(w, *r) for w in args.work_us for r in runs(w)]
    for work, label, method, predicted in tqdm(todo, desc="handoffs", disable=args.quiet):
        r = socllm.ops.measure_handoff(
            method, args.iterations, work, predicted_us=predicted, sleep_margin_us=MARGIN_US
        )
        lat, cpu, wait = r["latency_us"], r["waiter_cpu_us"], r["wait_us"]
        rows.append(
            {
                "work_us": work,
                "method": label,
                "predicted_us": work if predicted < 0 else predicted,
                "latency_p50_us": float(np.percentile(lat, 50)),
                "latency_p99_us": float(np.percentile(lat, 99)),
                "latency_mean_us": float(lat.mean()),
                "waiter_cpu_us_per_handoff": float(cpu.mean()),
                "waiter_cpu_share": float(cpu.sum() / wait.sum()),
                "wait_mean_us": float(wait.mean()),
            }
        )
    for work in args.work_us:
        ref = next(x for x in rows if x["work_us"] == work and x["method"] == "condvar")
        print(f"\nwork {work:g} µs: latency p50 / p99 (µs), vs condvar p50; host CPU per handoff")
        for x in (x for x in rows if x["work_us"] == work):
            x["p50_vs_condvar"] = x["latency_p50_us"] / ref["latency_p50_us"]
            print(
                f"  {x['method']:28s} {x['latency_p50_us']:8.2f} / {x['latency_p99_us']:8.2f}"
                f"  ({x['p50_vs_condvar']:.3g}x)  CPU {x['waiter_cpu_us_per_handoff']:8.1f} µs"
                f" ({100 * x['waiter_cpu_share']:5.1f}% of the wait)"
            )
    emit_json({"meta": meta, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
