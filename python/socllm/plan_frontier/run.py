"""``socllm frontier`` / :func:`socllm.plan_frontier`: search composed plans of one model on one
phone for the accuracy / time / energy / memory frontier, and say which plan to ship for a
budget (issue 41).

The report (:func:`frontier`) lists every plan of the space with its objectives, whether it is
on the frontier and, if the search stopped scoring it, why; what the search spent against an
exhaustive grid; and one recommended plan per goal (the most accurate, the fastest first token,
the least energy) among the frontier plans within every budget, each written as a plan file
that ``socllm eval``, ``simulate`` and ``run --cold`` take (``--plan @FILE``); and, for each of
the core's preset plans searched with the space, whether a frontier plan beats it
(:func:`~socllm.plan_frontier.presets.versus_presets`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import _core
from ..errors import InvalidArgumentError, SocllmError
from ..io.files import atomic_path, atomic_write_text
from ..plan_files import write_plan
from .evaluate import EngineEvaluator
from .pareto import DEFAULT_OBJECTIVES, DEFAULT_Z, check_objectives
from .presets import TTFT_SLACK, preset_verdicts, versus_presets
from .search import BUDGETS, budget_excess, search
from .space import DEFAULT_AXES, build_space

# The rounds' window counts: 2, 4, 8, ... up to the windows asked for.
FIRST_ROUND_WINDOWS = 2
# The goals a recommendation serves: (name, objective, minimize)
GOALS = (
    ("most-accurate", "dnll", True),
    ("fastest-ttft", "ttft_ms", True),
    ("least-energy", "energy_mj", True),
)


def window_schedule(windows: int) -> list[int]:
    """2, 4, 8, ... and ``windows`` last."""
    if windows < FIRST_ROUND_WINDOWS:
        raise InvalidArgumentError(
            f"frontier: windows must be >= {FIRST_ROUND_WINDOWS} (a standard error), got {windows}"
        )
    out, n = [], FIRST_ROUND_WINDOWS
    while n < windows:
        out.append(n)
        n *= 2
    return [*out, windows]


def _meets(row: Mapping, budgets: Mapping[str, float]) -> bool:
    return all(budget_excess(row, name, limit) <= 0 for name, limit in budgets.items())


def recommend(rows: Sequence[Mapping], budgets: Mapping[str, float]) -> dict[str, dict]:
    """Per goal, the frontier plan within every budget that serves it best: ``{goal: row}``;
    a goal no frontier plan within the budgets serves is absent."""
    feasible = [r for r in rows if r["frontier"] and _meets(r, budgets)]
    out = {}
    for goal, key, minimize in GOALS:
        if feasible:
            best = min(feasible, key=lambda r: (r[key] if minimize else -r[key], r["dnll"]))
            out[goal] = best
    return out


def nearest(rows: Sequence[Mapping], budgets: Mapping[str, float], n: int = 3) -> list[dict]:
    """The plans that miss the budgets by the least (the largest relative excess over a
    budget, smallest first; a ΔNLL budget on a plan never scored counts as missed by all):
    what to show when no plan meets them."""

    def excess(r) -> float:
        worst = 0.0
        for name, limit in budgets.items():
            over = budget_excess(r, name, limit)
            if not math.isfinite(over):
                return math.inf
            worst = max(worst, over / max(abs(limit), 1e-12))
        return worst

    return sorted(rows, key=excess)[:n]


def frontier(
    model,
    device="snapdragon-8gen3",
    *,
    prompt_len: int = 1024,
    decode_tokens: int = 16,
    axes: Mapping[str, Sequence[str]] | None = None,
    budgets: Mapping[str, float] | None = None,
    windows: int = 16,
    context: int = 512,
    max_evals: int | None = None,
    z: float = DEFAULT_Z,
    objectives: Sequence[str] = DEFAULT_OBJECTIVES,
    policy: str = "npu-stall-first",
    characterization: str = "",
    presets: Sequence[str] | None = None,
    plan_options: str = "",
    validate_tasks: Sequence[str] = (),
    validate_limit: int = 200,
    ray: bool = False,
    address: str | None = None,
    cache_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    progress: bool = False,
) -> dict:
    """The frontier of ``model`` (loaded, with the calibration its plans need) on ``device``
    (a profile name, path or dict) for a ``prompt_len``-token prompt and ``decode_tokens``
    decoded tokens; the frontier is over ``objectives`` (default ΔNLL and TTFT; the other
    objectives are budgets). ``presets``: the core's preset plans searched with the space
    (default all of ``Plan.known()``; ``()``: none). ``characterization``: one reading of the
    device's NPU for every plan (default: each plan's own, as ``socllm simulate``).
    ``plan_options``: options every plan gets (e.g. ``residual_scale=auto`` for Gemma 3).
    ``validate_tasks``: lm-eval tasks the frontier's members are scored on
    (``validate_limit`` documents each), their order compared with the ΔNLL's
    (plan_frontier/validate.py). ``ray``: the windows and timings run as Ray tasks (a local
    cluster, or the one at ``address``; plan_frontier/ray_evaluate.py). Returns the report
    (see the module doc); with ``out_dir`` also writes ``frontier.json``, ``.md``, ``.png``,
    ``.html``, ``plans/<goal>.json`` and the first recommended plan's timeline
    (``timeline.png``, Perfetto ``timeline.json``)."""
    budgets = {k: float(v) for k, v in (budgets or {}).items() if v is not None}
    for name in budgets:
        if name not in BUDGETS:
            raise InvalidArgumentError(
                f"frontier: unknown budget {name!r} (budgets: {', '.join(BUDGETS)})"
            )
    try:
        objectives = check_objectives(objectives)
    except ValueError as e:
        raise InvalidArgumentError(f"frontier: {e}") from None
    presets = _core.Plan.known() if presets is None else list(presets)
    space = build_space(axes or DEFAULT_AXES, presets, plan_options)
    settings = dict(
        prompt_len=prompt_len, decode_tokens=decode_tokens, context=context, max_windows=windows,
        policy=policy, characterization=characterization, cache_dir=cache_dir,
    )  # fmt: skip
    run = dict(
        budgets=budgets, windows=windows, z=z, max_evals=max_evals, objectives=objectives,
        validate_tasks=validate_tasks, validate_limit=validate_limit, out_dir=out_dir,
        progress=progress,
    )  # fmt: skip
    if ray:
        from .ray_evaluate import RayEvaluator

        with RayEvaluator(model, device, address=address, **settings) as evaluator:
            return _run(evaluator, model, space, **run)
    return _run(EngineEvaluator(model, device, **settings), model, space, **run)


def _run(
    evaluator, model, space, *, budgets, windows, z, max_evals, objectives, validate_tasks,
    validate_limit, out_dir, progress,
) -> dict:  # fmt: skip
    """:func:`frontier` on ``evaluator``."""
    from tqdm.auto import tqdm

    prompt_len, decode_tokens = evaluator.prompt_len, evaluator.decode_tokens
    context, policy = evaluator.context, evaluator.policy
    characterization = evaluator.characterization
    schedule = window_schedule(windows)

    def log(msg):
        if progress:
            tqdm.write(f"frontier: {msg}")

    # Every plan is timed first; one the device cannot run (e.g. HeteroLLM's partitions on a
    # profile without the NPU's static graph shapes) is left out with the engine's reason.
    evaluator.prefetch(space.plans)
    unrunnable, runnable = {}, []
    for plan in tqdm(space.plans, desc="frontier: simulate", disable=not progress):
        try:
            evaluator.simulate(plan)
            runnable.append(plan)
        except SocllmError as e:
            unrunnable[plan] = str(e)
            log(f"{plan} does not run on {evaluator.device}: {e}")
    if not runnable:
        raise InvalidArgumentError(
            f"frontier: no plan of the space runs on {evaluator.device} "
            f"({next(iter(unrunnable.items()))})"
        )
    result = search(
        runnable, evaluator.simulate, evaluator.score, schedule, z=z, budgets=budgets,
        max_evals=max_evals, objectives=objectives, progress=log,
    )  # fmt: skip
    rows = []
    named = {}
    for name, plan in space.presets.items():
        named.setdefault(plan, []).append(name)
    for r, on in zip(result.results, result.frontier, strict=True):
        rows.append(
            {
                "plan": r.plan,
                "parts": space.parts[r.plan],
                "presets": named.get(r.plan, []),
                "dnll": r.dnll,
                "dnll_se": r.dnll_se,
                "kl": r.mean("kl"),
                "kl_se": r.se("kl"),
                "top1": r.mean("top1"),
                "windows": len(r.windows),
                "window_dnll": {str(w): s["dnll"] for w, s in sorted(r.windows.items())},
                **r.simulated,
                "frontier": on,
                "dropped": r.dropped,
            }
        )
    rec = recommend(rows, budgets)
    report = {
        "model": str(getattr(model, "path", model)),
        "device": evaluator.device,
        "prompt_len": prompt_len,
        "decode_tokens": decode_tokens,
        "context": context,
        "windows": windows,
        "z": z,
        "policy": policy,
        "characterization": characterization or "each plan's own",
        "plan_options": space.plan_options,
        "objectives": list(objectives),
        "budgets": budgets,
        "space": {
            "axes": {k: list(v) for k, v in space.axes.items()},
            "products": space.size,
            "plans": len(space.plans),
            "refused": space.refused,
            "unrunnable": unrunnable,
        },
        "evaluations": {
            "windows_scored": result.windows_scored,
            "exhaustive_windows": result.exhaustive_windows,
            "rounds": result.rounds,
            "new_windows": evaluator.evaluations["windows"],
            "new_simulations": evaluator.evaluations["simulations"],
        },
        "plans": rows,
        "recommended": {g: r["plan"] for g, r in rec.items()},
        "presets": versus_presets(
            rows, {n: p for n, p in space.presets.items() if p not in unrunnable}, z
        ),
        "nearest": [] if rec else [r["plan"] for r in nearest(rows, budgets)],
    }
    if validate_tasks:
        from .validate import validate

        members = [r for r in rows if r["frontier"]]
        if len(members) < 3:  # a rank correlation needs 3: the other fully scored plans
            full = [r for r in rows if not r["dropped"] and not r["frontier"]]
            members += sorted(full, key=lambda r: r["dnll"])[: 3 - len(members)]
        # the reference: the space's fp32 plan (at its chunk length and plan options)
        reference = space.presets.get("fp32") or space.preset_text("fp32")
        report["validation"] = validate(
            evaluator, rows, [r["plan"] for r in members], tasks=validate_tasks,
            limit=validate_limit, reference=reference, progress=progress,
        )  # fmt: skip
    if out_dir is not None:
        first = next(iter(report["recommended"].values()), None)
        write_outputs(report, Path(out_dir), evaluator.timeline(first) if first else None)
    return report


def markdown(report: Mapping) -> str:
    """The Pareto table (frontier plans first) and what the search spent."""
    ev = report["evaluations"]
    lines = [
        f"Frontier of {Path(report['model']).name} on {report['device']}: "
        f"{report['prompt_len']}-token prompt, {report['decode_tokens']} decoded tokens; "
        f"accuracy on up to {report['windows']} held-out windows of {report['context']} tokens.",
        "",
        f"Space: {report['space']['plans']} plans ({report['space']['products']} products, "
        f"{len(report['space']['refused'])} not composable, "
        f"{len(report['space'].get('unrunnable', {}))} not runnable on the device). Scored "
        f"{ev['windows_scored']} plan-windows of an exhaustive {ev['exhaustive_windows']} "
        f"({100 * ev['windows_scored'] / max(ev['exhaustive_windows'], 1):.0f}%).",
        "",
        "| plan | frontier | ΔNLL ± SE (nats) | KL | top-1 | TTFT ms | decode tok/s | energy mJ "
        "| memory MB | CPU share | windows |",
        "| --- | :-: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    order = sorted(report["plans"], key=lambda r: (not r["frontier"], r["ttft_ms"]))
    for r in order:
        acc = f"{r['dnll']:+.4f} ± {r['dnll_se']:.4f}" if r["windows"] >= 2 else "-"
        kl = f"{r['kl']:.4f}" if r["windows"] else "-"
        top1 = f"{100 * r['top1']:.1f}%" if r["windows"] else "-"
        mark = "yes" if r["frontier"] else (r["dropped"] or "no")
        lines.append(
            f"| `{r['plan']}` | {mark} | {acc} | {kl} | {top1} | {r['ttft_ms']:.1f} | "
            f"{r['decode_tokens_per_s']:.2f} | {r['energy_mj']:.0f} | {r['memory_mb']:.0f} | "
            f"{100 * r['cpu_share']:.0f}% | {r['windows']} |"
        )
    lines.append("")
    if report["presets"]:
        beaten = [v for v in report["presets"] if v["beaten"]]
        lines += [
            f"Presets against the frontier: {len(beaten)} of {len(report['presets'])} beaten "
            "on a budget set at their own value (paired ΔNLL over the windows both scored: more "
            f"accurate by over {report['z']:g} SE, or as accurate within {report['z']:g} SE; "
            f"equal TTFT: within {100 * TTFT_SLACK:g}%).",
            "",
            "| preset | ΔNLL ± SE | TTFT ms | more accurate at its TTFT | faster at its accuracy |",
            "| --- | ---: | ---: | --- | --- |",
        ]
        for v in report["presets"]:
            acc = f"{v['dnll']:+.4f} ± {v['dnll_se']:.4f}" if math.isfinite(v["dnll_se"]) else "-"
            cells = [f"`{p}`: {t}" if p else t for p, t in preset_verdicts(v)]
            lines.append(f"| {v['preset']} | {acc} | {v['ttft_ms']:.1f} | {' | '.join(cells)} |")
        lines.append("")
    for plan, why in report["space"].get("unrunnable", {}).items():
        lines.append(f"- Not runnable on {report['device']}: `{plan}`: {why}")
    if report["space"].get("unrunnable"):
        lines.append("")
    if report.get("validation"):
        lines += validation_markdown(report["validation"])
    if report["recommended"]:
        lines.append("Recommended (frontier plans within the budgets):")
        for goal, plan in report["recommended"].items():
            lines.append(f"- {goal}: `{plan}` (plans/{goal}.json)")
    else:
        lines.append(
            f"No plan meets the budgets {report['budgets']}; nearest: "
            + ", ".join(f"`{p}`" for p in report["nearest"])
        )
    return "\n".join(lines) + "\n"


def validation_markdown(v: Mapping) -> list[str]:
    """The lm-eval check of the frontier's order (plan_frontier/validate.py) as Markdown lines."""
    lo, hi = v["interval"]
    tasks = v["tasks"]
    lines = [
        f"Validation on lm-eval tasks ({', '.join(tasks)}; up to {v['limit']} documents each, "
        f"{v['documents']} in all): Spearman's rho between ΔNLL and task accuracy loss "
        f"{v['spearman']:+.2f}, {100 * v['level']:.0f}% interval [{lo:+.2f}, {hi:+.2f}] "
        f"(bootstrap over {v['windows']} windows and the documents).",
        "",
        "| plan | ΔNLL | task accuracy change (points) | " + " | ".join(tasks) + " |",
        "| --- | ---: | ---: |" + " ---: |" * len(tasks),
    ]
    for plan, dnll in zip(v["plans"], v["dnll"], strict=True):
        per = v["per_plan"][plan]
        cells = [f"{100 * per[t]['acc']:.1f}%" for t in tasks]
        lines.append(
            f"| `{plan}` | {dnll:+.4f} | {100 * per['all']['diff']:+.1f} ± "
            f"{100 * per['all']['diff_se']:.1f} | " + " | ".join(cells) + " |"
        )
    lines.append("")
    for d in v["disagreements"]:
        lines.append(
            f"- Disagreement: `{d['wikitext_better']}` has the lower ΔNLL ({d['dnll'][0]:+.4f} "
            f"vs {d['dnll'][1]:+.4f}) but loses more task accuracy than `{d['tasks_better']}` "
            f"by {100 * d['task_loss_diff']:.1f} ± {100 * d['task_loss_diff_se']:.1f} points"
            f" ({'beyond' if d['beyond_noise'] else 'within'} the noise)."
        )
    if not v["disagreements"]:
        lines.append("- The two orders agree on every pair.")
    return [*lines, ""]


def plot(report: Mapping, dest: Path) -> None:
    """ΔNLL against TTFT, energy as colour, the frontier drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["plans"] if r["windows"]]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    if rows:
        sc = ax.scatter(
            [r["ttft_ms"] for r in rows], [r["dnll"] for r in rows],
            c=[r["energy_mj"] for r in rows], cmap="viridis", s=28, zorder=3,
        )  # fmt: skip
        fig.colorbar(sc, ax=ax, label="energy per request (mJ)")
        ax.errorbar(
            [r["ttft_ms"] for r in rows], [r["dnll"] for r in rows],
            yerr=[0 if math.isnan(r["dnll_se"]) else r["dnll_se"] for r in rows],
            fmt="none", ecolor="0.6", lw=0.8, zorder=2,
        )  # fmt: skip
        front = sorted((r for r in rows if r["frontier"]), key=lambda r: r["ttft_ms"])
        ax.step(
            [r["ttft_ms"] for r in front], [r["dnll"] for r in front], where="post",
            color="C3", lw=1.5, label="frontier", zorder=4,
        )  # fmt: skip
        at: dict[tuple[float, float], list[str]] = {}  # plans at one point share a label
        for r in front:
            at.setdefault((r["ttft_ms"], r["dnll"]), []).append(r["plan"])
        for (x, y), names in at.items():
            ax.annotate("\n".join(names), (x, y), fontsize=6, xytext=(4, 2),
                        textcoords="offset points")  # fmt: skip
        ttft = [r["ttft_ms"] for r in rows]
        if max(ttft) > 20 * min(ttft):  # decades apart: a log axis keeps the fast end readable
            ax.set_xscale("log")
        ax.legend(loc="upper right")
    ax.set_xlabel(f"TTFT (ms), {report['prompt_len']}-token prompt, {report['device']}")
    ax.set_ylabel("ΔNLL from fp32 (nats/token)")
    ax.set_title(f"{Path(report['model']).name}: accuracy against time to first token")
    fig.tight_layout()
    with atomic_path(dest) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def to_json(report: Mapping) -> str:
    """The report as strict JSON: a value not measured (NaN: a plan dropped before it was
    scored) is null."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, Mapping):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(report), indent=1, allow_nan=False) + "\n"


def write_outputs(report: Mapping, out: Path, timeline=None) -> None:
    """frontier.json, .md, .png, .html, plans/<goal>.json and, given the first recommended
    plan's ``timeline``, timeline.png and its Perfetto trace timeline.json."""
    from .html import render

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "frontier.json", to_json(report))
    atomic_write_text(out / "frontier.md", markdown(report))
    plot(report, out / "frontier.png")
    png = None
    if timeline is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(12, 2.8), dpi=100)
        timeline.plot(ax)
        fig.tight_layout()
        png = out / "timeline.png"
        with atomic_path(png) as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
        timeline.to_perfetto(out / "timeline.json")
    atomic_write_text(out / "frontier.html", render(report, out, png))
    rows = {r["plan"]: r for r in report["plans"]}
    for goal, plan in report["recommended"].items():
        r = rows[plan]
        write_plan(
            out / "plans" / f"{goal}.json",
            plan,
            about=(
                f"socllm frontier: {goal} among the frontier plans of {Path(report['model']).name} "
                f"on {report['device']} within {report['budgets'] or 'no budget'}: ΔNLL "
                f"{r['dnll']:+.4f} ± {r['dnll_se']:.4f}, TTFT {r['ttft_ms']:.1f} ms, "
                f"{r['energy_mj']:.0f} mJ"
            ),
        )
