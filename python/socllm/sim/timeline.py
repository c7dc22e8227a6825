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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _core
from ..configs import load_config
from ..devices import load_profile
from ..errors import InvalidArgumentError, int_arg
from ..io.files import write_output

TaskGraph = _core.sim.TaskGraph


def policies() -> list[dict]:
    """The scheduling policies (defined in C++, simulator.h): ``name``, ``alias`` (the earlier
    short name, still accepted) and ``description``."""
    return _core.sim.policies()


def _plan(plan, processor: str = "auto", chunk_len: int | None = None) -> _core.Plan:
    p = plan if isinstance(plan, _core.Plan) else _core.Plan(plan)
    if processor != "auto":  # the C++ core names an unknown processor and lists the known ones
        p = p.all_on(processor)
    if chunk_len is not None:
        p = p.with_chunk_len(chunk_len)
    return p


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
    fast synchronization instead of the plan's ``sync``."""
    p = _plan(plan, processor)
    profile = _profile(device)
    prompt_len = int_arg("simulate", "prompt_len", prompt_len, 1)
    decode_tokens = int_arg("simulate", "decode_tokens", decode_tokens, 0)
    if chunk is not None:
        chunk = int_arg("simulate", "chunk", chunk, 0)
    if phase == "decode" and chunk:
        raise InvalidArgumentError(
            f"simulate: a decoding step has no prompt chunks (chunk={chunk}); pass chunk=None"
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
        [float(x) for x in head_ratios] if head_ratios is not None else [],
        [int(x) for x in head_buckets] if head_buckets is not None else [],
        float(rescore_share),
        co_runner,
        characterization,
        fast_sync,
    )
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
    ``solve_for_co_runner`` (re-partitioning for what is left)."""
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
    steal_threshold: int = 5,
) -> Timeline:
    """Cold start of a config on a device (cpp/sim/cold_start.h, seed 004 §3-5): flash
    reads (lane ``io``), unpacking (``cpu-aux``), run-time graph preparation and the prefill to
    the first token, overlapped as ``system`` does (edgeflow, llm.npu+, llm.npu, llama.cpp,
    mnn). ``bits``: EdgeFlow's average bits per weight; ``policy`` "": the system's own
    (edgeflow: position-steal); summary() gives ttft_ms, read_ms, unpack_ms, compute_ms,
    bytes_read, energy_mj and per-processor busy time and bubbles."""
    profile = _profile(device)
    res = _core.sim.simulate_cold_start(
        _config(config),
        profile,
        system,
        float(bits),
        prompt_len,
        chunk or 0,
        policy,
        unpack_format,
        steal_threshold,
    )
    return Timeline(res, profile)


def _profile(device: str | dict) -> dict:
    return device if isinstance(device, dict) else load_profile(device)


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
    names (characterization, synchronization, phase, co-runner)."""
    profile = _profile(device)
    res = _core.sim.simulate_graph(graph, profile, policy, optimal_max_tasks, head_policy)
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
    (a session). ``characterization`` / ``fast_sync`` replace the plan's timing assumptions."""
    ids = model.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidArgumentError("simulate_model: empty prompt")
    profile = _profile(device)
    p = _plan(plan, processor, chunk_len=0).on_device(profile)  # chunking: ``chunk``'s
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
