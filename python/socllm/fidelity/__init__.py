"""How well one SoC model explains the four papers (issue 40): every paper number socllm can
reproduce (:mod:`.targets`), one vector of free device parameters (:mod:`.model`), a fit on a
chosen subset and cross-validation (:mod:`.fit`). :func:`run` returns the report that
``socllm fidelity`` prints, writes as JSON and renders into RESULTS (:func:`markdown`).

Statuses: ``fitted`` (in the main fit), ``held-out`` (predicted by the main fit without being
in it), ``not-modelled`` (no prediction; the reason is given). Cross-validation predicts every
modelled target from a fit that did not see it: leave-one-paper-out (fit on three papers,
predict the fourth) and k-fold.
"""

from __future__ import annotations

import math
import time

from .fit import Evaluator, folds, relative_error, summary
from .model import PAPERS, PARAMETERS, SocModel
from .targets import Target, all_targets

# The main fit holds these out (the cross-paper checks and what the papers' own headline
# numbers do not pin down); cross-validation holds out everything in turn.
MAIN_HELD_OUT = (
    "002 §5.2.1: llm.npu",
    "002 §5.2.2: llm.npu",
    "gemma-2b prefill at pruning",
    "speedup over llama.cpp-CPU at 64",
    "Fig. 19: + out-of-order",
    "Fig. 10: kernel speedup over the lossy",
    "Fig. 11: end-to-end speedup over C/G-Full, max",
    "Table 8: kernel energy, qwen2",
    "InternLM-1.8B, 256",
    "at 525 tokens",
    "decode, llama-3.2-3b",
    "decode, internlm-1.8b",
    "GPU-only (PPL-OpenCL), llama-3.2-3b",
    "GPU-only (PPL-OpenCL), internlm-1.8b",
    "fast sync over without, other models",
    "game, Hetero-tensor",
    "energy, Hetero-tensor over Hetero-layer",
    "energy efficiency",
    "4-bit TTFT speedup",
    "long prompts",
    "pipeline ablation",
    "bubble rate",
    "stealing threshold",
    "cold-start energy",
)

# The cheap variant of the default test tier: the targets whose simulations take milliseconds.
QUICK = ("001 ", "002 §5.2.1: llm.npu", "002 §5.2.2: llm.npu", "004 Fig. 1", "7-bit TTFT")
QUICK_EXCLUDED = ("Fig. 19", "Fig. 15: energy")


def held_out(t: Target) -> bool:
    return any(s in t.id for s in MAIN_HELD_OUT)


def quick_targets() -> list[Target]:
    return [
        t
        for t in all_targets()
        if any(t.id.startswith(s) or s in t.id for s in QUICK)
        and not any(s in t.id for s in QUICK_EXCLUDED)
    ]


def _held_out_fit(job: tuple) -> tuple[dict[int, float], int]:
    """One cross-validation fit in a worker process: fit on ``train``, predict ``test``."""
    quick, deps, train, test, max_evals = job
    ev = Evaluator(quick_targets() if quick else all_targets(), deps=deps)
    f = ev.fit(train, max_evals, probe=train)  # the held-out rows are simulated afresh below
    return ev._run(f["values"], test), ev.runs


def run(
    quick: bool = False,
    k: int = 5,
    seed: int = 0,
    progress: bool = True,
    cross_validate: bool = True,
    max_evals: int = 400,
    workers: int = 2,
) -> dict:
    """The fidelity report: the main fit, each target's prediction and status, and the
    cross-validated errors. ``quick``: the cheap subset (the default test tier's variant).
    The cross-validation fits run in ``workers`` processes (they are independent)."""
    t0 = time.perf_counter()
    targets = quick_targets() if quick else all_targets()
    ev = Evaluator(targets, progress=progress)
    modelled = ev.modelled
    train = [i for i in modelled if not held_out(targets[i])]
    test = [i for i in modelled if held_out(targets[i])]
    initial = ev.predict(ev.initial, modelled)
    main = ev.fit(train, max_evals)
    fitted = ev._run(main["values"], modelled)  # afresh: no cached prediction can be stale
    cv: dict = {}
    lopo_pred: dict[int, float] = {}
    kfold_pred: dict[int, float] = {}
    if cross_validate:
        jobs = []  # (which, train, test)
        for paper in PAPERS:
            out = [i for i in modelled if targets[i].paper == paper]
            if out:
                jobs.append(("lopo", [i for i in modelled if i not in out], out))
        for fold in folds(targets, modelled, k, seed):
            jobs.append(("kfold", [i for i in modelled if i not in fold], fold))
        args = [(quick, ev.deps, tr, te, max_evals) for _, tr, te in jobs]
        if workers > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
                results = list(ev._bar(pool.map(_held_out_fit, args), "cross-validation"))
        else:
            results = [_held_out_fit(a) for a in ev._bar(args, "cross-validation")]
        for (which, _, _), (pred, runs) in zip(jobs, results, strict=True):
            (lopo_pred if which == "lopo" else kfold_pred).update(pred)
            ev.runs += runs

        def errs(pred, idx):
            return [relative_error(targets[i], pred[i]) for i in idx]

        cv = {
            "leave_one_paper_out": {
                **summary(errs(lopo_pred, modelled)),
                "per_paper": {
                    p: summary(errs(lopo_pred, [i for i in modelled if targets[i].paper == p]))
                    for p in PAPERS
                    if any(targets[i].paper == p for i in modelled)
                },
            },
            "k_fold": {"k": k, "seed": seed, **summary(errs(kfold_pred, modelled))},
        }
    rows = []
    for i, t in enumerate(targets):
        row = {
            "id": t.id,
            "paper": t.paper,
            "value": t.value,
            "range": [t.lo, t.hi] if t.lo is not None else None,
            "unit": t.unit,
            "conditions": t.conditions,
            "status": "not-modelled" if not t.modelled else ("held-out" if i in test else "fitted"),
            "depends_on": list(ev.deps[i]),
        }
        if t.modelled:
            row.update(
                predicted=fitted[i],
                error=relative_error(t, fitted[i]),
                predicted_unfitted=initial[i],
                error_unfitted=relative_error(t, initial[i]),
            )
            if i in lopo_pred:
                row.update(lopo_predicted=lopo_pred[i], lopo_error=relative_error(t, lopo_pred[i]))
            if i in kfold_pred:
                row.update(
                    kfold_predicted=kfold_pred[i], kfold_error=relative_error(t, kfold_pred[i])
                )
        else:
            row.update(predicted=None, why_not_modelled=t.why_not_modelled)
        rows.append(row)
    return {
        "n_parameters": len(main["free"]),
        "n_targets": len(targets),
        "n_modelled": len(modelled),
        "quick": quick,
        "parameters": [
            {
                "name": p.name,
                "initial": p.initial,
                "fitted": main["values"][p.name],
                "free": p.name in main["free"],
                "bounds": [p.lower, p.upper],
                "unit": p.unit,
                "devices": list(p.devices),
                "about": p.about,
            }
            for p in PARAMETERS
        ],
        "main_fit": {
            "trained_on": len(train),
            "held_out": summary([relative_error(targets[i], fitted[i]) for i in test]),
            "fitted": summary([relative_error(targets[i], fitted[i]) for i in train]),
            "unfitted_all": summary([relative_error(targets[i], initial[i]) for i in modelled]),
            "cost": main["cost"],
            "evals": main["evals"],
        },
        "cross_validation": cv,
        "targets": rows,
        "simulated_parameter_vectors": ev.runs,
        "seconds": time.perf_counter() - t0,
        "workers": workers if cross_validate else 1,
    }


def _pct(x) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{100 * x:+.0f}%"


def _num(x) -> str:
    if x is None:
        return "-"
    a = abs(x)
    return f"{x:.3g}" if a < 1000 else f"{x:.0f}"


def markdown(report: dict, command: str = "socllm fidelity") -> str:
    """The fidelity section of RESULTS, generated (a table per paper, the parameters, the
    cross-validated summary at the top)."""
    cv = report["cross_validation"]
    mf = report["main_fit"]
    lines = [
        f"Generated by `{command}` (do not edit by hand).",
        "",
        f"**{report['n_parameters']} free parameters for {report['n_modelled']} modelled paper "
        f"numbers** ({report['n_targets']} gathered; the rest not modelled, reasons below).",
        "",
    ]
    if cv:
        lo, kf = cv["leave_one_paper_out"], cv["k_fold"]
        lines += [
            "| held-out error | targets | within 25% | median abs. error |",
            "| --- | ---: | ---: | ---: |",
            f"| leave one paper out | {lo['n']} | {lo['within_25pct']} "
            f"({100 * lo['share_within_25pct']:.0f}%) | {100 * lo['median_abs_error']:.0f}% |",
            f"| {kf['k']}-fold (seed {kf['seed']}) | {kf['n']} | {kf['within_25pct']} "
            f"({100 * kf['share_within_25pct']:.0f}%) | {100 * kf['median_abs_error']:.0f}% |",
            f"| main fit's held-out rows | {mf['held_out']['n']} | {mf['held_out']['within_25pct']}"
            f" ({100 * mf['held_out']['share_within_25pct']:.0f}%) | "
            f"{100 * mf['held_out']['median_abs_error']:.0f}% |",
            f"| neutral start, nothing fitted (all rows) | {mf['unfitted_all']['n']} | "
            f"{mf['unfitted_all']['within_25pct']} "
            f"({100 * mf['unfitted_all']['share_within_25pct']:.0f}%) | "
            f"{100 * mf['unfitted_all']['median_abs_error']:.0f}% |",
            "",
            "Leave one paper out, per paper: "
            + "; ".join(
                f"{PAPERS[p]} {v['within_25pct']}/{v['n']} within 25%"
                for p, v in lo["per_paper"].items()
            )
            + ".",
            "",
        ]
    lines += [
        "Parameters (one vector for every paper; a device column names the profiles it changes):",
        "",
        "| parameter | start | fitted | unit | devices | what it is |",
        "| --- | ---: | ---: | --- | --- | --- |",
    ]
    for p in report["parameters"]:
        dev = ", ".join(d.removeprefix("snapdragon-") for d in p["devices"])
        fitted = _num(p["fitted"]) if p["free"] else "(not free)"
        lines.append(
            f"| `{p['name']}` | {_num(p['initial'])} | {fitted} | {p['unit']} | {dev} | "
            f"{p['about']} |"
        )
    for paper, title in PAPERS.items():
        rows = [r for r in report["targets"] if r["paper"] == paper]
        if not rows:
            continue
        lines += [
            "",
            f"#### {title}",
            "",
            "| target | paper | unfitted | fitted | error | status | leave-paper-out | k-fold |",
            "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
        ]
        for r in rows:
            paper_v = (
                f"{_num(r['range'][0])}-{_num(r['range'][1])}" if r["range"] else _num(r["value"])
            ) + f" {r['unit']}"
            if r["status"] == "not-modelled":
                lines.append(
                    f"| {r['id']} | {paper_v} | - | - | - | not modelled: "
                    f"{r['why_not_modelled']} | - | - |"
                )
                continue
            lines.append(
                f"| {r['id']} | {paper_v} | {_num(r['predicted_unfitted'])} | "
                f"{_num(r['predicted'])} | {_pct(r['error'])} | {r['status']} | "
                f"{_pct(r.get('lopo_error'))} | {_pct(r.get('kfold_error'))} |"
            )
    return "\n".join(lines) + "\n"


BEGIN = "<!-- socllm fidelity: begin (generated) -->"
END = "<!-- socllm fidelity: end -->"


def headline(report: dict) -> str:
    """One paragraph for the terminal."""
    mf = report["main_fit"]
    out = [
        f"{report['n_parameters']} free parameters, {report['n_modelled']} modelled targets "
        f"({report['n_targets']} gathered); main fit on {mf['trained_on']}: held-out "
        f"{mf['held_out']['within_25pct']}/{mf['held_out']['n']} within 25%"
    ]
    cv = report["cross_validation"]
    if cv:
        lo, kf = cv["leave_one_paper_out"], cv["k_fold"]
        out.append(
            f"leave one paper out: {lo['within_25pct']}/{lo['n']} within 25%; "
            f"{kf['k']}-fold: {kf['within_25pct']}/{kf['n']}"
        )
    out.append(
        f"{report['simulated_parameter_vectors']} parameter vectors simulated in "
        f"{report['seconds']:.0f} s"
    )
    return "\n".join(out)


def check_results_file(path) -> None:
    """The file exists and holds the markers once each, in order (before any work)."""
    from pathlib import Path

    from ..errors import InvalidArgumentError

    p = Path(path)
    if not p.is_file():
        raise InvalidArgumentError(f"--results {path}: no such file")
    text = p.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise InvalidArgumentError(
            f"--results {path}: needs the lines {BEGIN!r} and {END!r} once each, in this order"
        )


def write_results_block(path, block: str) -> None:
    """Replaces what lies between the markers of ``path`` with ``block`` (atomically)."""
    from pathlib import Path

    from ..io.files import atomic_write_text

    check_results_file(path)
    text = Path(path).read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    atomic_write_text(path, head + BEGIN + "\n" + block + END + tail)


def write_parameters(report: dict, path) -> None:
    """The fitted vector as data: each parameter's value with its unit, bounds and source."""
    import json

    from ..io.files import atomic_write_text

    src = (
        f"fitted by socllm fidelity to {report['main_fit']['trained_on']} paper numbers "
        f"(issue 40; held-out and cross-validated errors in docs/RESULTS.md)"
    )
    data = {
        "_about": "One vector of SoC-model parameters for every paper (socllm.fidelity.model)",
        "parameters": {
            p["name"]: {
                "value": p["fitted"],
                "unit": p["unit"],
                "bounds": p["bounds"],
                "devices": p["devices"],
                "about": p["about"],
                "source": src if p["free"] else "its neutral start (no target moves it)",
                "fitted": p["free"],
            }
            for p in report["parameters"]
        },
    }
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")


__all__ = ["run", "markdown", "all_targets", "quick_targets", "SocModel", "Target", "PARAMETERS"]
