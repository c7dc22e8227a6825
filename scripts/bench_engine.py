#!/usr/bin/env python3
"""Prefill and decode speed of socllm's fp32 engine next to torch/transformers (and llama.cpp, if
llama-cpp-python is installed) on the same model, measured in one run on this machine with the
same thread count.

Each implementation runs in its own subprocess (so its peak RSS is its own), one after the
other (so they never share the cores). Prefill = the prompt through the model up to the
next-token logits (transformers: ``logits_to_keep=1``, the same work); decode = one token at a
time with a KV cache after a 128-token prompt, greedy.

llama.cpp runs a model in its file's storage types, so its peer runs the same SmolLM2 file
converted to F32 (scripts/gguf_to_f32.py; socllm's logits on that copy are bit-identical to the
original's) with its default CPU settings (F16 KV cache, micro-batches of 512), once with flash
attention off (``llama.cpp``) and once on (``llama.cpp+fa``). It is a benchmark-only extra:
``pip install -e .[bench-llamacpp]`` builds llama.cpp from source (15-25 minutes on 2 cores);
without it those peers are skipped, and ``--peers torch`` leaves them out.

    python scripts/bench_engine.py                 # 128/512/2048 prefill, 64 decode steps
    python scripts/bench_engine.py --quick         # smaller, for a smoke run
    python scripts/bench_engine.py --json out.json

OpenBLAS picks its kernels from OPENBLAS_CORETYPE: socllm sets it to the best core the CPU's
flags support unless it is set (socllm/blas_core.py, issue 38), and the workers inherit it;
``--socllm-coretype NAME`` runs socllm on another core, and the output then also reports
socllm's logits difference against torch as a correctness check.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LLAMA_CPP_FA = "llama.cpp+fa"  # llama.cpp with its flash-attention path on
PEERS = ("torch", "llama.cpp", LLAMA_CPP_FA)


def _prompt_ids(n: int) -> list[int]:
    sys.path.insert(0, str(REPO / "python"))
    import socllm
    import tokenizers  # noqa: F401  (the socllm tokenizer == transformers' on this GGUF, tested)
    from socllm.data import wikitext2_test_text

    m = socllm.load("smollm2-135m", progress=False)
    return m.tokenize(wikitext2_test_text()[:40000])[:n]


def worker(
    impl: str,
    lengths: list[int],
    decode_steps: int,
    repeats: int,
    threads: int,
    ids: list[int],
    f32_gguf: str | None = None,
) -> dict:
    import numpy as np

    out: dict = {"impl": impl, "threads": threads, "prefill": {}}
    if impl == "socllm":
        import socllm

        socllm.set_log_level("warn")
        socllm.set_num_threads(threads)
        m = socllm.load("smollm2-135m", progress=False)
        from socllm.eval.bench_utils import machine_line

        out["blas"] = socllm.blas_info()["corename"]
        out["machine"] = machine_line()  # this worker's (its --socllm-coretype)

        def prefill(x):
            c = m.new_cache(len(x) + decode_steps + 1)
            return c, m.step(c, x)[0]

        def decode(c, logits):
            for _ in range(decode_steps):
                logits = m.step(c, [int(np.argmax(logits))])[0]
            return logits
    elif impl.startswith("llama.cpp"):
        import llama_cpp

        n_ctx = max(lengths + [128]) + decode_steps + 1
        llm = llama_cpp.Llama(
            model_path=f32_gguf,
            n_ctx=n_ctx,
            n_batch=n_ctx,  # the whole prompt in one llama_decode call (micro-batches of 512)
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=impl == LLAMA_CPP_FA,
            verbose=False,
        )
        out["llama_cpp"] = llama_cpp.__version__
        n_vocab = llm.n_vocab()

        def last_logits():  # the batch's last row; Llama.eval keeps none without logits_all
            return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).copy()

        def prefill(x):
            llm.reset()
            llm.eval(x)
            return None, last_logits()

        def decode(_, logits):
            for _ in range(decode_steps):
                llm.eval([int(np.argmax(logits))])
                logits = last_logits()
            return logits
    else:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        from socllm.registry import BUILTIN_MODELS

        g = BUILTIN_MODELS["smollm2-135m"].path()
        ref = AutoModelForCausalLM.from_pretrained(
            g.parent, gguf_file=g.name, dtype=torch.float32
        ).eval()
        out["torch"] = torch.__version__

        @torch.no_grad()
        def prefill(x):
            r = ref(torch.tensor([x]), use_cache=True, logits_to_keep=1)
            return r.past_key_values, r.logits[0, -1].numpy()

        @torch.no_grad()
        def decode(pkv, logits):
            for _ in range(decode_steps):
                tok = torch.tensor([[int(np.argmax(logits))]])
                r = ref(tok, past_key_values=pkv, use_cache=True)
                pkv, logits = r.past_key_values, r.logits[0, -1].numpy()
            return logits

    prefill(ids[:16])  # warm-up
    for n in lengths:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, last = prefill(ids[:n])
            times.append(time.perf_counter() - t0)
        out["prefill"][n] = {
            "seconds": statistics.median(times),
            "tokens_per_s": n / statistics.median(times),
        }
        if n == 128:
            out["logits_128"] = last.tolist()
    times = []
    for _ in range(repeats):
        state, logits = prefill(ids[:128])
        t0 = time.perf_counter()
        decode(state, logits)
        times.append(time.perf_counter() - t0)
    out["decode"] = {
        "steps": decode_steps,
        "seconds": statistics.median(times),
        "tokens_per_s": decode_steps / statistics.median(times),
    }
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _f32_copy_of_model() -> str:
    """The default SmolLM2 file in F32 for llama.cpp, converted once into socllm's cache."""
    sys.path.insert(0, str(REPO / "scripts"))
    from gguf_to_f32 import gguf_to_f32
    from socllm.registry import BUILTIN_MODELS, cache_dir

    src = BUILTIN_MODELS["smollm2-135m"].path()
    dst = cache_dir() / "bench" / f"{src.stem}.F32.gguf"
    if not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime:
        gguf_to_f32(src, dst)
    return str(dst)


def _run_worker(impl: str, args, ids_file: Path, f32_gguf: str | None):
    env = dict(os.environ)
    if impl == "socllm" and args.socllm_coretype:
        env["OPENBLAS_CORETYPE"] = args.socllm_coretype
        env.pop("OPENBLAS_L2_SIZE", None)
    cmd = [sys.executable, __file__, "--worker", impl, "--lengths", args.lengths]
    cmd += ["--decode-steps", str(args.decode_steps), "--repeats", str(args.repeats)]
    cmd += ["--threads", str(args.threads), "--ids-file", str(ids_file)]
    if f32_gguf:
        cmd += ["--f32-gguf", f32_gguf]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="lengths 32,128; 8 decode steps; 1 repeat")
    ap.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"comma-separated, from {', '.join(PEERS)} (llama.cpp ones skipped if not installed)",
    )
    ap.add_argument(
        "--socllm-coretype",
        default=None,
        help="OPENBLAS_CORETYPE for the socllm worker (e.g. SkylakeX)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", choices=["socllm", *PEERS], help=argparse.SUPPRESS)
    ap.add_argument("--f32-gguf", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ids-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "python"))
    if args.json:  # before the work, not after it
        from socllm.io.files import check_output_path

        check_output_path(args.json, what="--json")
    if args.quick:
        args.lengths, args.decode_steps, args.repeats = "32,128", 8, 1
    lengths = [int(x) for x in args.lengths.split(",")]

    if args.worker:
        ids = json.loads(Path(args.ids_file).read_text())
        r = worker(
            args.worker, lengths, args.decode_steps, args.repeats, args.threads, ids, args.f32_gguf
        )
        print(json.dumps(r))
        return 0

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown or "torch" not in peers:
        ap.error(f"--peers: unknown {unknown}; choose from {list(PEERS)}, torch included")
    from socllm.eval.bench_utils import machine_line

    machine = machine_line()
    print(machine, flush=True)
    if any(p.startswith("llama.cpp") for p in peers):
        import importlib.util

        if importlib.util.find_spec("llama_cpp") is None:
            print("[bench] llama-cpp-python is not installed: the llama.cpp peers are skipped")
            peers = [p for p in peers if not p.startswith("llama.cpp")]
    f32_gguf = _f32_copy_of_model() if any(p.startswith("llama.cpp") for p in peers) else None

    # Tokenized here, not in the workers: loading socllm's model there would be in every
    # worker's peak RSS.
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = Path(tmp) / "prompt_ids.json"
        ids_file.write_text(json.dumps(_prompt_ids(max(lengths + [128]))))
        for impl in ["socllm", *peers]:
            r = _run_worker(impl, args, ids_file, f32_gguf)
            if r.returncode != 0:
                sys.stderr.write(r.stderr)
                return r.returncode
            results[impl] = json.loads(r.stdout.strip().splitlines()[-1])

    import numpy as np

    ref = np.array(results["torch"]["logits_128"]) if 128 in lengths else None
    diffs = {}
    for impl, res in results.items():
        got = res.pop("logits_128", None)
        if ref is not None and impl != "torch":
            diffs[impl] = float(np.abs(np.array(got) - ref).max() / np.abs(ref).max())
    s = results["socllm"]
    versions = f"torch {results['torch']['torch']} + transformers"
    if f32_gguf:
        llama = next(p for p in peers if p.startswith("llama.cpp"))
        versions += f", llama-cpp-python {results[llama]['llama_cpp']} on an F32 copy"
    print(f"socllm fp32 (OpenBLAS {s['blas']}) vs {versions}, {args.threads} threads, SmolLM2-135M")
    print(
        f"{'':26}"
        + "".join(f"{i:>14}" for i in results)
        + "".join(f"{'socllm/' + p:>20}" for p in peers)
    )

    def row(label, get, fmt):
        vals = [get(results[i]) for i in results]
        print(
            f"{label:26}"
            + "".join(f"{v:14{fmt}}" for v in vals)
            + "".join(f"{vals[0] / get(results[p]):19.2f}x" for p in peers)
        )

    for n in lengths:
        row(f"prefill {n:>5} tok/s", lambda r, n=n: r["prefill"][str(n)]["tokens_per_s"], ".1f")
    row(
        f"decode tok/s ({s['decode']['steps']} steps)", lambda r: r["decode"]["tokens_per_s"], ".1f"
    )
    row("peak RSS MB", lambda r: r["peak_rss_mb"], ".0f")
    for impl, d in diffs.items():
        print(f"max |logit diff| / max |logit| at 128 tokens, {impl} vs torch: {d:.2e}")
    if args.json:
        from socllm.io.files import emit_json

        emit_json(
            {
                "machine": machine,
                **results,
                "logit_rel_diff_128": diffs,
                "threads": args.threads,
                "f32_gguf": f32_gguf,
            },
            args.json,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
