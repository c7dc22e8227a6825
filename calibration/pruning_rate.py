"""The automatic pruning rate of llm.npu's shadow outlier execution (seed 003's reviewers asked
how seed 001's 85% is chosen).

The largest share of linear inputs whose CPU part can be pruned while perplexity on validation
text from the calibration slice stays within ``--budget`` (relative) of pruning nothing, by
bisection over the number of pruned inputs. Needs the outlier statistics (run
outlier_thresholds.py first, or give a file that has them):

    python calibration/pruning_rate.py --calib calib.h5 --out calib.h5 [--budget 0.01]

then run ``shadow-outlier:pruning_rate=<the rate printed>``.
"""

from __future__ import annotations

import json
import sys

import _common
from outlier_thresholds import outlier_thresholds
from socllm.calibration import calibrate_pruning_rate


def main(argv=None) -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--budget", type=float, default=0.01, help="relative perplexity increase")
    ap.add_argument("--pruning-plan", default="shadow-outlier")
    args = ap.parse_args(argv)
    model, data = _common.load(args)
    if data is None or data.stats.array("outlier_threshold", "attn_in") is None:
        data = outlier_thresholds(model, data, progress=not args.quiet, **_common.windows(args))
    data = calibrate_pruning_rate(
        model, data, budget=args.budget, pruning_plan=args.pruning_plan, progress=not args.quiet
    )
    tried = json.loads(data.provenance["auto_pruning_validation"])["tried"]
    for t in tried:
        print(f"pruning rate {t['rate']:.3f}: perplexity {t['perplexity']:.3f}")
    print(f"chosen: shadow-outlier:pruning_rate={data.provenance['auto_pruning_rate']:.4f}")
    _common.save(args, data, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
