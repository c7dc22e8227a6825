"""shadowAttn's head-wise NPU-CPU/GPU pipeline (seed 000 §3.4), a view over the C++ planner
(cpp/sched/head_pipeline.h).

A *problem* is one layer's heads: ``topk_us`` and ``qkv_us`` per head (ζtopk, ζqkv), the fused
NPU ``launches`` (lists of heads sharing a scale bucket) with their ``launch_us`` (ζnpu),
``sync_us`` (NPU result to the CPU) and ``shared_cpu`` (top-k and sparse attention on one core,
True; False is the paper's three-stage picture). :func:`plan` orders it under a policy
(:func:`policies`: sequential, pipelined, greedy = Algorithm 1, optimal); :func:`latency_us`
times any order under the same model. In a simulated prefill (``socllm.sim.simulate`` with a
non-fp32 attention plan) every layer's attention is planned this way and the plan is written into
the task graph, so the simulator replays it (``Timeline.head_plans``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import _core


def policies() -> list[dict]:
    """The head-pipeline policies: ``name`` and ``description``."""
    return _core.sim.head_policies()


def plan(problem: dict, policy: str = "greedy", *, optimal_max_nodes: int = 50_000_000) -> dict:
    """The plan of ``problem`` under ``policy``: ``launch_order`` (indices into launches),
    ``head_order`` (the CPU's order), ``latency_us``, ``orders_evaluated`` and ``planner_ns``
    (host time). ``optimal`` raises UnsupportedError beyond ``optimal_max_nodes`` search nodes."""
    return _core.sim.plan_head_pipeline(problem, policy, optimal_max_nodes)


def latency_us(
    problem: dict,
    launch_order: Sequence[int],
    head_order: Sequence[int],
    *,
    sequential: bool = False,
) -> float:
    """Latency (µs) of an order under Algorithm 1's recurrence (``sequential``: each launch
    waits for the previous launch's heads)."""
    return _core.sim.pipeline_latency_us(problem, list(launch_order), list(head_order), sequential)


def fuse_launches(bucket_of_head: Sequence[int], max_fused_heads: int = 4) -> list[list[int]]:
    """Heads sharing a bucket id, in head order, at most ``max_fused_heads`` per launch (0: no
    limit; 1: no fusion)."""
    return _core.sim.fuse_launches([int(b) for b in bucket_of_head], max_fused_heads)
