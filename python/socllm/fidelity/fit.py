"""Fit and cross-validation of the SoC model against the papers' numbers (issue 40).

Residuals are log ratios, log(predicted / paper), and for a range the paper states, the log
distance to its nearer end (0 inside). The free parameters are fitted in log space by bounded
Levenberg-Marquardt on Eigen (``socllm.sim.least_squares_bounded``, cpp/soc/fit.h), with a weak
prior pulling each toward its neutral start (weight ``PRIOR_WEIGHT`` per log unit), so a
parameter no training target sees stays at its start instead of drifting. No start comes from a
target (model.Parameter), so a held-out row cannot leak in through it.

Cost: a target's prediction is cached under the values of the parameters it depends on (found
by moving each parameter, at the start and again at each fitted vector), so a Jacobian column
re-runs only the targets of its parameter.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np

from ..errors import SocllmError
from ..sim import least_squares_bounded
from .model import PAPERS, PARAMETERS, Parameter, SocModel
from .targets import Target

PRIOR_WEIGHT = 0.05
WITHIN = 0.25  # the yardstick: a held-out number within 25% of the paper's
DIFF_STEP = 0.02  # forward-difference step in log units: simulated objectives are piecewise
# Stop when a step changes the cost by less than 1e-6 of itself or the parameters by 1e-5:
# tighter tolerances only chase the piecewise objective's steps.
FTOL, XTOL = 1e-6, 1e-5


def reference(t: Target, predicted: float) -> float:
    """The paper's number a prediction is compared with: the value, or a range's nearer end."""
    if t.lo is not None and t.hi is not None:
        return min(max(predicted, t.lo), t.hi)
    return t.value


def relative_error(t: Target, predicted: float) -> float:
    if predicted is None or not math.isfinite(predicted):
        return math.inf
    return predicted / reference(t, predicted) - 1.0


def log_residual(t: Target, predicted: float) -> float:
    if predicted is None or not math.isfinite(predicted) or predicted <= 0:
        return math.log(1e-6)  # a failed or non-positive prediction: far off, not a crash
    return math.log(predicted / reference(t, predicted))


@dataclass
class Evaluator:
    """Predictions of ``targets`` under parameter vectors, cached per target under the values
    of the parameters it depends on."""

    targets: list[Target]
    parameters: tuple[Parameter, ...] = PARAMETERS
    progress: bool = False
    deps: list[tuple[str, ...]] = field(default_factory=list)  # found when not given
    _cache: list[dict] = field(default_factory=list)
    runs: int = 0  # parameter vectors simulated

    def __post_init__(self) -> None:
        self._cache = [{} for _ in self.targets]
        self.initial = {p.name: p.initial for p in self.parameters}
        self.modelled = [i for i, t in enumerate(self.targets) if t.modelled]
        # a copy: add_dependencies grows it, and a caller's list may serve other evaluators
        self.deps = [tuple(d) for d in self.deps] or self._dependencies(self.initial)

    def _dependencies(self, at: dict, idx: list[int] | None = None) -> list[tuple[str, ...]]:
        """Which parameters move each target of ``idx`` (default: every modelled one) near the
        vector ``at``: predicted there and with one parameter moved by 40% (inside its
        bounds)."""
        idx = self.modelled if idx is None else idx
        base = self._run(at, idx)
        deps: list[list[str]] = [[] for _ in self.targets]
        for p in self._bar(self.parameters, "dependencies"):
            moved = at[p.name] * 1.4 if at[p.name] * 1.4 <= p.upper else at[p.name] / 1.4
            got = self._run({**at, p.name: moved}, idx)
            for i in idx:
                a, b = base[i], got[i]
                if not (math.isfinite(a) and math.isfinite(b)) or abs(b - a) > 1e-9 * max(
                    abs(a), 1e-12
                ):
                    deps[i].append(p.name)
        return [tuple(d) for d in deps]

    def add_dependencies(self, at: dict, idx: list[int] | None = None) -> bool:
        """Dependencies of the targets ``idx`` (default: every modelled one) found again at
        ``at`` joined to the known ones (a piecewise target, a pruned part or a processor that
        leaves the critical path, can depend on a parameter only away from the initial vector).
        True if any target gained one."""
        idx = self.modelled if idx is None else idx
        found = self._dependencies(at, idx)
        grew = False
        for i in idx:
            joined = tuple(p.name for p in self.parameters if p.name in self.deps[i] + found[i])
            if joined != self.deps[i]:
                self.deps[i], self._cache[i], grew = joined, {}, True
        return grew

    def _bar(self, it, desc: str):
        if not self.progress:
            return it
        from tqdm import tqdm

        return tqdm(it, desc=f"fidelity: {desc}", leave=False)

    def _run(self, values: dict, idx: list[int]) -> dict[int, float]:
        self.runs += 1
        m = SocModel(dict(values))
        out = {}
        for i in idx:
            try:
                out[i] = float(self.targets[i].predict(m))
            except (SocllmError, ZeroDivisionError):  # a vector the simulator refuses
                out[i] = math.nan
        return out

    def predict(self, values: dict, idx: list[int]) -> dict[int, float]:
        out, todo = {}, []
        keys = {}
        for i in idx:
            keys[i] = tuple(round(math.log(values[n]), 12) for n in self.deps[i])
            if keys[i] in self._cache[i]:
                out[i] = self._cache[i][keys[i]]
            else:
                todo.append(i)
        if todo:
            for i, v in self._run(values, todo).items():
                self._cache[i][keys[i]] = v
                out[i] = v
        return out

    def fit(
        self,
        train: list[int],
        max_evals: int = 400,
        rounds: int = 3,
        probe: list[int] | None = None,
    ) -> dict:
        """Parameters fitted to the targets ``train``: those no training target depends on stay
        at their initial values. After each fit the dependencies of ``probe`` (default: every
        modelled target; it must hold ``train``) are found again at the fitted vector; if a
        training target now moves with a parameter that was not free, the fit goes on from there
        with it free (at most ``rounds`` fits, ``max_evals`` each; a free set still growing
        after the last is reported as not converged). Returns {values, free, cost, evals,
        converged}."""
        values, evals = dict(self.initial), 0
        r = {"cost": 0.0, "converged": True}
        free: list[Parameter] = []

        def free_now() -> list[Parameter]:
            return [p for p in self.parameters if any(p.name in self.deps[i] for i in train)]

        for _ in range(rounds):
            if [p.name for p in free_now()] == [p.name for p in free]:
                break
            free = free_now()
            r = self._fit_free(train, free, values, max_evals)
            values, evals = r["values"], evals + r["evals"]
            if not self.add_dependencies(values, probe):
                break
        converged = r["converged"] and [p.name for p in free_now()] == [p.name for p in free]
        return {
            "values": values,
            "free": [p.name for p in free],
            "cost": r["cost"],
            "evals": evals,
            "converged": converged,
        }

    def _fit_free(self, train: list[int], free: list[Parameter], start: dict, max_evals: int):
        """One bounded LM fit of ``free`` from ``start``; the prior pulls to the initial values."""
        prior = [math.log(p.initial) for p in free]
        lo = [math.log(p.lower) for p in free]
        hi = [math.log(p.upper) for p in free]
        x0 = [min(max(math.log(start[p.name]), a), b) for p, a, b in zip(free, lo, hi, strict=True)]

        def values_of(x) -> dict:
            # clamped: the solver may land a rounding error outside a bound
            return {
                **start,
                **{
                    p.name: min(max(math.exp(v), p.lower), p.upper)
                    for p, v in zip(free, x, strict=True)
                },
            }

        def residuals(x) -> list[float]:
            pred = self.predict(values_of(x), train)
            r = [log_residual(self.targets[i], pred[i]) for i in train]
            return r + [PRIOR_WEIGHT * (a - b) for a, b in zip(x, prior, strict=True)]

        if not free:
            return {"values": dict(start), "cost": 0.0, "evals": 0, "converged": True}
        r = least_squares_bounded(
            residuals, x0, lo, hi, diff_step=DIFF_STEP, ftol=FTOL, xtol=XTOL, max_evals=max_evals
        )
        return {
            "values": values_of(r["x"]),
            "cost": r["cost"],
            "evals": r["evals"],
            "converged": r["converged"],
        }


def folds(targets: list[Target], idx: list[int], k: int, seed: int = 0) -> list[list[int]]:
    """``k`` folds of ``idx``, each paper's targets dealt round-robin after a seeded shuffle
    (every fold holds some of every paper)."""
    rng = random.Random(seed)
    out: list[list[int]] = [[] for _ in range(k)]
    j = 0
    for paper in PAPERS:
        mine = [i for i in idx if targets[i].paper == paper]
        rng.shuffle(mine)
        for i in mine:
            out[j % k].append(i)
            j += 1
    return [sorted(f) for f in out]


def summary(errors: list[float]) -> dict:
    """Counts within 25% and the median |error|; a failed (non-finite) prediction counts as
    infinitely far off, so it cannot flatter the median."""
    a = np.array([abs(e) if math.isfinite(e) else math.inf for e in errors])
    n = len(errors)
    return {
        "n": n,
        "within_25pct": int(np.sum(a <= WITHIN)),
        "share_within_25pct": float(np.sum(a <= WITHIN) / n) if n else math.nan,
        "median_abs_error": float(np.median(a)) if n else math.nan,
    }
