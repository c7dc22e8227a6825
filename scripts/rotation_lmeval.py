#!/usr/bin/env python3
"""lm-eval task accuracy of issue 39's plans (item 4): the plain and rotated plans of
``scripts/rotation_accuracy.py`` on local lm-eval tasks (each task's primary metric, as the sweep
scores it), with paired per-document differences against fp32 (the same documents; ± is the
standard error of the paired difference).

Each rotation's statistics (act-scales and gptq, 32 x 256 calibration tokens, seed 0) are
gathered on its rotated model and loaded into one plain model, which serves every plan.

    python scripts/rotation_lmeval.py --tasks arc_easy,piqa --limit 300 \\
        --json docs/results/rotation_lmeval.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
from socllm.calibration import run_steps  # noqa: E402
from socllm.cli import split_list  # noqa: E402
from socllm.eval.bench_utils import machine_line  # noqa: E402
from socllm.eval.sweep import evaluate_lmeval_cell  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402

QUAROT = "rotate=hadamard,rotate_seed=0,rotate_down=hadamard,rotate_heads=hadamard"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default="arc_easy,piqa")
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument(
        "--plans",
        default=f"fp32;w8a8;w8a8:{QUAROT};w8a8-perchannel:{QUAROT},act_percentile=99.99;"
        f"w4a16;w4a16:{QUAROT},rounding=gptq",
    )
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seqlen", type=int, default=256)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    print(machine_line())
    model = socllm.load(a.model, progress=False)
    for rotation in dict.fromkeys(socllm.Plan(p).rotation for p in split_list(a.plans)):
        m = model if rotation == "none" else model.rotated(rotation)
        cal = run_steps(m, ["act-scales", "gptq"], samples=a.calib_samples,
                        seqlen=a.calib_seqlen, seed=0, progress=False)  # fmt: skip
        model.set_calibration(cal.stats)  # to the plans of its rotation
    rows = []
    docs: dict[str, dict] = {}
    for plan in split_list(a.plans):
        for task in split_list(a.tasks):
            r = evaluate_lmeval_cell(model, plan, task, a.limit, batch_size=8, fewshot=None)
            docs.setdefault(task, {})[plan] = r["docs"]
            rows.append({"plan": plan, "task": task, "metric": r["metric"], "score": r["score"],
                         "n": r["n"]})  # fmt: skip
    for row in rows:  # paired against fp32 on the same documents
        ref, got = docs[row["task"]].get("fp32", {}), docs[row["task"]][row["plan"]]
        keys = sorted(set(ref) & set(got))
        if keys:
            d = np.array([got[k] - ref[k] for k in keys], dtype=float)
            row["delta"], row["delta_se"] = float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))
        print(f"{row['task']:<12}{row['plan']:<80}{row['score']:.3f}  "
              f"Δ {row.get('delta', 0):+.3f} ± {row.get('delta_se', 0):.3f}")  # fmt: skip
    if a.json:
        meta = {"model": a.model, "tasks": a.tasks, "limit": a.limit, "machine": machine_line()}
        atomic_write_text(Path(a.json), json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
