"""Smoothing factors and per-channel bit-widths for EdgeFlow (seed 004 §4.1).

Step smoothing chooses, per linear input, the exponent α of the input smoothing S_I^α by grid
search (the quantized linear's output error against fp32 on sampled calibration rows); step
bitwidths measures how Algorithm 1 allocates ``--bits`` per tensor (closed-form vs exact
ranking, heap vs water-filling), and with ``--bit-scope global-ttft`` stores one allocation
over the whole model at the per-tensor allocation's modelled cold-start time. Both need the
per-channel maxima of step act-scales, run first unless ``--calib`` has them.

    python calibration/bitwidths.py --out calib.h5 [--bits 5 --bit-scope global-ttft]
"""

from __future__ import annotations

import json
import sys

import _common
import numpy as np
from socllm.calibration import (
    SMOOTHING_GRID,
    Calibration,
    calibrate_act_scales,
    calibrate_bitwidths,
    calibrate_smoothing,
)


def bitwidths(model, data=None, *, bits=5.0, bit_scope="per-tensor", progress=True, **windows):
    """Steps act-scales (unless ``data`` has them), smoothing and bitwidths at ``bits``."""
    if data is None or data.stats.array("act_absmax", "attn_in") is None:
        data = calibrate_act_scales(model, data, progress=progress, **windows)
    data = calibrate_smoothing(model, data, bits=bits, progress=progress)
    return calibrate_bitwidths(model, data, bits=bits, bit_scope=bit_scope, progress=progress)


def report(data) -> None:
    print("site      alpha chosen (share of layers at each grid point > 0)")
    for site in Calibration.sites():
        alpha = data.stats.array("smooth_alpha", site)
        shares = {f"{a:g}": float(np.mean(alpha == np.float32(a))) for a in SMOOTHING_GRID}
        print(f"{site:9} " + ", ".join(f"{a}: {s:.2f}" for a, s in shares.items() if s))
    rep = json.loads(data.provenance["bitwidth_report"])
    print(
        f"closed-form vs exact channel ranking (Spearman), median over {rep['tensors']} "
        f"tensors: {rep['spearman_median']:.3f} (min {rep['spearman_min']:.3f}); tensors where "
        f"the heap differs from water-filling: {rep['tensors_where_heap_differs_from_waterfill']}"
    )
    g = rep["global_ttft"]
    if g:
        print(
            f"global-ttft: mean bits {g['global_mean_bits']:.3f} (per tensor "
            f"{g['per_tensor_mean_bits']:.3f}) at {g['global_s'] * 1e3:.2f} ms of modelled load"
        )
        for name, b in g["mean_bits_by_tensor"].items():
            print(f"  {name:7} {b['global']:.2f} bits")


def main(argv=None) -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--bits", type=float, default=5.0, help="average bits per weight")
    ap.add_argument("--bit-scope", choices=("per-tensor", "global-ttft"), default="per-tensor")
    args = ap.parse_args(argv)
    return _common.run(
        args,
        lambda model, data: bitwidths(
            model,
            data,
            bits=args.bits,
            bit_scope=args.bit_scope,
            progress=not args.quiet,
            **_common.windows(args),
        ),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
