"""The core's preset plans against a frontier (issue 41's "done when"): for each preset, the
frontier plan that beats it on a budget set at the preset's own value, if any."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..eval.stats import paired_difference
from .pareto import DEFAULT_Z


def _paired(a: Mapping, b: Mapping) -> tuple[float, float]:
    """Mean and SE of ΔNLL(b) - ΔNLL(a) over the windows both rows scored."""
    return paired_difference(a["window_dnll"], b["window_dnll"])


# "At equal TTFT": within this share of the preset's TTFT. The simulated TTFT is a model whose
# held-out fidelity is ±25% at best (issue 40), so a 1% difference is no difference it can
# resolve; the report gives each TTFT, so a reader can apply a stricter rule.
TTFT_SLACK = 0.01


def versus_presets(
    rows: Sequence[Mapping],
    presets: Mapping[str, str],
    z: float = DEFAULT_Z,
    ttft_slack: float = TTFT_SLACK,
) -> list[dict]:
    """For each preset (name -> its plan among ``rows``), the frontier plans that beat it on a
    budget set at the preset's own value, ΔNLL compared paired over the windows both scored:

    * ``at_ttft``: the most accurate frontier plan at the same TTFT (no more than
      ``ttft_slack`` of it slower), if it is more accurate beyond the noise (``gain``, the
      preset's ΔNLL minus its, more than ``z`` SE above 0);
    * ``at_dnll``: the fastest frontier plan as accurate (its ΔNLL minus the preset's less than
      ``z`` SE above 0: not worse beyond the noise), if its TTFT is lower (``speedup``: the
      preset's TTFT over its).

    ``beaten`` when either exists."""
    by_plan = {r["plan"]: r for r in rows}
    front = [r for r in rows if r["frontier"]]
    out = []
    for name, plan in presets.items():
        p = by_plan[plan]
        v = {
            "preset": name, "plan": plan, "dnll": p["dnll"], "dnll_se": p["dnll_se"],
            "ttft_ms": p["ttft_ms"], "frontier": p["frontier"], "at_ttft": None, "at_dnll": None,
        }  # fmt: skip
        # (a preset never scored, over a simulated budget, is compared with nothing)
        others = [r for r in front if r["plan"] != plan] if p["window_dnll"] else []
        faster = [r for r in others if r["ttft_ms"] <= p["ttft_ms"] * (1 + ttft_slack)]
        if faster:
            a = min(faster, key=lambda r: r["dnll"])
            diff, se = _paired(a, p)
            if diff > z * se:
                v["at_ttft"] = {"plan": a["plan"], "ttft_ms": a["ttft_ms"], "gain": diff,
                                "gain_se": se}  # fmt: skip
        as_good = [(r, *_paired(p, r)) for r in others]
        as_good = [(r, d, se) for r, d, se in as_good if d <= 0 or d < z * se]
        if as_good:
            b, d, se = min(as_good, key=lambda x: x[0]["ttft_ms"])
            if b["ttft_ms"] < p["ttft_ms"]:
                v["at_dnll"] = {
                    "plan": b["plan"], "ttft_ms": b["ttft_ms"], "dnll_diff": d,
                    "dnll_diff_se": se, "speedup": p["ttft_ms"] / b["ttft_ms"],
                }  # fmt: skip
        v["beaten"] = bool(v["at_ttft"] or v["at_dnll"])
        out.append(v)
    return out


def preset_verdicts(v: Mapping) -> list[tuple[str | None, str]]:
    """A :func:`versus_presets` entry's two verdicts, (more accurate at its TTFT, faster at its
    accuracy), each (the plan that beats it or None, the text)."""
    a, b = v["at_ttft"], v["at_dnll"]
    none = (None, "on the frontier" if v["frontier"] else "-")
    return [
        (a["plan"], f"ΔNLL -{a['gain']:.4f} ± {a['gain_se']:.4f}") if a else none,
        (
            b["plan"],
            f"{b['speedup']:.2f}x faster (ΔNLL {b['dnll_diff']:+.4f} ± {b['dnll_diff_se']:.4f})",
        )
        if b
        else none,
    ]
