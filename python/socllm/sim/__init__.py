"""Timing on a modelled phone SoC (DESIGN.md, "one task graph, two interpretations"): the block's
task graph of a request (a prefill, a decoding step or a session) timed by the discrete-event
simulator on a device profile, and the parts the studies of the four systems use on their own.

- Requests: :func:`simulate` (a config under a plan), :func:`simulate_model` (the graph a loaded
  model's engine executed), :func:`simulate_graph` (any recorded graph), :func:`task_graph`,
  :class:`Timeline`, :class:`TaskGraph`, :func:`policies`; HeteroLLM's engines
  (:func:`simulate_hetero`, :func:`hetero_engines`), cold starts (:func:`simulate_cold_start`,
  :func:`channel_cold_start_cost`).
- Devices: :class:`DeviceProfile`, :class:`CostModel`, :func:`load_device`,
  :func:`known_devices`.
- HeteroLLM's partitions (seed 002 §4.1, §4.3): :func:`make_partition`, :func:`row_partition`,
  :func:`validate_partition`, :func:`npu_graph_cover`, :func:`partition_rules`,
  :func:`solve_partition`, :func:`partition_time`; the profiler in :mod:`socllm.sim.hetero`.
- Fits of device numbers (Eigen, ``cpp/soc/fit.h``): :func:`linear_least_squares`,
  :func:`polyfit`, :func:`fit_roofline`, :func:`least_squares_bounded`.
- The scheduler on given graphs: :func:`schedule` (a graph on a cost model),
  :func:`simulate_durations` (given task durations), :func:`task_durations_us`,
  :func:`to_trace_json`; shadowAttn's head pipeline in :mod:`socllm.sim.head_pipeline`.
"""

from .. import _core
from .timeline import (
    TaskGraph,
    Timeline,
    hetero_engines,
    policies,
    simulate,
    simulate_cold_start,
    simulate_graph,
    simulate_hetero,
    simulate_model,
    task_graph,
)

DeviceProfile = _core.sim.DeviceProfile
CostModel = _core.sim.CostModel
load_device = _core.sim.load_device
known_devices = _core.sim.known_devices
DEFAULT_DEVICE = _core.sim.DEFAULT_DEVICE
make_partition = _core.sim.make_partition
row_partition = _core.sim.row_partition
validate_partition = _core.sim.validate_partition
npu_graph_cover = _core.sim.npu_graph_cover
partition_rules = _core.sim.partition_rules
solve_partition = _core.sim.solve_partition
partition_time = _core.sim.partition_time
schedule = _core.sim.simulate
simulate_durations = _core.sim.simulate_durations
task_durations_us = _core.sim.task_durations_us
to_trace_json = _core.sim.to_trace_json
channel_cold_start_cost = _core.sim.channel_cold_start_cost
linear_least_squares = _core.sim.linear_least_squares
polyfit = _core.sim.polyfit
fit_roofline = _core.sim.fit_roofline
least_squares_bounded = _core.sim.least_squares_bounded
policy_name = _core.sim.policy_name
prefill_graph_rows = _core.prefill_graph_rows
graph_census = _core.graph_census
DEFAULT_SHADOW_CHANNELS = _core.DEFAULT_SHADOW_CHANNELS

__all__ = [
    "TaskGraph",
    "Timeline",
    "hetero_engines",
    "policies",
    "simulate",
    "simulate_cold_start",
    "channel_cold_start_cost",
    "linear_least_squares",
    "polyfit",
    "fit_roofline",
    "least_squares_bounded",
    "simulate_graph",
    "simulate_hetero",
    "simulate_model",
    "task_graph",
    "DeviceProfile",
    "CostModel",
    "load_device",
    "known_devices",
    "DEFAULT_DEVICE",
    "make_partition",
    "row_partition",
    "validate_partition",
    "npu_graph_cover",
    "partition_rules",
    "solve_partition",
    "partition_time",
    "schedule",
    "simulate_durations",
    "task_durations_us",
    "to_trace_json",
    "policy_name",
    "prefill_graph_rows",
    "graph_census",
    "DEFAULT_SHADOW_CHANNELS",
]
