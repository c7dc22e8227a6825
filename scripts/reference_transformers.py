#!/usr/bin/env python3
"""WikiText-2 perplexity of the reference implementation (transformers + torch, CPU) under
socllm's protocol, so `socllm eval` can be checked against it.

Protocol (README "Perplexity"): the whole file tokenized once by transformers' tokenizer for
the same GGUF; windows of --context tokens every --stride tokens (default: non-overlapping);
each window scores only tokens no earlier window scored; a window's first token is not scored.

    python scripts/reference_transformers.py --json docs/results/wikitext2_transformers.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from socllm.data import wikitext2_test_path  # noqa: E402
from socllm.registry import BUILTIN_MODELS  # noqa: E402


def load_reference(model: str = "smollm2-135m"):
    gguf = BUILTIN_MODELS[model].path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ref = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    return tok, ref


@torch.no_grad()
def perplexity(ref, ids: list[int], context: int, stride: int, progress: bool = True) -> dict:
    nll_parts = []
    prev_end, n_windows = 0, 0
    starts = list(range(0, len(ids), stride))
    for begin in tqdm(starts, desc="transformers ppl", disable=not progress):
        end = min(begin + context, len(ids))
        window = torch.tensor([ids[begin:end]])
        keep = min(end - prev_end, window.shape[1] - 1)
        if keep > 0:
            logits = ref(window).logits[0, :-1].double()
            lp = torch.log_softmax(logits, dim=-1).gather(1, window[0, 1:, None]).squeeze(1)
            nll_parts.append(-lp[-keep:].numpy())
            n_windows += 1
        prev_end = end
        if end == len(ids):
            break
    nll = np.concatenate(nll_parts)
    return {
        "perplexity": math.exp(nll.mean()),
        "nll_mean": float(nll.mean()),
        "n_scored": int(nll.size),
        "n_tokens": len(ids),
        "n_windows": n_windows,
        "context": context,
        "stride": stride,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--stride", type=int, default=None)
    ap.add_argument("--limit-tokens", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok, ref = load_reference(args.model)
    ids = tok(wikitext2_test_path().read_text(encoding="utf-8"))["input_ids"]
    if args.limit_tokens:
        ids = ids[: args.limit_tokens]
    t0 = time.perf_counter()
    r = perplexity(ref, ids, args.context, args.stride or args.context)
    r.update(
        implementation=f"transformers {__import__('transformers').__version__} + torch "
        f"{torch.__version__}",
        threads=args.threads,
        limit_tokens=args.limit_tokens,
        seconds=round(time.perf_counter() - t0, 1),
    )
    print(json.dumps(r, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
