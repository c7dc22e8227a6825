"""The frontier search (issue 41): cheap fidelities first, more held-out windows only for the
plans that may still be on the frontier.

1. Every candidate plan is simulated (milliseconds): plans over a simulated budget
   (``max_ttft_ms``, ``max_energy_mj``, ``max_memory_mb``, ``min_decode_tokens_per_s``) are
   dropped before any window is scored.
2. Round r scores the survivors on the first ``schedule[r]`` held-out windows (windows already
   scored are reused: a plan's per-window ΔNLL is cached), then drops the plans that racing
   (:func:`~socllm.plan_frontier.pareto.racing_survivors`) or the ``max_dnll`` budget rules out at
   ``z`` standard errors.
3. The last round's survivors have all windows; the frontier is computed on them, and every
   dropped plan keeps the estimate it had when it was dropped.

The scorer is a callable given, per plan, the windows to score (a round's plans share their
new windows, so a scorer computes each window's fp32 reference once), so the same search runs
on the engine (frontier/evaluate.py), on Ray workers, or on synthetic plans in a test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..eval.stats import paired_difference
from .pareto import DEFAULT_OBJECTIVES, check_objectives, frontier_flags, racing_survivors

# {plan: window indices} -> {plan: {window index: {"dnll": (plan NLL - fp32 NLL) per token,
# and whatever else the scorer measures (kl, top1)}}}
WindowStats = Mapping[str, float]
WindowScorer = Callable[[Mapping[str, Sequence[int]]], Mapping[str, Mapping[int, WindowStats]]]
Simulator = Callable[[str], Mapping[str, float]]

SIMULATED_BUDGETS = {
    "max_ttft_ms": ("ttft_ms", True),
    "max_energy_mj": ("energy_mj", True),
    "max_memory_mb": ("memory_mb", True),
    "min_decode_tokens_per_s": ("decode_tokens_per_s", False),
}
BUDGETS = {"max_dnll": ("dnll", True), **SIMULATED_BUDGETS}  # name: (objective, upper bound)


def budget_excess(row: Mapping[str, float], name: str, limit: float) -> float:
    """How far ``row`` misses budget ``name`` at ``limit``, in the objective's unit (<= 0: met;
    NaN if the objective is not measured)."""
    key, upper = BUDGETS[name]
    return (row[key] - limit) if upper else (limit - row[key])


@dataclass
class PlanResult:
    plan: str
    simulated: dict[str, float]
    windows: dict[int, dict[str, float]] = field(default_factory=dict)  # window -> its stats
    dropped: str = ""  # why the search stopped scoring it ("" for the last round's plans)

    def mean(self, key: str) -> float:
        w = [s[key] for s in self.windows.values()]
        return sum(w) / len(w) if w else math.nan

    def se(self, key: str) -> float:
        """Standard error over windows of the mean of ``key`` (NaN below 2 windows); for
        ``dnll``, a per-window difference from fp32 on the same text, the paired SE."""
        if len(self.windows) < 2:
            return math.nan
        d = {str(k): s[key] for k, s in self.windows.items()}
        return paired_difference(dict.fromkeys(d, 0.0), d)[1]

    @property
    def dnll(self) -> float:
        return self.mean("dnll")

    @property
    def dnll_se(self) -> float:
        return self.se("dnll")

    def row(self) -> dict:
        return {"plan": self.plan, "dnll": self.dnll, "dnll_se": self.dnll_se, **self.simulated}


@dataclass
class SearchResult:
    results: list[PlanResult]
    frontier: list[bool]  # per result: on the frontier of the fully scored plans
    windows_scored: int  # plan x window evaluations spent
    exhaustive_windows: int  # what scoring every candidate on every window would cost
    rounds: list[dict]  # per round: windows, plans scored, plans left


def _within(sim: Mapping[str, float], budgets: Mapping[str, float]) -> str:
    """'' if ``sim`` meets every simulated budget, else the first one it misses."""
    for name, limit in budgets.items():
        if name in SIMULATED_BUDGETS and budget_excess(sim, name, limit) > 0:
            key, upper = SIMULATED_BUDGETS[name]
            side = "over" if upper else "under"
            return f"{key} {sim[key]:.4g} {side} --{name.replace('_', '-')} {limit:g}"
    return ""


def search(
    plans: Sequence[str],
    simulate: Simulator,
    score: WindowScorer,
    schedule: Sequence[int],
    *,
    z: float = 2.0,
    budgets: Mapping[str, float] | None = None,
    max_evals: int | None = None,
    objectives: Sequence[str] = DEFAULT_OBJECTIVES,
    progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """Race ``plans`` over the window counts of ``schedule`` (increasing, e.g. 2, 4, 8, 16)
    for the frontier of ``objectives`` (``dnll`` and simulated ones; the others can be
    budgets). ``max_evals`` caps plan x window evaluations: a round that would pass it scores
    fewer windows, and the search stops there (its plans' estimates carry their wider
    errors)."""
    objectives = check_objectives(objectives)
    timed = [k for k in objectives if k != "dnll"]
    budgets = dict(budgets or {})
    unknown = set(budgets) - set(BUDGETS)
    if unknown:
        raise ValueError(f"unknown budgets {sorted(unknown)}")
    if not plans:
        raise ValueError("the search space is empty: no plan to evaluate")
    if not schedule or any(b <= a for a, b in zip(schedule, schedule[1:], strict=False)):
        raise ValueError(f"the window schedule must increase, got {list(schedule)}")
    if schedule[0] < 2:
        raise ValueError(
            f"the first round needs at least 2 windows (a standard error), got {schedule[0]}"
        )
    if len(set(plans)) != len(plans):
        raise ValueError("the search space names a plan twice")
    results = [PlanResult(p, dict(simulate(p))) for p in plans]
    for r in results:
        r.dropped = _within(r.simulated, budgets)
    spent, rounds = 0, []
    for n in schedule:
        alive = [r for r in results if not r.dropped]
        if not alive:
            break
        need = {r.plan: [i for i in range(n) if i not in r.windows] for r in alive}
        cost = sum(len(v) for v in need.values())
        last = False
        if max_evals is not None and spent + cost > max_evals:
            # score as many windows as the cap allows, evenly, then stop
            per = (max_evals - spent) // len(alive)
            need = {k: v[:per] for k, v in need.items()}
            cost = sum(len(v) for v in need.values())
            last = True
        need = {p: w for p, w in need.items() if w}
        if need:
            got = score(need)
            for r in alive:
                for w in need.get(r.plan, ()):
                    r.windows[w] = dict(got[r.plan][w])
        spent += cost
        rows = [r.row() for r in alive]
        keep = racing_survivors(rows, z, timed)
        for r, k in zip(alive, keep, strict=True):
            if not k:
                r.dropped = f"dominated at {len(r.windows)} windows (z = {z:g})"
            elif "max_dnll" in budgets and r.dnll - z * r.dnll_se > budgets["max_dnll"]:
                r.dropped = (
                    f"ΔNLL over --max-dnll {budgets['max_dnll']:g} at {len(r.windows)} windows"
                )
        rounds.append(
            {"windows": n, "scored": len(alive), "evaluations": cost,
             "left": sum(not r.dropped for r in alive)}
        )  # fmt: skip
        if progress:
            progress(
                f"round {len(rounds)}: {n} windows, {rounds[-1]['left']} of {len(alive)} plans left"
            )
        if last:
            break
    for r in results:
        if not r.dropped and not r.windows:  # the cap came before its first window
            r.dropped = f"not scored within --max-evals {max_evals}"
    final = [r for r in results if not r.dropped]
    flags_final = frontier_flags([r.row() for r in final], objectives) if final else []
    on = {id(r): f for r, f in zip(final, flags_final, strict=True)}
    return SearchResult(
        results=results,
        frontier=[on.get(id(r), False) for r in results],
        windows_scored=spent,
        exhaustive_windows=len(plans) * schedule[-1],
        rounds=rounds,
    )
