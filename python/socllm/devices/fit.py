"""Cost-model fit of the device profiles (library part of scripts/fit_cost_model.py, which
documents the models): fits the per-processor matmul cost models to llm.npu's Table 3 (seed 001
§2.2, data/microbench/llmnpu_table3.json in the repository) and predicts rows through the C++
CostModel. A development-time tool: the table is repository data, not package data."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from .. import _core

ROOT = Path(__file__).resolve().parents[3]  # the repository (data/microbench is not packaged)

TABLE = ROOT / "data" / "microbench" / "llmnpu_table3.json"
DEVICES = Path(__file__).resolve().parent
COLUMNS = {  # Table 3 column: (processor, dtype)
    "npu_int8_ms": ("npu", "int8"),
    "cpu_int8_ms": ("cpu", "int8"),
    "gpu_fp16_ms": ("gpu", "fp16"),
    "npu_fp16_ms": ("npu", "fp16"),
}


def fit_roofline(flops: np.ndarray, wbytes: np.ndarray, t_us: np.ndarray, gops: float):
    """(overhead_us, weight_gbps) minimizing the squared relative error of
    t = overhead + max(flops / compute, weight bytes / weight rate) for a fixed compute rate,
    by a log-spaced search over the weight rate (the overhead then has a closed form)."""
    best = None
    for gbps in np.logspace(-3, 3, 6001):
        roof = np.maximum(flops / (gops * 1e3), wbytes / (gbps * 1e3))
        # overhead minimizing sum(((a + roof) / t - 1)^2), a >= 0
        w = 1.0 / t_us**2
        a = max(0.0, float(np.sum(w * (t_us - roof)) / np.sum(w)))
        err = float(np.sum(((a + roof) / t_us - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, a, float(gbps))
    return best[1], best[2]


def num(value: float, unit: str, source: str, **extra) -> dict:
    return {"value": float(value), "unit": unit, "source": source, **extra}


def ref(profile: dict, pointer: str, unit: str | None = None, why: str = "") -> dict:
    """A cost-model number copied from the profile entry at `pointer` (its source kept)."""
    node = profile
    for part in pointer.strip("/").split("/"):
        node = node[part]
    if node.get("value") is None:
        raise SystemExit(f"{profile['name']}: {pointer} has no value")
    out = {
        "value": float(node["value"]),
        "unit": unit or node.get("unit", ""),
        "source": f"profile {pointer}: {node['source']}" + (f" ({why})" if why else ""),
    }
    for flag in ("assumed", "derived"):
        if node.get(flag):
            out[flag] = True
    return out


# Compute roofs (G ops/s) the small-M rows cannot identify, each with its source.
ROOFS = {
    ("npu", "int8"): (
        10000.0,
        "HeteroLLM's measured NPU throughput 'up to 10 TFLOPS (in actual)' "
        "(seed 002 §1); INT8 assumed at least as fast",
    ),
    ("gpu", "fp16"): (
        1000.0,
        "HeteroLLM: the 8 Gen 3 GPU 'delivers approximately 1 TFLOPS (in actual)' (seed 002 §1)",
    ),
    ("cpu", "int8"): (
        None,
        "the highest effective rate among the training rows (a lower bound: "
        "no seed measures the CPU at large M)",
    ),
    ("npu", "fp16"): (
        None,
        "the highest effective rate among the training rows (Table 3's NPU "
        "FP16 path; HeteroLLM's 10 TFLOPS FP16 is another QNN setup)",
    ),
}
BYTES = {"int8": 1.0, "fp16": 2.0}


def fit(rows: list[dict], train: list[int]) -> dict:
    """Per Table 3 column: {<dtype>_overhead_us, _weight_gbps, _compute_gops} as profile numbers."""
    tr = [rows[i - 1] for i in train]
    label = f"fit by scripts/fit_cost_model.py to seed 001 Table 3 rows {','.join(map(str, train))}"
    out = {}
    flops = np.array([2.0 * r["m"] * r["k"] * r["n"] for r in tr])
    for col, (proc, dtype) in COLUMNS.items():
        t_us = np.array([1e3 * r[col] for r in tr])
        wbytes = np.array([r["k"] * r["n"] * BYTES[dtype] for r in tr])
        gops, why = ROOFS[(proc, dtype)]
        if gops is None:
            gops = float(np.max(flops / t_us)) / 1e3
        a, gbps = fit_roofline(flops, wbytes, t_us, gops)
        out[f"{proc}_{dtype}"] = {
            f"{dtype}_overhead_us": num(a, "us", label),
            f"{dtype}_weight_gbps": num(gbps, "GB/s", label + f" ({dtype} weight bytes / time)"),
            f"{dtype}_compute_gops": num(gops, "Gop/s", why, assumed=True),
        }
    return out


def cost_model_8gen3(profile: dict, fitted: dict) -> dict:
    """The full cost model of the 8 Gen 3 profile: fitted matmul numbers + profile entries."""
    npu = {
        **fitted["npu_int8"],
        **fitted["npu_fp16"],
        "tile_m": ref(profile, "/processors/npu/tile/m", "rows"),
        "tile_n": ref(profile, "/processors/npu/tile/n", "columns"),
        # The seeds give no K granularity; HeteroLLM's example unit is a 32 x 32 array.
        "tile_k": ref(
            profile,
            "/processors/npu/tile/illustrative_systolic_array",
            "elements",
            "K tile not in the seeds: the illustrative array side, assumed",
        ),
    }
    cpu_i8 = fitted["cpu_int8"]
    cpu = {**cpu_i8}
    # No seed measures CPU float matmuls. NEON lane arithmetic: SDOT does 16 int8 MACs per
    # 128-bit instruction, FMLA 8 fp16 or 4 fp32, so fp16 computes at half and fp32 at a
    # quarter of the INT8 rate; the overhead and the weight byte rate are the INT8 fit's.
    for dt, div in (("fp16", 2), ("fp32", 4)):
        cpu[f"{dt}_overhead_us"] = dict(cpu_i8["int8_overhead_us"], assumed=True)
        cpu[f"{dt}_weight_gbps"] = dict(cpu_i8["int8_weight_gbps"], assumed=True)
        cpu[f"{dt}_compute_gops"] = num(
            cpu_i8["int8_compute_gops"]["value"] / div,
            "Gop/s",
            f"CPU INT8 compute / {div} (NEON FMLA {dt} vs SDOT int8 lanes); not in the seeds",
            assumed=True,
        )
    gpu = {**fitted["gpu_fp16"]}
    dram = profile["memory"]["dram_bandwidth_gbps"]["npu"]["value"]
    # NPU float element-wise ops take 2.1x their CPU time (seed 004 Fig. 5b); CPU element-wise
    # ops stream 2 x 2 bytes per fp16 value at the DRAM rate.
    ratio = profile["processors"]["npu"]["elementwise_npu_vs_cpu_time_ratio"]["value"]
    npu["elementwise_gelems"] = num(
        dram / 4 / ratio,
        "Gelem/s",
        f"CPU fp16 element rate (DRAM {dram} GB/s / 4 bytes per value) / {ratio} (seed 004 "
        "Fig. 5b: NPU element-wise ops 2.1x slower than CPU)",
        derived=True,
        assumed=True,
    )
    cpu_w = num(
        profile["processors"]["npu"]["power_w"]["value"] * (47.6 / 31.3),
        "W",
        "derived: llm.npu (mostly NPU, 2.23 W whole-system in prefill, seed 002 §5.6) saves "
        "35.6-59.5x energy vs llama.cpp-CPU at 21.3-41.3x speed (seed 001 §4.2, 1024 tokens, "
        "K60 Pro): CPU power ~ 2.23 W x 47.6 / 31.3 (midpoints)",
        derived=True,
        assumed=True,
    )
    return {
        "_about": "Parameters of the cost models in cpp/soc/cost_model.cpp; written by "
        "scripts/fit_cost_model.py --write",
        "npu": npu,
        "cpu": cpu,
        "gpu": gpu,
        "memory": {
            "dram_gbps": ref(
                profile, "/memory/dram_bandwidth_gbps/npu", "GB/s", "one processor alone"
            ),
            "flash_gbps": ref(profile, "/memory/flash_read_gbps", "GB/s"),
        },
        "sync": {
            "cpu_npu_us": ref(profile, "/sync/cpu_npu_sync_us", "us"),
            "gpu_npu_us": ref(profile, "/sync/gpu_npu_sync_us", "us"),
            "cpu_gpu_us": ref(profile, "/processors/gpu/host_to_gpu_copy_us", "us"),
        },
        "power": {
            "npu_w": ref(profile, "/processors/npu/power_w", "W"),
            "gpu_w": ref(profile, "/processors/gpu/power_w", "W"),
            "cpu_w": cpu_w,
        },
        "graph": {
            "build_ms": ref(profile, "/graph/build_ms", "ms", "Gemma-2B, whole model"),
            "optimize_ms": ref(profile, "/graph/optimize_ms", "ms", "Gemma-2B, whole model"),
        },
    }


def borrowed(cm: dict, device: str, profile: dict) -> dict:
    """The 8 Gen 3 cost model for a device without its own measurements, marked assumed;
    entries the device's own profile has (flash, sync) are taken from it."""
    out = copy.deepcopy(cm)
    for group in out.values():
        if not isinstance(group, dict):
            continue
        for v in group.values():
            if isinstance(v, dict) and "value" in v:
                v["source"] = f"assumed equal to snapdragon-8gen3: {v['source']}"
                v["assumed"] = True
    out["memory"]["flash_gbps"] = ref(profile, "/memory/flash_read_gbps", "GB/s")
    out["_about"] += f"; {device}: no matmul measurements in the seeds, 8 Gen 3 numbers borrowed"
    return out


def predict(rows: list[dict], profile_json: dict) -> list[dict]:
    cost = _core.sim.CostModel(_core.sim.DeviceProfile.from_json(profile_json, "fit"))
    out = []
    for i, r in enumerate(rows, 1):
        for col, (proc, dtype) in COLUMNS.items():
            op = {"op": "matmul", "dtype": dtype, "m": r["m"], "k": r["k"], "n": r["n"]}
            pred_ms = cost.latency_us(op, proc) / 1e3
            out.append(
                {
                    "row": i,
                    "shape": f"{r['m']}x{r['k']}x{r['n']}",
                    "column": col,
                    "measured_ms": r[col],
                    "predicted_ms": pred_ms,
                    "error": pred_ms / r[col] - 1.0,
                }
            )
    return out
