"""The frontier's Pareto rules and its racing search (socllm.plan_frontier), on hand-computed cases
and on synthetic plans whose exhaustive frontier is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import socllm
from socllm.plan_frontier.pareto import dominates, frontier_flags, racing_survivors
from socllm.plan_frontier.presets import versus_presets
from socllm.plan_frontier.search import search

KEYS = ("dnll", "ttft_ms", "decode_tokens_per_s")


def _row(dnll, ttft, tps=10.0, se=0.01, energy=1.0, mem=1.0):
    return {
        "dnll": dnll, "dnll_se": se, "ttft_ms": ttft, "decode_tokens_per_s": tps,
        "energy_mj": energy, "memory_mb": mem,
    }  # fmt: skip


def test_dominance_by_hand():
    a, b = _row(0.1, 100), _row(0.2, 100)
    assert dominates(a, b, KEYS) and not dominates(b, a, KEYS)
    assert not dominates(a, a, KEYS)  # equal: neither dominates
    # more tokens/s is better: a faster decoder at equal accuracy and TTFT dominates
    assert dominates(_row(0.1, 100, tps=20), _row(0.1, 100, tps=10), KEYS)
    # a trade-off: neither dominates
    assert not dominates(_row(0.1, 200), _row(0.2, 100), KEYS)
    assert not dominates(_row(0.2, 100), _row(0.1, 200), KEYS)


def test_frontier_flags_by_hand():
    # (dnll, ttft): fp32-like (0, 300), two trade-offs, one dominated by (0.05, 150), a tie pair
    rows = [_row(0, 300), _row(0.05, 150), _row(0.08, 160), _row(0.3, 100), _row(0.3, 100)]
    assert frontier_flags(rows, ("dnll", "ttft_ms")) == [True, True, False, True, True]
    with pytest.raises(ValueError, match="must be finite"):
        frontier_flags([_row(math.nan, 1)], ("dnll",))


def test_racing_drops_only_what_is_surely_dominated():
    # b is as fast as a and its interval 0.10 ± 2 x 0.01 lies wholly above a's 0.02 ± 0.02
    a, b = _row(0.02, 100), _row(0.10, 100)
    assert racing_survivors([a, b], z=2) == [True, False]
    # within noise: 0.05 - 0.02 < 0.02 + 0.02, both stay
    assert racing_survivors([a, _row(0.05, 100)], z=2) == [True, True]
    # b is faster: a trade-off, never dropped however sure the accuracy
    assert racing_survivors([a, _row(0.10, 90)], z=2) == [True, True]
    # no standard error yet (one window): kept
    assert racing_survivors([a, _row(0.10, 100, se=math.nan)], z=2) == [True, True]
    with pytest.raises(ValueError, match="z must be >= 0"):
        racing_survivors([a], z=-1)


def _synthetic(n_plans=24, seed=0):
    """Plans with a true ΔNLL, window noise and a TTFT: faster plans lose more accuracy, with
    scatter as wide as the trade-off (like the preset plans: block-sparse attention loses a nat
    at the speed of sparse attention), so most plans are clearly dominated."""
    rng = np.random.default_rng(seed)
    ttft = rng.uniform(50, 400, n_plans)
    true = 0.5 * (400 - ttft) / 350 + rng.uniform(0, 0.6, n_plans)
    plans = [f"p{i}" for i in range(n_plans)]
    noise = {p: np.random.default_rng([seed, i]).normal(0, 0.05, 64) for i, p in enumerate(plans)}
    sim = {p: {"ttft_ms": ttft[i], "decode_tokens_per_s": 10.0, "energy_mj": 1.0,
               "memory_mb": 1.0} for i, p in enumerate(plans)}  # fmt: skip
    truth = {p: true[i] for i, p in enumerate(plans)}
    calls = []

    def score(need):
        calls.append({p: tuple(w) for p, w in need.items()})
        return {p: {w: {"dnll": truth[p] + noise[p][w]} for w in ws} for p, ws in need.items()}

    return plans, sim, score, calls


@pytest.mark.parametrize("seed", range(5))
def test_the_search_finds_the_exhaustive_frontier_with_fewer_evaluations(seed):
    plans, sim, score, calls = _synthetic(seed=seed)
    res = search(plans, lambda p: sim[p], score, schedule=(4, 8, 16, 32), z=2.0)
    # exhaustive: every plan on all 32 windows, the frontier of the point estimates
    n_calls = len(calls)
    every = score({p: range(32) for p in plans})
    exhaustive = [
        {"dnll": np.mean([s["dnll"] for s in every[p].values()]), **sim[p]} for p in plans
    ]
    want = frontier_flags(exhaustive, ("dnll", "ttft_ms"))
    assert res.frontier == want and sum(want) >= 3
    assert res.exhaustive_windows == 24 * 32
    assert res.windows_scored < 0.65 * res.exhaustive_windows  # 36-58% on seeds 0-19
    # no window of a plan was scored twice
    seen = [(p, w) for need in calls[:n_calls] for p, ws in need.items() for w in ws]
    assert len(seen) == len(set(seen)) == res.windows_scored
    # a frontier member has every window; a dropped plan says why
    for r, on in zip(res.results, res.frontier, strict=True):
        if on:
            assert len(r.windows) == 32 and not r.dropped
        if r.dropped:
            assert "dominated" in r.dropped and not on
    assert res.frontier == search(  # every constant objective added changes nothing
        plans, lambda p: sim[p], score, (4, 8, 16, 32),
        objectives=("dnll", "ttft_ms", "energy_mj", "decode_tokens_per_s"),
    ).frontier  # fmt: skip
    assert res.frontier == search(  # every constant objective added changes nothing
        plans,
        lambda p: sim[p],
        score,
        (4, 8, 16, 32),
        objectives=("dnll", "ttft_ms", "energy_mj", "decode_tokens_per_s"),
    ).frontier  # fmt: skip


def test_budgets_and_the_evaluation_cap():
    plans, sim, score, calls = _synthetic()
    res = search(plans, lambda p: sim[p], score, (4, 8, 16), budgets={"max_ttft_ms": 200})
    over = [r for r in res.results if r.simulated["ttft_ms"] > 200]
    assert over and all("over --max-ttft-ms 200" in r.dropped for r in over)
    assert not any(r.windows for r in over)  # never scored
    assert not any(on for r, on in zip(res.results, res.frontier, strict=True) if r in over)
    capped = search(plans, lambda p: sim[p], score, (4, 8, 16), max_evals=120)
    assert capped.windows_scored <= 120
    assert capped.rounds[0]["evaluations"] == 96  # 24 plans x 4 windows, then the cap
    # a cap below one window per plan: the plans left unscored say so, none is on the frontier
    tiny = search(plans, lambda p: sim[p], score, (4, 8), max_evals=10)
    assert tiny.windows_scored == 0 and not any(tiny.frontier)
    assert all("not scored within --max-evals 10" in r.dropped for r in tiny.results)
    slow = search(plans, lambda p: sim[p], score, (4,), budgets={"min_decode_tokens_per_s": 11})
    assert all("decode_tokens_per_s 10 under --min-decode-tokens-per-s 11" in r.dropped
               for r in slow.results)  # fmt: skip
    strict = search(plans, lambda p: sim[p], score, (4, 8), budgets={"max_dnll": 0.3})
    kept = [r for r in strict.results if not r.dropped]
    assert kept and all(r.dnll - 2 * r.dnll_se <= 0.3 for r in kept)
    assert any("over --max-dnll 0.3" in r.dropped for r in strict.results)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"plans": []}, "search space is empty"),
        ({"schedule": (8, 4)}, "must increase"),
        ({"schedule": (1, 4)}, "at least 2 windows"),
        ({"budgets": {"max_speed": 1}}, "unknown budgets"),
        ({"plans": ["p0", "p0"]}, "names a plan twice"),
        ({"objectives": ("ttft_ms",)}, "must include dnll"),
        ({"objectives": ("dnll", "speed")}, "unknown objective"),
    ],
)
def test_bad_search_input_is_refused(kw, words):
    plans, sim, score, _ = _synthetic(4)
    args = {"plans": plans, "schedule": (2, 4), **kw}
    with pytest.raises(ValueError, match=words):
        search(
            args["plans"], lambda p: sim[p], score, args["schedule"], budgets=kw.get("budgets"),
            objectives=kw.get("objectives", ("dnll", "ttft_ms")),
        )  # fmt: skip


def test_presets_against_the_frontier_by_hand():
    """A preset off the frontier is beaten at its TTFT by the most accurate faster frontier
    plan (gain paired over windows) and at its accuracy by the fastest as-accurate one; fp32
    and the fastest plan, on the frontier, are beaten by nothing."""

    def row(plan, ttft, w, on):
        return {"plan": plan, "ttft_ms": ttft, "window_dnll": dict(enumerate(w)), "frontier": on,
                "dnll": sum(w) / len(w), "dnll_se": math.nan}  # fmt: skip

    rows = [
        row("fast", 100, [0.5, 0.7], True),
        row("mid", 300, [0.1, 0.1], True),
        row("fp32", 1000, [0.0, 0.0], True),
        row("preset", 350, [0.3, 0.5], False),
    ]
    got = versus_presets(rows, {"p": "preset", "fp32": "fp32", "f": "fast"})
    p, fp32, fast = got
    assert p["at_ttft"]["plan"] == "mid"
    assert p["at_ttft"]["gain"] == pytest.approx(0.3)  # mean of 0.2 and 0.4
    assert p["at_ttft"]["gain_se"] == pytest.approx(0.1)  # sd 0.1414 / sqrt(2)
    assert p["at_dnll"]["plan"] == "mid" and p["at_dnll"]["speedup"] == pytest.approx(350 / 300)
    assert p["at_dnll"]["dnll_diff"] == pytest.approx(-0.3) and p["beaten"]
    for v in (fp32, fast):
        assert v["at_ttft"] is None and v["at_dnll"] is None and not v["beaten"]
    # more accurate only within the noise is not more accurate (z = 2: 0.3 < 2 x 0.1 ... 3.5)
    (v,) = versus_presets(rows, {"p": "preset"}, z=3.5)
    assert v["at_ttft"] is None and v["at_dnll"]["plan"] == "mid"
    # at equal TTFT within the slack: a plan 0.5% slower and more accurate beats "fast"
    rows.append(row("fast-but-8-bit", 100.5, [0.1, 0.2], True))
    rows[0]["frontier"] = True
    (v,) = versus_presets(rows, {"f": "fast"})
    assert v["at_ttft"]["plan"] == "fast-but-8-bit" and v["at_ttft"]["gain"] == pytest.approx(0.45)
    (v,) = versus_presets(rows, {"f": "fast"}, ttft_slack=0.0)
    assert v["at_ttft"] is None and not v["beaten"]


def test_rank_agreement_against_scipy_and_by_hand():
    """rho is scipy's Spearman on the plans' means; a pair the orders swap is listed with its
    paired task difference; its interval holds rho."""
    from scipy.stats import spearmanr
    from socllm.plan_frontier.validate import rank_agreement

    rng = np.random.default_rng(3)
    windows = [str(w) for w in range(8)]
    docs = [f"d{k}" for k in range(400)]
    true_dnll = {"fp32": 0.0, "a": 0.05, "b": 0.2, "c": 0.6}
    true_loss = {"fp32": 0.0, "a": 0.08, "b": 0.02, "c": 0.3}  # a and b swap on the tasks
    dnll = {p: {w: m + 0.01 * rng.standard_normal() for w in windows} for p, m in true_dnll.items()}
    ref_acc = {d: float(rng.random() < 0.6) for d in docs}
    acc = {
        p: {d: float(ref_acc[d] and rng.random() >= loss / 0.6) for d in docs}
        for p, loss in true_loss.items()
    }
    acc["fp32"] = ref_acc
    got = rank_agreement(dnll, acc, "fp32", resamples=500)
    means_d = [np.mean(list(dnll[p].values())) for p in got["plans"]]
    means_l = [np.mean([ref_acc[d] - acc[p][d] for d in docs]) for p in got["plans"]]
    assert got["spearman"] == pytest.approx(spearmanr(means_d, means_l).statistic)
    assert got["spearman"] == pytest.approx(0.8)  # one adjacent swap of 4: 1 - 6*2/60
    lo, hi = got["interval"]
    assert lo <= got["spearman"] <= hi
    (d,) = got["disagreements"]
    assert (d["wikitext_better"], d["tasks_better"]) == ("a", "b")
    diff = np.mean([acc["b"][k] - acc["a"][k] for k in docs])
    assert d["task_loss_diff"] == pytest.approx(diff) and d["beyond_noise"]
    with pytest.raises(socllm.InvalidArgumentError, match="3 plans or more"):
        rank_agreement({"fp32": dnll["fp32"], "a": dnll["a"]}, acc, "fp32")


def test_plan_options_reach_every_plan_and_preset():
    """--plan-options (e.g. Gemma 3's residual_scale=auto) is an option of every product and
    of every preset, as the core reads it back."""
    from socllm.plan_frontier.space import build_space

    axes = {"linear": ("fp32", "w8a8"), "attention": ("fp32",), "chunk_len": ("256",)}
    space = build_space(axes, ("w8a8", "hetero-layer"), "residual_scale=auto")
    assert len(space.plans) == 3
    assert space.presets["w8a8"] == "w8a8:residual_scale=auto,chunk_len=256"
    for p in space.plans:
        assert socllm.Plan(p).to_json()["residual_scale"] == "auto", p
