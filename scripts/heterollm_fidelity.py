"""HeteroLLM's engines against seed 002's numbers (issue 15 items 6-7).

    python scripts/heterollm_fidelity.py [--fit] [--json docs/results/heterollm_fidelity.json]

One parameter of the `heterollm` characterization is fitted: the NPU's shape-efficiency half
point r_half (seed 002 Fig. 5 is only a plot), by bisection so that Hetero-tensor's prefill of
Llama-8B at 1024 tokens is 247.9 tok/s (§5.2.1). Every other row is held out. --fit writes the
value into python/socllm/devices/fit.py's constant and regenerates the profiles
(scripts/fit_cost_model.py --write); without it the profile's value is used as is.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import socllm
from socllm.devices import load_profile
from socllm.io.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "Llama-8B": "llama-3-8b",
    "Llama-7B": "llama-2-7b",
    "Llama-3B": "llama-3.2-3b",
    "InternLM-1.8B": "internlm-1.8b",
}
ENGINES = [e["name"] for e in socllm.hetero_engines()]
FIT_TARGET = ("llama-3-8b", 1024, 247.9)


def tok_s(profile, model, engine, n, phase="prefill", fast=True):
    s = socllm.simulate_hetero(model, profile, engine, n, phase=phase, fast_sync=fast).summary()
    return s["decode_tokens_per_s"] if phase == "decode" else s["prefill_tokens_per_s"]


def with_r_half(profile: dict, r: float) -> dict:
    p = copy.deepcopy(profile)
    p["characterizations"]["heterollm"]["cost_model"]["npu"]["fp16_shape_ratio_half"]["value"] = r
    return p


def fit_r_half(profile: dict) -> float:
    model, n, target = FIT_TARGET
    lo, hi = 0.01, 100.0  # speed falls as r_half grows
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        if tok_s(with_r_half(profile, mid), model, "hetero-tensor", n) > target:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def with_game_share(profile: dict, share: float) -> dict:
    p = copy.deepcopy(profile)
    p["scenarios"]["mobile-game"]["gpu_time_share"]["value"] = share
    return p


def game_loss(profile: dict, engine: str, **kw) -> float:
    clean = tok_s(profile, "llama-3-8b", engine, 256)
    s = socllm.simulate_hetero(
        "llama-3-8b", profile, engine, 256, co_runner="mobile-game", **kw
    ).summary()
    return 1.0 - s["prefill_tokens_per_s"] / clean


def fit_game_share(profile: dict) -> float:
    """The game's GPU share making Hetero-layer's Llama-8B prefill at 256 lose 9.57% (§5.5)."""
    lo, hi = 0.0, 0.99
    for _ in range(50):
        mid = (lo + hi) / 2
        if game_loss(with_game_share(profile, mid), "hetero-layer") < 0.0957:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def row(name, paper, ours, fitted=False):
    return {
        "row": name,
        "paper": paper,
        "ours": ours,
        "error": (ours - paper) / paper if paper else None,
        "fitted": fitted,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit r_half and write the profiles")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    prof = load_profile("snapdragon-8gen3")
    if args.fit:
        r = fit_r_half(prof)
        share = fit_game_share(with_r_half(prof, r))
        fit_py = ROOT / "python" / "socllm" / "devices" / "fit.py"
        text = re.sub(
            r"(HETEROLLM_SHAPE_RATIO_HALF = )[0-9.e-]+",
            rf"\g<1>{r:.4f}",
            fit_py.read_text(),
        )
        text = re.sub(r"(GAME_GPU_TIME_SHARE = )[0-9.e-]+", rf"\g<1>{share:.4f}", text)
        atomic_write_text(fit_py, text)
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), "--write"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        prof = load_profile("snapdragon-8gen3")
        print(f"fitted r_half = {r:.4f} to Hetero-tensor Llama-8B 1024 = {FIT_TARGET[2]} tok/s")
        print(f"fitted the game's GPU share = {share:.4f} to Hetero-layer's -9.57% (§5.5)")
    r_half = prof["characterizations"]["heterollm"]["cost_model"]["npu"]["fp16_shape_ratio_half"]
    table = {}
    for label, cfg in MODELS.items():
        for n in (64, 256, 1024):
            for e in ENGINES:
                for fast in (True, False):
                    table[f"{label}|prefill|{n}|{e}|{'fast' if fast else 'conv'}"] = tok_s(
                        prof, cfg, e, n, fast=fast
                    )
        for e in ("gpu-only", "hetero-layer", "hetero-tensor"):
            for fast in (True, False):
                table[f"{label}|decode|256|{e}|{'fast' if fast else 'conv'}"] = tok_s(
                    prof, cfg, e, 256, "decode", fast
                )
    misaligned = {}
    for n in list(range(33, 1001, 41)) + [135, 300, 525, 600, 1000]:
        misaligned[n] = {e: tok_s(prof, "llama-3-8b", e, n) for e in ENGINES}

    def t(label, phase, n, e, fast=True):
        return table[f"{label}|{phase}|{n}|{e}|{'fast' if fast else 'conv'}"]

    tensor_over_layer = [
        t(m, "prefill", n, "hetero-tensor") / t(m, "prefill", n, "hetero-layer")
        for m in MODELS
        for n in (64, 256, 1024)
    ]
    fs_layer = [
        t("Llama-8B", "prefill", n, "hetero-layer")
        / t("Llama-8B", "prefill", n, "hetero-layer", False)
        for n in (64, 256, 1024)
    ]
    fs_tensor = [
        t("Llama-8B", "prefill", n, "hetero-tensor")
        / t("Llama-8B", "prefill", n, "hetero-tensor", False)
        for n in (64, 256, 1024)
    ]
    at525 = misaligned[525]
    power = {}  # §5.6: Llama-8B prefill at 256, average power (W) and energy (mJ)
    for e in ("gpu-only", "hetero-layer", "hetero-tensor"):
        s = socllm.simulate_hetero("llama-3-8b", prof, e, 256).summary()
        power[e] = (s["energy_mj"] / s["prefill_ms"], s["energy_mj"])
    rows = [
        row(
            "Hetero-tensor prefill Llama-8B 1024 (tok/s)",
            247.9,
            t("Llama-8B", "prefill", 1024, "hetero-tensor"),
            fitted=True,
        ),
        row(
            "Hetero-tensor prefill InternLM-1.8B 256 (tok/s)",
            1092,
            t("InternLM-1.8B", "prefill", 256, "hetero-tensor"),
        ),
        row(
            "Hetero-tensor over Hetero-layer, mean of 4 models x 64/256/1024",
            1.302,
            sum(tensor_over_layer) / len(tensor_over_layer),
        ),
        row(
            "525 tokens: over Online-prepare",
            2.24,
            at525["hetero-tensor"] / at525["npu-online-prepare"],
        ),
        row("525 tokens: over Padding", 2.21, at525["hetero-tensor"] / at525["npu-padding"]),
        row("525 tokens: over Pipe", 1.35, at525["hetero-tensor"] / at525["npu-pipe"]),
        row(
            "fast sync, Hetero-layer Llama-8B prefill (mean 64/256/1024)", 1.158, sum(fs_layer) / 3
        ),
        row(
            "fast sync, Hetero-tensor Llama-8B prefill (mean 64/256/1024)",
            1.243,
            sum(fs_tensor) / 3,
        ),
        row(
            "Hetero-tensor Llama-8B 256 without fast sync (tok/s)",
            196.44,
            t("Llama-8B", "prefill", 256, "hetero-tensor", False),
        ),
        row(
            "Hetero-tensor Llama-8B 256 with fast sync (tok/s)",
            236.92,
            t("Llama-8B", "prefill", 256, "hetero-tensor"),
        ),
        row("decode Llama-8B (tok/s)", 14.01, t("Llama-8B", "decode", 256, "hetero-tensor")),
        row("decode Llama-3B (tok/s)", 29.9, t("Llama-3B", "decode", 256, "hetero-tensor")),
        row(
            "decode InternLM-1.8B (tok/s)",
            51.12,
            t("InternLM-1.8B", "decode", 256, "hetero-tensor"),
        ),
        *[
            row(
                f"decode over GPU-only, {m}",
                p,
                t(m, "decode", 256, "hetero-tensor") / t(m, "decode", 256, "gpu-only"),
            )
            for m, p in (("Llama-8B", 1.234), ("Llama-3B", 1.0852), ("InternLM-1.8B", 1.1338))
        ],
        row(
            "with the game: Hetero-layer Llama-8B 256 prefill loss",
            0.0957,
            game_loss(prof, "hetero-layer"),
            fitted=True,
        ),
        row(
            "with the game: Hetero-tensor loss (partitions of the profile)",
            0.0726,
            game_loss(prof, "hetero-tensor"),
        ),
        row(
            "with the game: Hetero-tensor loss (re-solved for the game)",
            0.0726,
            game_loss(prof, "hetero-tensor", solve_for_co_runner=True),
        ),
        row(
            "power, Hetero-tensor over Hetero-layer (Llama-8B 256)",
            1.232,
            power["hetero-tensor"][0] / power["hetero-layer"][0],
        ),
        row(
            "energy, Hetero-tensor over Hetero-layer",
            1.033,
            power["hetero-tensor"][1] / power["hetero-layer"][1],
        ),
        row(
            "energy efficiency, Hetero-tensor over PPL-OpenCL (gpu-only)",
            5.87,
            power["gpu-only"][1] / power["hetero-tensor"][1],
        ),
        row(
            "decode with fast sync over without, Llama-8B",
            4.01,
            t("Llama-8B", "decode", 256, "hetero-tensor")
            / t("Llama-8B", "decode", 256, "hetero-tensor", False),
        ),
    ]
    print(f"characterization heterollm, r_half = {r_half['value']:.4f} (fitted row marked *)")
    print(f"{'row':<66} {'paper':>8} {'ours':>8} {'error':>7}")
    for r in rows:
        print(
            f"{r['row'] + (' *' if r['fitted'] else ''):<66} {r['paper']:>8.3f} "
            f"{r['ours']:>8.3f} {100 * r['error']:>+6.1f}%"
        )
    print("\nprefill tok/s, fast sync (conventional in parentheses)")
    for label in MODELS:
        for n in (64, 256, 1024):
            cells = "  ".join(
                f"{e} {t(label, 'prefill', n, e):.0f} ({t(label, 'prefill', n, e, False):.0f})"
                for e in ENGINES
            )
            print(f"{label:<14} {n:>5}: {cells}")
    print("\ndecode tok/s at 256, fast (conventional)")
    for label in MODELS:
        print(
            f"{label:<14} "
            + "  ".join(
                f"{e} {t(label, 'decode', 256, e):.2f} ({t(label, 'decode', 256, e, False):.2f})"
                for e in ("gpu-only", "hetero-layer", "hetero-tensor")
            )
        )
    print("\nLlama-8B misaligned lengths, tok/s")
    for n in sorted(misaligned):
        print(f"{n:>5}: " + "  ".join(f"{e} {v:.0f}" for e, v in misaligned[n].items()))
    if args.json:
        atomic_write_text(
            Path(args.json),
            json.dumps(
                {"r_half": r_half, "rows": rows, "table": table, "misaligned_llama8b": misaligned},
                indent=1,
            )
            + "\n",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
