#!/usr/bin/env python3
"""Evaluation throughput of each preset plan next to fp32, in one run on this machine
(issue 16 item 5): evaluating a quantized plan should not cost much more than fp32.

Two paths, as users run them:
* lm-eval: ``socllm.eval.lmeval.evaluate`` on a multiple-choice task (default HellaSwag, the longest
  contexts of the local tasks); tokens = the tokens of the sequences the engine ran;
* perplexity: ``socllm eval --task wikitext2``'s path (``perplexity_eval``) on the first
  ``--ppl-tokens`` tokens in ``--context`` windows.

lm-eval's one-time task setup runs before any timing. Each plan first prepares its weights
(quantization and packing, reported separately as ``prepare_s``, once per plan and model); then
each path is timed ``--repeats`` times, best kept. fp32 runs first and last, and every ratio is
against the mean of those two fp32 runs, so drift of a shared machine shows as their spread
(``fp32 drift``). ``SOCLLM_MAX_ISA=avx2`` runs the integer kernels on their AVX2 path on an
AVX-512 machine.

    python scripts/bench_eval.py                        # all preset plans, ~10 minutes
    python scripts/bench_eval.py --plans fp32,w8a8 --limit 10 --ppl-tokens 2048   # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
import socllm.eval.lmeval as sl  # noqa: E402
from socllm.cli import split_list  # noqa: E402
from socllm.eval.bench_utils import machine_line  # noqa: E402
from socllm.eval.perplexity import eval_wikitext2  # noqa: E402
from socllm.eval.sweep import PRESET_PLANS  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402


class TokenCounter:
    """Counts the tokens the lm-eval backend hands the engine (the model's batch calls)."""

    def __init__(self, model):
        self.tokens = 0
        for name in ("logits_batch", "token_logprobs"):
            original = getattr(model, name)

            def counted(seqs, *a, _original=original, **kw):
                self.tokens += sum(len(s) for s in seqs)
                return _original(seqs, *a, **kw)

            setattr(model, name, counted)


def time_lmeval(model, counter, plan, task, limit, batch_size) -> dict:
    counter.tokens = 0
    t0 = time.perf_counter()
    sl.evaluate(
        model,
        tasks=[task],
        plan=plan,
        limit=limit,
        batch_size=batch_size,
        quiet=True,
        bootstrap_iters=0,
    )
    seconds = time.perf_counter() - t0
    return {"tokens": counter.tokens, "seconds": seconds, "tokens_per_s": counter.tokens / seconds}


def time_perplexity(model, plan, tokens, context, batch_size) -> dict:
    t0 = time.perf_counter()
    r, _ = eval_wikitext2(
        model, plan, context=context, stride=None, limit_tokens=tokens, batch_size=batch_size
    )
    seconds = time.perf_counter() - t0
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "ppl": r["perplexity"],
    }


def best_of(repeats: int, fn) -> dict:
    runs = [fn() for _ in range(repeats)]
    return min(runs, key=lambda r: r["seconds"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--plans",
        default=",".join(PRESET_PLANS),
        help="comma-separated, or ';'-separated when a plan has options "
        "(fp32;w8-group:norm=fp32,...)",
    )
    ap.add_argument(
        "--calib",
        default=None,
        help="calibration file for the static plans (default: act-scales on 16 x 256 tokens, "
        "made here: throughput does not depend on the scales' values)",
    )
    ap.add_argument("--task", default="hellaswag")
    ap.add_argument("--limit", type=int, default=40, help="lm-eval documents")
    ap.add_argument("--batch-size", type=int, default=8, help="lm-eval sequences per engine call")
    ap.add_argument("--ppl-tokens", type=int, default=8192)
    ap.add_argument("--context", type=int, default=512, help="perplexity window")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    socllm.set_num_threads(args.threads)
    socllm.set_log_level("warn")
    machine = machine_line()
    print(machine, flush=True)
    plans = split_list(args.plans)
    model = socllm.load(args.model, progress=False)
    calib_note = args.calib
    with tempfile.TemporaryDirectory() as tmp:
        if args.calib:
            model.load_calibration(args.calib)
        elif any(socllm.Plan(p).needs_calibration for p in plans):
            from socllm.calibration import run_steps, save_calibration

            cal = run_steps(model, ["act-scales"], samples=16, seqlen=256, progress=False)
            model.load_calibration(save_calibration(Path(tmp) / "calib.h5", cal, model))
            calib_note = "act-scales, 16 x 256 tokens (made by this script)"
    counter = TokenCounter(model)
    # lm-eval builds and caches the task on its first use: not part of any plan's time
    time_lmeval(model, counter, "fp32", args.task, 2, args.batch_size)
    order = ["fp32", *[p for p in plans if p != "fp32"], "fp32"]
    rows: list[dict] = []
    for i, plan in enumerate(order):
        t0 = time.perf_counter()
        model.logits([1, 2, 3], plan)  # prepares (quantizes, packs) the plan's weights
        row = {"plan": plan, "prepare_s": time.perf_counter() - t0}
        row["lmeval"] = best_of(
            args.repeats,
            lambda plan=plan: time_lmeval(
                model, counter, plan, args.task, args.limit, args.batch_size
            ),
        )
        row["ppl"] = best_of(
            args.repeats,
            lambda plan=plan: time_perplexity(
                model, plan, args.ppl_tokens, args.context, args.batch_size
            ),
        )
        rows.append(row)
        print(
            f"[{i + 1}/{len(order)}] {plan:<16} lm-eval {row['lmeval']['tokens_per_s']:8.0f} tok/s"
            f"   perplexity {row['ppl']['tokens_per_s']:8.0f} tok/s",
            file=sys.stderr,
            flush=True,
        )

    fp32_runs = [r for r in rows if r["plan"] == "fp32"]
    ref = {k: sum(r[k]["tokens_per_s"] for r in fp32_runs) / 2 for k in ("lmeval", "ppl")}
    drift = {
        k: abs(fp32_runs[0][k]["tokens_per_s"] - fp32_runs[1][k]["tokens_per_s"]) / ref[k]
        for k in ref
    }
    isa = socllm.ops.isa()
    blas = socllm.blas_info()["corename"]
    print(
        f"\n{args.model}, {args.threads} threads; "
        f"lm-eval: {args.task}, {args.limit} docs, batch {args.batch_size}; perplexity: "
        f"{args.ppl_tokens} tokens in {args.context}-token windows; calibration: {calib_note}"
    )
    print(
        f"ratios against the mean of the first and last fp32 runs (fp32 drift: lm-eval "
        f"{100 * drift['lmeval']:.1f}%, perplexity {100 * drift['ppl']:.1f}%)\n"
    )
    print("| plan | lm-eval tok/s | vs fp32 | perplexity tok/s | vs fp32 | prepare s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| `fp32` (mean of 2) | {ref['lmeval']:.0f} | 1.00x | {ref['ppl']:.0f} | 1.00x | "
        f"{fp32_runs[0]['prepare_s']:.1f} |"
    )
    for r in rows:
        if r["plan"] == "fp32":
            continue
        for k in ("lmeval", "ppl"):
            r[k]["ratio"] = r[k]["tokens_per_s"] / ref[k]
        lm, pp = r["lmeval"], r["ppl"]
        print(
            f"| `{r['plan']}` | {lm['tokens_per_s']:.0f} | {lm['ratio']:.2f}x | "
            f"{pp['tokens_per_s']:.0f} | {pp['ratio']:.2f}x | {r['prepare_s']:.1f} |"
        )
    if args.json:
        out = {
            "machine": machine,
            "model": args.model,
            "threads": args.threads,
            "isa": isa,
            "blas": blas,
            "task": args.task,
            "limit": args.limit,
            "ppl_tokens": args.ppl_tokens,
            "context": args.context,
            "calibration": calib_note,
            "fp32_tokens_per_s": ref,
            "fp32_drift": drift,
            "rows": rows,
        }
        atomic_write_text(Path(args.json), json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
