"""Timelines of a prefill, a decoding step or a session (prompt, then decoding steps) on a
modelled phone SoC (DESIGN.md, "one task graph, two interpretations"). Everything is
computed in C++ (cpp/sim/simulate.h): the block description turns (config, plan, prompt
length, chunk length) into the operator-level task graph (block.h), the discrete-event
simulator times it on a device profile (simulator.h). This module
is a view over that result.

* :func:`task_graph` gives the graph of a config (a shape-only config of ``socllm.configs``, a
  config dict, or a loaded model: then with its calibrated shadow-outlier pruning).
* :func:`simulate` times a config's prefill (``phase``: or a decoding step, or a session);
  shadow-outlier loads are expected ones (for a
  shape-only config: ``shadow_channels`` per linear input per chunk, seed 001 §3.3 Fig. 10).
* :func:`simulate_model` runs the prompt in a loaded model's engine and times the graph that
  prefill executed, with the outlier channels and cold fetches each linear input really had.

Placement is the plan's (``socllm.Plan(name).placement``): presets whose linears a static NPU
graph runs (``w8a8``, ``smoothquant``, ``shadow-outlier``, ``w8-group`` ...) carry llm.npu's
placement; move an op class with ``Plan.placed("attention", "gpu")`` or ``"w8a8:attention=gpu"``.
``processor="cpu"|"gpu"|"npu"`` puts every op class on one processor (the single-processor
baselines), float ops in fp16 off the CPU.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _core
from ..configs import load_config
from ..devices import load_profile
from ..errors import (
    InvalidArgumentError,
    bool_arg,
    int_arg,
    ints_arg,
    not_applicable,
    real_arg,
    reals_arg,
    str_arg,
)
from ..io.files import write_output

TaskGraph = _core.sim.TaskGraph


def policies() -> list[dict]:
    """The scheduling policies (defined in C++, simulator.h): ``name``, ``alias`` (the earlier
    short name, still accepted) and ``description``."""
    return _core.sim.policies()


PHASES = ("prefill", "decode", "session")


def _plan(
    plan, processor: str = "auto", chunk_len: int | None = None, fn: str = "simulate"
) -> _core.Plan:
    p = plan if isinstance(plan, _core.Plan) else _core.Plan(plan)
    str_arg(fn, "processor", processor)
    if processor != "auto":  # the C++ core names an unknown processor and lists the known ones
        p = p.all_on(processor)
    if chunk_len is not None:
        p = p.with_chunk_len(chunk_len)
    return p


# -- which options a request uses (issue 37: an option that would change nothing is refused) --


def timed_plans(p: _core.Plan, phase: str) -> list[tuple[str, _core.Plan]]:
    """(what, plan) of each part of a request of ``phase``: the prompt's plan, the decoding
    steps' (``Plan.for_decode()``), or both for a session."""
    if phase == "decode":
        return [("its decoding step", p.for_decode())]
    if phase == "session":
        return [("its prompt", p), ("its decoding steps", p.for_decode())]
    return [("its prompt", p)]


def plan_processors(p: _core.Plan) -> set[str]:
    """The processors a plan's ops run on (a partitioned linear runs on the GPU and the NPU)."""
    procs = {v["processor"] for v in p.placement.values()}
    if p.partition["mode"] != "none":
        procs |= {"gpu", "npu"}
    return procs


def check_fast_sync(p: _core.Plan, phase: str, option: str, fn: str = "simulate") -> None:
    """``fast_sync`` times GPU-NPU edges: refused when no part of the request runs on both."""
    parts = timed_plans(p, phase)
    if not any({"gpu", "npu"} <= plan_processors(q) for _, q in parts):
        where = " and ".join(
            f"{what} runs on {', '.join(sorted(plan_processors(q) & {'cpu', 'gpu', 'npu'}))}"
            for what, q in parts
        )
        raise not_applicable(
            fn,
            option,
            "the synchronization of GPU and NPU work",
            f"plan {p.name!r} has no GPU-NPU edge to time ({where})",
        )


def check_runtime_graph_build(p: _core.Plan, option: str, fn: str = "simulate") -> None:
    """Run-time graph building times a prompt's NPU graphs: refused when nothing runs there."""
    if "npu" not in plan_processors(p):
        raise not_applicable(
            fn,
            option,
            "the NPU graphs of a prompt",
            f"plan {p.name!r} places nothing on the NPU "
            f"({', '.join(sorted(plan_processors(p) & {'cpu', 'gpu', 'npu'}))} only)",
        )


def _check_timing_options(
    p: _core.Plan,
    phase: str,
    *,
    shadow_channels: float,
    head_ratios,
    rescore_share: float,
) -> None:
    """The options of :func:`simulate` that apply to some plans only, checked before work."""
    parts = timed_plans(p, phase)
    if shadow_channels != _core.DEFAULT_SHADOW_CHANNELS and not any(
        q.to_json()["ops"]["linear"]["shadow_outliers"] is not None for _, q in parts
    ):
        raise not_applicable(
            "simulate",
            f"shadow_channels={shadow_channels!r}",
            "shadow-outlier linears (their expected outlier channels)",
            f"plan {p.name!r} has none in " + " or ".join(what for what, _ in parts),
        )
    kinds = [q.attention.get("kind") for _, q in parts]
    if head_ratios is not None and not any("keep" in q.attention for _, q in parts):
        raise not_applicable(
            "simulate",
            "head_ratios",
            "attention that keeps a share of keys per head (sparse, block-sparse, shadow-attn)",
            f"plan {p.name!r} times attention {' then '.join(dict.fromkeys(kinds))}",
        )
    if rescore_share != 1.0 and not any(
        q.attention.get("kind") == "shadow-attn" and q.attention.get("certified") for _, q in parts
    ):
        raise not_applicable(
            "simulate",
            f"rescore_share={rescore_share!r}",
            "certified shadow-attn (attention=shadow-attn,certified=1)",
            f"plan {p.name!r} times attention {' then '.join(dict.fromkeys(kinds))}"
            + (", not certified" if "shadow-attn" in kinds else ""),
        )


def _check_head_pipeline_options(res, p: _core.Plan, given: dict) -> None:
    """head_policy, max_fused_heads and head_buckets shape NPU-CPU head pipelines (shadow-attn):
    refused when the request planned none (they changed nothing)."""
    if given and not res.head_plans:
        option = ", ".join(f"{k}={v!r}" if k != "head_buckets" else k for k, v in given.items())
        raise not_applicable(
            "simulate",
            option,
            "the NPU-CPU head pipelines of shadow-attn attention",
            f"plan {p.name!r} planned none (its attention is "
            f"{p.attention.get('kind')}; e.g. attention=shadow-attn)",
        )


def _config(config) -> dict:
    if isinstance(config, str):
        return load_config(config)
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "config"):  # a LanguageModel
        return dict(config.config)
    raise InvalidArgumentError(
        "a config is a name of socllm.configs, a dict or a loaded model, got "
        f"{type(config).__name__}"
    )


def _chunk(chunk_len: int | None, prompt_len: int, fn: str) -> int:
    """An explicit chunk length must be in [1, prompt_len or more]; None runs the prompt whole."""
    if chunk_len is None:
        return 0
    if isinstance(chunk_len, bool) or not isinstance(chunk_len, (int, np.integer)):
        raise InvalidArgumentError(f"{fn}: chunk_len must be an int or None, got {chunk_len!r}")
    if chunk_len < 1:
        raise InvalidArgumentError(
            f"{fn}: chunk_len must be >= 1, got {chunk_len} (None runs the prompt as one chunk)"
        )
    return int_arg(fn, "chunk_len", chunk_len)


def task_graph(config_or_model, plan="fp32", prompt_len: int = 512, chunk_len: int | None = None):
    """The prefill task graph of ``prompt_len`` tokens in chunks of ``chunk_len`` (None: the plan's
    ``chunk_len``, 0 there meaning the whole prompt) from the config alone (block.h). For a loaded
    model the shadow-outlier pruning and expected loads come from its calibration; the graph then
    equals what ``m.prefill(ids, plan, chunk_len=..., return_graph=True)`` executes, task for task,
    but for the measured loads. ``TaskGraph.to_json()`` is documented in docs/ARCHITECTURE.md."""
    p = _plan(plan)
    prompt_len = int_arg("task_graph", "prompt_len", prompt_len, 1)
    chunk = p.chunk_len if chunk_len is None else _chunk(chunk_len, prompt_len, "task_graph")
    if hasattr(config_or_model, "_engine"):
        return config_or_model.task_graph(p, prompt_len, chunk or None)
    return _core.task_graph(_config(config_or_model), p, prompt_len, chunk)


@dataclass
class Timeline:
    """One simulated prefill, decoding step or session: a view over the C++ result (graph,
    schedule, summary)."""

    result: _core.sim.PrefillTimeline
    profile: dict = field(default_factory=dict, repr=False)
    optimal_max_tasks: int = 24
    extra: dict = field(default_factory=dict)  # what the caller adds to summary()

    @property
    def graph(self) -> TaskGraph:
        return self.result.graph

    @property
    def core(self) -> _core.sim.Timeline:
        return self.result.timeline

    @property
    def prompt_len(self) -> int:
        return self.graph.meta["prompt_len"]

    def with_policy(self, policy: str, device: str | dict | None = None) -> Timeline:
        """The same task graph under another scheduling policy (and/or device profile), with
        this timeline's search limit for the optimal policy."""
        profile = self.profile if device is None else _profile(device)
        str_arg("with_policy", "policy", policy)
        res = _core.sim.simulate_graph(self.graph, profile, policy, self.optimal_max_tasks)
        return Timeline(res, profile, self.optimal_max_tasks, dict(self.extra))

    @property
    def head_plans(self) -> list[dict]:
        """The head pipelines planned for this timeline (seed 000 §3.4): per chunk and layer the
        ``plan`` (launch and head order, latency, planner time) and its ``problem`` ([] for a
        cold start)."""
        return getattr(self.result, "head_plans", [])

    @property
    def tasks(self) -> list[dict]:
        return self.graph.to_json()["tasks"]

    @property
    def spans_us(self) -> np.ndarray:
        return self.core.spans

    def summary(self) -> dict:
        return {**self.result.summary(), **self.extra}

    def to_perfetto(self, path: str | Path) -> Path:
        """Chrome / Perfetto trace JSON (open in ui.perfetto.dev): one track per processor.
        ``path``: a file (written atomically, through symlinks), a FIFO or device, or "-"."""
        trace = _core.sim.to_trace_json(self.graph, self.core)
        trace["otherData"] = {k: v for k, v in self.summary().items() if not isinstance(v, dict)}
        write_output(path, json.dumps(trace) + "\n")
        return Path(path)

    def plot(self, ax=None, title: str | None = None):
        """Gantt chart: one row per processor, tasks coloured by kind."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(12, 2.6))
        tasks = self.tasks
        spans = self.core.spans / 1e3
        ran_on = self.core.span_processors  # a stolen task runs on the CPU
        lanes = ("io", "cpu-aux", "npu", "cpu", "gpu")
        rows = [p for p in lanes if p in ran_on]
        kinds = sorted({t["kind"] for t in tasks})
        cmap = plt.get_cmap("tab10")
        colour = {k: cmap(i % 10) for i, k in enumerate(kinds)}
        for k in kinds:
            for r, p in enumerate(rows):
                sel = [t["id"] for t in tasks if t["kind"] == k and ran_on[t["id"]] == p]
                if sel:
                    ax.broken_barh(
                        [(spans[i, 0], spans[i, 1] - spans[i, 0]) for i in sel],
                        (r - 0.4, 0.8),
                        color=colour[k],
                        label=k if r == rows.index(p) else None,
                    )
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles, strict=True))
        ax.legend(uniq.values(), uniq.keys(), fontsize=7, ncol=min(len(uniq), 8), loc="upper right")
        ax.set_yticks(range(len(rows)), [r.upper() for r in rows])
        ax.set_xlabel("time (ms)")
        s = self.summary()
        if title is None and "system" in s:  # a cold start
            title = f"{s['config']} {s['system']} ({s['policy']}): TTFT {s['ttft_ms']:.0f} ms"
        ax.set_title(
            title
            or f"{s.get('config', '')} {s['policy']}: prefill {s['prefill_ms']:.1f} ms, "
            f"NPU bubbles {100 * s['bubble_rate'].get('npu', 0):.0f}%"
        )
        ax.set_ylim(-0.6, len(rows) - 0.4 + 0.6)
        return ax


def simulate(
    config,
    device: str | dict = "snapdragon-8gen3",
    plan="shadow-outlier",
    prompt_len: int = 1024,
    *,
    chunk: int | None = 256,
    policy: str = "npu-stall-first",
    processor: str = "auto",
    runtime_graph_build: bool = False,
    shadow_channels: float = _core.DEFAULT_SHADOW_CHANNELS,
    optimal_max_tasks: int = 24,
    head_policy: str = "greedy",
    attention_cpu_core: str = "auto",
    max_fused_heads: int = 4,
    head_ratios: Sequence[float] | None = None,
    head_buckets: Sequence[int] | None = None,
    rescore_share: float = 1.0,
    co_runner: str = "",
    characterization: str = "",
    phase: str = "prefill",
    decode_tokens: int = 0,
    fast_sync: bool | None = None,
) -> Timeline:
    """Timeline of a request of a config (a name of ``socllm.configs``, a dict, or a loaded
    model's config) on a device: one call into C++ (module doc). ``phase``: ``prefill`` of
    ``prompt_len`` tokens, ``decode`` (one decoding step on a cache of ``prompt_len``; no
    ``chunk``) or ``session`` (the prefill, then ``decode_tokens`` decoding steps on one
    timeline). Decoding steps run the plan's decode placement (``Plan.for_decode()``).

    ``chunk``: prefill chunk length (None or 0: the whole prompt as one graph);
    ``runtime_graph_build``: build and optimize the NPU graph at run time, as naive NPU
    execution must for every new prompt length (seed 001 §2.2).

    Head-wise attention (plans whose attention is not fp32, seed 000; cpp/block/block.h
    AttentionTimingOptions and head_pipeline.h): ``head_policy`` (sequential, pipelined, greedy =
    Algorithm 1, optimal) orders each layer's NPU launches and CPU heads;
    ``attention_cpu_core`` the core class the attention's CPU work is timed on ("auto": one mid
    core for non-fp32 attention, the whole CPU for fp32; "mid" times seed 000's C/G-Full);
    ``max_fused_heads`` heads per fused NPU launch at most (0: no limit, 1: no fusion);
    ``head_ratios`` / ``head_buckets``: ``[n_layers * n_heads]`` keep ratios and scale-bucket
    ids per head (e.g. from a calibration; None: the plan's keep, one bucket per layer);
    ``rescore_share``: for certified shadow-attn, the share of causal pairs rescored in fp32 (1:
    the bound's worst case; ``simulate_model`` uses what the engine rescored).
    ``co_runner``: a co-running app of the profile's ``scenarios`` (seed 000 Table 9) sharing
    the SoC's processors and memory bandwidth; ``characterization``: one of the profile's
    named cost-model variants (e.g. ``llmnpu-e2e``, fitted to end-to-end numbers), replacing
    the plan's; ``fast_sync``: time GPU-NPU edges with (True) or without (False) HeteroLLM's
    fast synchronization instead of the plan's ``sync``.

    An option that would change nothing is refused (InvalidArgumentError naming it, issue 37):
    ``runtime_graph_build`` without NPU work in the prompt, ``fast_sync`` without GPU-NPU edges,
    ``shadow_channels`` without shadow-outlier linears, ``head_ratios`` without per-head keep
    ratios in the attention, ``rescore_share`` without certified shadow-attn, and
    ``head_policy`` / ``max_fused_heads`` / ``head_buckets`` when no head pipeline was
    planned."""
    fn = "simulate"
    phase = str_arg(fn, "phase", phase)
    if phase not in PHASES:
        raise InvalidArgumentError(
            f"simulate: phase must be prefill, decode or session, got {phase!r}"
        )
    p = _plan(plan, processor)
    profile = _profile(device)
    prompt_len = int_arg(fn, "prompt_len", prompt_len, 1)
    decode_tokens = int_arg(fn, "decode_tokens", decode_tokens, 0)
    if chunk is not None:
        chunk = int_arg(fn, "chunk", chunk, 0)
    if phase == "decode" and chunk:
        raise InvalidArgumentError(
            f"simulate: a decoding step has no prompt chunks (chunk={chunk}); pass chunk=None"
        )
    for name, value in (
        ("policy", policy),
        ("head_policy", head_policy),
        ("attention_cpu_core", attention_cpu_core),
        ("co_runner", co_runner),
        ("characterization", characterization),
    ):
        str_arg(fn, name, value)
    runtime_graph_build = bool_arg(fn, "runtime_graph_build", runtime_graph_build)
    if fast_sync is not None:
        fast_sync = bool_arg(fn, "fast_sync", fast_sync)
    shadow_channels = real_arg(fn, "shadow_channels", shadow_channels)
    if not (shadow_channels >= 0 and math.isfinite(shadow_channels)):
        raise InvalidArgumentError(
            f"simulate: shadow_channels must be finite and >= 0, got {shadow_channels}"
        )
    rescore_share = real_arg(fn, "rescore_share", rescore_share)
    if not 0 <= rescore_share <= 1:
        raise InvalidArgumentError(
            f"simulate: rescore_share must be in [0, 1], got {rescore_share}"
        )
    optimal_max_tasks = int_arg(fn, "optimal_max_tasks", optimal_max_tasks, 1)
    max_fused_heads = int_arg(fn, "max_fused_heads", max_fused_heads, 0)
    ratios = reals_arg(fn, "head_ratios", head_ratios) if head_ratios is not None else []
    buckets = ints_arg(fn, "head_buckets", head_buckets) if head_buckets is not None else []
    if runtime_graph_build and phase != "decode":  # a decoding step: refused by the core
        check_runtime_graph_build(p, "runtime_graph_build=True")
    if fast_sync is not None:
        check_fast_sync(p, phase, f"fast_sync={fast_sync}")
    _check_timing_options(
        p,
        phase,
        shadow_channels=shadow_channels,
        head_ratios=head_ratios,
        rescore_share=rescore_share,
    )
    res = _core.sim.simulate_request(
        _config(config),
        p,
        profile,
        prompt_len,
        chunk or 0,
        phase,
        decode_tokens,
        policy,
        runtime_graph_build,
        shadow_channels,
        optimal_max_tasks,
        head_policy,
        attention_cpu_core,
        max_fused_heads,
        ratios,
        buckets,
        rescore_share,
        co_runner,
        characterization,
        fast_sync,
    )
    pipeline_options = {
        k: v
        for k, v, default in (
            ("head_policy", head_policy, "greedy"),
            ("max_fused_heads", max_fused_heads, 4),
        )
        if v != default
    }
    if head_buckets is not None:
        pipeline_options["head_buckets"] = buckets
    _check_head_pipeline_options(res, p, pipeline_options)
    return Timeline(res, profile, optimal_max_tasks, {"processor": processor})


def hetero_engines() -> list[dict]:
    """HeteroLLM's engines (seed 002 §5), each a plan preset (cpp/plan/plan.h): ``name``, the
    ``partition`` mode its solver searches and a ``description``."""
    return _core.sim.hetero_engines()


def simulate_hetero(
    config,
    device: str | dict = "snapdragon-8gen3",
    engine: str = "hetero-tensor",
    prompt_len: int = 256,
    *,
    phase: str = "prefill",
    fast_sync: bool = True,
    characterization: str = "heterollm",
    policy: str = "first-ready",
    plan: str = "w4a16",
    predictor=None,
    solve_for_timing_sync: bool = False,
    co_runner: str = "",
    solve_for_co_runner: bool = False,
) -> Timeline:
    """A HeteroLLM engine (seed 002) on a config: its prefill of ``prompt_len`` tokens, or with
    ``phase="decode"`` one decoding step on a KV cache of ``prompt_len``. Linears are cut
    between the GPU and the NPU by the engine's partition solver (cpp/sched/partition.h);
    other ops run on the GPU in FP16. ``characterization`` picks the device profile's FP16 NPU
    description (``heterollm``: ~10 TFLOPS with shape sensitivity; ``llmnpu-table3``: llm.npu's
    measured 2 GFLOPS); ``fast_sync`` False times conventional GPU-NPU synchronization with the
    same partitions (``solve_for_timing_sync`` re-solves them for it). ``predictor(op, processor)
    -> µs``: the solver decides on predicted times (the profiler's prediction mode, e.g.
    ``socllm.sim.hetero.PartitionProfiler``), the timeline uses the cost model. summary() adds
    ``engine``, ``partitions`` (per linear shape: the cut and its predicted µs) and, for decode,
    ``decode_tokens_per_s``. ``co_runner``: a co-running app of the profile's ``scenarios``
    (seed 000 Table 9, seed 002 §5.5) sharing the SoC; the solver ignores it unless
    ``solve_for_co_runner`` (re-partitioning for what is left). ``solve_for_timing_sync``
    with ``fast_sync`` True would change nothing and is refused."""
    fn = "simulate_hetero"
    for name, value in (
        ("engine", engine),
        ("characterization", characterization),
        ("policy", policy),
        ("phase", phase),
        ("plan", plan),
        ("co_runner", co_runner),
    ):
        str_arg(fn, name, value)
    prompt_len = int_arg(fn, "prompt_len", prompt_len, 1)
    fast_sync = bool_arg(fn, "fast_sync", fast_sync)
    solve_for_timing_sync = bool_arg(fn, "solve_for_timing_sync", solve_for_timing_sync)
    solve_for_co_runner = bool_arg(fn, "solve_for_co_runner", solve_for_co_runner)
    if solve_for_timing_sync and fast_sync:
        raise not_applicable(
            fn,
            "solve_for_timing_sync=True",
            "timing with conventional synchronization (fast_sync=False)",
            "with fast_sync=True the partitions are already solved for the synchronization timed",
        )
    profile = _profile(device)
    res = _core.sim.simulate_hetero(
        _config(config),
        profile,
        prompt_len,
        engine,
        fast_sync,
        characterization,
        policy,
        phase,
        plan,
        predictor,
        solve_for_timing_sync,
        co_runner,
        solve_for_co_runner,
    )
    return Timeline(res, profile, 24, {"engine": engine})


def simulate_cold_start(
    config,
    device: str | dict = "snapdragon-8elite",
    system: str = "edgeflow",
    *,
    bits: float = 5.0,
    prompt_len: int = 128,
    chunk: int | None = 256,
    policy: str = "",
    unpack_format: str = "weightlet",
    steal_threshold: int | None = None,
) -> Timeline:
    """Cold start of a config on a device (cpp/sim/cold_start.h, seed 004 §3-5): flash
    reads (lane ``io``), unpacking (``cpu-aux``), run-time graph preparation and the prefill to
    the first token, overlapped as ``system`` does (edgeflow, llm.npu+, llm.npu, llama.cpp,
    mnn). ``bits``: EdgeFlow's average bits per weight; ``policy`` "": the system's own
    (edgeflow: position-steal); summary() gives ttft_ms, read_ms, unpack_ms, compute_ms,
    bytes_read, energy_mj and per-processor busy time and bubbles. ``unpack_format`` (one of
    the profile's unpack rates) applies to edgeflow only, ``steal_threshold`` to the
    position-steal policy only: elsewhere they are refused. Unset, the threshold follows seed
    004 §4.3's rule, the ratio of the NPU tasks' CPU time to their NPU time (rounded; the
    paper's phone: 5); summary() gives the one used."""
    fn = "simulate_cold_start"
    system = str_arg(fn, "system", system)
    bits = real_arg(fn, "bits", bits)
    prompt_len = int_arg(fn, "prompt_len", prompt_len)
    if chunk is not None:
        chunk = int_arg(fn, "chunk", chunk, 0)
    policy = str_arg(fn, "policy", policy)
    unpack_format = str_arg(fn, "unpack_format", unpack_format)
    if steal_threshold is not None:
        steal_threshold = int_arg(fn, "steal_threshold", steal_threshold, 0)
    profile = _profile(device)
    # each system's own policy (cold_start.cpp default_policy); an unknown system is the core's
    own = {
        "edgeflow": "position-steal",
        "llm.npu+": "npu-stall-first",
        "llm.npu": "npu-stall-first",
        "llama.cpp": "first-ready",
        "mnn": "first-ready",
    }
    if unpack_format != "weightlet" and system in own:
        if system != "edgeflow":
            raise not_applicable(
                fn,
                f"unpack_format={unpack_format!r}",
                "the unpacking of EdgeFlow's files (system='edgeflow')",
                f"system {system!r} unpacks nothing",
            )
        rates = profile.get("cost_model", {}).get("cpu", {})
        known = [k[7:-11] for k in rates if k.startswith("unpack_") and k.endswith("_gweights_s")]
        if known and unpack_format not in known:
            raise InvalidArgumentError(
                f"{fn}: unknown unpack_format {unpack_format!r} (profile "
                f"{profile.get('name', '?')!r} has unpack rates for: {', '.join(known)})"
            )
    if steal_threshold is not None and system in own:
        resolved = _core.sim.policy_name(policy) if policy else own[system]
        if resolved != "position-steal":
            raise not_applicable(
                fn,
                f"steal_threshold={steal_threshold}",
                "policy position-steal (system edgeflow's own)",
                f"system {system!r} is timed under {resolved}"
                + ("" if policy else " (its own policy)"),
            )
    res = _core.sim.simulate_cold_start(
        _config(config),
        profile,
        system,
        bits,
        prompt_len,
        chunk or 0,
        policy,
        unpack_format,
        steal_threshold,
    )
    return Timeline(res, profile)


def _profile(device: str | dict) -> dict:
    if isinstance(device, dict):
        return device
    if not isinstance(device, (str, os.PathLike)):
        raise InvalidArgumentError(
            "a device is a profile name, a .json path or a profile dict, got "
            f"{type(device).__name__} {device!r}"
        )
    return load_profile(device)


def simulate_graph(
    graph: TaskGraph,
    device: str | dict = "snapdragon-8gen3",
    policy: str = "npu-stall-first",
    *,
    optimal_max_tasks: int = 24,
    head_policy: str = "greedy",
) -> Timeline:
    """Times a task graph (from :func:`task_graph`, an engine's recorded prefill, or
    ``TaskGraph.from_json``) on a device under a policy, with the timing assumptions its meta
    names (characterization, synchronization, phase, co-runner). ``head_policy`` plans the
    graph's head pipelines: refused for a graph that has none, or whose pipelines were planned
    before under another policy (meta ``head_policy``, which the timing keeps)."""
    fn = "simulate_graph"
    str_arg(fn, "policy", policy)
    str_arg(fn, "head_policy", head_policy)
    optimal_max_tasks = int_arg(fn, "optimal_max_tasks", optimal_max_tasks, 1)
    profile = _profile(device)
    planned = graph.meta.get("head_policy")
    if planned is not None and head_policy != "greedy" and head_policy != planned:
        raise not_applicable(
            fn,
            f"head_policy={head_policy!r}",
            "a graph whose head pipelines are not planned yet",
            f"this graph's were planned under {planned!r} (meta head_policy), which the timing "
            "keeps: build the graph again to plan them under another policy",
        )
    res = _core.sim.simulate_graph(graph, profile, policy, optimal_max_tasks, head_policy)
    if planned is None and head_policy != "greedy" and not res.head_plans:
        raise not_applicable(
            fn,
            f"head_policy={head_policy!r}",
            "the NPU-CPU head pipelines of shadow-attn attention",
            "this graph has none",
        )
    return Timeline(res, profile, optimal_max_tasks)


def simulate_model(
    model,
    prompt: str | Sequence[int],
    device: str | dict = "snapdragon-8gen3",
    plan="shadow-outlier",
    *,
    chunk: int | None = 256,
    policy: str = "npu-stall-first",
    processor: str = "auto",
    optimal_max_tasks: int = 24,
    decode_tokens: int = 0,
    characterization: str = "",
    fast_sync: bool | None = None,
) -> Timeline:
    """Runs ``prompt`` through a loaded model's engine in chunks of ``chunk`` (None: whole) under
    ``plan`` (planned for ``device``: its partitions solved there) and simulates the graph that
    prefill executed: its chunks and, for shadow-outlier plans, the outlier channels and cold
    fetches every linear input had in every chunk, the scale buckets shadowAttn's heads chose.
    ``decode_tokens``: that many greedy decoding steps after it, recorded on the same timeline
    (a session). ``characterization`` / ``fast_sync`` replace the plan's timing assumptions
    (``fast_sync`` is refused where nothing runs on both the GPU and the NPU)."""
    fn = "simulate_model"
    ids = model.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidArgumentError("simulate_model: empty prompt")
    if chunk is not None:
        chunk = int_arg(fn, "chunk", chunk, 0)
    decode_tokens = int_arg(fn, "decode_tokens", decode_tokens, 0)
    str_arg(fn, "policy", policy)
    str_arg(fn, "characterization", characterization)
    optimal_max_tasks = int_arg(fn, "optimal_max_tasks", optimal_max_tasks, 1)
    profile = _profile(device)
    p = _plan(plan, processor, chunk_len=0, fn=fn).on_device(profile)  # chunking: ``chunk``'s
    if fast_sync is not None:
        fast_sync = bool_arg(fn, "fast_sync", fast_sync)
        check_fast_sync(p, "session" if decode_tokens else "prefill", f"fast_sync={fast_sync}", fn)
    r = model.prefill(
        ids, p, chunk_len=chunk or None, return_graph=True, decode_tokens=decode_tokens
    )
    graph = r["graph"] if isinstance(r, dict) else r[1]
    meta = graph.meta
    if characterization:
        meta["characterization"] = characterization
    if fast_sync is not None:
        meta["fast_sync"] = fast_sync
    graph.meta = meta
    res = _core.sim.simulate_graph(graph, profile, policy, optimal_max_tasks)
    extra = {"processor": processor, "engine_graphs": model.graph_stats()}
    if decode_tokens:
        extra["decoded"] = r["decoded"]
    return Timeline(res, profile, optimal_max_tasks, extra)
