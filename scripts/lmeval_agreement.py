#!/usr/bin/env python3
"""Does socllm (plan fp32) choose the same answers as lm-eval's own `hf` backend?

Runs the 8 local lm-eval tasks (socllm.eval.lmeval; data from SOCLLM_DATA_DIR) with --limit N
documents each (for MMLU, N spread over its 57 subjects: ceil(N / 57) per subject) through

* lm-eval's `hf` backend (HFLM) on transformers' model for the same GGUF
  (socllm.reference `load_reference`: fp32, CPU), and
* socllm's lm-eval backend with plan fp32,

and compares, document by document, the chosen answer: the argmax of the per-choice
log-likelihoods (what `acc` scores) and, for LAMBADA, whether the word is the greedy
continuation (is_greedy, what its `acc` scores). Prints a table (task, n, agreement %, acc(hf),
acc(socllm), largest |log-likelihood difference|); --json writes it with the disagreeing
documents.

    python scripts/lmeval_agreement.py --limit 200 --json docs/results/lmeval_agreement.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import socllm  # noqa: E402
import socllm.eval.lmeval as sl  # noqa: E402

# after socllm: its OpenMP wait policy must reach libgomp before torch loads it (issue 37)
import torch  # noqa: E402
from socllm.io.files import check_output_path, emit_json  # noqa: E402
from socllm.reference import load_reference  # noqa: E402

TASKS = list(sl.TASKS)


def run_hf(model: str, tasks: dict[str, str], limit, batch_size: int, tm, quiet: bool) -> dict:
    from lm_eval.models.huggingface import HFLM

    tok, ref = load_reference(model)
    lm = HFLM(pretrained=ref, tokenizer=tok, batch_size=batch_size, device="cpu")
    return sl.simple_evaluate(
        lm,
        list(tasks.values()),
        limit,
        task_manager=tm,
        log_samples=True,
        bootstrap_iters=0,
        quiet=quiet,
    )


def compare(hf_rows: list[dict], sl_rows: list[dict]) -> dict:
    hf = {(r["task"], r["doc_id"]): r for r in hf_rows}
    so = {(r["task"], r["doc_id"]): r for r in sl_rows}
    if hf.keys() != so.keys():
        raise RuntimeError("the two backends evaluated different documents")
    keys = sorted(hf)
    same = [hf[k]["pred"] == so[k]["pred"] for k in keys]
    dll = max(
        (
            abs(a - b)
            for k in keys
            for a, b in zip(hf[k]["loglikelihoods"], so[k]["loglikelihoods"], strict=True)
        ),
        default=0.0,
    )
    n = len(keys)
    return {
        "n": n,
        "agreement": sum(same) / n if n else float("nan"),
        "acc_hf": sum(hf[k]["acc"] for k in keys) / n if n else float("nan"),
        "acc_socllm": sum(so[k]["acc"] for k in keys) / n if n else float("nan"),
        "max_abs_dll": dll,
        "disagreements": [
            {
                "task": k[0],
                "doc_id": k[1],
                "pred_hf": hf[k]["pred"],
                "pred_socllm": so[k]["pred"],
                "ll_hf": hf[k]["loglikelihoods"],
                "ll_socllm": so[k]["loglikelihoods"],
            }
            for k, s in zip(keys, same, strict=True)
            if not s
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: all 8)")
    ap.add_argument("--limit", type=int, default=200, help="documents per task (0 = all)")
    ap.add_argument("--hf-batch-size", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8, help="socllm batch size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.json:  # before the work, not after it
        check_output_path(args.json, what="--json")

    torch.set_num_threads(args.threads)
    socllm.set_num_threads(args.threads)
    if args.quiet:
        socllm.set_log_level("warn")
    names = sl.task_names(args.tasks)
    limit = args.limit or None
    tm = sl.task_manager()

    t0 = time.perf_counter()
    raw_hf = run_hf(args.model, names, limit, args.hf_batch_size, tm, args.quiet)
    t_hf = time.perf_counter() - t0
    t0 = time.perf_counter()
    r_sl = sl.evaluate(
        args.model,
        tasks=list(names),
        plan="fp32",
        limit=limit,
        batch_size=args.batch_size,
        quiet=args.quiet,
        log_samples=True,
        bootstrap_iters=0,
    )
    t_sl = time.perf_counter() - t0

    rows = []
    for short, lm_name in names.items():
        c = compare(sl.predictions(raw_hf, lm_name), r_sl["predictions"][short])
        rows.append({"task": short, **c})

    print(
        f"\nlm-eval {__import__('lm_eval').__version__}: hf backend (transformers "
        f"{__import__('transformers').__version__}, torch {torch.__version__}) vs socllm fp32; "
        f"limit {limit} documents per task (mmlu: spread over its 57 subjects)"
    )
    head = f"{'task':<16}{'n':>7}{'agree %':>10}{'acc(hf)':>10}{'acc(socllm)':>13}{'max|dLL|':>11}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['task']:<16}{r['n']:>7}{100 * r['agreement']:>10.1f}{r['acc_hf']:>10.4f}"
            f"{r['acc_socllm']:>13.4f}{r['max_abs_dll']:>11.2e}"
        )
    print(f"(hf {t_hf:.0f} s, socllm {t_sl:.0f} s)")
    if args.json:
        out = {
            "model": args.model,
            "limit": limit,
            "lm_eval": __import__("lm_eval").__version__,
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
            "threads": args.threads,
            "seconds": {"hf": round(t_hf, 1), "socllm": round(t_sl, 1)},
            "tasks": rows,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
