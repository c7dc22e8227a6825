"""Step head-importance's two methods side by side (issue 38 item 4): the exact ablation of
shadowAttn's Eq. 1-2 (``importance_method=ablation``, the C++ part: ~155 forward passes a window)
and its first-order estimate from one backward pass a window (``importance_method=taylor``,
torch; socllm/calibration/head_importance.py), each run as ``socllm calibrate`` runs the step, on
the same windows.

Prints the machine, each method's wall time (the taylor one includes loading the torch model),
the Spearman rank correlation of the head importances (n_layers x n_heads) and of the layer
importances, the overlap of the 10 most important heads, and the share of heads whose sign
agrees, how Eq. 3's keep ratios at keep 0.2 differ; with ``--gradient-check``, the torch gate
gradient against a central difference of the engine's own loss (no torch); with
``--eval-windows``, shadowAttn's accuracy with each method's ratios. The exact method runs when
its cost is moderate (``--exact auto``: at most 4096 tokens;
about 20 s per 256-token window for SmolLM2-135M on 2 cores); at the paper's 128 windows x 512
tokens only the taylor time is measured:

    python scripts/head_importance_taylor.py                                # 4 x 256, both
    python scripts/head_importance_taylor.py --samples 8 --exact yes --gradient-check 0,1,15,29 \
        --eval-windows 8
    python scripts/head_importance_taylor.py --samples 128 --seqlen 512     # taylor only
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import socllm
from socllm.calibration import STEPS, run_steps
from socllm.eval.bench_utils import machine_line

AUTO_EXACT_TOKENS = 4096


def spearman(a, b) -> float:
    """Spearman's rank correlation (no ties among float importances)."""
    ra, rb = (np.argsort(np.argsort(np.ravel(x))).astype(float) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def top_overlap(a, b, k: int) -> int:
    """How many of the k largest entries of ``a`` are among the k largest of ``b``."""
    top = [set(np.argsort(np.ravel(x))[::-1][:k].tolist()) for x in (a, b)]
    return len(top[0] & top[1])


def run(model, method: str, args) -> tuple[np.ndarray, np.ndarray, float]:
    """(head importance, layer importance, seconds) of the step run as ``socllm calibrate``
    runs it."""
    t0 = time.perf_counter()
    data = run_steps(
        model,
        "head-importance",
        progress=not args.quiet,
        importance_method=method,
        importance_samples=args.samples,
        importance_seqlen=args.seqlen,
        seed=args.seed,
    )
    seconds = time.perf_counter() - t0
    return data.stats.array("head_importance"), data.stats.array("layer_importance"), seconds


def keep_ratios(heads, layers, keep: float) -> np.ndarray:
    """Eq. 3's per-head keep ratios (the shadow-attn plan's ``ratios=calibrated``)."""
    return np.asarray(socllm.ops.head_keep_ratios(heads, layers, keep)).reshape(heads.shape)


def compare(exact_heads, exact_layers, taylor_heads, taylor_layers, k: int = 10) -> dict:
    slope = float(np.dot(taylor_layers, exact_layers) / np.dot(taylor_layers, taylor_layers))
    r_exact = keep_ratios(exact_heads, exact_layers, 0.2)
    r_taylor = keep_ratios(taylor_heads, taylor_layers, 0.2)
    return {
        "spearman_heads": spearman(exact_heads, taylor_heads),
        "spearman_layers": spearman(exact_layers, taylor_layers),
        "pearson_heads": float(np.corrcoef(np.ravel(exact_heads), np.ravel(taylor_heads))[0, 1]),
        "pearson_layers": float(np.corrcoef(exact_layers, taylor_layers)[0, 1]),
        f"top{k}_heads_overlap": top_overlap(exact_heads, taylor_heads, k),
        "sign_agreement_heads": float(np.mean(np.sign(exact_heads) == np.sign(taylor_heads))),
        "positive_layers": [int((exact_layers > 0).sum()), int((taylor_layers > 0).sum())],
        # exact layer importance against the first-order one (least squares through 0): how far
        # removing a whole layer is from linear
        "layer_exact_over_taylor": slope,
        # Eq. 3 at keep 0.2: Spearman of the ratios, heads at the lowest ratio and at 1
        "spearman_keep_ratios": spearman(r_exact, r_taylor),
        "heads_at_floor": [int(np.isclose(r, r.min()).sum()) for r in (r_exact, r_taylor)],
        "heads_at_one": [int(np.isclose(r, 1).sum()) for r in (r_exact, r_taylor)],
    }


def gradient_check(model, window: list[int], layers: list[int], eps: float = 0.01) -> dict:
    """The taylor step's gate gradient (torch) against a central difference of the engine's own
    loss (its ablation kernel with head masks 1 +- eps: no torch), on one window: the largest
    difference per layer, for single heads and for a whole layer's gates."""
    import torch
    from socllm.calibration.head_importance import GatedReference, reference_model

    c = model.config
    L, H = c["n_layers"], c["n_heads"]
    torch.set_num_threads(socllm.num_threads())
    gated = GatedReference(reference_model(model), L, H, c["head_dim"])
    grad, _ = gated.gate_gradient([window])
    gated.close()
    out = {}
    for layer in layers:
        masks = []
        for h in [*range(H), None]:  # None: every head of the layer
            for sign in (1, -1):
                mask = np.ones(H, np.float32)
                mask[slice(None) if h is None else h] += sign * eps
                masks.append(mask)
        lp = model.head_masked_logprobs(window, layer, np.array(masks))
        nll = -lp.astype(np.float64).mean(1)
        fd = (nll[0::2] - nll[1::2]) / (2 * eps)
        out[layer] = {
            "max_abs_gradient": float(np.abs(grad[layer]).max()),
            "max_head_difference": float(np.abs(fd[:H] - grad[layer]).max()),
            "layer_gradient": float(grad[layer].sum()),
            "layer_difference": float(fd[H] - grad[layer].sum()),
        }
    return out


def downstream(model, results: dict[str, tuple], windows: int, keep: float) -> dict:
    """shadowAttn at ``keep`` with Eq. 3's ratios from each method's importances (Q/K scales
    from step qk-scales with its defaults) and with uniform ratios: KL from fp32, top-1
    agreement and perplexity ratio on ``windows`` held-out windows of 512 tokens."""
    from socllm.eval.divergence import compare_plans

    base = run_steps(model, "qk-scales", progress=False)
    plan = f"fp32:attention=shadow-attn,keep={keep}"
    out = {}
    for name, (heads, layers) in [*results.items(), ("uniform", (None, None))]:
        if layers is not None:
            base.stats.set_array("head_importance", None, heads)
            base.stats.set_array("layer_importance", None, layers)
        model.set_calibration(base.stats)
        p = plan if layers is not None else plan + ",ratios=uniform"
        r = compare_plans(model, [p], windows=windows, context=512)[p]
        out[name] = {k: r[k]["value"] for k in ("kl", "top1", "ppl_ratio")}
        out[name]["kl_se"] = r["kl"]["se"]
        print(
            f"  {name:>8}: KL {r['kl']['value']:.3f} +- {r['kl']['se']:.3f}, top-1 "
            f"{100 * r['top1']['value']:.1f}%, perplexity x{r['ppl_ratio']['value']:.3f}",
            flush=True,
        )
    model.set_calibration(None)
    return out


def main() -> int:
    defaults = STEPS["head-importance"].options
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=4, help="windows (the paper: 128)")
    ap.add_argument("--seqlen", type=int, default=256, help="tokens per window")
    ap.add_argument("--seed", type=int, default=defaults["seed"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--exact",
        choices=("auto", "yes", "no"),
        default="auto",
        help=f"run the exact ablation too (auto: when samples x seqlen <= {AUTO_EXACT_TOKENS})",
    )
    ap.add_argument(
        "--gradient-check",
        default=None,
        metavar="LAYERS",
        help="check the gate gradient against the engine's central difference on the first "
        "window, in these layers (e.g. 0,1,15,29)",
    )
    ap.add_argument(
        "--eval-windows",
        type=int,
        default=0,
        help="also evaluate shadowAttn (keep 0.2) with each method's ratios and uniform ones on "
        "this many held-out windows of 512 tokens (runs step qk-scales first)",
    )
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args()

    print(machine_line(), flush=True)
    socllm.set_log_level("warn")
    model = socllm.load(args.model, threads=args.threads, progress=not args.quiet)
    c = model.config
    print(
        f"model {args.model}: {c['n_layers']} layers x {c['n_heads']} heads; "
        f"{args.samples} windows x {args.seqlen} tokens (seed {args.seed}), "
        f"{socllm.num_threads()} threads",
        flush=True,
    )
    out: dict = {
        "machine": machine_line(),
        "model": args.model,
        "samples": args.samples,
        "seqlen": args.seqlen,
        "seed": args.seed,
        "threads": socllm.num_threads(),
    }
    th, tl, ts = run(model, "taylor", args)
    out["taylor_seconds"] = round(ts, 1)
    print(f"taylor: {ts:.1f} s ({ts / args.samples:.2f} s/window)", flush=True)
    exact = args.exact == "yes" or (
        args.exact == "auto" and args.samples * args.seqlen <= AUTO_EXACT_TOKENS
    )
    if exact:
        eh, el, es = run(model, "ablation", args)
        out["ablation_seconds"] = round(es, 1)
        print(f"ablation: {es:.1f} s ({es / args.samples:.2f} s/window, {es / ts:.0f}x taylor)")
        r = compare(eh, el, th, tl)
        out.update(r)
        n_heads = eh.size
        print(
            f"Spearman: heads {r['spearman_heads']:.3f} ({n_heads}), "
            f"layers {r['spearman_layers']:.3f} ({el.size}); Pearson: heads "
            f"{r['pearson_heads']:.3f}, layers {r['pearson_layers']:.3f}"
        )
        print(
            f"top-10 heads shared: {r['top10_heads_overlap']}/10; head signs agree: "
            f"{100 * r['sign_agreement_heads']:.0f}%; layers of positive importance: exact "
            f"{r['positive_layers'][0]}, taylor {r['positive_layers'][1]} of {el.size}; exact "
            f"layer importance = {r['layer_exact_over_taylor']:.2f} x taylor's (least squares)"
        )
        print(
            f"Eq. 3 at keep 0.2: Spearman of the ratios {r['spearman_keep_ratios']:.3f}; heads at "
            f"the lowest ratio: exact {r['heads_at_floor'][0]}, taylor {r['heads_at_floor'][1]}; "
            f"at 1: exact {r['heads_at_one'][0]}, taylor {r['heads_at_one'][1]}"
        )
        order = np.argsort(el)[::-1][:5]
        print(
            "most important layers (exact | taylor, nats/token): "
            + ", ".join(f"{i}: {el[i]:.3f} | {tl[i]:.3f}" for i in order)
        )
        out["layer_importance"] = {"ablation": el.tolist(), "taylor": tl.tolist()}
        out["head_importance"] = {"ablation": eh.tolist(), "taylor": th.tolist()}
    else:
        print(f"ablation skipped (--exact {args.exact}; about 155 forward passes a window)")
        out["head_importance"] = {"taylor": th.tolist()}
        out["layer_importance"] = {"taylor": tl.tolist()}
    if args.gradient_check:
        from socllm.calibration import calibration_windows, corpus_tokens

        layers = [int(x) for x in args.gradient_check.split(",")]
        window = calibration_windows(corpus_tokens(model), args.samples, args.seqlen, args.seed)[0]
        g = gradient_check(model, window, layers)
        out["gradient_check"] = g
        print("gate gradient (torch) vs the engine's central difference (masks 1 +- 0.01):")
        for layer, v in g.items():
            print(
                f"  layer {layer}: heads max |difference| {v['max_head_difference']:.1e} "
                f"(max |gradient| {v['max_abs_gradient']:.3f}); whole layer "
                f"{v['layer_gradient']:+.4f}, difference {v['layer_difference']:+.1e}"
            )
    if args.eval_windows:
        print(f"shadowAttn keep 0.2, {args.eval_windows} held-out windows x 512:", flush=True)
        results = {"taylor": (th, tl)}
        if exact:
            results = {"ablation": (eh, el), **results}
        out["downstream"] = downstream(model, results, args.eval_windows, 0.2)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
