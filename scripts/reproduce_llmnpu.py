#!/usr/bin/env python3
"""llm.npu's prefill results (seed 001 §3.4, §4.2, §4.4, §4.7) predicted by the simulator on the
Snapdragon 8 Gen 3 profile, next to the paper's numbers. The cost model is fitted to Table 3's
micro-benchmarks only (scripts/fit_cost_model.py); nothing here is tuned to these answers.

    python scripts/reproduce_llmnpu.py [--json docs/results/llmnpu_reproduction.json]

Configurations (socllm.sim.timeline):
  llama.cpp-CPU   every subgraph on the CPU, INT8 linears, the whole prompt at once
  naive NPU       per-group INT8 (K-Quant-like, groups of 32) on the NPU as sub-matmuls, one
                  graph for the whole prompt built and optimized at run time, in order
  + chunk graphs  the same linears on pre-built chunk-sharing graphs of 256 (no run-time build)
  + shadow        per-tensor INT8 + shadow outliers on the CPU (85% pruned), in order
  + out-of-order  the same with llm.npu's Eq. 6 scheduler
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from socllm.io.files import atomic_write_text  # noqa: E402
from socllm.sim.timeline import simulate  # noqa: E402

MODELS = ("qwen1.5-1.8b", "gemma-2b", "llama-2-7b")
DEVICE = "snapdragon-8gen3"
# name, plan, processor ("auto": the plan's placement, llm.npu's for these presets; "cpu": every
# op class on the CPU), policy, runtime build, chunk
LADDER = (
    ("llama.cpp-CPU", "w8-group", "cpu", "in-order", False, 0),
    ("naive NPU", "w8-group", "auto", "in-order", True, 0),
    ("+ chunk graphs", "w8-group", "auto", "in-order", False, 256),
    ("+ shadow outliers", "shadow-outlier", "auto", "in-order", False, 256),
    ("+ out-of-order", "shadow-outlier", "auto", "npu-stall-first", False, 256),
)
# seed 001 §4.7 (Fig. 19, ranges over the three models) and §4.2
PAPER_LADDER = {
    "naive NPU": ("slower than llama.cpp-CPU", 2.55, 2.68),
    "+ chunk graphs": ("speedup over naive NPU", 1.46, 5.09),
    "+ shadow outliers": ("speedup over + chunk graphs", 3.91, 8.68),
    "+ out-of-order": ("latency reduction over + shadow", 0.18, 0.44),
}
PAPER_VS_CPU = {1024: (18.17, 38.4), 64: (7.1, 14.86)}  # llama.cpp-CPU, Redmi K70 Pro
# seed 001 §4.4 Fig. 16 (K70 Pro): prefill tokens/s at pruning rates 0 / 80 / 100%
PAPER_PRUNING = {
    "qwen1.5-1.8b": {0.0: 156, 0.8: 544, 1.0: 596},
    "gemma-2b": {0.0: 102, 0.8: 285, 1.0: 345},
}


def run(cfg, plan, processor, policy, build, chunk, prompt):
    return simulate(
        cfg,
        DEVICE,
        plan,
        prompt,
        chunk=chunk,
        policy=policy,
        processor=processor,
        runtime_graph_build=build,
    ).summary()


def in_range(x: float, lo: float, hi: float) -> str:
    return "in range" if lo <= x <= hi else ("below" if x < lo else "above")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict = {"device": DEVICE, "prefill": {}, "ladder": {}, "pruning": {}, "section_3_4": {}}

    print(f"Prefill speed, llm.npu (shadow-outlier, chunks of 256, out-of-order) on {DEVICE}")
    print(
        f"{'model':<14} {'64':>8} {'256':>8} {'1024':>8}  tokens/s   "
        "(paper: >1000 for Qwen1.5-1.8B at 1024)"
    )
    for cfg in MODELS:
        row = {
            L: run(cfg, "shadow-outlier", "auto", "npu-stall-first", False, 256, L)
            for L in (64, 256, 1024)
        }
        out["prefill"][cfg] = {L: s["prefill_tokens_per_s"] for L, s in row.items()}
        print(
            f"{cfg:<14} "
            + " ".join(f"{row[L]['prefill_tokens_per_s']:>8.0f}" for L in (64, 256, 1024))
        )

    print("\nAblation ladder at prompt 1024 (seed 001 §4.7): prefill ms, and each step's ratio")
    for cfg in MODELS:
        ms = {name: run(cfg, *rest, 1024)["prefill_ms"] for name, *rest in LADDER}
        ratios = {
            "naive NPU": ms["naive NPU"] / ms["llama.cpp-CPU"],
            "+ chunk graphs": ms["naive NPU"] / ms["+ chunk graphs"],
            "+ shadow outliers": ms["+ chunk graphs"] / ms["+ shadow outliers"],
            "+ out-of-order": 1 - ms["+ out-of-order"] / ms["+ shadow outliers"],
        }
        out["ladder"][cfg] = {"prefill_ms": ms, "ratios": ratios}
        print(f"  {cfg}: " + ", ".join(f"{k} {v:.0f}" for k, v in ms.items()))
        for k, r in ratios.items():
            what, lo, hi = PAPER_LADDER[k]
            print(
                f"    {k:<18} {what:<32} ours {r:6.2f}   paper {lo}-{hi}  ({in_range(r, lo, hi)})"
            )
    for L, (lo, hi) in PAPER_VS_CPU.items():
        sp = {
            cfg: run(cfg, "w8-group", "cpu", "in-order", False, 0, L)["prefill_ms"]
            / run(cfg, "shadow-outlier", "auto", "npu-stall-first", False, 256, L)["prefill_ms"]
            for cfg in MODELS
        }
        out["ladder"][f"speedup_vs_cpu_{L}"] = sp
        print(
            f"  llm.npu vs llama.cpp-CPU at {L}: "
            + ", ".join(f"{c} {v:.1f}x" for c, v in sp.items())
            + f"   (paper {lo}-{hi}x)"
        )

    print("\nPruning rate vs prefill speed at prompt 1024 (seed 001 §4.4, Fig. 16), tokens/s")
    for cfg, paper in PAPER_PRUNING.items():
        ours = {
            r: run(
                cfg, f"shadow-outlier:pruning_rate={r}", "auto", "npu-stall-first", False, 256, 1024
            )["prefill_tokens_per_s"]
            for r in paper
        }
        out["pruning"][cfg] = {"ours": ours, "paper": paper}
        print(
            f"  {cfg}: "
            + ", ".join(f"{int(100 * r)}%: ours {ours[r]:.0f} / paper {paper[r]}" for r in paper)
        )

    s = run("qwen1.5-1.8b", "shadow-outlier", "auto", "in-order", False, 256, 256)
    so = run("qwen1.5-1.8b", "shadow-outlier", "auto", "npu-stall-first", False, 256, 1024)
    si = run("qwen1.5-1.8b", "shadow-outlier", "auto", "in-order", False, 256, 1024)
    out["section_3_4"] = {
        "npu_busy_ms_qwen_256": s["busy_ms"]["npu"],
        "cpu_busy_ms_qwen_256": s["busy_ms"]["cpu"],
        "npu_bubble_inorder_1024": si["bubble_rate"]["npu"],
        "npu_bubble_ooe_1024": so["bubble_rate"]["npu"],
    }
    print(
        f"\nQwen1.5-1.8B, prompt 256: NPU busy {s['busy_ms']['npu']:.0f} ms (paper 315 ms), CPU "
        f"{s['busy_ms']['cpu']:.0f} ms (paper: about half the NPU's)"
    )
    print(
        f"NPU bubbles at 1024: in order {100 * si['bubble_rate']['npu']:.0f}% (paper: 37% on the "
        f"critical path), out of order {100 * so['bubble_rate']['npu']:.0f}%"
    )
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(out, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
