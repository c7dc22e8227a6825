"""``socllm run``: the main job on one model, written up as a report directory.

Load (converting once), generate from a fixed prompt, calibrate (static scales and the outlier
profile), evaluate WikiText-2 perplexity under every known plan, time the engine's own chunked
prefill on a modelled Snapdragon 8 Gen 3 under each scheduling policy, and write
``report.json``, ``report.md``, a plot of the per-token loss, a Gantt chart and a Perfetto trace.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .. import _core
from .._version import __version__
from ..errors import InvalidArgumentError
from ..io.files import (
    atomic_path,
    atomic_write_text,
    check_distinct_outputs,
    check_output_path,
    emit_json,
)

SAMPLE_PROMPT = "The three most important ideas in computer architecture are"
# The demonstration (a few minutes on 2 cores) and `socllm run --full` (the full table).
QUICK_LIMIT_TOKENS, QUICK_CALIB_SAMPLES = 4096, 16
FULL_LIMIT_TOKENS, FULL_CALIB_SAMPLES = 16384, 32
NLL_BLOCK = 128  # tokens per block for the paired standard error (per-token NLL is correlated)
# The files of a report directory.
CALIB_FILE, REPORT_JSON, REPORT_MD = "calib.h5", "report.json", "report.md"
LOSS_PLOT, TIMELINE_PLOT, TRACE_FILE = "token_loss.png", "timeline.png", "timeline_trace.json"
REPORT_FILES = (CALIB_FILE, REPORT_JSON, REPORT_MD, LOSS_PLOT, TIMELINE_PLOT, TRACE_FILE)


def check_report_outputs(model_name: str, out_dir: Path, json_dest: str | None) -> None:
    """Before any work: ``out_dir`` can hold the report, and neither its files nor ``json_dest``
    is one of the model's files (InvalidArgumentError naming the path)."""
    from ..registry import model_inputs

    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidArgumentError(f"report directory {out_dir} exists and is not a directory")
    inputs = model_inputs(model_name)
    files = {name: out_dir / name for name in REPORT_FILES}
    for path in files.values():  # HDF5 and PNG need regular files
        check_output_path(path, inputs=inputs, what="report file", streams=False)
    if json_dest is not None:
        check_distinct_outputs({"--json": json_dest, **files})
        check_output_path(json_dest, inputs=inputs, what="--json")


def paired_nll_vs(reference: np.ndarray, other: np.ndarray, block: int = NLL_BLOCK) -> dict:
    """Mean per-token NLL difference ``other - reference`` on the same scored tokens, with its
    standard error over blocks of ``block`` consecutive tokens (neighbouring tokens' losses are
    correlated, so blocks, not tokens, are the independent units; NaN below two blocks), and
    the perplexity ratio."""
    from .stats import paired_difference

    m = min(reference.size, other.size)
    n = m // block * block
    a = reference[:n].reshape(-1, block).mean(1)
    b = other[:n].reshape(-1, block).mean(1)
    se = paired_difference(dict(enumerate(a)), dict(enumerate(b)))[1] if a.size > 1 else math.nan
    return {
        "delta_nll": float((other[:m] - reference[:m]).mean()),
        "delta_nll_se": float(se),
        "blocks": int(a.size),
        "ppl_ratio": float(np.exp(other.mean() - reference.mean())),
    }


def plot_token_loss(token_nll: np.ndarray, dest: Path, title: str, window: int = 256) -> None:
    """Per-token negative log-likelihood with a running mean, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.2), dpi=110)
    ax.plot(token_nll, lw=0.3, alpha=0.4, label="per-token NLL")
    if token_nll.size >= window:
        run = np.convolve(token_nll, np.ones(window) / window, mode="valid")
        ax.plot(
            np.arange(window - 1, token_nll.size), run, lw=1.5, label=f"running mean ({window})"
        )
    ax.set_xlabel("scored token (WikiText-2 test, in order)")
    ax.set_ylabel("NLL (nats)")
    ax.set_title(title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    with atomic_path(dest) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def run_main_job(
    model_name: str,
    out_dir: Path,
    *,
    limit_tokens: int | None = QUICK_LIMIT_TOKENS,
    calib_samples: int = QUICK_CALIB_SAMPLES,
    progress: bool = True,
    json_dest: str | None = None,
    extra_plan: tuple[str, str] | None = None,
) -> dict:
    """The main job (module doc). ``extra_plan``: (label, plan text) of a plan evaluated and
    timed next to the presets (``socllm run --plan``), calibrated for with the steps it reads."""
    from ..model import load
    from .bench_utils import machine_line
    from .perplexity import eval_wikitext2

    check_report_outputs(model_name, out_dir, json_dest)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the machine every speed below is measured on: first on the console, and in the report
    machine = machine_line()
    print(machine, file=sys.stderr if json_dest == "-" else sys.stdout, flush=True)
    t0 = time.perf_counter()
    model = load(model_name, progress=progress)
    load_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    gen_ids = model.generate_ids(SAMPLE_PROMPT, max_new_tokens=48)
    gen_s = time.perf_counter() - t0
    limit = None if not limit_tokens else limit_tokens

    # Static-scale plans need calibration (shadow-outlier also the outlier profile, edgeflow
    # its smoothing exponents): windows from the calibration slice of WikiText-2, evaluation on
    # the held-out rest only.
    from ..calibration import run_steps, save_calibration

    t0 = time.perf_counter()
    plans = {p: p for p in _core.Plan.known()}  # label -> plan text
    if extra_plan is not None:
        label, text = extra_plan
        if label in plans:
            label = f"{label} (--plan)"
        plans[label] = text
    from ..plan_frontier.calibrate import step_options, steps_for

    steps = steps_for(list(plans.values()))  # the presets': act-scales, outliers, smoothing
    options = step_options(steps, calib_samples, model.config["arch"])
    cal = run_steps(
        model,
        steps,
        seqlen=512,
        smoothing_windows=min(8, calib_samples),
        smoothing_rows=64,
        progress=progress,
        **options,
    )
    calib_path = save_calibration(out_dir / CALIB_FILE, cal, model)
    model.load_calibration(calib_path)
    calib_s = time.perf_counter() - t0

    evals, token_nll = [], {}
    for label, plan in plans.items():
        summary, result = eval_wikitext2(
            model,
            plan,
            context=2048,
            stride=None,
            limit_tokens=limit,
            batch_size=1,
            progress=progress,
            heldout=True,
        )
        summary["plan"] = label
        if plan != label:
            summary["plan_spec"] = plan
        evals.append(summary)
        token_nll[label] = result.token_nll
    for e in evals:
        e.update(paired_nll_vs(token_nll["fp32"], token_nll[e["plan"]]))
    plot_token_loss(
        token_nll["fp32"],
        out_dir / LOSS_PLOT,
        f"{model.config['name']}: WikiText-2 per-token loss (fp32)",
    )

    timeline = simulate_section(model, out_dir, progress)
    frontier = preset_frontier(model, evals, out_dir, progress)

    report = {
        "socllm_version": __version__,
        "machine": {
            "description": machine,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": _core.num_threads(),
        },
        "model": {"name": model_name, "file": str(model.path), "config": dict(model.config)},
        "load_seconds": round(load_s, 2),
        "generation": {
            "prompt": SAMPLE_PROMPT,
            "plan": "fp32",
            "greedy": True,
            "new_tokens": len(gen_ids),
            "text": model.detokenize(gen_ids),
            "tokens_per_s": round(len(gen_ids) / gen_s, 1),
        },
        "calibration": {
            "file": calib_path.name,
            "tokens": cal.tokens,
            "seconds": round(calib_s, 2),
            **cal.provenance,
        },
        "wikitext2": evals,
        "timeline": timeline,
        "frontier": frontier,
        "plots": {"token_loss": LOSS_PLOT, "timeline": TIMELINE_PLOT, "frontier": FRONTIER_PLOT},
    }
    atomic_write_text(out_dir / REPORT_JSON, json.dumps(report, indent=2) + "\n")
    atomic_write_text(out_dir / REPORT_MD, render_markdown(report))
    emit_json(report, json_dest)
    if json_dest != "-":
        print(render_markdown(report))
        print(f"report written to {out_dir}/")
    return report


SIM_DEVICE = "snapdragon-8gen3"
SIM_PROMPT = 512
SIM_CHUNK = 256  # the prompt's chunks unless a plan names its own


def simulate_section(model, out_dir: Path, progress: bool) -> dict:
    """The engine's own chunked prefill of a held-out prompt under shadow-outlier, timed on the
    8 Gen 3 profile under each policy; Gantt chart and Perfetto trace of the out-of-order run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..calibration import corpus_tokens, held_out_tokens
    from ..sim.timeline import simulate_model

    ids = held_out_tokens(corpus_tokens(model))[:SIM_PROMPT]
    rows = []
    # one engine run; its graph is simulated under each policy
    ooe = simulate_model(model, ids, SIM_DEVICE, "shadow-outlier", chunk=SIM_CHUNK)
    for policy in tqdm(
        ("in-order", "first-ready", "npu-stall-first"), desc="simulate", disable=not progress
    ):
        t = ooe if policy == "npu-stall-first" else ooe.with_policy(policy)
        s = {k: v for k, v in t.summary().items() if k not in ("engine_graphs", "processors")}
        rows.append(s)
        if policy == "npu-stall-first":
            t.to_perfetto(out_dir / TRACE_FILE)
            ax = t.plot()
            with atomic_path(out_dir / TIMELINE_PLOT) as tmp:
                ax.figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
            plt.close(ax.figure)
    return {
        "device": SIM_DEVICE,
        "plan": "shadow-outlier",
        "prompt_len": len(ids),
        "runs": rows,
        "trace": TRACE_FILE,
    }


FRONTIER_PLOT = "frontier.png"


def preset_frontier(model, evals: list[dict], out_dir: Path, progress: bool) -> dict:
    """The preset plans side by side (issue 41 item 6): each one's held-out ΔNLL (the table
    above) and the TTFT and energy of the engine's own prefill of the timeline's held-out prompt
    under it, planned for and simulated on the 8 Gen 3 profile; the frontier of ΔNLL and TTFT,
    and its plot."""
    from ..calibration import corpus_tokens, held_out_tokens
    from ..plan_frontier.evaluate import request_objectives
    from ..plan_frontier.pareto import frontier_flags
    from ..plan_frontier.run import plot
    from ..sim.timeline import simulate_model

    ids = held_out_tokens(corpus_tokens(model))[:SIM_PROMPT]
    rows = []
    for e in tqdm(evals, desc="frontier", disable=not progress):
        plan = e.get("plan_spec", e["plan"])
        chunk = _core.Plan(plan).chunk_len or SIM_CHUNK  # the plan's own, if it names one
        s = simulate_model(model, ids, SIM_DEVICE, plan, chunk=chunk).summary()
        rows.append(
            {
                "plan": e["plan"],
                "dnll": e["delta_nll"],
                "dnll_se": e["delta_nll_se"],
                **request_objectives(s),
                "windows": e["n_windows"],
            }
        )
    for r, on in zip(rows, frontier_flags(rows, ("dnll", "ttft_ms")), strict=True):
        r["frontier"] = on
    out = {"device": SIM_DEVICE, "prompt_len": len(ids), "chunk_len": SIM_CHUNK, "plans": rows}
    plot({**out, "model": model.config["name"]}, out_dir / FRONTIER_PLOT)
    return out


def machine_lines(m: dict) -> list[str]:
    """The report's lines on the machine (:func:`~socllm.eval.bench_utils.machine_line`, the
    threads and Python): every speed in the report is this machine's."""
    if "description" not in m:  # a report written before the machine line
        return []
    return [
        f"Machine: {m['description']}; {m['threads']} threads, Python {m['python']}.",
        "",
    ]


def render_markdown(r: dict) -> str:
    c = r["model"]["config"]
    lines = [
        f"# socllm report: {r['model']['name']}",
        "",
        f"Model: {c['name']} ({c['arch']}, {c['n_layers']} layers, d_model {c['d_model']}, "
        f"vocab {c['vocab_size']}); loaded in {r['load_seconds']} s.",
        "",
        *machine_lines(r.get("machine", {})),
        "## Generation (greedy, fp32)",
        "",
        f"> **{r['generation']['prompt']}**{r['generation']['text']}",
        "",
        f"{r['generation']['new_tokens']} tokens at {r['generation']['tokens_per_s']} tokens/s.",
        "",
        "## WikiText-2 perplexity (held-out part)",
        "",
        f"Calibration: {r['calibration']['samples']} windows of {r['calibration']['seqlen']} "
        f"tokens from the {r['calibration']['slice']} (seed {r['calibration']['seed']}); "
        "perplexity on the tokens after that slice.",
        "",
        f"ΔNLL: mean per-token loss minus fp32's on the same tokens, ± its standard error over "
        f"blocks of {NLL_BLOCK} tokens (paired).",
        "",
        "| plan | perplexity | ΔNLL vs fp32 (nats) | scored tokens | windows x context | seconds |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for e in r["wikitext2"]:
        lines.append(
            f"| {e['plan']} | {e['perplexity']:.4f} | "
            f"{e['delta_nll']:+.4f} ± {e['delta_nll_se']:.4f} | {e['n_scored']} | "
            f"{e['n_windows']} x {e['context']} | {e['seconds']} |"
        )
    lines += ["", "![per-token loss](token_loss.png)", ""]
    if "timeline" in r:
        t = r["timeline"]
        lines += [
            f"## Prefill timeline on {t['device']} (simulated)",
            "",
            f"The engine's chunked prefill of {t['prompt_len']} held-out tokens under "
            f"`{t['plan']}` (chunks of 256), timed by the discrete-event simulator "
            f"(trace: `{t['trace']}`, open in ui.perfetto.dev).",
            "",
            "| policy | prefill ms | tokens/s | energy mJ | NPU bubbles | CPU bubbles |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in t["runs"]:
            b = s["bubble_rate"]
            lines.append(
                f"| {s['policy']} | {s['prefill_ms']:.1f} | {s['prefill_tokens_per_s']:.0f} | "
                f"{s['energy_mj']:.0f} | {100 * b.get('npu', 0):.0f}% | "
                f"{100 * b.get('cpu', 0):.0f}% |"
            )
        lines += ["", "![timeline](timeline.png)", ""]
    if "frontier" in r:
        f = r["frontier"]
        lines += [
            f"## Which preset to ship: accuracy and time to first token ({f['device']})",
            "",
            f"ΔNLL from the table above; TTFT and energy of the engine's prefill of "
            f"{f['prompt_len']} held-out tokens under each plan (chunks of {f['chunk_len']} "
            "unless the plan names its own), "
            "simulated. Frontier: no other preset is both more accurate and faster "
            "(`socllm frontier` searches composed plans).",
            "",
            "| plan | frontier | ΔNLL (nats) | TTFT ms | energy mJ | memory MB | CPU share |",
            "| --- | :-: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for p in sorted(f["plans"], key=lambda p: (not p["frontier"], p["ttft_ms"])):
            lines.append(
                f"| {p['plan']} | {'yes' if p['frontier'] else ''} | "
                f"{p['dnll']:+.4f} ± {p['dnll_se']:.4f} | {p['ttft_ms']:.1f} | "
                f"{p['energy_mj']:.0f} | {p['memory_mb']:.0f} | {100 * p['cpu_share']:.0f}% |"
            )
        lines += ["", f"![frontier]({FRONTIER_PLOT})", ""]
    return "\n".join(lines)
