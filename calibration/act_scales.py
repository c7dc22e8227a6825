"""Static activation scales for the NPU plans (seed 001 §2.3, §3.3): per-channel max |x| of
every linear input, from WikiText-2 windows in the documented calibration slice.

    python calibration/act_scales.py --samples 128 --seqlen 512 --seed 0 --out calib.h5

is the same as ``socllm calibrate --steps act-scales ...`` (this script only forwards to it).
"""

import sys

from socllm.cli import main

if __name__ == "__main__":
    sys.exit(main(["calibrate", "--steps", "act-scales", *sys.argv[1:]]))
