"""The frontier's report as one self-contained HTML file (issue 41 item 4): the Pareto table
(sortable by any column), the accuracy-against-TTFT plot, the recommended plans with their
files, and the timeline of the first recommended plan, every image inlined, no network."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping
from pathlib import Path

# Click a column header to sort by it (numbers as numbers; again for the reverse order).
_SORT_JS = """
document.querySelectorAll("table.sortable th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var up = th.dataset.order !== "up";
    th.dataset.order = up ? "up" : "down";
    function key(r) {
      var t = r.cells[col].textContent;
      var x = parseFloat(t);
      return isNaN(x) ? t : x;
    }
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      var c = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0)
                                    : (typeof x === "number" ? -1 : 1);
      return up ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
"""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f0f0f0; cursor: pointer; }
td.plan { text-align: left; font-family: monospace; }
tr.on { background: #eef7ee; }
img { max-width: 100%; }
"""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def _num(v: float, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _validation(v: Mapping) -> str:
    """The lm-eval check of the frontier's order: rho, its interval, the table, the pairs the
    two orders disagree on."""
    e = html.escape
    lo, hi = v["interval"]
    head = "".join(
        f"<th>{e(c)}</th>" for c in ("plan", "ΔNLL", "task accuracy change", "± SE", *v["tasks"])
    )
    body = ""
    for plan, dnll in zip(v["plans"], v["dnll"], strict=True):
        per = v["per_plan"][plan]
        body += (
            f'<tr><td class="plan">{e(plan)}</td><td>{dnll:+.4f}</td>'
            f"<td>{100 * per['all']['diff']:+.1f}</td><td>{100 * per['all']['diff_se']:.1f}</td>"
            + "".join(f"<td>{100 * per[t]['acc']:.1f}%</td>" for t in v["tasks"])
            + "</tr>"
        )
    pairs = (
        "".join(
            f"<li><code>{e(d['wikitext_better'])}</code> has the lower ΔNLL but loses "
            f"{100 * d['task_loss_diff']:.1f} ± {100 * d['task_loss_diff_se']:.1f} points more "
            f"task accuracy than <code>{e(d['tasks_better'])}</code> "
            f"({'beyond' if d['beyond_noise'] else 'within'} the noise)</li>"
            for d in v["disagreements"]
        )
        or "<li>The two orders agree on every pair.</li>"
    )
    return (
        f"<h2>Validation on lm-eval tasks</h2><p>{e(', '.join(v['tasks']))}, up to "
        f"{v['limit']} documents each ({v['documents']} in all): Spearman's rho between ΔNLL "
        f"and task accuracy loss {v['spearman']:+.2f}, {100 * v['level']:.0f}% interval "
        f'[{lo:+.2f}, {hi:+.2f}].</p><table class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table><ul>{pairs}</ul>"
    )


def render(report: Mapping, out: Path, timeline_png: Path | None = None) -> str:
    """The report page; images are read from ``out`` (frontier.png) and ``timeline_png``."""
    e = html.escape
    ev = report["evaluations"]
    head = (
        f"{e(Path(report['model']).name)} on {e(report['device'])}: {report['prompt_len']}-token "
        f"prompt, {report['decode_tokens']} decoded tokens; accuracy on up to "
        f"{report['windows']} held-out WikiText-2 windows of {report['context']} tokens"
    )
    cols = (
        "plan", "frontier", "ΔNLL (nats)", "± SE", "KL", "top-1", "TTFT ms", "decode tok/s",
        "energy mJ", "memory MB", "CPU share", "windows",
    )  # fmt: skip
    rows = []
    for r in sorted(report["plans"], key=lambda r: (not r["frontier"], r["ttft_ms"])):
        state = "yes" if r["frontier"] else (r["dropped"] or "no")
        cells = [
            f'<td class="plan">{e(r["plan"])}</td>',
            f"<td>{e(state)}</td>",
            f"<td>{_num(r['dnll'], '+.4f')}</td>",
            f"<td>{_num(r['dnll_se'], '.4f')}</td>",
            f"<td>{_num(r['kl'], '.4f')}</td>",
            f"<td>{_num(100 * r['top1'], '.1f') if r['windows'] else '-'}</td>",
            f"<td>{r['ttft_ms']:.1f}</td>",
            f"<td>{r['decode_tokens_per_s']:.2f}</td>",
            f"<td>{r['energy_mj']:.0f}</td>",
            f"<td>{r['memory_mb']:.0f}</td>",
            f"<td>{100 * r['cpu_share']:.0f}%</td>",
            f"<td>{r['windows']}</td>",
        ]
        rows.append(f'<tr class="{"on" if r["frontier"] else ""}">' + "".join(cells) + "</tr>")
    rec = "".join(
        f'<li>{e(goal)}: <code>{e(plan)}</code> (<a href="plans/{e(goal)}.json">'
        f"plans/{e(goal)}.json</a>)</li>"
        for goal, plan in report["recommended"].items()
    ) or (
        f"<li>No plan meets the budgets {e(str(report['budgets']))}; nearest: "
        + ", ".join(f"<code>{e(p)}</code>" for p in report["nearest"])
        + "</li>"
    )
    presets = ""
    if report.get("presets"):
        from .presets import TTFT_SLACK, preset_verdicts

        def cell(plan: str | None, text: str) -> str:
            return f"<td><code>{e(plan)}</code>: {e(text)}</td>" if plan else f"<td>{e(text)}</td>"

        body = "".join(
            f'<tr><td class="plan">{e(v["preset"])}</td><td>{_num(v["dnll"], "+.4f")}</td>'
            f"<td>{_num(v['dnll_se'], '.4f')}</td><td>{v['ttft_ms']:.1f}</td>"
            + "".join(cell(p, t) for p, t in preset_verdicts(v))
            + "</tr>"
            for v in report["presets"]
        )
        n = sum(v["beaten"] for v in report["presets"])
        presets = (
            f"<h2>Presets against the frontier</h2><p>{n} of {len(report['presets'])} presets "
            "beaten on a budget set at their own value (paired ΔNLL over the windows both "
            f"scored: more accurate by over {report['z']:g} SE, or as accurate within "
            f"{report['z']:g} SE; equal TTFT: within {100 * TTFT_SLACK:g}%).</p>"
            '<table class="sortable"><thead><tr>'
            + "".join(
                f"<th>{e(c)}</th>"
                for c in (
                    "preset",
                    "ΔNLL",
                    "± SE",
                    "TTFT ms",
                    "more accurate at its TTFT",
                    "faster at its accuracy",
                )
            )  # fmt: skip
            + f"</tr></thead><tbody>{body}</tbody></table>"
        )
    validation = _validation(report["validation"]) if report.get("validation") else ""
    unrunnable = "".join(
        f"<li><code>{e(plan)}</code>: {e(why)}</li>"
        for plan, why in report["space"].get("unrunnable", {}).items()
    )
    if unrunnable:
        unrunnable = f"<p>Not runnable on {e(report['device'])}:</p><ul>{unrunnable}</ul>"
    share = 100 * ev["windows_scored"] / max(ev["exhaustive_windows"], 1)
    timeline = ""
    if timeline_png is not None and timeline_png.exists():
        first = next(iter(report["recommended"].values()), "")
        timeline = (
            f"<h2>Timeline of <code>{e(first)}</code></h2>{_img(timeline_png)}"
            '<p>Trace for ui.perfetto.dev: <a href="timeline.json">timeline.json</a></p>'
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>socllm frontier</title>
<style>{_CSS}</style></head>
<body>
<h1>Plan frontier</h1>
<p>{head}. Objectives: {e(", ".join(report["objectives"]))};
budgets: {e(str(report["budgets"] or "none"))}.</p>
<p>Space: {report["space"]["plans"]} plans of {report["space"]["products"]} products
({len(report["space"]["refused"])} not composable). The search scored {ev["windows_scored"]}
plan-windows of an exhaustive {ev["exhaustive_windows"]} ({share:.0f}%).</p>
<h2>Recommended</h2><ul>{rec}</ul>
<h2>Accuracy against time to first token</h2>{_img(out / "frontier.png")}
<h2>Plans</h2>
<table class="sortable"><thead><tr>{"".join(f"<th>{e(c)}</th>" for c in cols)}</tr></thead>
<tbody>{"".join(rows)}</tbody></table>
{unrunnable}
{presets}
{validation}
{timeline}
<script>{_SORT_JS}</script>
</body></html>
"""
