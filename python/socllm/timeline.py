"""Timelines of a prefill on a modelled phone SoC (DESIGN.md, "one task graph, two
interpretations"): the task graph of a request is replayed by the C++ discrete-event simulator
(cpp/include/socllm/simulator.h) on a device profile's cost model.

* Shape-only configs (``socllm.configs``: Qwen1.5-1.8B, Gemma-2B, Llama-2-7B ...) get the graph
  llm.npu would run, with expected shadow-outlier loads (below).
* A loaded model (:class:`socllm.LanguageModel`) runs the prompt in the engine chunk by chunk
  under the plan; the graph is built from what the engine executed: the same chunks, and for
  shadow-outlier plans the outlier channels and cold fetches each linear input really had.

Placement (``processor="auto"``): plans whose linears an NPU can run (static per-tensor INT8:
``w8a8``, ``smoothquant``, ``shadow-outlier``...; per-group INT8 as sub-matmuls: ``w8-group``)
run llm.npu's placement: linears, norms and SiLU on the NPU, attention and the shadow part on
the CPU (seed 001 §3.4, §4). Plans with dynamic or float activations (``fp32``, ``llm-int8``,
``w4a16``) cannot run on a static NPU graph and go to the CPU. ``processor="cpu"|"gpu"|"npu"``
puts every subgraph on one processor (the CPU / GPU baselines).

Expected shadow loads for shape-only configs: ``shadow_channels`` outlier channels per linear
input per chunk (default 10: "around 5-15 channels", seed 001 §3.3 Fig. 10), a share
``1 - hot_share`` of them fetched cold from flash; the pruned inputs are the plan's
``pruning_rate`` of all inputs, keeping the FFN-down inputs of evenly spaced layers first (on
SmolLM2 the profile keeps down-projection inputs almost only: notebooks/02_outliers.ipynb).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import _core
from .configs import load_config
from .devices import load_profile
from .errors import InvalidArgumentError
from .io_utils import atomic_write_text

POLICIES = ("inorder", "fifo", "ooe", "optimal")
PROCESSORS = ("auto", "npu", "cpu", "gpu")
SUBGRAPHS = ("attn_in", "attention", "o_proj", "mlp_in", "mlp_act", "down")
DEFAULT_SHADOW_CHANNELS = 10.0
MIN_GRAPH_ROWS = 32
FP32_BYTES = 4


def _plan(plan) -> _core.Plan:
    return plan if isinstance(plan, _core.Plan) else _core.Plan(plan)


def placement(plan, processor: str = "auto") -> dict:
    """The processor of each decoder subgraph and the compute types for ``plan`` (module doc)."""
    if processor not in PROCESSORS:
        raise InvalidArgumentError(
            f"unknown processor {processor!r} (known: {', '.join(PROCESSORS)})"
        )
    lin = _plan(plan).to_json()["ops"]["linear"]
    acts = lin["activations"]
    int8 = acts.startswith("int8")
    npu_ok = acts in ("int8-static-per-tensor", "int8-dynamic-per-group")
    groups_of = lin["weights"].get("group_size") if acts == "int8-dynamic-per-group" else None
    if processor == "auto":
        processor = "npu" if npu_ok else "cpu"
    if processor == "npu":
        # float activations on the NPU take its (slow) FP16 path
        linear_dtype = "int8" if int8 else "fp16"
        procs = {s: "npu" for s in SUBGRAPHS}
        procs["attention"] = "cpu"
        float_dtype = "fp16"
    elif processor == "gpu":
        procs, linear_dtype, float_dtype = {s: "gpu" for s in SUBGRAPHS}, "fp16", "fp16"
    else:
        procs = {s: "cpu" for s in SUBGRAPHS}
        linear_dtype = "int8" if int8 else "fp32"
        float_dtype = "fp32" if acts == "fp32" else "fp16"
    return {
        "processor": procs,
        "linear_dtype": linear_dtype,
        "float_dtype": float_dtype,
        "group_size": groups_of if processor == "npu" else None,
        "shadow": lin["shadow_outliers"] if processor == "npu" else None,
    }


def _core_placement(pl: dict) -> dict:
    return {
        "processor": pl["processor"],
        "linear_dtype": pl["linear_dtype"],
        "float_dtype": pl["float_dtype"],
        "linear_group_size": pl["group_size"] or 0,
    }


def expected_shadow_loads(
    config: dict, pruning_rate: float, hot_share: float, channels: float = DEFAULT_SHADOW_CHANNELS
) -> list[dict]:
    """Per layer x (attn_in, attn_out, mlp_in, mlp_act) input: the CPU load of one chunk
    (module doc: llm.npu's sparsity and pruning without a calibration of this model)."""
    n_layers = int(config["n_layers"])
    n_inputs = 4 * n_layers
    keep = n_inputs - round(pruning_rate * n_inputs)
    # kept first: down inputs spread over depth, then the other inputs layer by layer
    downs = [
        (int(x), 3)
        for x in np.unique(np.linspace(0, n_layers - 1, max(min(keep, n_layers), 1)).round())
    ]
    rest = [(layer, s) for layer in range(n_layers) for s in range(4) if (layer, s) not in downs]
    kept = set((downs + rest)[:keep]) if keep > 0 else set()
    gated = config.get("mlp", "gated") == "gated"
    out_width = {  # output width of the linear each input feeds (its float weight columns)
        0: (config["n_heads"] + 2 * config["n_kv_heads"]) * config["head_dim"],
        1: config["d_model"],
        2: 2 * config["d_ff"] if gated else config["d_ff"],
        3: config["d_model"],
    }
    loads = []
    for layer in range(n_layers):
        for s in range(4):
            cold = channels * (1.0 - hot_share) * out_width[s] * FP32_BYTES
            loads.append(
                {
                    "pruned": (layer, s) not in kept,
                    "outlier_channels": channels,
                    "cold_fetch_bytes": cold,
                }
            )
    return loads


def graph_build_ms(config: dict, profile: dict) -> tuple[float, float]:
    """(build, optimize) ms of one whole-model NPU graph at run time: the profile's Gemma-2B
    measurement (seed 001 §2.2) scaled by the model's linear weight count (our choice: the
    seeds give one model's numbers only)."""
    cm = profile.get("cost_model", {}).get("graph", {})
    try:
        build, optimize = cm["build_ms"]["value"], cm["optimize_ms"]["value"]
    except KeyError as e:
        raise InvalidArgumentError(
            f"device profile {profile['name']!r} has no cost_model/graph/{e.args[0]} (needed for "
            "run-time graph building)"
        ) from None
    gemma = load_config("gemma-2b")
    scale = _linear_params(config) / _linear_params(gemma)
    return build * scale, optimize * scale


def graph_rows(prompt_len: int, chunk: int) -> int:
    """Rows of the static graphs a prompt runs on: chunks of ``chunk``; a prompt shorter than
    a chunk runs on the smallest pre-built size that holds it, powers of two from 32 (the
    standard sizes of seed 002 §5.2.2). ``chunk`` 0: one graph of the whole prompt."""
    if chunk <= 0:
        return prompt_len
    if prompt_len >= chunk:
        return chunk
    return min(chunk, max(MIN_GRAPH_ROWS, 1 << (prompt_len - 1).bit_length()))


def _linear_params(c: dict) -> int:
    qkv = (c["n_heads"] + 2 * c["n_kv_heads"]) * c["head_dim"]
    mlp = 3 if c.get("mlp", "gated") == "gated" else 2
    return c["n_layers"] * (
        c["d_model"] * qkv
        + c["n_heads"] * c["head_dim"] * c["d_model"]
        + mlp * c["d_model"] * c["d_ff"]
    )


@dataclass
class Timeline:
    """One simulated prefill: the task graph, every task's span, and the summary numbers."""

    graph: _core.sim.TaskGraph
    core: _core.sim.Timeline
    prompt_len: int
    meta: dict = field(default_factory=dict)
    profile: dict = field(default_factory=dict, repr=False)

    def with_policy(self, policy: str, device: str | dict | None = None) -> Timeline:
        """The same task graph under another scheduling policy (and/or device profile)."""
        if policy not in POLICIES:
            raise InvalidArgumentError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
        profile = self.profile if device is None else _profile(device)
        return _run(self.graph, profile, policy, self.prompt_len, 24, dict(self.meta))

    @property
    def tasks(self) -> list[dict]:
        return self.graph.to_json()["tasks"]

    @property
    def spans_us(self) -> np.ndarray:
        return self.core.spans

    def summary(self) -> dict:
        s = self.core.summary()
        tasks = self.tasks
        spans = self.core.spans
        build_us = sum(
            spans[t["id"], 1] - spans[t["id"], 0] for t in tasks if t["kind"] == "graph_build"
        )
        prefill_ms = self.core.makespan_us / 1e3
        procs = s["processors"]
        return {
            **self.meta,
            "policy": s["policy"],
            "device": s["device"],
            "prompt_len": self.prompt_len,
            "prefill_ms": prefill_ms,
            "prefill_tokens_per_s": self.prompt_len / (prefill_ms / 1e3)
            if prefill_ms > 0
            else math.inf,
            # the first token's logits come with the prefill's last task (LM head)
            "ttft_ms": prefill_ms,
            "energy_mj": s["energy_mj"],
            "graph_build_ms": build_us / 1e3,
            "peak_memory_bytes": self.meta.get("resident_bytes", 0) + s["peak_working_bytes"],
            "tasks": len(tasks),
            "bubble_rate": {p: v["bubble_rate"] for p, v in procs.items()},
            "busy_ms": {p: v["busy_ms"] for p, v in procs.items()},
            "processors": procs,
            "scheduler_decisions": s["decisions"],
            "scheduler_us_per_decision": s["decision_us_mean"],
        }

    def to_perfetto(self, path: str | Path) -> Path:
        """Chrome / Perfetto trace JSON (open in ui.perfetto.dev): one track per processor."""
        trace = _core.sim.to_trace_json(self.graph, self.core)
        trace["otherData"] = {k: v for k, v in self.summary().items() if not isinstance(v, dict)}
        path = Path(path)
        atomic_write_text(path, json.dumps(trace) + "\n")
        return path

    def plot(self, ax=None, title: str | None = None):
        """Gantt chart: one row per processor, tasks coloured by kind."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(12, 2.6))
        tasks = self.tasks
        spans = self.core.spans / 1e3
        rows = [p for p in ("npu", "cpu", "gpu") if any(t["processor"] == p for t in tasks)]
        kinds = sorted({t["kind"] for t in tasks})
        cmap = plt.get_cmap("tab10")
        colour = {k: cmap(i % 10) for i, k in enumerate(kinds)}
        for k in kinds:
            for r, p in enumerate(rows):
                sel = [t["id"] for t in tasks if t["kind"] == k and t["processor"] == p]
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
        ax.set_title(
            title
            or f"{s.get('config', '')} {s['policy']}: prefill {s['prefill_ms']:.1f} ms, "
            f"NPU bubbles {100 * s['bubble_rate'].get('npu', 0):.0f}%"
        )
        ax.set_ylim(-0.6, len(rows) - 0.4 + 0.6)
        return ax


def _resident_bytes(config: dict, pl: dict, prompt_len: int) -> int:
    """Weights (linears at their compute type, embedding fp16) + fp16 KV of the prompt."""
    wb = {"int8": 1, "fp16": 2, "fp32": 4}[pl["linear_dtype"]]
    kv = 2 * config["n_layers"] * prompt_len * config["n_kv_heads"] * config["head_dim"] * 2
    return _linear_params(config) * wb + config["vocab_size"] * config["d_model"] * 2 + kv


def simulate(
    config: str | dict,
    device: str | dict = "snapdragon-8gen3",
    plan="shadow-outlier",
    prompt_len: int = 1024,
    *,
    chunk: int = 256,
    policy: str = "ooe",
    processor: str = "auto",
    runtime_graph_build: bool = False,
    shadow_channels: float = DEFAULT_SHADOW_CHANNELS,
    optimal_max_tasks: int = 24,
) -> Timeline:
    """Prefill timeline of a shape-only model config on a device (module doc).

    ``chunk``: prefill chunk length (0: the whole prompt as one graph); ``runtime_graph_build``:
    build and optimize the NPU graph at run time, as naive NPU execution must for every new
    prompt length (seed 001 §2.2)."""
    cfg = load_config(config) if isinstance(config, str) else dict(config)
    if prompt_len < 1:
        raise InvalidArgumentError(f"prompt_len must be >= 1, got {prompt_len}")
    if chunk < 0:
        raise InvalidArgumentError(f"chunk must be >= 0, got {chunk}")
    if policy not in POLICIES:
        raise InvalidArgumentError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    profile = _profile(device)
    p = _plan(plan)
    pl = placement(p, processor)
    rows = graph_rows(prompt_len, chunk)
    n_chunks = math.ceil(prompt_len / rows)
    shadow = None
    if pl["shadow"]:
        shadow = expected_shadow_loads(
            cfg, pl["shadow"]["pruning_rate"], pl["shadow"]["hot_share"], shadow_channels
        )
    build, opt = graph_build_ms(cfg, profile) if runtime_graph_build else (0.0, 0.0)
    graph = _core.sim.graph_builder_chunks(
        cfg,
        _core_placement(pl),
        [rows] * n_chunks,
        [shadow] * n_chunks if shadow else None,
        build,
        opt,
        1,
    )
    return _run(
        graph,
        profile,
        policy,
        prompt_len,
        optimal_max_tasks,
        {
            "config": cfg.get("name", "model"),
            "plan": p.name,
            "chunk": chunk,
            "processor": processor,
            "resident_bytes": _resident_bytes(cfg, pl, prompt_len),
        },
    )


def _profile(device: str | dict) -> dict:
    return device if isinstance(device, dict) else load_profile(device)


def _run(
    graph, profile: dict, policy: str, prompt_len: int, optimal_max_tasks: int, meta: dict
) -> Timeline:
    cost = _core.sim.CostModel(
        _core.sim.DeviceProfile.from_json(profile, profile.get("name", "profile"))
    )
    core = _core.sim.simulate(graph, cost, policy, optimal_max_tasks)
    return Timeline(graph, core, prompt_len, meta, profile)


def simulate_model(
    model,
    prompt: str | Sequence[int],
    device: str | dict = "snapdragon-8gen3",
    plan="shadow-outlier",
    *,
    chunk: int = 256,
    policy: str = "ooe",
    processor: str = "auto",
) -> Timeline:
    """Runs ``prompt`` through a loaded model's engine in chunks of ``chunk`` under ``plan`` and
    simulates the graph it executed: its chunks and, for shadow-outlier plans, the outlier
    channels and cold fetches every linear input had in every chunk."""
    ids = model.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidArgumentError("simulate_model: empty prompt")
    if chunk < 1:
        raise InvalidArgumentError(f"simulate_model: chunk must be >= 1, got {chunk}")
    base = _plan(plan).to_json()
    base["chunk_len"] = chunk
    p = _core.Plan(base)
    pl = placement(p, processor)
    profile = _profile(device)
    cfg = dict(model.config)
    cache = model.new_cache(len(ids))
    per_chunk = []
    if pl["shadow"]:
        model._engine.shadow_stats(p, reset=True)
    for c0 in range(0, len(ids), chunk):
        model._engine.step(cache, ids[c0 : c0 + chunk], False, p)
        if pl["shadow"]:
            st = model._engine.shadow_stats(p, reset=True)
            per_chunk.append(
                [
                    {
                        "pruned": bool(d["pruned"]),
                        "outlier_channels": float(d["outlier_channels"]),
                        "cold_fetch_bytes": float(d["cold_fetch_bytes"]),
                    }
                    for d in st
                ]
            )
    graph = _core.sim.graph_builder_chunks(
        cfg,
        _core_placement(pl),
        [chunk] * math.ceil(len(ids) / chunk),
        per_chunk or None,
        0.0,
        0.0,
        1,
    )
    return _run(
        graph,
        profile,
        policy,
        len(ids),
        24,
        {
            "config": cfg.get("name", "model"),
            "plan": p.name,
            "chunk": chunk,
            "processor": processor,
            "resident_bytes": _resident_bytes(cfg, pl, len(ids)),
            "engine_graphs": model._engine.graph_stats(),
        },
    )
