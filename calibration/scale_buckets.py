"""Q/K scale statistics and scale buckets for shadowAttn's NPU estimation (seed 000 §3.3).

Per calibration window, the max |x| of every head's post-RoPE Q and K (and V) (step
qk-scales); a head's INT8 scale is max / 127. Plan ``shadow-attn`` pre-builds one NPU graph per
bucket <λ̄Q·σ^a, λ̄K·σ^b> around each head's mean scale λ̄ and runs an input on the nearest one;
this script shows, for the bucket count and step a plan would use (§5.2: 9 buckets, σ = 0.5),
which buckets the calibration windows themselves would pick and how far their own scales are
from the picked bucket's.

    python calibration/scale_buckets.py --out calib.h5 [--buckets 9 --step 0.5]
"""

from __future__ import annotations

import sys
from collections import Counter

import _common
import numpy as np
from socllm.calibration import calibrate_qk_scales
from socllm.ops import bucket_offsets, nearest_bucket


def scale_buckets(model, data=None, *, progress=True, **windows):
    """Step qk-scales on ``windows`` (corpus, samples, seqlen, seed)."""
    return calibrate_qk_scales(model, data, progress=progress, **windows)


def report(data, buckets: int = 9, step: float = 0.5) -> None:
    q = data.stats.array("q_absmax") / 127.0  # [windows, layers, heads]
    k = data.stats.array("k_absmax") / 127.0  # [windows, layers, kv heads]
    group = q.shape[2] // k.shape[2]
    mq, mk = q.mean(0), k.mean(0)  # the bucket centres λ̄
    offsets = bucket_offsets(buckets)
    picked, err = Counter(), []
    for layer in range(q.shape[1]):
        for h in range(q.shape[2]):
            bq = [mq[layer, h] * step**a for a, _ in offsets]
            bk = [mk[layer, h // group] * step**b for _, b in offsets]
            for w in range(q.shape[0]):
                lq, lk = q[w, layer, h], k[w, layer, h // group]
                i = nearest_bucket(float(lq), float(lk), bq, bk)
                picked[offsets[i]] += 1
                err.append(max(abs(bq[i] / lq - 1), abs(bk[i] / lk - 1)))
    total = sum(picked.values())
    print(
        f"{q.shape[0]} windows x {q.shape[1]} layers x {q.shape[2]} heads; spread of a head's "
        f"Q scale over windows (max/min, median): {np.median(q.max(0) / q.min(0)):.2f}"
    )
    print("bucket (a, b)  share of inputs")
    for off in offsets:
        print(f"{off!s:13} {picked[off] / total:15.3f}")
    print(
        f"the picked bucket's scale vs the input's own: median {np.median(err):.1%}, "
        f"95th percentile {np.percentile(err, 95):.1%}"
    )


def main(argv=None) -> int:
    ap = _common.parser(__doc__)
    ap.add_argument("--buckets", type=int, default=9)
    ap.add_argument("--step", type=float, default=0.5)
    args = ap.parse_args(argv)
    return _common.run(
        args,
        lambda model, data: scale_buckets(
            model, data, progress=not args.quiet, **_common.windows(args)
        ),
        lambda d: report(d, args.buckets, args.step),
    )


if __name__ == "__main__":
    sys.exit(main())
