"""The scheduling questions the llm.npu reviews left open (seed 003; issue 15 items 8 and 10).

    python scripts/scheduling_questions.py [--json docs/results/scheduling_questions.json]
        [--trace session.trace.json]

1. Policies on llm.npu's graph (Qwen1.5-1.8B, shadow-outlier): in-order, first-ready (FIFO),
   Eq. 6 (npu-stall-first), the executor llm.npu released (mllm-executor) and position-first,
   at 256 / 512 / 1024 tokens in chunks of 256 and of 32 (the released code's chunk size).
2. A whole session of Hetero-tensor on Llama-8B: the prefill of 256 tokens and 64 decoding
   steps on one timeline (TTFT, TPOT).
3. Co-running apps (seed 000 Table 9's situations and seed 002's game): what each policy loses
   on llm.npu's graph and what each HeteroLLM engine loses.
4. Re-partitioning at run time: the game starts at decoding step 17 and ends at 49 of 64; the
   static partitions, the adaptive runtime (measures drift, re-solves one step later) and an
   oracle, by TPOT p50 / p99.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import socllm
from socllm.configs import load_config
from socllm.io.files import atomic_write_text
from socllm.sim.hetero import simulate_session

POLICIES = ("in-order", "first-ready", "npu-stall-first", "mllm-executor", "position-first")
SCENARIOS = (
    "none",
    "taking-photos",
    "watching-videos",
    "listening-to-music",
    "browsing-shopping",
    "mobile-game",
)


def llmnpu_ms(prompt_len, chunk, policy, co_runner=""):
    tl = socllm.simulate(
        "qwen1.5-1.8b",
        "snapdragon-8gen3",
        "shadow-outlier",
        prompt_len,
        chunk=chunk,
        policy=policy,
        co_runner=co_runner if co_runner != "none" else "",
    )
    return tl.summary()["prefill_ms"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--trace", default=None, help="Perfetto trace of the 64-token session")
    args = ap.parse_args()
    out: dict = {}

    print("1. llm.npu (Qwen1.5-1.8B, shadow-outlier) prefill ms by policy")
    out["policies"] = []
    for chunk in (256, 32):
        for n in (256, 512, 1024):
            row = {"chunk": chunk, "prompt_len": n}
            row.update({p: llmnpu_ms(n, chunk, p) for p in POLICIES})
            out["policies"].append(row)
            print(
                f"  chunk {chunk:>3} prompt {n:>4}: "
                + "  ".join(f"{p} {row[p]:.0f}" for p in POLICIES)
            )

    print(
        "1b. against the optimum: one layer of Qwen1.5-1.8B (branch and bound needs small graphs)"
    )
    one_layer = {**load_config("qwen1.5-1.8b"), "n_layers": 1}
    out["optimum_one_layer"] = []
    for n in (512, 768):
        row = {
            "prompt_len": n,
            "tasks": len(socllm.task_graph(one_layer, "shadow-outlier", n, 256)),
        }
        for p in (*POLICIES, "optimal"):
            row[p] = socllm.simulate(
                one_layer,
                "snapdragon-8gen3",
                "shadow-outlier",
                n,
                chunk=256,
                policy=p,
                optimal_max_tasks=40,
            ).summary()["prefill_ms"]
        out["optimum_one_layer"].append(row)
        print(
            f"  prompt {n} ({row['tasks']} tasks): "
            + "  ".join(f"{p} {row[p]:.2f}" for p in (*POLICIES, "optimal"))
        )

    print("2. Hetero-tensor session, Llama-8B, prompt 256 + 64 tokens")
    sess = simulate_session("llama-3-8b", prompt_len=256, new_tokens=64)
    out["session"] = sess.summary()
    s = out["session"]
    print(
        f"  TTFT {s['ttft_ms']:.0f} ms, TPOT {s['tpot_ms_mean']:.1f} ms "
        f"({s['decode_tokens_per_s']:.2f} tok/s), session {s['session_ms']:.0f} ms, "
        f"energy {s['energy_mj'] / 1e3:.1f} J; busy "
        + ", ".join(f"{p} {v:.0f} ms" for p, v in s["busy_ms"].items())
    )
    if args.trace:
        sess.to_perfetto(args.trace)

    print("3. co-running apps: slowdown against no co-runner")
    out["co_runners"] = {"llmnpu_1024_chunk256": {}, "hetero_llama8b_256": {}}
    base = {p: llmnpu_ms(1024, 256, p) for p in POLICIES}
    for sc in SCENARIOS:
        row = {p: llmnpu_ms(1024, 256, p, sc) / base[p] - 1 for p in POLICIES}
        out["co_runners"]["llmnpu_1024_chunk256"][sc] = row
        print(f"  llm.npu {sc:<19}: " + "  ".join(f"{p} {100 * v:+.1f}%" for p, v in row.items()))
    engines = {
        "gpu-only": {},
        "hetero-layer": {},
        "hetero-tensor": {},
        "hetero-tensor re-solved": {"solve_for_co_runner": True},
    }
    for sc in SCENARIOS:
        row = {}
        for name, kw in engines.items():
            eng = name.split()[0]
            clean = socllm.simulate_hetero("llama-3-8b", "snapdragon-8gen3", eng, 256)
            tl = socllm.simulate_hetero(
                "llama-3-8b",
                "snapdragon-8gen3",
                eng,
                256,
                co_runner="" if sc == "none" else sc,
                **kw,
            )
            row[name] = (
                tl.summary()["prefill_tokens_per_s"] / clean.summary()["prefill_tokens_per_s"] - 1
            )
        out["co_runners"]["hetero_llama8b_256"][sc] = row
        print(f"  hetero  {sc:<19}: " + "  ".join(f"{p} {100 * v:+.1f}%" for p, v in row.items()))

    print("4. re-partitioning at run time: the game during decoding steps 17-48 of 64")
    out["repartition"] = {}
    for mode in ("static", "adaptive", "oracle"):
        s = simulate_session(
            "llama-3-8b",
            prompt_len=256,
            new_tokens=64,
            co_runner="mobile-game",
            co_runner_steps=(17, 49),
            repartition=mode,
        ).summary()
        out["repartition"][mode] = s
        print(
            f"  {mode:<8}: TPOT mean {s['tpot_ms_mean']:.1f} ms, p50 {s['tpot_ms_p50']:.1f}, "
            f"p99 {s['tpot_ms_p99']:.1f}, max {s['tpot_ms_max']:.1f}; "
            f"re-solved steps {s['re_solved_steps']}"
        )
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
