"""llm.npu's two large fidelity misses, fitted as system-level parameters (issue 15 item 9).

    python scripts/llmnpu_e2e_fit.py [--write] [--json docs/results/llmnpu_e2e_fit.json]

The micro-benchmark-only profile (the default cost model, fitted to llm.npu's Table 3) gives
llm.npu about half the paper's speedup over llama.cpp and a prefill speed that hardly moves with
the pruning rate. Three system-level parameters of characterization `llmnpu-e2e` are fitted to
one model's end-to-end numbers, Qwen1.5-1.8B's:

  npu_time_scale   whole-model NPU time over the micro-benchmarks'
  cpu_time_scale   whole-model CPU time (llama.cpp, the shadow parts, attention) over them
  shadow_fixed_us  what one shadow part costs beyond its arithmetic

Targets: the pruning curve 156 / 544 / 596 tok/s at 0 / 80 / 100% (seed 001 §4.4 Fig. 16, 1024
tokens) and llama.cpp-CPU's prefill speed, derived from §1 ("21.7 seconds for automated email
replies" over LongBench prompts of 1168-1835 tokens and 7.9 output tokens on average: the
midpoint 1501 tokens in 21.7 s, the decode neglected: 69 tok/s). Everything else is held out:
Gemma-2B's curve 102 / 285 / 345, the speedups over llama.cpp at 1024 (18.17-38.4x) and 64 tokens
(7.1-14.86x) over the three models, Qwen's NPU time at 256 tokens (315 ms, §3.4).
--write stores the parameters in python/socllm/devices/fit.py and regenerates the profiles.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import socllm
from socllm.devices import fit as devfit
from socllm.devices import load_profile
from socllm.fidelity.targets import (
    LLAMACPP_QWEN_S,
    LLAMACPP_QWEN_TOKENS,
    LLAMACPP_RUN,
    LLMNPU_MODELS,
    LLMNPU_PRUNING_TOK_S,
    LLMNPU_RUN,
    LLMNPU_VS_LLAMACPP,
)
from socllm.io.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
# the paper numbers and the two systems' runs are the fidelity targets' (socllm.fidelity.targets)
PRUNING = LLMNPU_PRUNING_TOK_S  # Qwen1.5-1.8B's curve fitted, Gemma-2B's held out
VS_CPU = LLMNPU_VS_LLAMACPP
MODELS = LLMNPU_MODELS
LLAMACPP_QWEN_TOK_S = LLAMACPP_QWEN_TOKENS / LLAMACPP_QWEN_S  # unrounded, as issue 15 fitted it
NAMES = ("npu_time_scale", "cpu_time_scale", "shadow_fixed_us")


def with_params(profile: dict, params: dict) -> dict:
    p = copy.deepcopy(profile)
    p["characterizations"]["llmnpu-e2e"]["cost_model"] = devfit.llmnpu_e2e_patch(
        profile["cost_model"], params
    )
    return p


def _simulate(profile, cfg, n, run: dict, char: str, **over) -> dict:
    kw = {**run, **over}
    return socllm.simulate(cfg, profile, kw.pop("plan"), n, characterization=char, **kw).summary()


def llmnpu(profile, cfg, n, pruning=None, char="llmnpu-e2e", policy="npu-stall-first"):
    plan = "shadow-outlier" if pruning is None else f"shadow-outlier:pruning_rate={pruning}"
    return _simulate(profile, cfg, n, LLMNPU_RUN, char, plan=plan, policy=policy)


def llamacpp(profile, cfg, n, char="llmnpu-e2e"):
    return _simulate(profile, cfg, n, LLAMACPP_RUN, char)


def residuals(x, profile):
    params = dict(zip(NAMES, (np.exp(x[0]), np.exp(x[1]), np.exp(x[2])), strict=True))
    p = with_params(profile, params)
    r = [
        np.log(llmnpu(p, "qwen1.5-1.8b", 1024, rate)["prefill_tokens_per_s"] / t)
        for rate, t in PRUNING["qwen1.5-1.8b"].items()
    ]
    r.append(
        np.log(llamacpp(p, "qwen1.5-1.8b", 1024)["prefill_tokens_per_s"] / LLAMACPP_QWEN_TOK_S)
    )
    return np.array(r)


def predictions(profile: dict, char: str) -> dict:
    out = {"pruning": {}, "vs_cpu": {}}
    for cfg, curve in PRUNING.items():
        out["pruning"][cfg] = {
            str(r): llmnpu(profile, cfg, 1024, r, char)["prefill_tokens_per_s"] for r in curve
        }
    for n in VS_CPU:
        out["vs_cpu"][n] = {
            cfg: llamacpp(profile, cfg, n, char)["prefill_ms"]
            / llmnpu(profile, cfg, n, None, char)["prefill_ms"]
            for cfg in MODELS
        }
    out["llamacpp_qwen_1024_tok_s"] = llamacpp(profile, "qwen1.5-1.8b", 1024, char)[
        "prefill_tokens_per_s"
    ]
    s = llmnpu(profile, "qwen1.5-1.8b", 256, None, char, policy="in-order")
    out["qwen_256_npu_busy_ms"] = s["busy_ms"]["npu"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    profile = load_profile("snapdragon-8gen3")
    # Levenberg-Marquardt on Eigen (cpp/soc/fit.h), in log space
    fit = socllm.sim.least_squares_bounded(
        lambda x: residuals(np.asarray(x), profile), np.log([1.5, 2.0, 2000.0]), diff_step=1e-3
    )
    params = dict(zip(NAMES, np.exp(fit["x"]).tolist(), strict=True))
    print("fitted on Qwen1.5-1.8B: " + ", ".join(f"{k} {v:.3f}" for k, v in params.items()))
    print("  residuals (log): " + ", ".join(f"{r:+.3f}" for r in fit["residuals"]))
    fitted = with_params(profile, params)
    micro, e2e = predictions(profile, ""), predictions(fitted, "llmnpu-e2e")
    rows = []

    def add(name, paper, key_fn, held_out=True):
        rows.append(
            {
                "row": name,
                "paper": paper,
                "micro": key_fn(micro),
                "e2e": key_fn(e2e),
                "held_out": held_out,
            }
        )

    for cfg, curve in PRUNING.items():
        for r, t in curve.items():
            add(
                f"{cfg} pruning {int(100 * r)}% (tok/s)",
                t,
                lambda d, cfg=cfg, r=r: d["pruning"][cfg][str(r)],
                cfg != "qwen1.5-1.8b",
            )
    add(
        "llama.cpp-CPU Qwen1.5-1.8B at 1024 (tok/s)",
        LLAMACPP_QWEN_TOK_S,
        lambda d: d["llamacpp_qwen_1024_tok_s"],
        False,
    )
    for n, (lo, hi) in VS_CPU.items():
        for cfg in MODELS:
            add(
                f"speedup over llama.cpp at {n}, {cfg} (paper range {lo}-{hi})",
                (lo, hi),
                lambda d, n=n, cfg=cfg: d["vs_cpu"][n][cfg],
            )
    add("Qwen1.5-1.8B NPU time at 256, in order (ms)", 315, lambda d: d["qwen_256_npu_busy_ms"])
    print(f"\n{'row':<62} {'paper':>13} {'micro-bench':>11} {'fitted':>8}")
    for r in rows:
        paper = (
            f"{r['paper'][0]}-{r['paper'][1]}"
            if isinstance(r["paper"], tuple)
            else f"{r['paper']:.0f}"
        )
        print(
            f"{r['row'] + ('' if r['held_out'] else ' *'):<62} {paper:>13} "
            f"{r['micro']:>11.1f} {r['e2e']:>8.1f}"
        )
    if args.write:
        fit_py = ROOT / "python" / "socllm" / "devices" / "fit.py"
        text = re.sub(
            r"LLMNPU_E2E = \{[^}]*\}",
            "LLMNPU_E2E = {" + ", ".join(f'"{k}": {v:.4f}' for k, v in params.items()) + "}",
            fit_py.read_text(),
        )
        atomic_write_text(fit_py, text)
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), "--write"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        print("wrote the parameters into the profiles (characterization llmnpu-e2e)")
    if args.json:
        atomic_write_text(
            Path(args.json),
            json.dumps(
                {
                    "params": params,
                    "residuals": fit["residuals"],
                    "cost": fit["cost"],
                    "evals": fit["evals"],
                    "rows": rows,
                    "micro": micro,
                    "e2e": e2e,
                },
                indent=1,
                default=str,
            )
            + "\n",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
