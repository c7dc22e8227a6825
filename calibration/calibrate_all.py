"""One calibration file with everything the plans read, on a WikiText-style corpus.

Runs the scripts beside this one in order, each adding its arrays to the same statistics, and
saves the file (atomically) after each, so an interrupted run keeps what finished: outlier
thresholds (llm.npu), head importance and scale buckets (shadowAttn), smoothing factors and
bit-widths (EdgeFlow). Every plan in ``socllm.Plan.known()`` then runs from the one file.

    python calibration/calibrate_all.py --out calib.h5             # the paper-sized settings
    python calibration/calibrate_all.py --out calib.h5 --corpus my_text.txt --samples 32
"""

from __future__ import annotations

import sys

import _common
from bitwidths import bitwidths
from bitwidths import report as bitwidths_report
from head_importance import head_importance
from head_importance import report as head_report
from outlier_thresholds import outlier_thresholds
from outlier_thresholds import report as outlier_report
from scale_buckets import report as bucket_report
from scale_buckets import scale_buckets


def main(argv=None) -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--importance-samples", type=int, default=8, help="head-importance windows")
    ap.add_argument("--importance-seqlen", type=int, default=256)
    ap.add_argument("--bits", type=float, default=5.0, help="EdgeFlow's average bits")
    args = ap.parse_args(argv)
    model, data = _common.load(args)
    windows, progress = _common.windows(args), not args.quiet
    data = outlier_thresholds(model, data, progress=progress, **windows)
    outlier_report(data)
    _common.save(args, data, model)
    data = head_importance(
        model,
        data,
        samples=args.importance_samples,
        seqlen=args.importance_seqlen,
        seed=args.seed,
        corpus=args.corpus,
        progress=progress,
    )
    head_report(data)
    _common.save(args, data, model)
    data = scale_buckets(model, data, progress=progress, **windows)
    bucket_report(data)
    _common.save(args, data, model)
    data = bitwidths(model, data, bits=args.bits, progress=progress, **windows)
    bitwidths_report(data)
    _common.save(args, data, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
