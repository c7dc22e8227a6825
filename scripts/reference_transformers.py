#!/usr/bin/env python3
"""WikiText-2 perplexity of the reference implementation (transformers + torch, CPU) under
socllm's protocol, so `socllm eval` can be checked against it.

Protocol (README "Perplexity"): the whole file tokenized once by transformers' tokenizer for
the same GGUF; windows of --context tokens every --stride tokens (default: non-overlapping);
each window scores only tokens no earlier window scored; a window's first token is not scored.
The code is socllm.reference; this is its command line.

    python scripts/reference_transformers.py --json docs/results/wikitext2_transformers.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from socllm.reference import wikitext2_perplexity  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--stride", type=int, default=None)
    ap.add_argument("--limit-tokens", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    r = wikitext2_perplexity(
        args.model,
        context=args.context,
        stride=args.stride,
        limit_tokens=args.limit_tokens,
        threads=args.threads,
    )
    print(json.dumps(r, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
