"""Pareto frontier of execution plans, and the racing rule that lets the frontier search spend
held-out windows only on plans that may still be on it (issue 41).

Objectives (:data:`OBJECTIVES`): the accuracy cost ``dnll`` (mean paired ΔNLL from fp32,
nats/token, with its standard error ``dnll_se``) and the simulator's ``ttft_ms``,
``decode_tokens_per_s``, ``energy_mj`` and ``memory_mb``. Simulated objectives are exact for a
plan (one task graph, one cost model); the accuracy is an estimate from sampled windows, so the
search compares plans through an interval ``dnll ± z·dnll_se``:

* a plan is **dominated** by another that is no worse in every objective and better in one
  (point estimates; :func:`frontier_flags`);
* during the search a plan is **eliminated** only when another is no worse in every simulated
  objective and its pessimistic ΔNLL (``dnll + z·se``) is below this plan's optimistic one
  (``dnll - z·se``) (:func:`racing_survivors`), a multi-objective form of racing (Maron and
  Moore's Hoeffding races; successive halving keeps a fixed share instead, which could drop a
  frontier member on noise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Objective:
    key: str
    unit: str
    minimize: bool
    about: str


OBJECTIVES: tuple[Objective, ...] = (
    Objective("dnll", "nats/token", True, "mean paired ΔNLL from fp32 on held-out windows"),
    Objective("ttft_ms", "ms", True, "time to the first token (the prompt's prefill)"),
    Objective("decode_tokens_per_s", "tokens/s", False, "decoding speed after the prompt"),
    Objective("energy_mj", "mJ", True, "energy of the prompt and the decoded tokens"),
    Objective("memory_mb", "MB", True, "peak memory (resident weights, caches, working set)"),
)
SIMULATED = tuple(o.key for o in OBJECTIVES if o.key != "dnll")
# A plan is dropped when another is surely better: its ΔNLL interval at this many SEs lies
# wholly below this plan's (racing_survivors); the presets' verdicts use the same bar.
DEFAULT_Z = 2.0
# The frontier's default objectives: accuracy against the time to the first token (the
# question of issue 41); the others are budgets unless asked for.
DEFAULT_OBJECTIVES = ("dnll", "ttft_ms")


def check_objectives(keys: Sequence[str]) -> tuple[str, ...]:
    """``keys`` checked: known objectives, ``dnll`` among them, none twice."""
    known = [o.key for o in OBJECTIVES]
    keys = tuple(keys)
    for k in keys:
        if k not in known:
            raise ValueError(f"unknown objective {k!r} (objectives: {', '.join(known)})")
    if "dnll" not in keys:
        raise ValueError(f"the objectives must include dnll (accuracy), got {list(keys)}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"an objective is named twice in {list(keys)}")
    return keys


def _cost(row: Mapping[str, float], key: str) -> float:
    """``row[key]`` as a cost (smaller is better)."""
    obj = next(o for o in OBJECTIVES if o.key == key)
    v = float(row[key])
    return v if obj.minimize else -v


def dominates(a: Mapping[str, float], b: Mapping[str, float], keys: Sequence[str]) -> bool:
    """``a`` is no worse than ``b`` in every objective of ``keys`` and better in one."""
    ca = [_cost(a, k) for k in keys]
    cb = [_cost(b, k) for k in keys]
    return all(x <= y for x, y in zip(ca, cb, strict=True)) and any(
        x < y for x, y in zip(ca, cb, strict=True)
    )


def frontier_flags(rows: Sequence[Mapping[str, float]], keys: Sequence[str]) -> list[bool]:
    """For each row, whether no other row dominates it (ties: equal rows are all kept)."""
    for r in rows:
        for k in keys:
            if not math.isfinite(float(r[k])):
                raise ValueError(
                    f"objective {k} of a plan is {r[k]}: every objective must be finite"
                )
    return [not any(dominates(o, r, keys) for o in rows if o is not r) for r in rows]


def racing_survivors(
    rows: Sequence[Mapping[str, float]], z: float, keys: Sequence[str] = SIMULATED
) -> list[bool]:
    """For each row (with ``dnll``, ``dnll_se`` and the simulated ``keys``), whether it may still
    be on the frontier: no other row is no worse in every one of ``keys`` while its ΔNLL
    interval lies wholly below this row's (``o.dnll + z·o.se < r.dnll - z·r.se``). A row with
    no windows scored yet (``dnll_se`` NaN) always survives."""
    if not z >= 0:
        raise ValueError(f"z must be >= 0, got {z}")

    def worse_or_equal(o, r) -> bool:  # o no worse than r in every simulated objective
        return all(_cost(o, k) <= _cost(r, k) for k in keys)

    def surely_better(o, r) -> bool:
        if math.isnan(o["dnll_se"]) or math.isnan(r["dnll_se"]):
            return False
        return o["dnll"] + z * o["dnll_se"] < r["dnll"] - z * r["dnll_se"]

    return [
        not any(worse_or_equal(o, r) and surely_better(o, r) for o in rows if o is not r)
        for r in rows
    ]
