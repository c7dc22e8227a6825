"""Head and layer importance for shadowAttn's per-head sparsity (seed 000 §3.2).

The loss increase (nats per token) when one head's attention output is zeroed (Eq. 1) and when
a layer's whole attention output is zeroed (Eq. 2), averaged over calibration windows; plan
``shadow-attn`` turns them into per-head keep ratios by Eq. 3, shown here at a 20% budget. The
paper profiles 128 windows; 8 of 256 tokens take a few minutes for SmolLM2-135M on 2 cores.

    python calibration/head_importance.py --out calib.h5 [--samples 8 --seqlen 256]
"""

from __future__ import annotations

import sys

import _common
import numpy as np
from socllm.calibration import calibrate_head_importance
from socllm.ops import head_keep_ratios


def head_importance(
    model, data=None, *, samples=8, seqlen=256, seed=0, corpus="wikitext2", progress=True
):
    """Step head-importance on ``samples`` windows of ``seqlen`` tokens."""
    return calibrate_head_importance(
        model,
        data,
        importance_samples=samples,
        importance_seqlen=seqlen,
        seed=seed,
        corpus=corpus,
        progress=progress,
    )


def report(data, keep: float = 0.2) -> None:
    heads = data.stats.array("head_importance")
    layers = data.stats.array("layer_importance")
    ratios = head_keep_ratios(heads, layers, keep)
    print("layer  importance  most important head (nats)  keep ratios at 20% (min-max)")
    for i in np.argsort(-layers)[:8]:
        h = int(np.argmax(heads[i]))
        print(
            f"{i:5d} {layers[i]:11.4f} {h:12d} ({heads[i, h]:.4f}) "
            f"{ratios[i].min():14.2f}-{ratios[i].max():.2f}"
        )


def main(argv=None) -> int:
    ap = _common.parser(__doc__)
    ap.set_defaults(samples=8, seqlen=256)
    args = ap.parse_args(argv)
    return _common.run(
        args,
        lambda model, data: head_importance(
            model,
            data,
            samples=args.samples,
            seqlen=args.seqlen,
            seed=args.seed,
            corpus=args.corpus,
            progress=not args.quiet,
        ),
        report,
    )


if __name__ == "__main__":
    sys.exit(main())
