"""Gemma-3-270M in socllm against transformers on the same GGUF (issue 16 item 1).

    python scripts/gemma3_agreement.py [--lengths 1,7,100,700]

Prints, per prompt length of WikiText-2 test text, the largest |logit| difference relative to
the largest |logit| and the share of positions whose argmax agrees (fp32 on both sides).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import socllm
from socllm.data import wikitext2_test_text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1,7,100,700")
    args = ap.parse_args()
    import torch
    from socllm.reference import load_reference

    tok, ref = load_reference("gemma3-270m")
    m = socllm.load("gemma3-270m", progress=False)
    ids = tok(wikitext2_test_text()[:20000]).input_ids
    for n in (int(x) for x in args.lengths.split(",")):
        with torch.no_grad():
            r = ref(torch.tensor([ids[:n]])).logits[0].numpy()
        o = m.logits(ids[:n])
        err = np.abs(o - r).max() / np.abs(r).max()
        agree = (o.argmax(-1) == r.argmax(-1)).mean()
        print(f"{n:>5} tokens: max relative error {err:.1e}, argmax agreement {agree:.3f}")
    # W4A16 with every float op in fp32 (fp16 float ops overflow on Gemma 3): top-1 kept
    ids200 = m.tokenize(wikitext2_test_text()[:3000])[:200]
    floats = "norm=fp32,activation=fp32,residual=fp32,rope=fp32,attention=fp32"
    top1 = (m.logits(ids200, f"w4a16:{floats}").argmax(-1) == m.logits(ids200).argmax(-1)).mean()
    print(f"w4a16 with fp32 float ops: fp32's top-1 kept at {top1:.2f} of 200 positions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
