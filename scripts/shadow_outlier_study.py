#!/usr/bin/env python3
"""The reviewers' questions on llm.npu's shadow outlier execution (seed 003), answered on a
real model: how pruning trades accuracy for CPU work, an automatic pruning rate, robustness of
the hot channels to domain shift, and the memory they take.

Needs a calibration file with the outlier profile (socllm calibrate --steps act-scales,outliers).
Every prefill runs in chunks of --chunk tokens (llm.npu's default 256), so "per chunk" below is
per chunk of one prompt, and every CPU part that runs is one CPU-NPU synchronization.

    python scripts/shadow_outlier_study.py --calib socllm-out/calib-outliers.h5 \\
        --json docs/results/shadow_outlier_study.json [--study sweep,auto,domain,memory]

* sweep: WikiText-2 held-out perplexity (--limit-tokens, windows of --context) and CPU-side
  work per chunk (syncs, outlier channels gathered, cold fetches) for pruning rates
  0, 10, ..., 100%; w8a8 and fp32 alongside.
* auto: the largest pruning rate whose perplexity on a calibration-split validation text
  (windows from the calibration slice that calibration did not use) stays within --budget
  (relative) of pruning rate 0, by bisection on the rate's step of 1 / n_linear_inputs;
  then its held-out perplexity.
* domain: with the WikiText-2 profile, prompts from HellaSwag, LAMBADA and MMLU (--prompts
  each): share of gathered outlier channels that were hot (resident), cold fetches per chunk,
  and the same on WikiText-2 held-out text.
* memory: resident float bytes of the hot channels vs a full float copy of the linears' weights
  and vs the plan's whole weight memory (paper: 0.6-1% of total memory).
* timeline: the cost side of the sweep on a phone: the engine's own chunked prefill of the first
  --timeline-tokens held-out tokens at each pruning rate, simulated on --device under llm.npu's
  out-of-order policy and FIFO (the CPU parts are what the engine measured in each chunk).

An existing --json file is updated: only the studies run now are replaced.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
from socllm.calibration import (  # noqa: E402
    calibration_split,
    corpus_tokens,
    held_out_tokens,
)
from socllm.io.files import atomic_write_text  # noqa: E402

STUDIES = ("sweep", "auto", "domain", "memory", "timeline")


def plan_name(rate: float, hot_share: float, chunk: int) -> str:
    return f"shadow-outlier:pruning_rate={rate:g},hot_share={hot_share:g},chunk_len={chunk}"


def windows(ids: list[int], context: int, limit_tokens: int) -> list[list[int]]:
    ids = ids[:limit_tokens]
    return [ids[i : i + context] for i in range(0, len(ids) - 1, context) if len(ids[i:]) > 1]


def perplexity(model, wins: list[list[int]], plan: str) -> float:
    """exp(mean NLL) over every scored token of the windows (each from a fresh context)."""
    lps = model.token_logprobs(wins, plan)
    return float(math.exp(-np.concatenate(lps).astype(np.float64).mean()))


def cpu_work(model, plan: str, chunks: int) -> dict:
    """Shadow counters since the last reset, summed over linear inputs, per chunk."""
    st = model.shadow_stats(plan, reset=True)
    tot = {k: sum(d[k] for d in st) for k in ("syncs", "outlier_channels", "hot_hits")}
    tot["cold_fetches"] = sum(d["cold_fetches"] for d in st)
    tot["cold_fetch_bytes"] = sum(d["cold_fetch_bytes"] for d in st)
    per_chunk = {f"{k}_per_chunk": v / chunks for k, v in tot.items()}
    ch = tot["outlier_channels"]
    return {
        **tot,
        **per_chunk,
        "hot_coverage": tot["hot_hits"] / ch if ch else float("nan"),
        "linear_inputs": len(st),
        "pruned_inputs": sum(d["pruned"] for d in st),
    }


def n_chunks(wins: list[list[int]], chunk: int) -> int:
    return sum(math.ceil(len(w) / chunk) for w in wins)


def study_sweep(model, args, held: list[list[int]]) -> dict:
    rows = []
    chunks = n_chunks(held, args.chunk)
    for base in ("fp32", "w8a8"):
        t0 = time.perf_counter()
        rows.append({"plan": base, "perplexity": perplexity(model, held, base)})
        print(
            f"{base:<24} ppl {rows[-1]['perplexity']:.4f} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    for rate in args.rates:
        plan = plan_name(rate, args.hot_share, args.chunk)
        model.shadow_stats(plan, reset=True)
        t0 = time.perf_counter()
        ppl = perplexity(model, held, plan)
        rows.append(
            {
                "plan": "shadow-outlier",
                "pruning_rate": rate,
                "perplexity": ppl,
                **cpu_work(model, plan, chunks),
            }
        )
        r = rows[-1]
        print(
            f"pruning {rate:>4.0%}            ppl {ppl:.4f}  syncs/chunk "
            f"{r['syncs_per_chunk']:.1f}  channels/chunk {r['outlier_channels_per_chunk']:.1f}  "
            f"cold/chunk {r['cold_fetches_per_chunk']:.2f} ({time.perf_counter() - t0:.0f} s)"
        )
    return {"chunks": chunks, "rows": rows}


def study_auto(model, args, held: list[list[int]]) -> dict:
    """Bisection over k = number of pruned inputs (accuracy falls as k grows, in practice)."""
    cal = model.calibration
    p = model.calibration_provenance
    toks = corpus_tokens(model, p.get("corpus", "wikitext2"))
    # validation text from the calibration slice's tail, after the last calibration window
    # could start: calibration_windows draws starts from the whole slice, so we take the
    # slice's last --auto-tokens tokens and accept that some may overlap a calibration window.
    end = calibration_split(len(toks))
    val = windows(toks[end - args.auto_tokens : end], args.context, args.auto_tokens)
    n_inputs = cal.outlier_importance().size
    ref = perplexity(model, val, plan_name(0.0, args.hot_share, 0))
    limit = ref * (1 + args.budget)
    tried = {0: ref}
    lo, hi = 0, n_inputs  # invariant: lo within budget; hi unknown or over
    if perplexity(model, val, plan_name(1.0, args.hot_share, 0)) <= limit:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ppl = perplexity(model, val, plan_name(mid / n_inputs, args.hot_share, 0))
        tried[mid] = ppl
        print(f"auto: prune {mid}/{n_inputs} -> validation ppl {ppl:.4f} (limit {limit:.4f})")
        lo, hi = (mid, hi) if ppl <= limit else (lo, mid)
    rate = lo / n_inputs
    held_plan = plan_name(rate, args.hot_share, args.chunk)
    model.shadow_stats(held_plan, reset=True)
    held_ppl = perplexity(model, held, held_plan)
    work = cpu_work(model, held_plan, n_chunks(held, args.chunk))
    print(f"auto: pruning rate {rate:.3f} ({lo}/{n_inputs}); held-out ppl {held_ppl:.4f}")
    return {
        "budget": args.budget,
        "validation_tokens": sum(len(w) for w in val),
        "validation_ppl_unpruned": ref,
        "tried": {str(k / n_inputs): v for k, v in sorted(tried.items())},
        "pruning_rate": rate,
        "pruned_inputs": lo,
        "heldout_perplexity": held_ppl,
        **{k: work[k] for k in ("syncs_per_chunk", "outlier_channels_per_chunk")},
    }


def domain_prompts(n: int) -> dict[str, list[str]]:
    """n prompt texts per task, from the local data (context + gold continuation)."""
    from socllm.eval.lmeval.task_configs import MMLU_SUBJECTS, load_dataset

    hs = load_dataset(dataset="hellaswag")["validation"]
    lb = load_dataset(dataset="lambada_openai")["test"]
    out = {
        "hellaswag": [hs[i]["query"] + " " + hs[i]["choices"][hs[i]["gold"]] for i in range(n)],
        "lambada": [lb[i]["query"] + " " + lb[i]["answers_text"][0] for i in range(n)],
        "mmlu": [],
    }
    subjects = sorted(MMLU_SUBJECTS)
    per = math.ceil(n / len(subjects))
    for s in subjects:
        test = load_dataset(dataset=f"mmlu/{s}")["test"]
        for d in test.select(range(min(per, len(test)))):
            opts = "\n".join(f"{k}. {c}" for k, c in zip("ABCD", d["choices"], strict=False))
            out["mmlu"].append(f"{d['question']}\n{opts}\nAnswer: {'ABCD'[d['answer']]}")
    out["mmlu"] = out["mmlu"][:n]
    return out


def study_domain(model, args, held: list[list[int]]) -> dict:
    plan = plan_name(0.0, args.hot_share, args.chunk)  # every input's CPU part runs
    texts = domain_prompts(args.prompts)
    rows = {}
    sets = {name: [model.tokenize(t) for t in ts] for name, ts in texts.items()}
    sets["wikitext2-heldout"] = held
    for name, seqs in sets.items():
        model.shadow_stats(plan, reset=True)
        for s in seqs:
            model.logits_batch([s[: model.config["context_length"]]], plan)
        rows[name] = {
            "prompts": len(seqs),
            "tokens": sum(len(s) for s in seqs),
            **cpu_work(model, plan, n_chunks(seqs, args.chunk)),
        }
        r = rows[name]
        print(
            f"{name:<18} hot coverage {r['hot_coverage']:.3f}  cold fetches/chunk "
            f"{r['cold_fetches_per_chunk']:.2f}  "
            f"channels/chunk {r['outlier_channels_per_chunk']:.1f}"
        )
    return rows


def study_memory(model, args) -> dict:
    st = model.shadow_stats(plan_name(args.memory_rate, args.hot_share, 0))
    resident = sum(d["resident_float_bytes"] for d in st)
    float_copy = sum(d["in_features"] * d["out_features"] * 4 for d in st)
    int8_weights = sum(d["weight_bytes"] for d in st)
    total = int8_weights + resident + model.config["vocab_size"] * model.config["d_model"] * 4
    out = {
        "pruning_rate": args.memory_rate,
        "hot_share": args.hot_share,
        "resident_float_bytes": resident,
        "full_float_copy_bytes": float_copy,
        "resident_vs_full_copy": resident / float_copy,
        "int8_linear_weight_bytes": int8_weights,
        "total_weight_bytes": total,
        "resident_vs_total": resident / total,
    }
    print(
        f"memory: hot-channel float weights {resident / 1e6:.2f} MB = "
        f"{100 * out['resident_vs_full_copy']:.2f}% of a full float copy, "
        f"{100 * out['resident_vs_total']:.2f}% of all weights"
    )
    return out


def study_timeline(model, args) -> dict:
    from socllm.sim.timeline import simulate_model

    ids = held_out_tokens(corpus_tokens(model))[: args.timeline_tokens]
    keys = ("prefill_ms", "prefill_tokens_per_s", "energy_mj", "tasks", "bubble_rate", "busy_ms")
    rows = []
    for rate in args.rates:
        plan = plan_name(rate, args.hot_share, args.chunk)
        ooe = simulate_model(
            model, ids, args.device, plan, chunk=args.chunk, policy="npu-stall-first"
        )
        for policy in ("npu-stall-first", "first-ready"):
            s = (ooe if policy == "npu-stall-first" else ooe.with_policy(policy)).summary()
            rows.append({"pruning_rate": rate, "policy": policy, **{k: s[k] for k in keys}})
            print(
                f"timeline: pruning {rate:>4.0%} {policy:<4}  prefill {s['prefill_ms']:.1f} ms "
                f"({s['prefill_tokens_per_s']:.0f} tok/s), CPU busy {s['busy_ms']['cpu']:.1f} ms, "
                f"NPU bubbles {100 * s['bubble_rate']['npu']:.0f}%"
            )
    return {"device": args.device, "tokens": len(ids), "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--calib", required=True, help="calibration file with the outliers step")
    ap.add_argument("--study", default=",".join(STUDIES))
    ap.add_argument("--rates", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.85,0.9,1.0")
    ap.add_argument("--hot-share", type=float, default=0.8)
    ap.add_argument("--chunk", type=int, default=256, help="prefill chunk length")
    ap.add_argument("--context", type=int, default=2048, help="perplexity window")
    ap.add_argument("--limit-tokens", type=int, default=16384, help="held-out tokens")
    ap.add_argument("--budget", type=float, default=0.01, help="auto: relative perplexity budget")
    ap.add_argument("--auto-tokens", type=int, default=8192, help="auto: validation tokens")
    ap.add_argument("--prompts", type=int, default=100, help="domain: prompts per task")
    ap.add_argument("--memory-rate", type=float, default=0.85)
    ap.add_argument("--device", default="snapdragon-8gen3", help="timeline: device profile")
    ap.add_argument("--timeline-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    studies = [s.strip() for s in args.study.split(",") if s.strip()]
    for s in studies:
        if s not in STUDIES:
            raise SystemExit(f"unknown study {s!r} (known: {', '.join(STUDIES)})")

    socllm.set_num_threads(args.threads)
    socllm.set_log_level("warn")
    model = socllm.load(args.model, calib=args.calib, progress=False)
    if not model.calibration.has_outlier_stats:
        raise SystemExit(f"{args.calib} has no outlier profile (--steps act-scales,outliers)")
    held = windows(held_out_tokens(corpus_tokens(model)), args.context, args.limit_tokens)
    prev = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else {}
    out: dict = {
        **prev,
        "model": args.model,
        "calib": args.calib,
        "chunk": args.chunk,
        "hot_share": args.hot_share,
        "limit_tokens": args.limit_tokens,
        "provenance": model.calibration_provenance,
    }
    for s in studies:
        t0 = time.perf_counter()
        if s == "sweep":
            out[s] = study_sweep(model, args, held)
        elif s == "auto":
            out[s] = study_auto(model, args, held)
        elif s == "domain":
            out[s] = study_domain(model, args, held)
        elif s == "timeline":
            out[s] = study_timeline(model, args)
        else:
            out[s] = study_memory(model, args)
        print(f"[{s}: {time.perf_counter() - t0:.0f} s]", flush=True)
        if args.json:
            atomic_write_text(Path(args.json), json.dumps(out, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
