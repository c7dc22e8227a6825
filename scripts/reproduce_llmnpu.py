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
from socllm.fidelity.targets import (  # noqa: E402
    LLAMACPP_RUN,
    LLMNPU_LADDER,
    LLMNPU_LADDER_PAPER,
    LLMNPU_MODELS,
    LLMNPU_PRUNING_TOK_S,
    LLMNPU_RUN,
    LLMNPU_VS_LLAMACPP,
    ladder_ratios,
)
from socllm.io.files import atomic_write_text  # noqa: E402
from socllm.sim.timeline import simulate  # noqa: E402

DEVICE = "snapdragon-8gen3"
# The ladder, its paper ranges and every paper number come from the fidelity targets, so this
# script and `socllm fidelity` simulate the same runs.


def run(cfg, step: dict, prompt: int, **over) -> dict:
    kw = {**step, **over}
    return simulate(cfg, DEVICE, kw.pop("plan"), prompt, **kw).summary()


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
    for cfg in LLMNPU_MODELS:
        row = {L: run(cfg, LLMNPU_RUN, L) for L in (64, 256, 1024)}
        out["prefill"][cfg] = {L: s["prefill_tokens_per_s"] for L, s in row.items()}
        print(
            f"{cfg:<14} "
            + " ".join(f"{row[L]['prefill_tokens_per_s']:>8.0f}" for L in (64, 256, 1024))
        )

    print("\nAblation ladder at prompt 1024 (seed 001 §4.7): prefill ms, and each step's ratio")
    for cfg in LLMNPU_MODELS:
        ms = {name: run(cfg, step, 1024)["prefill_ms"] for name, step in LLMNPU_LADDER.items()}
        ratios = ladder_ratios(ms)
        out["ladder"][cfg] = {"prefill_ms": ms, "ratios": ratios}
        print(f"  {cfg}: " + ", ".join(f"{k} {v:.0f}" for k, v in ms.items()))
        for k, r in ratios.items():
            what, lo, hi = LLMNPU_LADDER_PAPER[k]
            print(
                f"    {k:<18} {what:<32} ours {r:6.2f}   paper {lo}-{hi}  ({in_range(r, lo, hi)})"
            )
    for L, (lo, hi) in LLMNPU_VS_LLAMACPP.items():
        sp = {
            cfg: run(cfg, LLAMACPP_RUN, L)["prefill_ms"] / run(cfg, LLMNPU_RUN, L)["prefill_ms"]
            for cfg in LLMNPU_MODELS
        }
        out["ladder"][f"speedup_vs_cpu_{L}"] = sp
        print(
            f"  llm.npu vs llama.cpp-CPU at {L}: "
            + ", ".join(f"{c} {v:.1f}x" for c, v in sp.items())
            + f"   (paper {lo}-{hi}x)"
        )

    print("\nPruning rate vs prefill speed at prompt 1024 (seed 001 §4.4, Fig. 16), tokens/s")
    for cfg, paper in LLMNPU_PRUNING_TOK_S.items():
        ours = {
            r: run(cfg, LLMNPU_RUN, 1024, plan=f"shadow-outlier:pruning_rate={r}")[
                "prefill_tokens_per_s"
            ]
            for r in paper
        }
        out["pruning"][cfg] = {"ours": ours, "paper": paper}
        print(
            f"  {cfg}: "
            + ", ".join(f"{int(100 * r)}%: ours {ours[r]:.0f} / paper {paper[r]}" for r in paper)
        )

    in_order = LLMNPU_LADDER["+ shadow outliers"]
    s = run("qwen1.5-1.8b", in_order, 256)
    so = run("qwen1.5-1.8b", LLMNPU_RUN, 1024)
    si = run("qwen1.5-1.8b", in_order, 1024)
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
