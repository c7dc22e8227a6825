"""llm.npu's chunk-sharing graphs (seed 001 §3.2) counted on a shape-only config: subgraphs per
chunk, how many are shared, graphs built and memory with and without sharing.

    python scripts/graph_census.py --config qwen1.5-1.8b --prompt-len 1024 --chunk 256
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from socllm.configs import graph_census, known
from socllm.io.files import atomic_write_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen1.5-1.8b", choices=known())
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--plan", default="w8a8", help="plan whose graphs are counted")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    shared = graph_census(a.config, a.prompt_len, a.chunk, plan=a.plan)
    naive = graph_census(a.config, a.prompt_len, a.chunk, plan=a.plan, sharing=False)
    gb = 1e9
    print(
        f"{a.config}, prompt {a.prompt_len}, chunk {a.chunk} ({shared['chunks']} chunks), {a.plan}"
    )
    print(
        f"subgraphs per chunk: {shared['subgraphs_per_chunk']}, shareable: "
        f"{shared['shareable_per_chunk']}   (paper, seed 001 §3.2: 120 of 144)"
    )
    print("                 graphs built   weights GB   activations GB   total GB")
    for name, s in (("per-chunk", naive), ("chunk-sharing", shared)):
        tot = (s["weight_bytes"] + s["activation_bytes"]) / gb
        print(
            f"{name:<16} {s['built']:>12} {s['weight_bytes'] / gb:>12.2f} "
            f"{s['activation_bytes'] / gb:>16.2f} {tot:>10.2f}"
        )
    t_n = naive["weight_bytes"] + naive["activation_bytes"]
    t_s = shared["weight_bytes"] + shared["activation_bytes"]
    print(
        f"memory saved by sharing: {(t_n - t_s) / gb:.2f} GB ({100 * (1 - t_s / t_n):.0f}%)   "
        "(paper: up to 75%, 7.2 GB)"
    )
    if a.json:
        out = {"shared": shared, "per_chunk": naive, "args": vars(a)}
        atomic_write_text(Path(a.json), json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
