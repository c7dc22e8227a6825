#!/usr/bin/env python3
"""EdgeFlow's accuracy tables on the real model (seed 004 Table 4 / Table 5, Fig. 12 analogues).

For each average bit-width (--bits, default 4 5 6 7) and each method at that budget:
SmoothQuant adapted to the NPU (``smoothquant-npu``: SmoothQuant's input smoothing, output
smoothing, uniform per-channel weights), llm.npu's shadow outlier with B-bit per-tensor weights
(``shadow-outlier:weight_bits=B``), CMPQ moved to output channels with EdgeFlow's metric
(``edgeflow:allocation=cmpq``), EdgeFlow (``edgeflow``), and two more baselines of the same
budget: uniform per-channel bits and the INT4/INT8 mix, both with EdgeFlow's smoothing.
Fractional budgets run the methods that take one (greedy, cmpq). Extra rows at --ablation-bits
show what the output quantization and the smoothing exponents change.

Metrics on held-out WikiText-2 windows (--windows x --seqlen tokens after the calibration
slice), against fp32 on the same tokens: perplexity, the paired per-token NLL difference with
its standard error over 128-token blocks, the mean KL divergence KL(fp32 || plan) of the
next-token distribution and the top-1 agreement (both more sensitive than accuracy on a 135M
model), and the stored bits per weight of the linears (codes, scales and bit-width metadata).

    python scripts/edgeflow_accuracy.py --calib CAL.h5 [--bits 4 5 6 7] [--windows 16]
        [--seqlen 512] [--json docs/results/edgeflow_accuracy.json]

CAL.h5: `socllm calibrate --steps act-scales,smoothing,bitwidths,outliers` (outliers for the
shadow-outlier rows).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import socllm
from socllm.calibration import corpus_tokens, held_out_tokens
from socllm.eval.report import paired_nll_vs
from socllm.io.files import check_output_path, emit_json
from tqdm.auto import tqdm


def plans_for(bits: float) -> dict[str, str]:
    integer = float(bits).is_integer()
    b = int(bits) if integer else bits
    out = {}
    if integer:
        out["SmoothQuant-NPU"] = f"smoothquant-npu:bits={b}"
        out["shadow outlier"] = f"shadow-outlier:weight_bits={b}" if b >= 2 else None
    out["CMPQ (out-ch)"] = f"edgeflow:bits={bits!r},allocation=cmpq"
    out["EdgeFlow"] = f"edgeflow:bits={bits!r}"
    if integer:
        out["uniform"] = f"edgeflow:bits={b},allocation=uniform"
    if bits >= 4:
        out["INT4/INT8 mix"] = f"edgeflow:bits={bits!r},allocation=int4-int8"
    return {k: v for k, v in out.items() if v}


ABLATION = {
    "EdgeFlow, outputs not quantized": "edgeflow:bits={b},output_quant=none",
    "EdgeFlow, int16 outputs": "edgeflow:bits={b},output_quant=int16",
    "EdgeFlow, int8 outputs, beta=0": "edgeflow:bits={b},beta=0",
    "EdgeFlow, alpha=0.5 (not searched)": "edgeflow:bits={b},alpha=0.5",
    "EdgeFlow, alpha=0 (no input smoothing)": "edgeflow:bits={b},alpha=0",
    "EdgeFlow, exact metric": "edgeflow:bits={b},metric=exact",
    "EdgeFlow, unfolded smoothing": "edgeflow:bits={b},fold=0",
}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def evaluate(model, plan: str, windows, ref_lp, ref_top1) -> dict:
    nll, kl, top1 = [], [], []
    for w, rlp, rt in zip(windows, ref_lp, ref_top1, strict=True):
        lp = log_softmax(model.logits(w, plan))
        nll.append(-lp[np.arange(len(w) - 1), w[1:]])
        p = np.exp(rlp.astype(np.float64))
        kl.append((p * (rlp.astype(np.float64) - lp)).sum(-1))
        top1.append(lp.argmax(-1) == rt)
    nll = np.concatenate(nll)
    return {
        "nll": nll,
        "kl": float(np.concatenate(kl).mean()),
        "top1": float(np.concatenate(top1).mean()),
    }


def fp32_reference(m, n_windows: int, seqlen: int, quiet: bool):
    """The first n_windows held-out WikiText-2 windows of seqlen tokens and fp32's next-token
    log-probabilities (fp16), argmax and per-token NLL (concatenated) on them."""
    toks = held_out_tokens(corpus_tokens(m))
    windows = [toks[i * seqlen : (i + 1) * seqlen] for i in range(n_windows)]
    ref_lp, ref_top1, ref_nll = [], [], []
    for w in tqdm(windows, desc="fp32", disable=quiet):
        lp = log_softmax(m.logits(w, "fp32"))
        ref_lp.append(lp.astype(np.float16))
        ref_top1.append(lp.argmax(-1))
        ref_nll.append(-lp[np.arange(len(w) - 1), w[1:]])
    return windows, ref_lp, ref_top1, np.concatenate(ref_nll)


def add_window_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quiet", action="store_true")


def load_with_reference(args):
    """The model of --model/--calib and fp32_reference on its --windows x --seqlen tokens."""
    if args.json:
        check_output_path(args.json, what="--json")
    m = socllm.load(args.model, calib=args.calib, progress=not args.quiet)
    return (m, *fp32_reference(m, args.windows, args.seqlen, args.quiet))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--calib", required=True)
    ap.add_argument("--bits", type=float, nargs="+", default=[4.0, 5.0, 6.0, 7.0])
    ap.add_argument("--ablation-bits", type=float, default=5.0)
    add_window_args(ap)
    args = ap.parse_args(argv)
    m, windows, ref_lp, ref_top1, ref_nll = load_with_reference(args)
    c = m.config
    q, kv = c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"]
    n_params = c["n_layers"] * (
        c["d_model"] * (q + 2 * kv) + q * c["d_model"] + 3 * c["d_model"] * c["d_ff"]
    )
    jobs = [(b, name, plan) for b in args.bits for name, plan in plans_for(b).items()]
    jobs += [
        (args.ablation_bits, name, plan.format(b=args.ablation_bits))
        for name, plan in ABLATION.items()
    ]
    rows = []
    for b, name, plan in tqdm(jobs, desc="plans", disable=args.quiet):
        t0 = time.perf_counter()
        weight_bytes = m.prepare(plan)
        r = evaluate(m, plan, windows, ref_lp, ref_top1)
        rows.append(
            {
                "bits": b,
                "method": name,
                "plan": plan,
                "bits_per_weight": 8.0 * weight_bytes / n_params,
                "perplexity": float(np.exp(r["nll"].mean())),
                **paired_nll_vs(ref_nll, r["nll"]),
                "kl": r["kl"],
                "top1": r["top1"],
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
        if not args.quiet:
            x = rows[-1]
            print(
                f"{b:>4g} {name:38s} ppl {x['perplexity']:9.2f}  dNLL {x['delta_nll']:+.4f}"
                f"±{x['delta_nll_se']:.4f}  KL {x['kl']:.4f}  top1 {x['top1']:.3f}  "
                f"b/w {x['bits_per_weight']:.3f}",
                flush=True,
            )
    out = {
        "model": args.model,
        "calibration": args.calib,
        "windows": args.windows,
        "seqlen": args.seqlen,
        "tokens_scored": int(ref_nll.size),
        "fp32_perplexity": float(np.exp(ref_nll.mean())),
        "rows": rows,
    }
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
