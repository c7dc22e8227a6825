#!/usr/bin/env python3
"""EdgeFlow's per-tensor bit allocation against one TTFT-budgeted heap over the whole model
(issue 14 item 6, beyond the paper), at equal modelled cold-start time.

For every --bits B: plan ``edgeflow:bits=B`` (Algorithm 1 per tensor, the paper) against
``edgeflow:bitwidths=stored`` with the bit-widths of step bitwidths at
``bit_scope=global-ttft`` (one heap over every output channel; error: the closed form weighted
by the channel's share of its tensor's output; cost: flash bytes / bandwidth + unpacking time on
--device; budget: the per-tensor allocation's modelled time; cpp/calibrate/bitwidths.cpp).
Both run on the same held-out WikiText-2 windows; reported per B: modelled load time of each
(flash + unpack, the part of the TTFT the allocation changes: prefill runs the same INT8
GEMMs), mean bits, ΔNLL vs fp32 and the paired difference global - per-tensor with its SE
over 128-token blocks, KL and top-1 agreement with fp32.

    python scripts/edgeflow_global_allocation.py --calib ef_calib.h5 [--bits 4 5 6]
        [--windows 16] [--json docs/results/edgeflow_global_allocation.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from socllm.calibration import load_calibration, run_steps, using_calibration
from socllm.eval.report import paired_nll_vs
from socllm.io.files import emit_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from edgeflow_accuracy import add_window_args, evaluate, load_with_reference  # noqa: E402


def metrics(ref_nll, r: dict, mean_bits: float, load_s: float) -> dict:
    return {
        "modelled_load_s": load_s,
        "mean_bits": mean_bits,
        "perplexity": float(np.exp(r["nll"].mean())),
        **paired_nll_vs(ref_nll, r["nll"]),
        "kl": r["kl"],
        "top1": r["top1"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--calib", required=True, help="with steps act-scales and smoothing")
    ap.add_argument("--bits", type=float, nargs="+", default=[4.0, 5.0, 6.0])
    ap.add_argument("--device", default="snapdragon-8elite")
    ap.add_argument(
        "--importance",
        nargs="+",
        default=["output-share", "output-absolute", "none"],
        help="the global heap's error weightings to compare (socllm calibrate --bit-importance)",
    )
    add_window_args(ap)
    args = ap.parse_args(argv)
    m, windows, ref_lp, ref_top1, ref_nll = load_with_reference(args)
    rows = []
    for b in args.bits:
        t0 = time.perf_counter()
        per_tensor = evaluate(m, f"edgeflow:bits={b!r}", windows, ref_lp, ref_top1)
        row = {"bits": b, "global_ttft": {}}
        for importance in args.importance:
            data = load_calibration(args.calib, m)
            run_steps(
                m,
                "bitwidths",
                data=data,
                progress=not args.quiet,
                bits=b,
                bit_scope="global-ttft",
                cost_device=args.device,
                bit_importance=importance,
            )
            rep = json.loads(data.provenance["bitwidth_report"])["global_ttft"]
            with using_calibration(m, data.stats):
                glob = evaluate(m, "edgeflow:bitwidths=stored", windows, ref_lp, ref_top1)
            row["per_tensor"] = metrics(
                ref_nll, per_tensor, rep["per_tensor_mean_bits"], rep["budget_s"]
            )
            g = metrics(ref_nll, glob, rep["global_mean_bits"], rep["global_s"])
            diff = paired_nll_vs(per_tensor["nll"], glob["nll"])
            g["minus_per_tensor"] = {k: diff[k] for k in ("delta_nll", "delta_nll_se")}
            g["allocation"] = {
                k: rep[k]
                for k in (
                    "mean_bits_by_tensor",
                    "weight_share_by_bits",
                    "per_tensor_weighted_error",
                    "global_weighted_error",
                    "cost_inputs",
                )
            }
            row["global_ttft"][importance] = g
            if not args.quiet:
                pt, d = row["per_tensor"], g["minus_per_tensor"]
                print(
                    f"{b:g} bits, {importance}: modelled load {pt['modelled_load_s'] * 1e3:.2f}"
                    f" / {g['modelled_load_s'] * 1e3:.2f} ms, mean bits {pt['mean_bits']:.3f} / "
                    f"{g['mean_bits']:.3f}; dNLL per-tensor {pt['delta_nll']:+.4f}, global "
                    f"{g['delta_nll']:+.4f}, global - per-tensor {d['delta_nll']:+.4f} ± "
                    f"{d['delta_nll_se']:.4f}; KL {pt['kl']:.4f} / {g['kl']:.4f}; top-1 "
                    f"{pt['top1']:.3f} / {g['top1']:.3f}",
                    flush=True,
                )
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
    emit_json(
        {
            "model": args.model,
            "calibration": args.calib,
            "device": args.device,
            "windows": args.windows,
            "seqlen": args.seqlen,
            "tokens_scored": int(ref_nll.size),
            "rows": rows,
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
