#!/usr/bin/env python3
"""socllm fp32 vs transformers + torch on the same GGUF: logits on five WikiText-2 prompts of
1 to 1024 tokens, and 64-token greedy generations. Prints a markdown table (docs/RESULTS.md).

    python scripts/agreement.py [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402

# after socllm: its OpenMP wait policy must reach libgomp before torch loads it (issue 37)
import torch  # noqa: E402
from socllm.data import wikitext2_test_text  # noqa: E402
from socllm.io.files import check_output_path, emit_json  # noqa: E402
from socllm.reference import load_reference  # noqa: E402

LENGTHS = [1, 17, 128, 511, 1024]
PROMPTS = ["The history of the Roman Empire", "def fibonacci(n):", "Photosynthesis is"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.json:  # before the work, not after it
        check_output_path(args.json, what="--json")
    torch.set_num_threads(2)
    socllm.set_log_level("warn")
    m = socllm.load("smollm2-135m", progress=False)
    tok, ref = load_reference("smollm2-135m")
    ids = m.tokenize(wikitext2_test_text()[:40000])
    rows = []
    print("| prompt tokens | max abs logit diff | max abs logit | ratio (limit 1e-3) |")
    print("| ---: | ---: | ---: | ---: |")
    for n in LENGTHS:
        x = ids[3 * n : 4 * n]  # same offsets as tests/python/test_reference.py
        ours = m.logits(x)
        with torch.no_grad():
            theirs = ref(torch.tensor([x])).logits[0].numpy()
        diff, scale = float(np.abs(ours - theirs).max()), float(np.abs(theirs).max())
        rows.append({"tokens": n, "max_abs_diff": diff, "max_abs_logit": scale})
        print(f"| {n} | {diff:.2e} | {scale:.2f} | {diff / scale:.1e} |")
    gens = []
    print("\n| prompt | 64 greedy tokens identical |\n| --- | --- |")
    for p in PROMPTS:
        x = tok(p)["input_ids"]
        with torch.no_grad():
            out = ref.generate(
                torch.tensor([x]),
                max_new_tokens=64,
                min_new_tokens=64,
                do_sample=False,
                pad_token_id=tok.eos_token_id,
            )
        theirs = out[0, len(x) :].tolist()
        ours = m.generate_ids(p, max_new_tokens=64, stop_at_eos=False)
        gens.append({"prompt": p, "identical": ours == theirs, "text": m.detokenize(ours)})
        print(f"| {p!r} | {'yes' if ours == theirs else 'NO'} |")
    if args.json:
        emit_json({"logits": rows, "generation": gens}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
