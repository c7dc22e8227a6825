#!/usr/bin/env python3
"""Accuracy of NPU plans with rotations, GPTQ rounding and a scaled residual stream (issue 39
items 4-5; QuaRot, Ashkboos et al. 2024 §4; GPTQ, Frantar et al. 2023), each next to the same
plan without them.

Every row is scored against the plain model's fp32 logits on the same held-out WikiText-2
windows: the paired mean NLL difference per token (ΔNLL, error over windows), the KL divergence
from fp32 and the top-1 agreement. A rotation changes no fp32 logit (its own row shows the float
rounding), so any difference of a quantized plan comes from how it quantizes. Each rotation's
statistics (``--steps``: act-scales, and as the plans need them outliers, smoothing, gptq) are
gathered on its own rotated model from the same windows of the calibration slice (calibration
text is never scored), and the plans run with the rotation as plan parts
(``w8a8:rotate=hadamard,...``) on one plain model.

A rotation is a name from ROTATIONS (``hadamard``: the residual stream; ``quarot``: it and the
online down-projection and per-head rotations; ``inner``: the last two alone, which Gemma 3's
post norms allow) or plan parts joined by '+' (``rotate=random+rotate_seed=3``). A plan is a
plan text or an alias from PLANS (``w4a8``: 4-bit per-channel weights, static per-tensor int8
activations); ``+gptq`` after it adds ``rounding=gptq``, ``+rs`` adds ``residual_scale=auto``.
Plans are ','-separated, or ';'-separated when one has options (``w8a8;edgeflow:bits=4``).

    python scripts/rotation_accuracy.py --json docs/results/rotation_accuracy.json
    python scripts/rotation_accuracy.py --model gemma3-270m --rotations none,inner \\
        --plans "w8a8+rs,w8a8+rs+gptq,w4a16+rs" --json docs/results/rotation_accuracy_gemma.json
    python scripts/rotation_accuracy.py --windows 2 --plans w8a8 --rotations none,quarot  # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
from socllm.calibration import run_steps  # noqa: E402
from socllm.cli import split_list  # noqa: E402
from socllm.eval.bench_utils import machine_line  # noqa: E402
from socllm.eval.divergence import heldout_windows, summarize, window_stats  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402

# name -> plan parts ({seed}: --seed)
ROTATIONS = {
    "none": "",
    "fold": "rotate=fold",
    "hadamard": "rotate=hadamard,rotate_seed={seed}",
    "random": "rotate=random,rotate_seed={seed}",
    "down": "rotate_down=hadamard",
    "heads": "rotate_heads=hadamard",
    "inner": "rotate_down=hadamard,rotate_heads=hadamard",
    "quarot": "rotate=hadamard,rotate_seed={seed},rotate_down=hadamard,rotate_heads=hadamard",
}
# alias -> plan JSON
CPU_FP32 = {"processor": "cpu", "format": "fp32"}
PLANS = {
    # llm.npu's w8a8 with every float op in fp32 on the CPU (Gemma 3's fp16 overflow workaround)
    "w8a8-fp32-floats": {
        "name": "w8a8",
        "placement": {c: CPU_FP32 for c in ("norm", "activation", "residual", "rope", "attention")},
    },
    "w4a8": {
        "name": "custom",
        "ops": {
            "linear": {
                "weights": {"format": "int8", "granularity": "per-channel", "bits": 4},
                "activations": "int8-static-per-tensor",
            }
        },
    },
}
SUFFIXES = {"gptq": {"rounding": "gptq"}, "rs": {"residual_scale": "auto"}}


def rotation_parts(name: str, seed: int) -> dict:
    """The plan parts of a rotation named on the command line, as a dict."""
    text = ROTATIONS.get(name, name.replace("+", ",")).format(seed=seed)
    return dict(_scalar(kv) for kv in text.split(",") if kv)


def _scalar(kv: str) -> tuple[str, object]:
    """ "key=value" -> (key, the value as an int, a float, or the text)."""
    k, _, v = kv.partition("=")
    for kind in (int, float):
        try:
            return k, kind(v)
        except ValueError:
            pass
    return k, v


def plan_spec(name: str, parts: dict) -> str:
    """The plan (text, or JSON for an alias) of ``name`` ("w8a8+gptq", "edgeflow:bits=4+rs")
    with the rotation's parts added."""
    head, *suffixes = name.split("+")
    extra = dict(parts)
    for s in suffixes:
        extra.update(SUFFIXES[s])
    if head in PLANS:
        return json.dumps({**PLANS[head], **extra})
    base, _, opts = head.partition(":")
    j = {"name": base, **dict(_scalar(kv) for kv in opts.split(",") if kv), **extra}
    return json.dumps(j)


def steps_for(plans: list[str], given: list[str]) -> list[str]:
    """The calibration steps the plans need, of those given (act-scales always)."""
    need = {"act-scales"}
    for p in plans:
        if "gptq" in p:
            need.add("gptq")
        if p.startswith("shadow-outlier"):
            need.add("outliers")
        if p.startswith("edgeflow"):
            need.add("smoothing")
    return [s for s in given if s in need]


def markdown(rows: list[dict], rotations: list[str]) -> str:
    """The table RESULTS shows: per plan, ΔNLL ± SE, KL and top-1 under each rotation."""
    head = "| plan | " + " | ".join(f"{r}: ΔNLL, KL, top-1" for r in rotations) + " |"
    out = [head, "| --- |" + " ---: |" * len(rotations)]
    for p in dict.fromkeys(x["plan"] for x in rows):
        cells = {x["rotation"]: x for x in rows if x["plan"] == p}
        out.append(f"| `{p}` | " + " | ".join(
            f"{cells[r]['dnll']:+.3f} ± {cells[r]['dnll_se']:.3f}, {cells[r]['kl']['value']:.3f}, "
            f"{100 * cells[r]['top1']['value']:.1f}%" if r in cells else "" for r in rotations
        ) + " |")  # fmt: skip
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--plans",
        default="fp32,w8a8,w8a8+gptq,smoothquant,smoothquant+gptq,w4a8,w4a8+gptq,"
        "edgeflow:bits=4,edgeflow:bits=4+gptq,edgeflow:bits=5,edgeflow:bits=5+gptq,"
        "shadow-outlier,w4a16,w4a16+gptq",
    )
    ap.add_argument("--rotations", default="none,hadamard,quarot")
    ap.add_argument("--seed", type=int, default=0, help="the rotations' seed")
    ap.add_argument("--steps", default="act-scales,outliers,smoothing,gptq")
    ap.add_argument("--windows", type=int, default=16, help="held-out windows scored")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seqlen", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--table-from", help="print the markdown table of an earlier --json, only")
    a = ap.parse_args(argv)
    if a.table_from:
        d = json.loads(Path(a.table_from).read_text())
        print(markdown(d["rows"], list(d["meta"]["parts"])))
        return 0
    say = (lambda *x: None) if a.quiet else print
    plans, rotations = split_list(a.plans), split_list(a.rotations)
    say(machine_line())
    plain = socllm.load(a.model, progress=not a.quiet)
    parts = {r: rotation_parts(r, a.seed) for r in rotations}
    spans = heldout_windows(plain, a.context, a.windows)
    refs = [plain.logits(ids, "fp32")[:-1] for ids in spans]
    steps = steps_for(plans, split_list(a.steps))
    # how far each linear input's largest channel stands out: per layer the largest channel
    # absmax over the median channel's, the median of that over layers (a rotation of the
    # residual stream reaches attn_in and mlp_in; the online ones mlp_act and attn_out)
    peaks: dict[str, dict[str, float]] = {}
    seconds: dict[str, float] = {}
    rows: list[dict] = []
    for r in rotations:
        t0 = time.perf_counter()
        rotation = socllm.Plan(plan_spec("fp32", parts[r])).rotation
        m = plain if rotation == "none" else plain.rotated(rotation)
        cal = run_steps(
            m, steps, samples=a.calib_samples, seqlen=a.calib_seqlen, seed=0, progress=not a.quiet
        )
        plain.set_calibration(cal.stats)  # to the plans of its rotation
        del m
        seconds[r] = time.perf_counter() - t0
        peaks[r] = {}
        for site in ("attn_in", "attn_out", "mlp_in", "mlp_act"):
            x = cal.stats.array("act_absmax", site)
            peaks[r][site] = float(np.median(x.max(1) / np.median(x, 1)))
        say(f"{', '.join(steps)} on the {rotation} model: {seconds[r]:.1f} s; channel peak / "
            + ", ".join(f"{s} {v:.1f}" for s, v in peaks[r].items()))  # fmt: skip
        for p in plans:
            spec = plan_spec(p, parts[r])
            t1 = time.perf_counter()
            w = []
            for ids, ref in tqdm(list(zip(spans, refs, strict=True)), desc=f"{p} {r}",
                                 disable=a.quiet, leave=False):  # fmt: skip
                targets = np.asarray(ids[1:], dtype=np.int64)
                w.append(window_stats(ref, plain.logits(ids, spec)[:-1], targets))
            s = summarize(w)
            d = np.array([x["nll"] / x["n"] - x["nll_ref"] / x["n"] for x in w])
            se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else 0.0
            rows.append({"plan": p, "rotation": r, "spec": json.loads(spec),
                         "dnll": float(d.mean()), "dnll_se": se,
                         "seconds": time.perf_counter() - t1, **s, "windows": w})  # fmt: skip
            say(f"{p:<24}{r:<10}{d.mean():>+10.4f} ± {se:.4f}  KL {s['kl']['value']:.4f} ± "
                f"{s['kl']['se']:.4f}  top-1 {100 * s['top1']['value']:5.1f}%  "
                f"ppl {s['ppl']:.2f}")  # fmt: skip
    say(f"\n{a.model}, {len(spans)} held-out windows of {a.context} tokens, against plain fp32")
    say(f"{'plan':<24}" + "".join(f"{r:>22}" for r in rotations))
    for p in plans:
        cells = {x["rotation"]: x for x in rows if x["plan"] == p}
        say(f"{p:<24}" + "".join(f"{cells[r]['dnll']:>+13.4f} ± {cells[r]['dnll_se']:.4f}"
                                 for r in rotations))  # fmt: skip
    if a.json:
        meta = {"model": a.model, "context": a.context, "windows": len(spans), "seed": a.seed,
                "calib_samples": a.calib_samples, "calib_seqlen": a.calib_seqlen,
                "steps": steps, "calibration_seconds": seconds, "parts": parts,
                "channel_peak_over_median": peaks, "machine": machine_line()}  # fmt: skip
        atomic_write_text(Path(a.json), json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
