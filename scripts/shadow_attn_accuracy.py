#!/usr/bin/env python3
"""Accuracy of the sparse-attention plans (seed 000 Table 6, Fig. 13/14/16 analogues).

WikiText-2 held-out windows of --context tokens (default 2048: long enough that attention
matters) are scored under every plan with the same windows: perplexity, the paired difference
of each window's mean NLL from fp32's with its standard error, the KL divergence of the plan's
next-token distribution from fp32's (nats/token) and the top-1 agreement. Plans (fp32 linears,
so only attention differs):

* main (Table 6): C/G-Full (fp32), C/G-Sparse, C/G-Block-Sparse, NPU-Full (npu-int8), shadowAttn
  at the default keep 0.2;
* ablation (Fig. 16): shadowAttn without buckets (buckets=1), with uniform per-head ratios, with
  a tighter Eq. 3 clamp (quantiles 0.75, 0.6 instead of 0.95);
* sensitivity (Fig. 13/14): keep 5-50%, bucket counts 1/3/5/9/15, steps 5e-3 to 5.

Passkey retrieval (--passkey): a 5-digit key hidden at a random depth of 1-4K tokens of filler,
asked for at the end; greedy decoding (prefill under the plan, decode full, §4); accuracy =
the key's digits appear in the first 8 new tokens.

Results are written to --json after every plan (atomically) and a rerun resumes.

    python scripts/shadow_attn_accuracy.py --calib CALIB.h5 \\
        --json docs/results/shadow_attn_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import socllm  # noqa: E402
from socllm.calibration import corpus_tokens, held_out_tokens  # noqa: E402
from socllm.eval.divergence import window_stats  # noqa: E402
from socllm.eval.stats import paired_difference  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402

A = "fp32:attention="
GROUPS = {
    "main": {
        "C/G-Full": "fp32",
        "C/G-Sparse": A + "sparse:keep=0.2",
        "C/G-Block-Sparse": A + "block-sparse:keep=0.2",
        "NPU-Full": A + "npu-int8",
        "shadowAttn": A + "shadow-attn:keep=0.2",
    },
    "ablation": {
        "shadowAttn w/o buckets": A + "shadow-attn:keep=0.2,buckets=1",
        "shadowAttn uniform ratios": A + "shadow-attn:keep=0.2,ratios=uniform",
        # Eq. 3's clamp (our quantile form): a tighter clamp moves the ratios toward uniform
        "shadowAttn clamp 0.75": A + "shadow-attn:keep=0.2,clamp_quantile=0.75",
        "shadowAttn clamp 0.6": A + "shadow-attn:keep=0.2,clamp_quantile=0.6",
    },
    "keep": {f"keep={k}": A + f"shadow-attn:keep={k}" for k in (0.05, 0.1, 0.3, 0.5)},
    "buckets": {f"buckets={b}": A + f"shadow-attn:keep=0.2,buckets={b}" for b in (3, 5, 15)},
    "step": {f"step={s}": A + f"shadow-attn:keep=0.2,step={s}" for s in (0.005, 0.05, 0.8, 5.0)},
}
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)


def score_window(m, ids, plan, ref_logits):
    """(mean NLL, KL(fp32 || plan) mean, top-1 agreement, logits) of one window by
    socllm.eval.divergence.window_stats; ref_logits: fp32's [T-1, V] (None: this is the fp32
    run, scored against itself, and its logits are returned for the plans' runs)."""
    lg = m.logits(ids, plan)[:-1]
    s = window_stats(lg if ref_logits is None else ref_logits, lg, np.asarray(ids[1:]))
    return (
        s["nll"] / s["n"],
        s["kl"] / s["n"],
        s["top1"] / s["n"],
        lg if ref_logits is None else None,
    )


def passkey_prompts(m, lengths, trials, seed=0):
    rng = np.random.default_rng(seed)
    unit = m.tokenize(FILLER)
    out = []
    for n in lengths:
        for _ in range(trials):
            key = int(rng.integers(10000, 100000))
            needle = m.tokenize(f" The pass key is {key}. Remember it. {key} is the pass key. ")
            question = m.tokenize(" What is the pass key? The pass key is")
            fill = (unit * (n // len(unit) + 1))[: n - len(needle) - len(question)]
            at = int(rng.integers(0, len(fill)))
            out.append((n, key, fill[:at] + needle + fill[at:] + question))
    return out


def main_clamp(m, how: str) -> float | None:
    """The clamp_quantile of Table 6's shadowAttn row: None for the plan's default
    (kDefaultClampQuantile, attention_scheme.h)."""
    if how == "default":
        return None
    if how == "auto":
        q = (m.calibration_provenance or {}).get("auto_clamp_quantile")
        if q is None:
            raise SystemExit(
                "--clamp auto: the calibration has no auto_clamp_quantile (socllm calibrate "
                "--steps attention-clamp --calib FILE --out FILE)"
            )
        return float(q)
    try:
        q = float(how)
    except ValueError:
        raise SystemExit(f"--clamp must be default, auto or a number, got {how!r}") from None
    if not 0.5 <= q <= 1.0:
        raise SystemExit(f"--clamp must be in [0.5, 1], got {q}")
    return q


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--calib", required=True, help="calibration with head-importance, qk-scales")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated plan names of the groups to score (default all; passkey runs "
        "only for the main plans among them)",
    )
    ap.add_argument("--passkey", default="1024,2048,4096", help="lengths ('' to skip)")
    ap.add_argument("--passkey-trials", type=int, default=10)
    ap.add_argument(
        "--clamp",
        default="default",
        help="Eq. 3 clamp of the main group's shadowAttn: default (the plan's), auto (the "
        "calibration's auto_clamp_quantile, step attention-clamp) or a number",
    )
    ap.add_argument("--json", required=True, help="results (resumed if it exists)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    socllm.set_log_level("warn")
    m = socllm.load(a.model, calib=a.calib, progress=False)
    path = Path(a.json)
    state = json.loads(path.read_text()) if path.exists() else {}
    groups = {g: dict(plans) for g, plans in GROUPS.items()}
    clamp = main_clamp(m, a.clamp)
    if clamp is not None:  # the chosen clamp in Table 6's row, the plan's default next to it
        groups["main"]["shadowAttn"] = A + f"shadow-attn:keep=0.2,clamp_quantile={clamp!r}"
        groups["main"]["shadowAttn clamp 0.95"] = A + "shadow-attn:keep=0.2,clamp_quantile=0.95"
    setup = {"model": a.model, "windows": a.windows, "context": a.context, "calib": a.calib}
    if clamp is not None:
        setup["clamp"] = clamp
    if state and state.get("setup") != setup:
        raise SystemExit(f"{path} was run with {state.get('setup')}, not {setup}")
    state["setup"] = setup
    res = state.setdefault("ppl", {})
    toks = held_out_tokens(corpus_tokens(m, "wikitext2"))
    starts = np.linspace(0, len(toks) - a.context, a.windows).astype(int)
    windows = [toks[s : s + a.context] for s in starts]
    plans = {"C/G-Full": "fp32"}
    for g in a.groups.split(","):
        plans.update(groups[g])
    only = [n for n in a.only.split(",") if n]
    unknown = [n for n in only if n not in plans]
    if unknown:
        raise SystemExit(f"--only: {unknown} are not plans of --groups {a.groups}: {list(plans)}")
    if only:
        plans = {n: p for n, p in plans.items() if n in only or n == "C/G-Full"}
    todo = [name for name in plans if name not in res]
    if todo:
        refs = []
        for w in tqdm(windows, desc="fp32 reference", disable=a.quiet):
            refs.append(score_window(m, w, "fp32", None))
        if "C/G-Full" not in res:
            res["C/G-Full"] = {"plan": "fp32", "nll": [r[0] for r in refs], "kl": 0.0, "top1": 1.0}
        for name in tqdm(todo, desc="plans", disable=a.quiet):
            if name in res:
                continue
            t0 = time.perf_counter()
            pairs = zip(windows, refs, strict=True)
            rows = [score_window(m, w, plans[name], r[3]) for w, r in pairs]
            res[name] = {
                "plan": plans[name],
                "nll": [r[0] for r in rows],
                "kl": float(np.mean([r[1] for r in rows])),
                "top1": float(np.mean([r[2] for r in rows])),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            atomic_write_text(path, json.dumps(state, indent=1) + "\n")
    lengths = [int(x) for x in a.passkey.split(",") if x.strip()]
    pk = state.setdefault("passkey", {})
    if lengths:
        prompts = passkey_prompts(m, lengths, a.passkey_trials)
        for name in [n for n in groups["main"] if n in plans and n not in pk]:
            hits: dict[str, list[int]] = {}
            for n, key, ids in tqdm(prompts, desc=f"passkey {name}", disable=a.quiet):
                new = m.detokenize(m.generate_ids(ids, 8, groups["main"][name]))
                hits.setdefault(str(n), []).append(int(str(key) in new.replace(" ", "")))
            pk[name] = hits
            atomic_write_text(path, json.dumps(state, indent=1) + "\n")

    base = {str(i): x for i, x in enumerate(res["C/G-Full"]["nll"])}
    print(f"\nWikiText-2 held-out, {a.windows} windows x {a.context} tokens, fp32 linears")
    print(f"{'plan':28s} {'ppl':>8s} {'dNLL (nats) ± SE':>22s} {'KL':>9s} {'top-1':>7s}")
    for name in plans:
        if name not in res:
            continue
        r = res[name]
        d, se = paired_difference(base, {str(i): x for i, x in enumerate(r["nll"])})
        ppl = math.exp(float(np.mean(r["nll"])))
        print(f"{name:28s} {ppl:8.3f} {d:+10.4f} ± {se:.4f} {r['kl']:9.4f} {100 * r['top1']:6.2f}%")
    if "shadowAttn" in res and "C/G-Sparse" in res:  # Table 6's order, paired by window
        sparse = {str(i): x for i, x in enumerate(res["C/G-Sparse"]["nll"])}
        print("\npaired dNLL against C/G-Sparse (negative: closer to fp32 than C/G-Sparse)")
        for name in plans:
            if name in res and name.startswith("shadowAttn"):
                d, se = paired_difference(
                    sparse, {str(i): x for i, x in enumerate(res[name]["nll"])}
                )
                print(f"{name:28s} {d:+.4f} ± {se:.4f}")
    if pk:
        print(f"\npasskey retrieval ({a.passkey_trials} trials per length), accuracy %")
        for name, hits in pk.items():
            print(
                f"{name:28s} " + "  ".join(f"{n}: {100 * np.mean(v):5.1f}" for n, v in hits.items())
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
