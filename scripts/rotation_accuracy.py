#!/usr/bin/env python3
"""Accuracy of linear plans on a model whose residual stream is rotated (issue 39 item 1;
QuaRot, Ashkboos et al. 2024 §4.1), next to the same plans on the plain model.

Every row is scored against the plain model's fp32 logits on the same held-out WikiText-2
windows: the paired mean NLL difference per token (ΔNLL, error over windows), the KL divergence
from fp32 and the top-1 agreement. A rotation changes no fp32 logit (its own row shows the float
rounding), so any difference of a quantized plan comes from how its activations quantize. Each
rotation's static scales are calibrated on its own model (step act-scales, the same windows of
the calibration slice: calibration text is never scored).

    python scripts/rotation_accuracy.py --json docs/results/rotation_accuracy.json
    python scripts/rotation_accuracy.py --windows 2 --plans w8a8 --rotations none,hadamard  # smoke
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
from socllm.calibration import calibrate_act_scales  # noqa: E402
from socllm.cli import split_list  # noqa: E402
from socllm.eval.bench_utils import machine_line  # noqa: E402
from socllm.eval.divergence import heldout_windows, summarize, window_stats  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--plans", default="fp32,w8a8,w8a8-perchannel,smoothquant,w4-group,w4a16")
    ap.add_argument("--rotations", default="none,hadamard,random")
    ap.add_argument("--seed", type=int, default=0, help="the rotations' seed")
    ap.add_argument("--windows", type=int, default=16, help="held-out windows scored")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seqlen", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    say = (lambda *x: None) if a.quiet else print
    plans, rotations = split_list(a.plans), split_list(a.rotations)
    say(machine_line())
    models = {r: socllm.load(a.model, progress=not a.quiet, rotate=r, rotate_seed=a.seed)
              for r in rotations}  # fmt: skip
    plain = models.get("none") or socllm.load(a.model, progress=False)
    spans = heldout_windows(plain, a.context, a.windows)
    # how far each linear input's largest channel stands out: per layer the largest channel
    # absmax over the median channel's, the median of that over layers (a rotation of the
    # residual stream reaches attn_in and mlp_in only; attn_out and mlp_act need online ones)
    peaks: dict[str, dict[str, float]] = {}
    for r, m in models.items():
        t0 = time.perf_counter()
        cal = calibrate_act_scales(
            m, samples=a.calib_samples, seqlen=a.calib_seqlen, seed=0, progress=not a.quiet
        )
        m.set_calibration(cal.stats)
        peaks[r] = {}
        for site in ("attn_in", "attn_out", "mlp_in", "mlp_act"):
            x = cal.stats.array("act_absmax", site)
            peaks[r][site] = float(np.median(x.max(1) / np.median(x, 1)))
        say(f"act-scales on the {r} model: {time.perf_counter() - t0:.1f} s; channel peak / "
            + ", ".join(f"{s} {v:.1f}" for s, v in peaks[r].items()))  # fmt: skip
    rows: dict[tuple[str, str], list[dict]] = {(r, p): [] for r in rotations for p in plans}
    for ids in spans:
        targets = np.asarray(ids[1:], dtype=np.int64)
        ref = plain.logits(ids, "fp32")[:-1]
        for r, m in models.items():
            for p in plans:
                rows[(r, p)].append(window_stats(ref, m.logits(ids, p)[:-1], targets))
    out = []
    say(f"\n{a.model}, {len(spans)} held-out windows of {a.context} tokens, against plain fp32")
    say(f"{'plan':<18}{'rotation':<10}{'ΔNLL (nats/token)':>22}{'KL':>20}{'top-1':>10}{'ppl':>9}")
    for p in plans:
        for r in rotations:
            w = rows[(r, p)]
            s = summarize(w)
            d = np.array([x["nll"] / x["n"] - x["nll_ref"] / x["n"] for x in w])
            dnll, se = (
                float(d.mean()),
                float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0,
            )
            out.append({"plan": p, "rotation": r, "dnll": dnll, "dnll_se": se, **s, "windows": w})
            say(
                f"{p:<18}{r:<10}{dnll:>+14.4f} ± {se:.4f}{s['kl']['value']:>12.4f} ± "
                f"{s['kl']['se']:.4f}{100 * s['top1']['value']:>9.1f}%{s['ppl']:>9.2f}"
            )
    if a.json:
        meta = {"model": a.model, "context": a.context, "windows": len(spans), "seed": a.seed,
                "calib_samples": a.calib_samples, "calib_seqlen": a.calib_seqlen,
                "channel_peak_over_median": peaks, "machine": machine_line()}  # fmt: skip
        atomic_write_text(Path(a.json), json.dumps({"meta": meta, "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
