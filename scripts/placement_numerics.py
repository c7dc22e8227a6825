#!/usr/bin/env python3
"""What the placement's number formats cost in accuracy: every preset that runs on the NPU
(llm.npu's placement: norms, SiLU and residual adds on the NPU in fp16, RoPE and attention on
the CPU in fp16) against the same plan with every float op class in fp32 on the CPU, on the same
WikiText-2 held-out tokens. The engine emulates an fp16 op by rounding its output to binary16
(plan.h), so the difference is the fp16 storage of the float ops alone.

    python scripts/placement_numerics.py [--limit-tokens 4096] [--calib-samples 16] [--json PATH]

Reported per plan: perplexity with fp16 floats and with fp32 floats, and the paired mean
per-token NLL difference (fp16 - fp32) with its standard error over 128-token blocks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
from socllm.calibration import run_steps  # noqa: E402
from socllm.eval.perplexity import eval_wikitext2  # noqa: E402
from socllm.eval.report import paired_nll_vs  # noqa: E402
from socllm.io.files import atomic_write_text  # noqa: E402

FLOAT_CLASSES = ("norm", "rope", "attention", "activation", "residual")


def fp32_floats(plan: socllm.Plan) -> socllm.Plan:
    for c in FLOAT_CLASSES:
        plan = plan.placed(c, "cpu", "fp32")
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-tokens", type=int, default=4096)
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    socllm.set_log_level("warn")
    m = socllm.load("smollm2-135m", progress=False)
    cal = run_steps(m, "act-scales,outliers", samples=args.calib_samples, progress=False)
    m.set_calibration(cal.stats)
    rows = []
    print(f"{'plan':<18} {'ppl fp16 floats':>16} {'ppl fp32 floats':>16} {'dNLL (fp16-fp32)':>22}")
    for name in socllm.Plan.known():
        plan = socllm.Plan(name)
        if plan.placement["linear"]["processor"] != "npu":
            continue
        t0 = time.perf_counter()
        res = {}
        for label, p in (("fp16", plan), ("fp32", fp32_floats(plan))):
            _, r = eval_wikitext2(
                m, p, context=2048, stride=None, limit_tokens=args.limit_tokens, heldout=True
            )
            res[label] = r
        d = paired_nll_vs(res["fp32"].token_nll, res["fp16"].token_nll)
        rows.append(
            {
                "plan": name,
                "ppl_fp16_floats": res["fp16"].perplexity,
                "ppl_fp32_floats": res["fp32"].perplexity,
                **d,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
        print(
            f"{name:<18} {res['fp16'].perplexity:>16.4f} {res['fp32'].perplexity:>16.4f} "
            f"{d['delta_nll']:>+12.5f} ± {d['delta_nll_se']:.5f}"
        )
    out = {"limit_tokens": args.limit_tokens, "calib_samples": args.calib_samples, "rows": rows}
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
