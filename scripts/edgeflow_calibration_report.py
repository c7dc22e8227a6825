#!/usr/bin/env python3
"""What EdgeFlow's calibration steps chose (seed 004 §4.1), read from a calibration file: the
smoothing exponent α of every input site and how much the search gained, the share of linear
weights at each bit-width, and the bitwidths step's report (closed-form vs exact metric, heap vs
water-filling).

    python scripts/edgeflow_calibration_report.py --calib ef_calib.h5 [--json PATH]

CAL: `socllm calibrate --steps act-scales,smoothing,bitwidths`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import numpy as np
import socllm
from socllm.calibration import SMOOTHING_GRID, load_calibration
from socllm.io.files import check_output_path, emit_json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--calib", required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.json:
        check_output_path(args.json, what="--json")
    m = socllm.load(args.model, progress=False)
    cal = load_calibration(args.calib, m)
    grid = SMOOTHING_GRID
    at = {round(float(a), 6): i for i, a in enumerate(grid)}
    alpha = {}
    print("site        mean α  range     err(α=0)/err(chosen)  err(chosen)/err(α=0.5)  (medians)")
    for site in socllm.calibration.Calibration.sites():
        a = cal.stats.array("smooth_alpha", site)
        e = cal.stats.array("smooth_alpha_error", site).astype(np.float64)
        chosen = e[np.arange(len(a)), [at[round(float(x), 6)] for x in a]]
        row = {
            "mean": float(a.mean()),
            "min": float(a.min()),
            "max": float(a.max()),
            "err_alpha0_over_chosen": float(np.median(e[:, 0] / chosen)),
            "err_chosen_over_half": float(np.median(chosen / e[:, at[0.5]])),
        }
        alpha[site] = row
        print(
            f"{site:10s} {row['mean']:6.2f}  {row['min']:.1f}-{row['max']:.1f}   "
            f"{row['err_alpha0_over_chosen']:8.2f}              {row['err_chosen_over_half']:.3f}"
        )
    weights = np.zeros(9)
    for site in socllm.calibration.Calibration.sites():
        bits = cal.stats.array("channel_bits", site)  # [n_layers, out]
        cols = cal.stats.array("act_absmax", site).shape[1]  # the site's input width
        weights += np.bincount(bits.reshape(-1), minlength=9) * cols
    share = {b: float(weights[b] / weights.sum()) for b in range(1, 9) if weights[b]}
    print("share of linear weights per bit-width:", {b: round(v, 4) for b, v in share.items()})
    rep = json.loads(cal.provenance["bitwidth_report"])
    per = defaultdict(list)
    for r in rep["per_tensor"]:
        per[r["tensor"]].append(r["spearman_closed_vs_exact"])
    spearman = {k: float(np.median(v)) for k, v in per.items()}
    print(
        f"closed form vs exact (Spearman at {rep['bits']:g} bits): median "
        f"{rep['spearman_median']:.3f}, min {rep['spearman_min']:.3f}; per tensor kind "
        + ", ".join(f"{k} {v:.3f}" for k, v in spearman.items())
    )
    print(
        f"heap differs from water-filling in {rep['tensors_where_heap_differs_from_waterfill']} "
        f"of {rep['tensors']} tensors"
    )
    emit_json(
        {
            "alpha": alpha,
            "bit_share": share,
            "spearman_per_tensor_kind": spearman,
            "report": {k: v for k, v in rep.items() if k != "per_tensor"},
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
