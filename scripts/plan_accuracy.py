#!/usr/bin/env python3
"""Benchmark accuracy of a model under several plans: the 8 lm-eval tasks x every plan.

Each (plan, task) is evaluated on the same documents (--limit per task; MMLU's limit spread
over its 57 subjects), so a plan's difference to fp32 is paired: the table shows each plan's
accuracy, its change from fp32 in points, and the standard error of that paired difference.
Results go to --json after every (plan, task), written atomically; a rerun with the same file
skips what is already there, so an interrupted run resumes.

    python scripts/plan_accuracy.py --calib socllm-out/calib-smollm2-135m.h5 --limit 100 \\
        --json docs/results/plan_accuracy.json
    python scripts/plan_accuracy.py --json docs/results/plan_accuracy.json --table-only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
from socllm.cli import split_list  # noqa: E402
from socllm.eval.lmeval.task_configs import PRIMARY_METRIC  # noqa: E402
from socllm.eval.sweep import PRESET_PLANS, evaluate_lmeval_cell, paired_change  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402

PLANS = list(PRESET_PLANS)
METRIC = PRIMARY_METRIC


def evaluate_pair(
    model, plan: str, task: str, limit: int | None, batch_size: int, fewshot: int | None = None
) -> dict:
    t0 = time.perf_counter()
    r = evaluate_lmeval_cell(model, plan, task, limit, batch_size, fewshot)
    return {"plan": plan, "task": task, **r, "seconds": round(time.perf_counter() - t0, 1)}


def table(results: dict, plans: list[str], tasks: list[str]) -> str:
    """Markdown: one row per plan, per task the score in % and the paired change vs fp32."""
    base = {t: results.get(f"fp32/{t}") for t in tasks}
    head = "| plan | " + " | ".join(f"{t} ({METRIC[t]})" for t in tasks) + " | mean | vs fp32 |"
    lines = [head, "|" + " --- |" + " ---: |" * (len(tasks) + 2)]
    for plan in plans:
        cells, means, deltas = [], [], []
        for t in tasks:
            r = results.get(f"{plan}/{t}")
            if r is None:
                cells.append("")
                continue
            cell = f"{100 * r['score']:.1f}"
            means.append(r["score"])
            if plan != "fp32" and base[t] is not None:
                paired, text = paired_change(base[t]["docs"], r["docs"])
                deltas.append(paired["delta"])
                cell += f" ({text})"
            cells.append(cell)
        mean = f"{100 * sum(means) / len(means):.1f}" if len(means) == len(tasks) else ""
        delta = (
            f"{100 * sum(deltas) / len(deltas):+.1f}"
            if plan != "fp32" and len(deltas) == len(tasks)
            else ""
        )
        lines.append(f"| `{plan}` | " + " | ".join(cells) + f" | {mean} | {delta} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--calib", default=None, help="calibration file for the static plans")
    ap.add_argument(
        "--plans",
        default=",".join(PLANS),
        help="plans separated by ',' (or ';' when a plan has options)",
    )
    ap.add_argument("--tasks", default=",".join(METRIC))
    ap.add_argument("--limit", type=int, default=100, help="documents per task (0 = all)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument(
        "--fewshot",
        type=int,
        default=None,
        help="few-shot examples per prompt (long prompts, EdgeFlow Table 3 style; default: "
        "the task's)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", required=True, help="results file (resumed if it exists)")
    ap.add_argument("--table-only", action="store_true", help="print the table of --json")
    args = ap.parse_args()

    # plans with options of their own ("edgeflow:bits=5,allocation=cmpq") are separated by ";"
    plans, tasks = split_list(args.plans), split_list(args.tasks)
    for t in tasks:
        if t not in METRIC:
            raise SystemExit(f"plan_accuracy: unknown task {t!r} (known: {', '.join(METRIC)})")
    out_path = Path(args.json)
    state = json.loads(out_path.read_text()) if out_path.exists() else {}
    results: dict = state.get("results", {})
    limit = args.limit or None
    if state and state.get("limit") != limit:
        raise SystemExit(f"plan_accuracy: {out_path} was run with limit {state.get('limit')}")
    if state and state.get("fewshot") != args.fewshot:
        raise SystemExit(f"plan_accuracy: {out_path} was run with fewshot {state.get('fewshot')}")

    if not args.table_only:
        socllm.set_num_threads(args.threads)
        socllm.set_log_level("warn")
        model = socllm.load(args.model, calib=args.calib, progress=False)
        todo = [(p, t) for p in plans for t in tasks if f"{p}/{t}" not in results]
        for i, (plan, task) in enumerate(todo, 1):
            r = evaluate_pair(model, plan, task, limit, args.batch_size, args.fewshot)
            results[f"{plan}/{task}"] = r
            print(
                f"[{i}/{len(todo)}] {plan:<16} {task:<14} {r['metric']} "
                f"{100 * r['score']:.1f} (n={r['n']}, {r['seconds']} s)",
                flush=True,
            )
            state = {
                "model": args.model,
                "calib": args.calib,
                "limit": limit,
                "fewshot": args.fewshot,
                "metrics": METRIC,
                "results": results,
            }
            atomic_write_text(out_path, json.dumps(state) + "\n")
    print(f"\n{args.model}, limit {limit} documents per task (mmlu: spread over 57 subjects)")
    print(
        "score % (paired change vs fp32 in points ± its standard error [paired bootstrap 95% "
        "interval])\n"
    )
    print(table(results, plans, tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
