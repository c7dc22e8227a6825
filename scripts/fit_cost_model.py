#!/usr/bin/env python3
"""Fits the per-processor matmul cost models to part of llm.npu's Table 3 (seed 001 §2.2,
Redmi K70 Pro / Snapdragon 8 Gen 3) and predicts the held-out rows through the C++ CostModel.

    python scripts/fit_cost_model.py [--train 1,2,4,5] [--write] [--json PATH]

Models (cpp/soc/cost_model.cpp):
  NPU INT8   t = overhead + max(padded flops / compute roof, K*N weight bytes / weight rate):
             at Table 3's 32-64 rows the latency follows the weight size (rows 2 and 4 hold the
             same 16.8 MB of weights at 2x different flops and take 1.5 vs 1.7 ms), so the fit is
             linear in K*N; the compute roof is HeteroLLM's measured NPU throughput (seed 002 §1).
  CPU INT8, GPU FP16, NPU FP16   t = overhead + flops / rate (linear, seed 002 §3.1).
Each fit is least squares on the training rows; a negative overhead is refitted as 0.

--write stores the fitted numbers, with the rest of each device's cost model (every number
pointing at the profile entry or seed it comes from), under "cost_model" in
python/socllm/devices/*.json. The 8 Gen 2 and 8 Elite profiles have no matmul measurements in
the seeds, so their fitted numbers are the 8 Gen 3 fit, marked assumed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from socllm.devices.fit import (  # noqa: E402
    DEVICES,
    TABLE,
    borrowed,
    characterizations_8gen3,
    cost_model_8gen3,
    fit,
    predict,
    scenarios_8gen3,
)
from socllm.io.files import atomic_write_text  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="1,2,4,5", help="Table 3 rows (1-based) to fit on")
    ap.add_argument("--write", action="store_true", help="store the cost models in the profiles")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    table = json.loads(TABLE.read_text())
    rows = table["rows"]
    train = [int(x) for x in args.train.split(",")]
    if not train or any(not 1 <= i <= len(rows) for i in train):
        raise SystemExit(f"--train rows must be in 1..{len(rows)}")
    fitted = fit(rows, train)
    p3 = json.loads((DEVICES / "snapdragon-8gen3.json").read_text())
    p3["cost_model"] = cost_model_8gen3(p3, fitted)
    p3["characterizations"] = characterizations_8gen3(p3)
    p3["scenarios"] = scenarios_8gen3()
    preds = predict(rows, p3)

    print(
        f"cost models fitted on Table 3 rows {args.train}; held out: "
        f"{','.join(str(i) for i in range(1, len(rows) + 1) if i not in train)}"
    )
    print(
        f"{'row':>3} {'shape':<14} {'column':<12} {'measured ms':>11} {'predicted':>10} "
        f"{'error':>7}  set"
    )
    for p in preds:
        held = p["row"] not in train
        print(
            f"{p['row']:>3} {p['shape']:<14} {p['column']:<12} {p['measured_ms']:>11.1f} "
            f"{p['predicted_ms']:>10.2f} {100 * p['error']:>+6.1f}%  "
            f"{'HELD-OUT' if held else 'train'}"
        )
    held_err = [abs(p["error"]) for p in preds if p["row"] not in train]
    print(
        f"held-out rows: max |error| {100 * max(held_err):.1f}%, "
        f"mean {100 * np.mean(held_err):.1f}% (goal: within 20%)"
    )
    for name, group in fitted.items():
        print(name, {k: round(v["value"], 3) for k, v in group.items()})

    if args.write:
        atomic_write_text(DEVICES / "snapdragon-8gen3.json", json.dumps(p3, indent=1) + "\n")
        for dev in ("snapdragon-8gen2", "snapdragon-8elite"):
            p = json.loads((DEVICES / f"{dev}.json").read_text())
            p["cost_model"] = borrowed(p3["cost_model"], dev, p)
            atomic_write_text(DEVICES / f"{dev}.json", json.dumps(p, indent=1) + "\n")
        print(f"wrote cost_model into {DEVICES}/*.json")
    if args.json:
        atomic_write_text(
            Path(args.json),
            json.dumps({"train_rows": train, "fitted": fitted, "predictions": preds}, indent=1)
            + "\n",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
