"""The ``socllm`` command: convert, calibrate, eval, simulate, run.

Every command that produces numbers can print them as JSON (``--json PATH`` or ``--json -``).
``--quiet`` silences progress bars and C++ info logs.

Arguments and output paths are checked before any work: counts must be positive, and an output
must be writable and none of the command's inputs (socllm.io.files.check_output_path). Errors
are one line on stderr (exit status 2), no traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from . import _core
from .errors import INT64_MAX, InvalidArgumentError, not_applicable
from .io.files import check_distinct_outputs, check_output_path
from .io.files import emit_json as _emit_json

PERPLEXITY_TASKS = ("wikitext2", "wikitext2-heldout")
MIN_WINDOW = 2  # tokens: a window's first token has no prediction, so it scores one token less
# lm-eval tasks (socllm.eval.lmeval, local data); "lambada" is lambada_openai
LMEVAL_TASKS = (
    "hellaswag",
    "winogrande",
    "openbookqa",
    "arc_easy",
    "arc_challenge",
    "piqa",
    "mmlu",
    "lambada",
)
TASKS = PERPLEXITY_TASKS + LMEVAL_TASKS


def _plans(specs: list[str] | None) -> list[str]:
    """Plans from repeated --plan options; a comma list is split unless it carries options
    ("smoothquant:alpha=0.8"); a plan file (@PATH or *.json, plan_files) is read."""
    from .plan_files import read_plan

    out: list[str] = []
    for spec in specs or ["fp32"]:
        out.extend([spec] if ":" in spec or spec.startswith(("{", "@")) else spec.split(","))
    out = [read_plan(p.strip()) for p in out if p.strip()]
    if not out:
        raise InvalidArgumentError(f"--plan {' '.join(specs or [])!r} names no plan")
    for plan in out:
        _core.Plan(plan)  # fail before any work on an unknown plan
    return out


def _number(
    kind: type, low: float, high: float | None = None, *, low_open: bool = False, zero: bool = False
) -> Callable[[str], float]:
    """An argparse type: a ``kind`` in [low, high] ((low, high] if ``low_open``); with ``zero``
    also 0 (a flag's "all" or "whole"). argparse reports a violation as one line, before work.
    An int's ``high`` is at most INT64_MAX (the core's counts are int64)."""
    if kind is int:
        high = INT64_MAX if high is None else min(high, INT64_MAX)

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        inside = (value > low if low_open else value >= low) and (high is None or value <= high)
        if not inside and not (zero and value == 0):  # NaN is never inside
            bound = f"{'>' if low_open else '>='} {low}" + (
                f" and <= {high}" if high is not None else ""
            )
            raise argparse.ArgumentTypeError(
                f"must be {bound}{' (or 0)' if zero else ''}, got {text}"
            )
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


_COUNT = _number(int, 1)
_WINDOW = _number(int, MIN_WINDOW)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars, C++ logs at warn level")
    p.add_argument("--threads", type=_COUNT, default=None, help="compute threads (default 2)")


def _add_policy(p: argparse.ArgumentParser, what: str) -> None:
    """--policy: a scheduling policy of the simulator, by name or alias."""
    from ._core import sim

    pols = sim.policies()
    p.add_argument(
        "--policy",
        choices=[x["name"] for x in pols] + [x["alias"] for x in pols if x["alias"] != x["name"]],
        default=None,
        help="; ".join([what] + [f"{x['name']} ({x['alias']}): {x['description']}" for x in pols]),
    )


def _inputs(model: str | None, *files: str | None) -> list[Path]:
    """What a command reads: the model's files (see registry.model_inputs) and ``files``."""
    from .registry import model_inputs

    return (model_inputs(model) if model is not None else []) + [Path(f) for f in files if f]


def _check_outputs(
    outputs: dict[str, str | None], inputs: Iterable[Path], *, hdf5: Iterable[str] = ()
) -> None:
    """The outputs (``{flag: path}``) are writable, distinct and none of ``inputs``; the flags
    in ``hdf5`` need a regular file."""
    check_distinct_outputs(outputs)
    inputs = list(inputs)
    for flag, path in outputs.items():
        if path is not None:
            check_output_path(path, inputs=inputs, what=flag, streams=flag not in hdf5)


def _setup(args) -> None:
    _core.set_log_level("warn" if args.quiet else "info")
    if args.threads is not None:
        _core.set_num_threads(args.threads)


def cmd_convert(args) -> int:
    from .io.convert import convert

    _setup(args)
    if args.edgeflow_bits is not None and args.edgeflow_plan is not None:
        raise InvalidArgumentError(
            f"convert: --edgeflow-bits {args.edgeflow_bits:g} is the plan "
            f"edgeflow:bits={args.edgeflow_bits:g}; --edgeflow-plan {args.edgeflow_plan} names "
            "another: give one of them"
        )
    if args.edgeflow_bits is None and args.edgeflow_plan is None:
        if args.calib:
            raise SystemExit("socllm convert: --calib goes with --edgeflow-bits / --edgeflow-plan")
        if args.group is not None:
            raise not_applicable(
                "convert",
                f"--group {args.group}",
                "the weightlets of a prequantized model (--edgeflow-bits / --edgeflow-plan)",
                "a plain conversion stores fp32 weights",
            )
        out = convert(args.source, args.output, progress=not args.quiet)
    else:
        from .io.convert_packed import convert_packed
        from .model import load

        if not args.calib:
            raise SystemExit("socllm convert: a prequantized model needs --calib FILE")
        if args.group is not None and args.group % 8:
            raise InvalidArgumentError(
                f"convert: --group must be a positive multiple of 8, got {args.group}"
            )
        plan = args.edgeflow_plan or f"edgeflow:bits={args.edgeflow_bits!r}"
        _check_outputs(
            {"--output": args.output}, _inputs(args.source, args.calib), hdf5=["--output"]
        )
        model = load(args.source, calib=args.calib, progress=not args.quiet)
        out = convert_packed(
            model, args.output, plan=plan, group=args.group, progress=not args.quiet
        )
    print(f"wrote {out}", file=sys.stderr)
    return 0


def cmd_eval(args) -> int:
    from .errors import InvalidArgumentError
    from .eval import divergence, perplexity
    from .model import load

    _setup(args)
    metrics = divergence.parse_metrics(args.metrics) if args.metrics is not None else []
    task_spec = args.task if args.task is not None else ("" if metrics else "wikitext2")
    tasks = [t.strip() for t in task_spec.split(",") if t.strip()]
    for t in tasks:
        if t not in TASKS:
            raise SystemExit(f"socllm eval: unknown task {t!r} (known: {', '.join(TASKS)})")
    if not tasks and not metrics:
        raise InvalidArgumentError(
            f"eval: --task {task_spec!r} names no task and no --metrics are given: nothing to "
            f"evaluate (tasks: {', '.join(TASKS)})"
        )
    _check_eval_flags(args, tasks, metrics)
    plans = _plans(args.plan)
    if args.device is not None and not metrics:
        raise InvalidArgumentError("--device times the --metrics windows: give --metrics")
    if args.decode_tokens is not None and args.device is None:
        raise InvalidArgumentError("--decode-tokens needs --device")
    if args.policy is not None and args.device is None:
        raise InvalidArgumentError("--policy needs --device")
    if args.device is not None:
        _core.sim.load_device(args.device)  # an unknown device before any work
    _check_outputs({"--json": args.json}, _inputs(args.model, args.calib))
    reference = "fp32" if args.reference is None else args.reference
    _core.Plan(reference)
    windows = 16 if args.windows is None else args.windows
    batch_size = 1 if args.batch_size is None else args.batch_size
    model = load(args.model, calib=args.calib, progress=not args.quiet)
    results = []
    if metrics:
        compared = divergence.compare_plans(
            model,
            plans,
            reference=reference,
            context=args.context or divergence.DEFAULT_CONTEXT,
            windows=windows or None,
            progress=not args.quiet,
            device=args.device,
            decode_tokens=args.decode_tokens or 0,
            policy=args.policy,
        )
        for name, s in compared.items():
            results.append({"task": "metrics", "metrics": metrics, **s})
            if args.json != "-":
                print(divergence.format_summary(name, s, metrics))
    for plan in plans:
        for t in tasks:
            if t in PERPLEXITY_TASKS:
                r, _ = perplexity.eval_wikitext2(
                    model,
                    plan,
                    context=args.context or perplexity.DEFAULT_CONTEXT,
                    stride=args.stride,
                    limit_tokens=args.limit_tokens,
                    batch_size=batch_size,
                    progress=not args.quiet,
                    heldout=t == "wikitext2-heldout",
                )
                line = (
                    f"{t} plan={plan}: perplexity {r['perplexity']:.4f} over {r['n_scored']} "
                    f"tokens ({r['n_windows']} windows of {r['context']}, {r['seconds']} s)"
                )
            else:
                from .eval.lmeval import evaluate

                t0 = time.perf_counter()
                out = evaluate(
                    model=model,
                    tasks=[t],
                    plan=plan,
                    limit=args.limit,
                    batch_size=max(batch_size, 8),
                    quiet=args.quiet,
                )
                r = {**out[t], "task": t, "lm_eval_task": out[t]["task"]}
                r.update(plan=plan, limit=args.limit)
                r["seconds"] = round(time.perf_counter() - t0, 2)
                line = f"{t} plan={plan}: acc {r['acc']}, acc_norm {r['acc_norm']} (n={r['n']})"
            results.append(r)
            if args.json != "-":
                print(line)
    _emit_json(
        {
            "model": str(args.model),
            "model_file": str(model.path),
            "calib": args.calib,
            "results": results,
        },
        args.json,
    )
    return 0


def _check_eval_flags(args, tasks: list[str], metrics: list[str]) -> None:
    """Each of eval's flags applies to some tasks (or to --metrics): given where none of those
    runs, it would change nothing, so it is refused (issue 37)."""
    ppl = [t for t in tasks if t in PERPLEXITY_TASKS]
    lm = [t for t in tasks if t in LMEVAL_TASKS]
    none = (f"--task {','.join(tasks)} has none" if tasks else "no --task is given") + (
        ", only --metrics" if metrics else ""
    )
    no_metrics = "no --metrics are given"
    checks = (
        ("--limit", args.limit, bool(lm), f"lm-eval tasks ({', '.join(LMEVAL_TASKS)})", none),
        ("--reference", args.reference, bool(metrics), "--metrics", no_metrics),
        ("--windows", args.windows, bool(metrics), "--metrics", no_metrics),
        ("--limit-tokens", args.limit_tokens, bool(ppl), "perplexity tasks", none),
        ("--stride", args.stride, bool(ppl), "perplexity tasks", none),
        ("--context", args.context, bool(ppl or metrics), "perplexity tasks and --metrics",
         f"{none} and {no_metrics}"),
        ("--batch-size", args.batch_size, bool(ppl or lm), "perplexity and lm-eval tasks", none),
    )  # fmt: skip
    for flag, value, applies, to, why in checks:
        if value is not None and not applies:
            raise not_applicable("eval", f"{flag} {value}", to, why)


def _calibration_rotation(args) -> str | None:
    """The rotation name the calibrate flags give (None when no --rotate flag is given), as a
    plan with the same parts names it."""
    parts = {
        "rotate": args.rotate,
        "rotate_seed": args.rotate_seed,
        "rotate_down": args.rotate_down,
        "rotate_heads": args.rotate_heads,
    }
    given = ",".join(f"{k}={v}" for k, v in parts.items() if v is not None)
    return _core.Plan(f"fp32:{given}").rotation if given else None


def cmd_calibrate(args) -> int:
    from .calibration import (
        check_options,
        load_calibration,
        run_steps,
        save_calibration,
        step_options,
    )
    from .errors import InvalidArgumentError
    from .model import load

    _setup(args)
    names = [s.strip() for s in args.steps.split(",") if s.strip()]
    if not names:
        raise SystemExit("socllm calibrate: no steps given")
    opts = {k: getattr(args, k) for k in step_options() if getattr(args, k, None) is not None}
    try:  # options before any work, named by their flags
        check_options(names, opts)
    except InvalidArgumentError as e:
        flag = re.sub(r"option '(\w+)'", lambda m: "--" + m[1].replace("_", "-"), str(e))
        raise InvalidArgumentError(flag) from None
    # --out may be the --calib file: it is read whole before the atomic write replaces it
    model_files = _inputs(args.model)
    check_distinct_outputs({"--out": args.out, "--json": args.json})
    _check_outputs({"--out": args.out}, model_files, hdf5=["--out"])
    _check_outputs({"--json": args.json}, [*model_files, *_inputs(None, args.calib)])
    model = load(args.model, progress=not args.quiet)
    data = load_calibration(args.calib, model) if args.calib else None
    # the rotation the statistics are gathered on: the flags', else the continued file's
    rotation = _calibration_rotation(args)
    if data is not None and rotation is not None and rotation != data.stats.rotation:
        raise InvalidArgumentError(
            f"socllm calibrate: --calib {args.calib} was made on rotation "
            f"{data.stats.rotation!r}, the --rotate flags give {rotation!r}"
        )
    rotation = rotation or (data.stats.rotation if data is not None else "none")
    if rotation != "none":
        model = model.rotated(rotation)
    t0 = time.perf_counter()
    # each finished step is saved (atomically) before the next starts: a later step that fails
    # or is interrupted loses nothing, and --calib OUT --steps <the rest> continues
    saved: list[str] = []

    def save(d) -> None:
        save_calibration(args.out, d, model)
        saved.append(d.provenance.get("steps", ""))

    try:
        cal = run_steps(model, names, data=data, progress=not args.quiet, after_step=save, **opts)
    except Exception as e:
        if saved:
            rest = names[len(saved) :]
            e.add_note(
                f"steps {saved[-1]} are saved in {args.out}: continue with "
                f"--calib {args.out} --steps {','.join(rest)}"
            )
        raise
    summary = {
        "out": str(args.out),
        "tokens": int(cal.tokens),
        "seconds": round(time.perf_counter() - t0, 2),
        **cal.provenance,
    }
    if args.json != "-":
        seen = f", {cal.tokens} tokens observed for act-scales" if cal.tokens else ""
        print(f"wrote {args.out}: steps {','.join(names)}{seen} ({summary['seconds']} s)")
    _emit_json(summary, args.json)
    return 0


def cmd_cold_start(args) -> int:
    from .calibration import corpus_tokens, held_out_tokens
    from .eval.bench_utils import machine_line
    from .model import FileTokenizer
    from .registry import resolve_model_file
    from .sim.coldstart import cold_start

    files = [resolve_model_file(m.strip(), progress=not args.quiet) for m in args.model.split(",")]
    _check_outputs({"--json": args.json}, [*files, *_inputs(None, args.calib)])
    machine = machine_line()  # the machine the times are measured on, first
    print(machine, file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
    # The prompt: held-out WikiText-2 tokens of the first file's tokenizer (its weights are not
    # loaded: that would put the file in the page cache before its cold start).
    prompt = held_out_tokens(corpus_tokens(FileTokenizer(files[0])))[: args.prompt_tokens]
    from .plan_files import read_plan

    rows = cold_start(
        files,
        prompt=prompt,
        plan=None if args.plan is None else read_plan(args.plan),
        calib=args.calib,
        repeats=args.repeats,
        progress=not args.quiet,
    )
    if args.json != "-":
        print(f"cold start, {len(prompt)}-token prompt, fastest of {args.repeats}:")
        print(
            f"{'file':40s} {'MB':>7} {'plan':>10} {'read s':>7} {'unpack s':>8} "
            f"{'prepare s':>9} {'prefill s':>9} {'TTFT s':>7}"
        )
        for r in rows:
            print(
                f"{Path(r['file']).name[:40]:40s} {r['bytes'] / 1e6:7.1f} {r['plan']:>10} "
                f"{r['read_s']:7.3f} {r['unpack_s']:8.3f} {r['prepare_s']:9.3f} "
                f"{r['prefill_s']:9.3f} {r['ttft_s']:7.3f}"
            )
    _emit_json(
        {"machine": machine, "prompt_tokens": len(prompt), "repeats": args.repeats, "files": rows},
        args.json,
    )
    return 0


def _check_run_flags(args) -> None:
    """--cold measures cold starts instead of the main job: each mode's flags are refused in
    the other, where they would change nothing (issue 37)."""
    cold_only = {
        "--calib": args.calib,
        "--prompt-tokens": args.prompt_tokens,
        "--repeats": args.repeats,
    }
    main_only = {
        "--out": args.out,
        "--full": args.full or None,
        "--limit-tokens": args.limit_tokens,
        "--calib-samples": args.calib_samples,
    }
    flags, applies, mode = (
        (main_only, "the main job (without --cold)", "--cold times cold starts only")
        if args.cold
        else (cold_only, "--cold (cold starts)", "no --cold is given: the main job runs")
    )
    for flag, value in flags.items():
        if value is not None:
            shown = flag if value is True else f"{flag} {value}"
            raise not_applicable("run", shown, applies, mode)
    if args.cold and args.calib is not None and args.plan is None:
        raise not_applicable(
            "run", f"--calib {args.calib}", "--plan (a calibrated plan on fp32 files)",
            "no --plan is given: fp32 files run fp32",
        )  # fmt: skip
    if args.full and args.limit_tokens is not None and args.calib_samples is not None:
        raise not_applicable(
            "run",
            "--full",
            "the sizes not given (--limit-tokens, --calib-samples)",
            "both are given",
        )


def cmd_run(args) -> int:
    from .eval.report import run_main_job

    _setup(args)
    _check_run_flags(args)
    if args.cold:
        args.prompt_tokens = 128 if args.prompt_tokens is None else args.prompt_tokens
        args.repeats = 3 if args.repeats is None else args.repeats
        return cmd_cold_start(args)
    from .eval.report import (
        FULL_CALIB_SAMPLES,
        FULL_LIMIT_TOKENS,
        QUICK_CALIB_SAMPLES,
        QUICK_LIMIT_TOKENS,
    )

    limit = args.limit_tokens
    if limit is None:
        limit = FULL_LIMIT_TOKENS if args.full else QUICK_LIMIT_TOKENS
    samples = args.calib_samples
    if samples is None:
        samples = FULL_CALIB_SAMPLES if args.full else QUICK_CALIB_SAMPLES
    extra = None
    if args.plan is not None:
        from .plan_files import plan_file_path, read_plan

        path = plan_file_path(args.plan)
        extra = (path.name if path is not None else args.plan, read_plan(args.plan))
        _core.Plan(extra[1])  # an unknown plan before any work
    run_main_job(
        args.model,
        Path("socllm-out" if args.out is None else args.out),
        limit_tokens=limit,
        calib_samples=samples,
        progress=not args.quiet,
        json_dest=args.json,
        extra_plan=extra,
    )
    return 0


def split_list(text: str) -> list[str]:
    """Comma-separated items, or ';'-separated when an item has options of its own."""
    return [x.strip() for x in text.split(";" if ";" in text else ",") if x.strip()]


def cmd_sweep(args) -> int:
    from .eval.sweep import DEFAULT_CALIBRATION, SweepSettings, run_sweep

    _core.set_log_level("warn" if args.quiet else "info")
    if args.table_only and args.retry_errors:  # --address, --cpus-per-cell, --retries: a
        # rerun of the sweep's own command with --table-only keeps them (they set no result)
        raise not_applicable(
            "sweep", "--retry-errors", "cells that run", "--table-only runs none (it writes the "
            "table of the finished ones)",
        )  # fmt: skip
    settings = SweepSettings(
        limit=args.limit or None,
        fewshot=args.fewshot,
        batch_size=args.batch_size,
        context=args.context,
        windows=args.windows or None,
        cpus_per_cell=args.cpus_per_cell,
        retries=args.retries,
    )
    report = run_sweep(
        split_list(args.models),
        split_list(args.plans),
        split_list(args.tasks),
        args.out,
        calibs=args.calib or [DEFAULT_CALIBRATION],
        settings=settings,
        address=args.address,
        retry_errors=args.retry_errors,
        progress=not args.quiet,
        crash_pattern=args.inject_crash,
        table_only=args.table_only,
    )
    from .eval.sweep_plot import write_sweep_plots

    plots = write_sweep_plots(report.rows, args.out)
    print(report.table_md)
    restarted = f", {len(report.restarted)} started over" if report.restarted else ""
    print(
        f"\n{len(report.cells)} cells: {len(report.ran)} ran, {len(report.skipped)} already done, "
        f"{len(report.retried)} retried, {len(report.failed)} failed{restarted} "
        f"({report.seconds} s); table in {Path(args.out) / 'sweep.md'} and sweep.json"
        + "".join(f", plot {p.name}" for p in plots),
        file=sys.stderr,
    )
    for key, attempts in report.retried.items():
        print(f"retried: {key} ({attempts} attempts)", file=sys.stderr)
    for key, err in report.failed.items():
        print(f"FAILED: {key}: {err}", file=sys.stderr)
    if report.ray_logs:
        print(f"Ray's logs of this run: {report.ray_logs}", file=sys.stderr)
    return 1 if report.failed else 0


def _simulate_plan(args):
    """The plan --plan / --engine name (an engine is its HeteroLLM preset), checked against the
    flags that apply to it: a flag that does not apply is an error, never ignored."""
    from .errors import InvalidArgumentError

    if args.engine is not None and args.plan is not None:
        raise InvalidArgumentError(
            f"simulate: --engine {args.engine} is the plan {args.engine!r} (a HeteroLLM preset); "
            f"give --engine or --plan, not both"
        )
    from .plan_files import read_plan

    plan = args.engine or (read_plan(args.plan) if args.plan is not None else "shadow-outlier")
    if args.phase == "decode" and args.chunk is not None:
        raise InvalidArgumentError(
            f"simulate: --chunk {args.chunk} applies to a prompt (--phase prefill or session), "
            "not to one decoding step"
        )
    if args.phase != "session" and args.decode_tokens is not None:
        raise InvalidArgumentError(
            f"simulate: --decode-tokens applies to --phase session, not {args.phase}"
        )
    if args.phase == "session" and args.decode_tokens is None:
        raise InvalidArgumentError("simulate: --phase session needs --decode-tokens N")
    if args.runtime_graph_build and args.phase == "decode":
        raise InvalidArgumentError(
            "simulate: --runtime-graph-build builds a prompt's NPU graphs, not a decoding step's"
        )
    if args.config is not None:
        # (--threads, a resource setting every command takes, is not a result option)
        for flag, value, what in (
            ("--calib", args.calib, "the static plans of a real model (--model)"),
        ):
            if value is not None:
                raise not_applicable(
                    "simulate",
                    f"{flag} {value}",
                    what,
                    "a shape-only --config runs no engine",
                )
    from .sim.timeline import _plan, check_fast_sync, check_runtime_graph_build

    timed = _plan(plan, args.processor)
    if args.no_fast_sync:
        check_fast_sync(timed, args.phase, "--no-fast-sync")
    if args.runtime_graph_build:
        check_runtime_graph_build(timed, "--runtime-graph-build")
    return plan


def _fitted_device(device: str, params: str | None):
    """``device`` (a profile name or path) as is, or under the SoC-model parameters ``params``
    (``fitted``: the committed vector; a path: one ``socllm fidelity --write`` stored)."""
    if params is None:
        return device
    from .fidelity.model import DEVICES, SocModel

    if device not in DEVICES:
        raise InvalidArgumentError(
            f"simulate: --device-params applies to the phones the SoC model covers "
            f"({', '.join(DEVICES)}), not {device!r}"
        )
    return SocModel.fitted(None if params == "fitted" else params).profile(device)


def cmd_simulate(args) -> int:
    from .sim import timeline as sim

    _setup(args)
    if (args.config is None) == (args.model is None):
        raise InvalidArgumentError("simulate: give exactly one of --config (shape-only) or --model")
    device_file = args.device if Path(args.device).is_file() else None  # a profile .json
    params_file = None if args.device_params in (None, "fitted") else args.device_params
    inputs = _inputs(args.model, args.calib, device_file, params_file)
    device = _fitted_device(args.device, args.device_params)
    _check_outputs({"--trace": args.trace, "--json": args.json}, inputs)
    plan = _simulate_plan(args)
    chunk = (256 if args.chunk is None else args.chunk) if args.phase != "decode" else 0
    policy = args.policy or ("first-ready" if args.engine else "npu-stall-first")
    timing = {
        "characterization": args.characterization or "",
        "fast_sync": False if args.no_fast_sync else None,
    }
    if args.config is not None:
        tl = sim.simulate(
            args.config,
            device,
            plan,
            args.prompt_len,
            chunk=chunk,
            policy=policy,
            processor=args.processor,
            runtime_graph_build=args.runtime_graph_build,
            phase=args.phase,
            decode_tokens=args.decode_tokens or 0,
            **timing,
        )
    else:
        from .calibration import corpus_tokens, held_out_tokens
        from .model import load

        if args.runtime_graph_build:
            raise InvalidArgumentError(
                "simulate: --runtime-graph-build times a config's naive NPU execution (--config)"
            )
        model = load(args.model, calib=args.calib, progress=not args.quiet)
        ids = held_out_tokens(corpus_tokens(model))[: args.prompt_len]
        # a decoding step runs after its prompt: the engine records both (a session of one step)
        steps = 1 if args.phase == "decode" else args.decode_tokens or 0
        tl = sim.simulate_model(
            model,
            ids,
            device,
            plan,
            chunk=chunk or None,
            policy=policy,
            processor=args.processor,
            decode_tokens=steps,
            **timing,
        )
    s = tl.summary()
    name = f"engine {args.engine}" if args.engine else f"plan {s['plan']}"
    busy = ", ".join(
        f"{p} {v:.1f} ms ({100 * s['bubble_rate'][p]:.0f}% bubbles)"
        for p, v in s["busy_ms"].items()
    )
    head = f"{s['config']} on {s['device']}, {name}, {s['policy']}"
    if args.phase == "decode":
        print(
            f"{head}: decode at {args.prompt_len + 1} positions {s['tpot_ms']:.1f} ms = "
            f"{s['decode_tokens_per_s']:.2f} tokens/s; busy: {busy}",
            file=sys.stderr,
        )
    else:
        line = (
            f"{head}: prompt {s['prompt_len']}, prefill {s['prefill_ms']:.1f} ms = "
            f"{s['prefill_tokens_per_s']:.1f} tokens/s"
        )
        if args.phase == "session":
            line += (
                f", then {args.decode_tokens} tokens at {s['tpot_ms']:.1f} ms each "
                f"({s['decode_tokens_per_s']:.2f} tokens/s), {s['total_ms']:.1f} ms in all"
            )
        print(f"{line}, energy {s['energy_mj']:.0f} mJ; busy: {busy}", file=sys.stderr)
    if args.trace:
        tl.to_perfetto(args.trace)
        if args.trace != "-":
            print(f"wrote {args.trace}", file=sys.stderr)
    _emit_json({k: v for k, v in s.items() if k != "engine_graphs"}, args.json)
    return 0


def cmd_frontier(args) -> int:
    from .io.files import write_output
    from .plan_frontier.pareto import check_objectives
    from .plan_frontier.run import frontier, markdown, to_json
    from .plan_frontier.space import build_space, parse_axes, parse_presets

    _setup(args)
    if args.out is None and args.json is None:
        args.out = "socllm-frontier"
    _check_outputs({"--json": args.json}, _inputs(args.model, args.calib))
    axes = parse_axes(args.axis or [])
    presets = parse_presets(args.presets)
    if args.address is not None and not args.ray:
        raise not_applicable(
            "frontier", f"--address {args.address}", "Ray's cluster", "--ray is not given"
        )
    validate_tasks = []
    if args.validate_tasks is not None:
        from .eval.lmeval.task_configs import resolve_task

        validate_tasks = [t.strip() for t in args.validate_tasks.split(",") if t.strip()]
        if not validate_tasks:
            raise InvalidArgumentError(f"frontier: --validate-tasks {args.validate_tasks!r}")
        for t in validate_tasks:
            try:
                resolve_task(t)  # an unknown task before any work
            except ValueError as e:
                raise InvalidArgumentError(f"frontier: --validate-tasks: {e}") from None
    build_space(axes, presets, args.plan_options)  # unknown axis, preset, option: before work
    objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    try:
        check_objectives(objectives)
    except ValueError as e:
        raise InvalidArgumentError(f"frontier: {e}") from None
    budgets = {
        "max_dnll": args.max_dnll,
        "max_ttft_ms": args.max_ttft_ms,
        "max_energy_mj": args.max_energy_mj,
        "max_memory_mb": args.max_memory_mb,
        "min_decode_tokens_per_s": args.min_decode_tokens_per_s,
    }
    device = _fitted_device(args.device, args.device_params)
    if args.device_params is None:
        _core.sim.load_device(args.device)  # an unknown device before any work
    if args.calib is not None and args.calib_samples is not None:
        raise not_applicable(
            "frontier", f"--calib-samples {args.calib_samples}",
            "the calibration the command makes", f"--calib {args.calib} is given",
        )  # fmt: skip
    from .model import load
    from .registry import cache_dir

    if args.cache:
        cache = Path(args.cache)
    else:
        cache = Path(args.out, "cache") if args.out else cache_dir() / "frontier"
    model = load(args.model, calib=args.calib, progress=not args.quiet)
    if args.calib is None:
        from .plan_frontier.calibrate import calibrate_for

        samples = 16 if args.calib_samples is None else args.calib_samples
        calibrate_for(
            model, axes, cache, presets=presets, plan_options=args.plan_options,
            samples=samples, progress=not args.quiet,
        )  # fmt: skip
    rep = frontier(
        model, device, prompt_len=args.prompt_len, decode_tokens=args.decode_tokens,
        axes=axes, budgets=budgets, windows=args.windows, context=args.context,
        max_evals=args.max_evals, z=args.z, objectives=objectives, cache_dir=cache,
        out_dir=args.out, progress=not args.quiet, policy=args.policy or "npu-stall-first",
        characterization=args.characterization or "", presets=presets,
        plan_options=args.plan_options,
        validate_tasks=validate_tasks, validate_limit=args.validate_limit, ray=args.ray,
        address=args.address,
    )  # fmt: skip
    if args.json is not None:
        write_output(args.json, to_json(rep), what="--json")
    if args.json != "-":
        print(markdown(rep), end="")
        if args.out:
            print(f"wrote {args.out}/frontier.html (and .json, .md, .png; plans/*.json)")
    return 0 if rep["recommended"] else 3


def cmd_fidelity(args) -> int:
    from . import fidelity
    from .io.files import write_output

    _setup(args)
    outs = {"--json": args.json, "--markdown": args.markdown, "--write": args.write}
    _check_outputs(outs, [])
    if args.results is not None:
        fidelity.check_results_file(args.results)
    rep = fidelity.run(
        quick=args.quick,
        k=args.folds,
        seed=args.seed,
        progress=not args.quiet,
        cross_validate=args.folds > 0,
        max_evals=args.max_evals,
        workers=args.workers,
    )
    command = "socllm fidelity" + (" --quick" if args.quick else "")
    if args.folds != 5:
        command += f" --folds {args.folds}"
    text = fidelity.markdown(rep, command)
    if args.json != "-" and args.markdown != "-":
        print(fidelity.headline(rep))
    _emit_json(rep, args.json)
    if args.markdown is not None:
        write_output(args.markdown, text, what="--markdown")
    if args.results is not None:
        fidelity.write_results_block(args.results, text)
    if args.write is not None:
        fidelity.write_parameters(rep, args.write)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="socllm", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser(
        "convert",
        help="GGUF file or HF model directory -> socllm HDF5 model; with --edgeflow-bits, any "
        "model socllm.load takes -> a file of prequantized (EdgeFlow-packed) linears",
    )
    c.add_argument("source")
    c.add_argument("-o", "--output", required=True)
    c.add_argument("--calib", default=None, help="calibration file (with --edgeflow-bits)")
    c.add_argument(
        "--edgeflow-bits",
        type=_number(float, 1, 8),
        default=None,
        help="store the linears of plan edgeflow:bits=B as weightlets (seed 004 §4.2)",
    )
    c.add_argument(
        "--edgeflow-plan",
        default=None,
        help="the plan to prequantize for instead (e.g. 'edgeflow:bits=8,allocation=uniform': "
        "an INT8 model file)",
    )
    c.add_argument(
        "--group",
        type=_COUNT,
        default=None,
        help="with --edgeflow-bits / --edgeflow-plan: weightlet group R (weights, a multiple of "
        "8; default 128)",
    )
    _common(c)
    c.set_defaults(fn=cmd_convert)

    e = sub.add_parser("eval", help="evaluate a model under one or more plans")
    e.add_argument("--model", default="smollm2-135m", help="built-in name, .gguf, HF dir or .h5")
    e.add_argument(
        "--plan",
        action="append",
        help="plan name, name:key=value,..., JSON, or a plan file (@PATH or PATH.json); repeat "
        "or comma-separate for several "
        "(default fp32; see socllm.Plan.known())",
    )
    e.add_argument("--calib", default=None, help="calibration file (socllm calibrate)")
    e.add_argument(
        "--limit",
        type=_COUNT,
        default=None,
        help="lm-eval tasks: documents per task (mmlu: spread over its 57 subjects)",
    )
    e.add_argument(
        "--task",
        default=None,
        help=f"comma-separated tasks: {', '.join(TASKS)} (default wikitext2, none with --metrics)",
    )
    e.add_argument(
        "--metrics",
        default=None,
        help="kl,top1,ppl: each plan's next-token distribution against --reference on held-out "
        "WikiText-2 windows (socllm.eval.divergence), errors over windows",
    )
    e.add_argument(
        "--reference", default=None, help="--metrics: the plan compared against (default fp32)"
    )
    e.add_argument(
        "--device",
        default=None,
        help="--metrics: plan every plan for this device and time the graph its first window "
        "executed (accuracy and simulated time of the same numerics)",
    )
    e.add_argument(
        "--decode-tokens",
        type=_COUNT,
        default=None,
        help="--device: greedy decoding steps after the window's prompt, on the same timeline",
    )
    _add_policy(e, "with --device: the timing's scheduling policy (default npu-stall-first)")
    e.add_argument(
        "--windows",
        type=_number(int, 1, zero=True),
        default=None,
        help="--metrics: held-out windows of --context tokens (0 = all; default 16)",
    )
    e.add_argument("--limit-tokens", type=_WINDOW, default=None, help="use only the first N tokens")
    e.add_argument(
        "--context",
        type=_WINDOW,
        default=None,
        help="window in tokens: perplexity tasks (default 2048), --metrics (default 512)",
    )
    e.add_argument("--stride", type=_COUNT, default=None, help="window stride (default = context)")
    e.add_argument(
        "--batch-size",
        type=_COUNT,
        default=None,
        help="perplexity tasks: windows per engine call (default 1); lm-eval tasks: requests "
        "(at least 8)",
    )
    e.add_argument("--json", default=None, metavar="PATH|-", help="write results as JSON")
    _common(e)
    e.set_defaults(fn=cmd_eval)

    k = sub.add_parser("calibrate", help="offline calibration statistics -> HDF5")
    k.add_argument("--model", default="smollm2-135m")
    from .calibration import STEPS

    k.add_argument(
        "--steps",
        default="act-scales",
        help="comma-separated, run in order: "
        + "; ".join(f"{s.name}: {s.description}" for s in STEPS.values()),
    )
    k.add_argument(
        "--calib",
        default=None,
        help="continue from this calibration file (e.g. --steps pruning-rate); --out may name "
        "the same file to update it",
    )
    # the plan parts rotate, rotate_seed, rotate_down, rotate_heads (plan.h)
    k.add_argument(
        "--rotate",
        default=None,
        choices=["none", "fold", "hadamard", "random"],
        help="gather the statistics on the model with its residual stream rotated (QuaRot; "
        "issue 39): the file records the rotation and serves the plans with the same rotate "
        "parts (w8a8:rotate=hadamard) only",
    )
    k.add_argument("--rotate-seed", type=int, default=None, help="the rotation's seed (0)")
    k.add_argument(
        "--rotate-down",
        default=None,
        choices=["none", "hadamard"],
        help="rotate the down projection's input online (plan part rotate_down)",
    )
    k.add_argument(
        "--rotate-heads",
        default=None,
        choices=["none", "hadamard"],
        help="rotate every head's values (plan part rotate_heads)",
    )
    # one flag per step option, from the core's registry (cpp/calibrate/steps.h)
    takers: dict = {}
    for s in STEPS.values():
        for name in s.options:
            takers.setdefault(name, []).append(s)
    for name, steps in takers.items():
        default = steps[0].options[name]
        k.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            choices=steps[0].choices.get(name),
            default=None,
            help=f"{steps[0].help[name]} ({', '.join(x.name for x in steps)}; default "
            f"{default})".replace("%", "%%"),
        )
    k.add_argument(
        "--out",
        required=True,
        help="calibration HDF5 file, written atomically (it may be the --calib file: continuing "
        "from a file and writing it back is an update)",
    )
    k.add_argument("--json", default=None, metavar="PATH|-")
    _common(k)
    k.set_defaults(fn=cmd_calibrate)

    m = sub.add_parser(
        "simulate",
        help="timeline of a prefill, a decoding step or a session on a modelled phone SoC",
    )
    m.add_argument(
        "--config", default=None, help="shape-only model config (socllm.configs.known())"
    )
    m.add_argument("--model", default=None, help="or a real model: runs its engine on WikiText-2")
    m.add_argument("--calib", default=None, help="with --model: calibration file for static plans")
    m.add_argument("--device", default="snapdragon-8gen3", help="profile name or .json path")
    m.add_argument(
        "--plan",
        default=None,
        help="plan name, name:key=value,... or a plan file (@PATH or PATH.json; default "
        "shadow-outlier); every part composes, "
        "e.g. edgeflow:bits=5,partition=solver,attention=shadow-attn",
    )
    m.add_argument("--prompt-len", type=_COUNT, default=1024)
    m.add_argument(
        "--chunk",
        type=_number(int, 1, zero=True),
        default=None,
        help="prefill chunk length (0: whole prompt; default 256)",
    )
    from ._core import sim as _sim

    _add_policy(m, "default npu-stall-first (first-ready with --engine)")
    m.add_argument("--processor", choices=("auto", "npu", "cpu", "gpu"), default="auto")
    engines = _sim.hetero_engines()
    m.add_argument(
        "--engine",
        choices=[e["name"] for e in engines],
        default=None,
        help="a HeteroLLM engine: the plan preset of that name (seed 002; same as --plan NAME, "
        "first-ready policy): " + "; ".join(f"{e['name']}: {e['description']}" for e in engines),
    )
    m.add_argument(
        "--phase",
        choices=("prefill", "decode", "session"),
        default="prefill",
        help="prefill of --prompt-len tokens; decode: one decoding step on a cache of "
        "--prompt-len (the plan's decode placement); session: the prefill, then "
        "--decode-tokens steps on one timeline",
    )
    m.add_argument(
        "--decode-tokens", type=_COUNT, default=None, help="with --phase session: tokens decoded"
    )
    m.add_argument(
        "--no-fast-sync",
        action="store_true",
        help="time GPU-NPU edges with conventional synchronization (seed 002 §5.4 ablation; "
        "the partitions stay those the plan solved)",
    )
    m.add_argument(
        "--characterization",
        default=None,
        help="time with the device's named cost-model variant (heterollm, llmnpu-table3, "
        "llmnpu-e2e); default: the plan's (HeteroLLM's presets: heterollm)",
    )
    m.add_argument(
        "--runtime-graph-build",
        action="store_true",
        help="build and optimize the NPU graph at run time (naive NPU execution)",
    )
    m.add_argument(
        "--device-params",
        default=None,
        metavar="fitted|PATH",
        help="time on --device under the SoC-model parameters that explain the four papers "
        "together (socllm fidelity; fitted: the committed vector, or a file --write stored)",
    )
    m.add_argument(
        "--trace", default=None, metavar="PATH|-", help="write a Chrome/Perfetto trace JSON"
    )
    m.add_argument("--json", default=None, metavar="PATH|-")
    _common(m)
    m.set_defaults(fn=cmd_simulate)

    from .eval.sweep import PRESET_PLANS, sweep_tasks

    w = sub.add_parser(
        "sweep",
        help="models x calibrations x plans x tasks as Ray tasks, resumable, one paired table",
        description="Each cell is a Ray task; results are written atomically under --out and a "
        "rerun skips finished cells. fp32 is always in the grid: every row is paired with it.",
    )
    w.add_argument("--models", default="smollm2-135m", help="comma-separated names or paths")
    w.add_argument(
        "--plans",
        default=",".join(PRESET_PLANS),
        help="comma-separated (';' when a plan has options)",
    )
    w.add_argument(
        "--tasks",
        default=",".join(sweep_tasks()),
        help=f"comma-separated: {', '.join(sweep_tasks())}",
    )
    w.add_argument(
        "--calib",
        action="append",
        help="calibration setting, repeatable: none, or steps joined by + with options, e.g. "
        "act-scales or act-scales+outliers:samples=64 (default act-scales)",
    )
    w.add_argument(
        "--limit",
        type=_number(int, 1, zero=True),
        default=0,
        help="documents per lm-eval task (0 = all; mmlu: spread over 57 subjects)",
    )
    w.add_argument("--fewshot", type=_number(int, 0), default=None)
    w.add_argument("--batch-size", type=_COUNT, default=8)
    w.add_argument("--context", type=_WINDOW, default=512, help="wikitext2-heldout window")
    w.add_argument(
        "--windows",
        type=_number(int, 1, zero=True),
        default=16,
        help="wikitext2-heldout windows (0 = all)",
    )
    w.add_argument("--cpus-per-cell", type=_COUNT, default=2, help="Ray CPUs and threads per cell")
    w.add_argument(
        "--retries", type=_number(int, 0), default=2, help="Ray retries of a failed cell"
    )
    w.add_argument(
        "--address",
        default=None,
        help="an existing Ray cluster (auto, ip:port or ray://...); default: start one locally",
    )
    w.add_argument("--out", default="socllm-out/sweep", help="cells, calibrations and the table")
    w.add_argument(
        "--retry-errors", action="store_true", help="rerun cells that ended in a socllm error"
    )
    w.add_argument(
        "--table-only", action="store_true", help="run nothing: the table of the finished cells"
    )
    w.add_argument("--inject-crash", default=None, help=argparse.SUPPRESS)  # tests: kill a worker
    w.add_argument("--quiet", action="store_true", help="no progress bar, C++ logs at warn level")
    w.set_defaults(fn=cmd_sweep)

    f = sub.add_parser(
        "fidelity",
        help="one SoC model against the four papers' numbers: fit, cross-validation, tables",
        description="Gathers every paper number socllm reproduces (llm.npu, shadowAttn, "
        "HeteroLLM, EdgeFlow), predicts each with the simulator under one vector of device "
        "parameters, fits the vector on a chosen subset (log least squares, Eigen) and reports "
        "held-out errors by leave-one-paper-out and k-fold cross-validation.",
    )
    f.add_argument(
        "--quick",
        action="store_true",
        help="the cheap subset of targets whose simulations take milliseconds (the test tier's)",
    )
    f.add_argument(
        "--folds",
        type=_number(int, 2, zero=True),
        default=5,
        help="k of the k-fold cross-validation (0: no cross-validation; default 5)",
    )
    f.add_argument("--seed", type=int, default=0, help="seed of the fold assignment")
    f.add_argument(
        "--max-evals",
        type=_COUNT,
        default=400,
        help="residual evaluations per fit round (a fit takes up to 3 rounds; default 400)",
    )
    f.add_argument(
        "--workers",
        type=_COUNT,
        default=2,
        help="processes for the cross-validation fits (default 2)",
    )
    f.add_argument("--json", default=None, metavar="PATH|-", help="the report as JSON")
    f.add_argument("--markdown", default=None, metavar="PATH|-", help="the tables as Markdown")
    f.add_argument(
        "--results",
        default=None,
        metavar="RESULTS.md",
        help="replace the generated block between the fidelity markers of this file",
    )
    f.add_argument(
        "--write",
        default=None,
        metavar="PATH",
        help="the fitted parameters as data (JSON: value, unit, bounds, source of each)",
    )
    _common(f)
    f.set_defaults(fn=cmd_fidelity)

    fr = sub.add_parser(
        "frontier",
        help="which plan to ship: the accuracy / TTFT (/ energy / memory) frontier of composed "
        "plans on a modelled phone (exit status 3: no plan meets the budgets)",
    )
    fr.add_argument("--model", default="smollm2-135m")
    fr.add_argument(
        "--calib",
        default=None,
        help="calibration file with the steps the space's plans read (default: made for the "
        "space and cached, --calib-samples windows of 512; head importance by Taylor)",
    )
    fr.add_argument("--calib-samples", type=_COUNT, default=None, help="see --calib (default 16)")
    fr.add_argument("--device", default="snapdragon-8gen3", help="profile name or .json path")
    fr.add_argument(
        "--device-params", default=None, metavar="fitted|PATH",
        help="time on the SoC model's fitted parameters (socllm fidelity)",
    )  # fmt: skip
    fr.add_argument(
        "--characterization", default=None,
        help="time every plan with the device's named cost-model variant (heterollm, "
        "llmnpu-table3, llmnpu-e2e): one reading of its NPU; default: each plan's own",
    )  # fmt: skip
    fr.add_argument(
        "--presets", default="all", metavar="all|none|NAME,NAME",
        help="the core's preset plans searched with the space, each reported as beaten or "
        "not by a frontier plan (default all)",
    )  # fmt: skip
    fr.add_argument(
        "--plan-options", default="", metavar="K=V,K=V",
        help="options every plan of the space and every preset gets, e.g. residual_scale=auto "
        "(Gemma 3's residual stream overflows binary16 without it)",
    )  # fmt: skip
    fr.add_argument("--prompt-len", type=_COUNT, default=1024)
    fr.add_argument("--decode-tokens", type=_COUNT, default=16)
    _add_policy(fr, "the scheduler every plan's executed graph is timed under (npu-stall-first)")
    fr.add_argument(
        "--axis",
        action="append",
        metavar="NAME=V1|V2|...",
        help="an axis of the space replacing its default: linear, attention, partition, "
        "chunk_len (values separated by '|'; repeat for several axes)",
    )
    fr.add_argument(
        "--objectives",
        default="dnll,ttft_ms",
        help="the frontier's objectives (default dnll,ttft_ms; also energy_mj, memory_mb, "
        "decode_tokens_per_s)",
    )
    for flag, what in (
        ("--max-dnll", "mean ΔNLL from fp32, nats/token"),
        ("--max-ttft-ms", "time to the first token"),
        ("--max-energy-mj", "energy of the request"),
        ("--max-memory-mb", "peak memory"),
        ("--min-decode-tokens-per-s", "decoding speed"),
    ):
        fr.add_argument(flag, type=float, default=None, help=f"budget: {what}")
    fr.add_argument(
        "--windows", type=_number(int, 2), default=16,
        help="held-out windows for the plans still on the frontier at the end (default 16)",
    )  # fmt: skip
    fr.add_argument("--context", type=_WINDOW, default=512, help="tokens per window (512)")
    fr.add_argument(
        "--max-evals", type=_COUNT, default=None, help="cap on plan x window evaluations"
    )
    fr.add_argument(
        "--z", type=_number(float, 0), default=2.0,
        help="a plan is dropped when another's ΔNLL is lower by z standard errors (default 2)",
    )  # fmt: skip
    fr.add_argument(
        "--validate-tasks", default=None, metavar="TASK,TASK",
        help="score the frontier's members on these lm-eval tasks (e.g. hellaswag,arc_easy,"
        "piqa) and compare their order with the ΔNLL's: rank correlation with its interval",
    )  # fmt: skip
    fr.add_argument(
        "--validate-limit", type=_COUNT, default=200, help="documents per validation task (200)"
    )
    fr.add_argument(
        "--ray", action="store_true",
        help="score windows and time plans as Ray tasks (a worker that dies is run again)",
    )  # fmt: skip
    fr.add_argument(
        "--address", default=None,
        help="with --ray: an existing Ray cluster (auto, ip:port or ray://...); default: local",
    )  # fmt: skip
    fr.add_argument("--json", default=None, metavar="PATH|-", help="the report as JSON")
    fr.add_argument(
        "--out", default=None, help="report directory (default socllm-frontier unless --json)"
    )
    fr.add_argument(
        "--cache",
        default=None,
        help="per-plan results (default OUT/cache, or the socllm cache folder with --json only): "
        "a rerun reuses them",
    )
    _common(fr)
    fr.set_defaults(fn=cmd_frontier)

    r = sub.add_parser("run", help="the main job on a model: generate, evaluate, report")
    r.add_argument("--model", default="smollm2-135m")
    r.add_argument("--out", default=None, help="report directory (default socllm-out)")
    r.add_argument(
        "--full",
        action="store_true",
        help="the full table: 16384 held-out tokens per plan, 32 calibration windows (default: "
        "a demonstration of a few minutes, 4096 tokens and 16 windows)",
    )
    r.add_argument(
        "--limit-tokens",
        type=_number(int, MIN_WINDOW, zero=True),
        default=None,
        help="WikiText-2 held-out tokens to evaluate per plan (0 = all of them)",
    )
    r.add_argument("--calib-samples", type=_COUNT, default=None, help="calibration windows of 512")
    r.add_argument(
        "--cold",
        action="store_true",
        help="instead of the main job: time to first token of each --model file (comma-separated) "
        "evicted from the page cache, split into read / unpack / prepare / prefill",
    )
    r.add_argument(
        "--plan",
        default=None,
        help="a plan (text or file: @PATH, PATH.json, e.g. socllm frontier's recommendation) "
        "evaluated and timed next to the presets; with --cold: the plan for fp32 files "
        "(default fp32)",
    )
    r.add_argument("--calib", default=None, help="--cold: calibration for --plan on fp32 files")
    r.add_argument(
        "--prompt-tokens", type=_COUNT, default=None, help="--cold: prompt length (default 128)"
    )
    r.add_argument(
        "--repeats",
        type=_COUNT,
        default=None,
        help="--cold: runs per file, fastest kept (default 3)",
    )
    r.add_argument("--json", default=None, metavar="PATH|-")
    _common(r)
    r.set_defaults(fn=cmd_run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import SocllmError

    try:
        return args.fn(args)
    except (SocllmError, OSError, ValueError) as e:  # the user's files and values: no traceback
        notes = "".join(f"\n  {n}" for n in getattr(e, "__notes__", ()))
        print(f"socllm {args.command}: error: {e}{notes}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
