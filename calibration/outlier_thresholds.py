"""Outlier profiling for llm.npu's shadow outlier execution (seed 001 §3.3): per linear input
the outlier threshold (static scale = threshold / 127), per-channel outlier counts (hot
channels, Fig. 11) and outlier importance (pruning, Fig. 12), on WikiText-2 windows of the
documented calibration slice. Runs the act-scales step first (the thresholds come from its
|x| histograms), then a second pass over the same windows.

    python calibration/outlier_thresholds.py --samples 128 --seqlen 512 --seed 0 \\
        [--outlier-threshold percentile|maxmin] [--percentile 99.99] --out calib.h5

is the same as ``socllm calibrate --steps act-scales,outliers ...``.
"""

import sys

from socllm.cli import main

if __name__ == "__main__":
    sys.exit(main(["calibrate", "--steps", "act-scales,outliers", *sys.argv[1:]]))
