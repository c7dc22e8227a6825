"""Outlier thresholds for llm.npu's shadow outlier execution (seed 001 §3.3).

Per linear input: the per-channel max |x| and |x| histogram of the fp32 model on calibration
windows (step act-scales), the outlier threshold t read off the histogram (the NPU's static
scale is t / 127) and, on a second pass over the same windows, how often each channel exceeds
it (step outliers): hot channels (Fig. 11) and outlier importance (Fig. 12) come from these.

    python calibration/outlier_thresholds.py --out calib.h5 [--percentile 99.99]
"""

from __future__ import annotations

import sys

import _common
import numpy as np
from socllm.calibration import Calibration, calibrate_act_scales, calibrate_outliers


def outlier_thresholds(model, data=None, *, percentile=99.99, progress=True, **windows):
    """Steps act-scales (on ``windows``: corpus, samples, seqlen, seed) and outliers."""
    data = calibrate_act_scales(model, data, progress=progress, **windows)
    return calibrate_outliers(model, data, percentile=percentile, progress=progress)


def report(data) -> None:
    s = data.stats
    print(f"{'site':9} {'threshold (median over layers)':>31} {'outlier channels / window':>26}")
    for site in Calibration.sites():
        t = s.array("outlier_threshold", site)
        per_window = s.array("outlier_seq_channels", site) / np.maximum(
            s.array("outlier_seqs", site), 1
        )
        print(f"{site:9} {np.median(t):31.3f} {per_window.mean():26.1f}")


def main(argv=None) -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--percentile", type=float, default=99.99, help="of |x|, in %%")
    args = ap.parse_args(argv)
    return _common.run(
        args,
        lambda model, data: outlier_thresholds(
            model,
            data,
            percentile=args.percentile,
            progress=not args.quiet,
            **_common.windows(args),
        ),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
