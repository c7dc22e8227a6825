"""The automatic pruning rate of llm.npu's shadow outlier execution (seed 003's reviewers asked
how 85% is chosen): the largest share of linear inputs whose CPU part can be pruned while the
perplexity on validation text from the calibration slice stays within --budget (relative) of
pruning nothing. Needs the outliers step (continue a file with --calib, or run all three):

    python calibration/pruning_rate.py --calib calib.h5 --out calib.h5 [--budget 0.01]
    socllm calibrate --steps act-scales,outliers,pruning-rate --out calib.h5

writes the root attributes auto_pruning_rate, auto_pruning_budget, auto_pruning_validation.
"""

import sys

from socllm.cli import main

if __name__ == "__main__":
    sys.exit(main(["calibrate", "--steps", "pruning-rate", *sys.argv[1:]]))
