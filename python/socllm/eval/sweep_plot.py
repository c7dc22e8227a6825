"""The sweep table as a forest plot, one PNG per model: a panel per lm-eval task (and the
mean over tasks) with every plan's paired change from fp32 and its paired bootstrap 95%
interval, and a panel of the KL divergence from fp32 on ``wikitext2-heldout``.

Input is the ``rows`` list of ``sweep.json`` (:func:`socllm.eval.sweep.build_table`), so a table
committed to the docs can be drawn again without its cells
(``python scripts/plot_sweep.py docs/results/sweep/*.json``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..io.files import atomic_path
from .sweep import DISTRIBUTION_TASK, NO_CALIBRATION, REFERENCE_PLAN, slug

MEAN_PANEL = "mean"
LABEL_WIDTH_CHARS = 38  # plan strings with options wrap at their commas
# The mean column has a standard error, not a bootstrap interval: a normal 95% interval.
NORMAL_Z95 = 1.959964


@dataclass(frozen=True)
class ForestPoint:
    """One plan's mark in one panel: ``value`` with its interval [lo, hi] in the panel's unit
    (percentage points for lm-eval tasks, nats for KL); ``error`` when the cell ended in one."""

    label: str
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    error: str | None = None

    @property
    def resolved(self) -> bool:
        """The interval excludes zero (a change the documents resolve)."""
        return self.lo is not None and (self.lo > 0 or self.hi < 0)


@dataclass(frozen=True)
class ForestPanel:
    task: str
    title: str
    points: tuple[ForestPoint, ...]


def _row_label(row: dict, calibs_per_plan: dict[str, int]) -> str:
    label = row["plan"]
    if calibs_per_plan[row["plan"]] > 1 or row["calib"] != NO_CALIBRATION:
        label += f" [{row['calib']}]"
    return textwrap.fill(label.replace(",", ", "), width=LABEL_WIDTH_CHARS, break_on_hyphens=False)


def forest_panels(rows: Sequence[dict], model: str) -> list[ForestPanel]:
    """The panels of ``model``'s plot from the table rows: every non-fp32 row in table order,
    in every task that has a result for some row (a row without one is left blank there)."""
    mine = [r for r in rows if r["model"] == model]
    ref = next((r for r in mine if r["plan"] == REFERENCE_PLAN), None)
    others = [r for r in mine if r["plan"] != REFERENCE_PLAN]
    calibs_per_plan: dict[str, int] = {}
    for r in others:
        calibs_per_plan[r["plan"]] = calibs_per_plan.get(r["plan"], 0) + 1
    labels = [_row_label(r, calibs_per_plan) for r in others]
    tasks = list(dict.fromkeys(t for r in mine for t in r["tasks"]))
    panels = []
    for task in tasks:
        points = []
        for label, r in zip(labels, others, strict=True):
            e = r["tasks"].get(task)
            if e is None:
                points.append(ForestPoint(label))
            elif "error" in e:
                points.append(ForestPoint(label, error=e["error"].split(":")[0]))
            elif task == DISTRIBUTION_TASK:
                kl = e["kl"]
                lo, hi = kl.get("ci95", (kl["value"], kl["value"]))
                points.append(ForestPoint(label, kl["value"], lo, hi))
            elif "delta" in e:
                lo, hi = e["ci95"]
                points.append(ForestPoint(label, 100 * e["delta"], 100 * lo, 100 * hi))
            else:
                points.append(ForestPoint(label))
        if not any(p.value is not None or p.error for p in points):
            continue
        ref_e = (ref or {}).get("tasks", {}).get(task) or {}
        if task == DISTRIBUTION_TASK:
            title = "wikitext2-heldout: KL from fp32 (nats)"
            if "ppl" in ref_e:
                title += f"\nfp32 ppl {ref_e['ppl']:.2f}"
        else:
            metric = next(
                (
                    r["tasks"][task]["metric"]
                    for r in mine
                    if "metric" in (r["tasks"].get(task) or {})
                ),
                "",
            )
            title = f"{task} ({metric}), Δ points"
            if "score" in ref_e:
                title += f"\nfp32 {100 * ref_e['score']:.1f}%, n={ref_e['n']}"
        panels.append(ForestPanel(task, title, tuple(points)))
    means = []
    for label, r in zip(labels, others, strict=True):
        m = r.get("mean")
        if m and "delta" in m:
            half = NORMAL_Z95 * m["se"]
            means.append(
                ForestPoint(
                    label, 100 * m["delta"], 100 * (m["delta"] - half), 100 * (m["delta"] + half)
                )
            )
        else:
            means.append(ForestPoint(label))
    if any(p.value is not None for p in means):
        n_tasks = max(r["mean"]["n_tasks"] for r in others if r.get("mean"))
        title = f"mean of {n_tasks} lm-eval tasks, Δ points"
        ref_mean = (ref or {}).get("mean") or {}
        if "score" in ref_mean:
            title += f"\nfp32 {100 * ref_mean['score']:.1f}%, ±1.96 se"
        panels.append(ForestPanel(MEAN_PANEL, title, tuple(means)))
    return panels


def plot_forest(rows: Sequence[dict], model: str, dest: str | Path, columns: int = 4) -> Path:
    """Draws ``model``'s panels (:func:`forest_panels`) into the PNG ``dest`` (written
    atomically). Resolved changes (interval excluding 0) are red for a loss, green for a gain;
    cells that ended in an error show its name."""
    panels = forest_panels(rows, model)
    if not panels:
        raise ValueError(f"sweep plot: no finished non-fp32 cell of {model!r} to draw")
    return _save(forest_figure(panels, model, columns), Path(dest))


def _save(fig, dest: Path) -> Path:
    import matplotlib.pyplot as plt

    with atomic_path(dest) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return dest


def forest_figure(panels: Sequence[ForestPanel], model: str, columns: int = 4):
    """The matplotlib figure of ``panels``, ``columns`` to a row, under one title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows = (len(panels) + columns - 1) // columns
    n_cols = min(columns, len(panels))
    n_plans = len(panels[0].points)
    label_lines = max(p.label.count("\n") + 1 for p in panels[0].points)
    plan_height_in = 0.24 + 0.12 * label_lines
    fig, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=(2.6 + 3.2 * n_cols, 0.8 + n_rows * (0.9 + plan_height_in * n_plans)),
        dpi=110,
        squeeze=False,
        sharey=True,
        layout="constrained",  # makes room for the suptitle, which tight_layout does not
    )
    ys = list(range(n_plans))[::-1]
    for ax, panel in zip(axes.flat, panels, strict=False):
        kl = panel.task == DISTRIBUTION_TASK
        for y, p in zip(ys, panel.points, strict=True):
            if p.error:
                ax.text(
                    0.5,
                    y,
                    p.error,
                    transform=ax.get_yaxis_transform(),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="0.4",
                )
                continue
            if p.value is None:
                continue
            color = "C0" if kl or not p.resolved else ("C3" if p.value < 0 else "C2")
            ax.errorbar(
                p.value,
                y,
                xerr=[[p.value - p.lo], [p.hi - p.value]],
                fmt="o",
                color=color,
                ms=4,
                capsize=2,
                lw=1,
            )
        if kl:
            ax.set_xscale("log")
        else:
            ax.axvline(0, color="0.5", lw=0.8, ls="--")
        ax.set_title(panel.title, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_yticks(ys, [p.label for p in panel.points], fontsize=7)
        ax.set_ylim(-0.7, n_plans - 0.3)
        ax.grid(axis="x", lw=0.3, alpha=0.5)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"{model}: each plan against fp32 (95% intervals)", fontsize=10)
    return fig


def write_sweep_plots(
    rows: Sequence[dict], out: str | Path, stem: str = "sweep", model_suffix: bool = True
) -> list[Path]:
    """``<stem>-<model>.png`` in ``out`` for each model with a finished non-fp32 cell
    (``<stem>.png`` when ``model_suffix`` is false and the rows hold one model)."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    suffix = model_suffix or len(models) > 1
    written = []
    for m in models:
        panels = forest_panels(rows, m)
        if panels:
            name = f"{stem}-{slug(m)}" if suffix else stem
            written.append(_save(forest_figure(panels, m), Path(out) / f"{name}.png"))
    return written
