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
    t = overhead + max(flops / compute, weight bytes / weight rate) for a fixed compute rate
    (the C++ fit on Eigen, cpp/soc/fit.h: a log-spaced search over the weight rate, the overhead
    then in closed form)."""
    r = _core.sim.fit_roofline(flops, wbytes, t_us, gops)
    return r["overhead_us"], r["weight_gbps"]


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
    npu_attn, cpu_core = attention_cost_model(profile)
    npu.update(npu_attn)
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
            **memory_contention_model(profile),
        },
        "sync": {
            "cpu_npu_us": ref(profile, "/sync/cpu_npu_sync_us", "us"),
            "gpu_npu_us": ref(profile, "/sync/gpu_npu_sync_us", "us"),
            "cpu_gpu_us": ref(profile, "/processors/gpu/host_to_gpu_copy_us", "us"),
            "gpu_resubmit_us": ref(profile, "/sync/gpu_submit_after_sync_us", "us"),
            "fast_gpu_npu_us": ref(profile, "/sync/fast_sync_us", "us"),
            "fast_gpu_resubmit_us": ref(profile, "/sync/fast_sync_prefill_gpu_resubmit_us", "us"),
        },
        "power": {
            "npu_w": ref(profile, "/processors/npu/power_w", "W"),
            "gpu_w": ref(profile, "/processors/gpu/power_w", "W"),
            "cpu_w": cpu_w,
        },
        "cpu_core": cpu_core,
        "graph": {
            "build_ms": ref(profile, "/graph/build_ms", "ms", "Gemma-2B, whole model"),
            "optimize_ms": ref(profile, "/graph/optimize_ms", "ms", "Gemma-2B, whole model"),
            "reference_linear_params": gemma_2b_linear_params(),
            **online_prepare_model(profile),
        },
    }


def online_prepare_model(profile: dict) -> dict:
    """Run-time graph preparation for one prompt length (seed 002 §5.2.2 Online-prepare): the
    line through its two Llama-8B points, per token and at zero length, and Llama-3-8B's linear
    weights (the engine scales by a model's linear weights: our assumption)."""
    g = profile["graph"]
    (l0, t0), (l1, t1) = (
        (135, g["online_prepare_ms_llama8b_seq135"]["value"]),
        (
            1000,
            g["online_prepare_ms_llama8b_seq1000"]["value"],
        ),
    )
    slope = (t1 - t0) / (l1 - l0)
    src = (
        f"derived: the line through seed 002 §5.2.2's Llama-8B preparation times {t0} ms at "
        f"{l0} tokens and {t1} ms at {l1} tokens"
    )
    return {
        "online_prepare_base_ms": num(t0 - slope * l0, "ms", src, derived=True),
        "online_prepare_ms_per_token": num(slope, "ms/token", src, derived=True),
        "online_prepare_reference_linear_params": num(
            llama3_8b_linear_params(), "params", "Llama-3-8B's linear weights (public config)"
        ),
    }


def memory_contention_model(profile: dict) -> dict:
    """What processors running at once share (seed 002 §3.3): each alone, two together, more."""
    out = {
        f"{p}_gbps": ref(profile, f"/memory/dram_bandwidth_gbps/{p}", "GB/s", f"{p} alone")
        for p in ("cpu", "gpu", "npu")
    }
    out["two_processors_gbps"] = ref(
        profile,
        "/memory/combined_bandwidth_gbps/gpu+npu",
        "GB/s",
        "measured for GPU + NPU; seed 002 §1 gives 'about 60 GB/s' for any two processing units",
    )
    out["peak_gbps"] = ref(
        profile, "/memory/dram_peak_gbps", "GB/s", "three or more processors: the SoC maximum"
    )
    return out


# HeteroLLM's NPU shape-efficiency half point r_half (cost_model.cpp): fitted by
# `scripts/heterollm_fidelity.py --fit` to one number (Hetero-tensor prefill of Llama-8B at 1024
# tokens, 247.9 tok/s, seed 002 §5.2.1); every other HeteroLLM figure is held out.
HETEROLLM_SHAPE_RATIO_HALF = 5.3991
HETEROLLM_SHAPE_FIT_TARGET = "Hetero-tensor Llama-8B 1024: 247.9 tok/s"


# llm.npu's system-level parameters (issue 15 item 9), fitted by `scripts/llmnpu_e2e_fit.py
# --write` to Qwen1.5-1.8B's end-to-end numbers only (seed 001 §4.4 Fig. 16's pruning curve and
# llama.cpp's speed from §1): whole-model NPU and CPU time over the micro-benchmarks' and the
# fixed cost of one shadow part.
LLMNPU_E2E = {"npu_time_scale": 1.6610, "cpu_time_scale": 1.5844, "shadow_fixed_us": 11222.8740}


def llmnpu_e2e_patch(cm: dict, params: dict) -> dict:
    """The cost-model patch of characterization `llmnpu-e2e`: the micro-benchmark fit (`cm`)
    with NPU and CPU times scaled and a fixed cost per shadow part."""
    src = (
        "fitted by scripts/llmnpu_e2e_fit.py to Qwen1.5-1.8B's end-to-end prefill (seed 001 §4.4 "
        "Fig. 16: 156 / 544 / 596 tok/s at pruning 0 / 80 / 100%; §1: llama.cpp)"
    )
    out: dict = {"npu": {}, "cpu": {}}
    for proc, scale in (("npu", params["npu_time_scale"]), ("cpu", params["cpu_time_scale"])):
        for key, v in cm[proc].items():
            if not isinstance(v, dict) or "value" not in v:
                continue
            if key.endswith("_overhead_us"):
                value = v["value"] * scale
            elif key.endswith(("_compute_gops", "_weight_gbps")) or key == "elementwise_gelems":
                value = v["value"] / scale
            else:
                continue
            out[proc][key] = num(
                value, v["unit"], f"{v['source']}; x {scale:.3f} in time, {src}", fitted=True
            )
    out["cpu"]["outlier_fixed_us"] = num(params["shadow_fixed_us"], "us", src, fitted=True)
    return out


def characterizations_8gen3(profile: dict) -> dict:
    """The two descriptions of the 8 Gen 3's FP16 NPU the seeds give (they differ 5000x), each a
    merge patch of the cost model with the stack and layout it assumes."""
    npu_bw = ref(profile, "/memory/dram_bandwidth_gbps/npu", "GB/s", "the NPU alone")
    gpu_bw = ref(profile, "/memory/dram_bandwidth_gbps/gpu", "GB/s", "the GPU alone")
    stored = num(
        1, "flag", "seed 002 §4.4/§6: W4A16 stores int4 weights; kernels read them as stored"
    )
    npu_gflops = profile["processors"]["npu"]["fp16_matmul_gops_effective"]["value"]
    gpu_gflops = profile["processors"]["gpu"]["fp16_gflops"]["value"]
    return {
        "llmnpu-table3": {
            "_about": "The default cost model: NPU FP16 matmuls as llm.npu measured them.",
            "stack": "QNN FP16 matmul ops as built by llm.npu's authors (seed 001 §2.2 Table 3)",
            "layout": "activations [M, K] x weights [K, N] (weights the stationary operand)",
            "source": "seed 001 §2.2 Table 3: 64x2048x2048 NPU FP16 in 252 ms (2.1 GFLOPS)",
            "cost_model": {},
        },
        "llmnpu-e2e": {
            "_about": "The default cost model with llm.npu's system-level parameters fitted to "
            "one model's end-to-end numbers (RESULTS, issue 15 item 9)",
            "stack": "llm.npu (mllm + QNN) and llama.cpp as whole systems, not micro-benchmarks",
            "layout": "as llmnpu-table3",
            "source": "seed 001 §1, §4.4 Fig. 16 (Qwen1.5-1.8B)",
            "cost_model": llmnpu_e2e_patch(profile["cost_model"], LLMNPU_E2E),
        },
        "heterollm": {
            "_about": "HeteroLLM's 8 Gen 3 (seed 002): the NPU at ~10 TFLOPS FP16 with tensor "
            "order and shape chosen well, the GPU at ~1 TFLOPS through PPL's OpenCL kernels; the "
            "characterization every HeteroLLM engine uses (RESULTS, issue 15)",
            "stack": "QNN HTP FP16 graphs built per static shape (seed 002 §4.3, §5.1), W4A16 "
            "weights; GPU: PPL OpenCL W4A16 kernels",
            "layout": "weights [N, K] streamed through an array holding the activations [K, M] "
            "(seed 002 §3.2 Characteristic 2: the order with the small stationary operand)",
            "source": "seed 002 §1, §3.1-3.3",
            "cost_model": {
                "npu": {
                    "fp16_overhead_us": num(
                        0,
                        "us",
                        "no per-graph figure in seed 002: a linear's call costs its GPU-NPU "
                        "synchronization edges (sync section)",
                        assumed=True,
                    ),
                    "fp16_compute_gops": ref(
                        profile, "/processors/npu/fp16_matmul_gops_effective", "Gop/s"
                    ),
                    "fp16_weight_gbps": npu_bw,
                    "fp16_weights_as_stored": stored,
                    "fp16_shape_efficiency_min": num(
                        gpu_gflops / npu_gflops,
                        "share",
                        f"derived: seed 002 §3.2 'the NPU performance regresses to the GPU level' "
                        f"in the worst case: GPU {gpu_gflops:g} / NPU {npu_gflops:g} GFLOPS (§1)",
                        derived=True,
                    ),
                    "fp16_shape_ratio_half": num(
                        HETEROLLM_SHAPE_RATIO_HALF,
                        "rows/columns",
                        "fitted: seed 002 Fig. 5 is only a plot; the half point of the "
                        "efficiency in the streamed weight's rows/columns, fitted to "
                        f"{HETEROLLM_SHAPE_FIT_TARGET} (§5.2.1) by "
                        "scripts/heterollm_fidelity.py --fit",
                        fitted=True,
                    ),
                    "fp16_order_penalty": ref(
                        profile, "/processors/npu/matmul_order_sensitivity", "x"
                    ),
                },
                "gpu": {
                    "fp16_overhead_us": ref(
                        profile,
                        "/processors/gpu/kernel_submit_us",
                        "us",
                        "queued kernel submission",
                    ),
                    "fp16_compute_gops": ref(profile, "/processors/gpu/fp16_gflops", "Gop/s"),
                    "fp16_weight_gbps": gpu_bw,
                    "fp16_weights_as_stored": stored,
                },
            },
        },
    }


# The game's GPU time share (seed 002 §5.5): fitted by `scripts/heterollm_fidelity.py --fit` so
# that Hetero-layer's Llama-8B prefill at 256 tokens loses 9.57% with the game; Hetero-tensor's
# 7.26% is held out.
GAME_GPU_TIME_SHARE = 0.6376


def scenarios_8gen3() -> dict:
    """Co-running apps (seed 000 Table 9's situations; seed 002 §5.5's game). The seeds name
    which processors each app keeps busy but give no shares (Table 9's numbers are lost to a
    figure): the shares are our assumptions, marked so, except the game's fitted GPU share."""

    def share(v, why, **flags):
        return num(v, "share of the processor's time", why, **flags)

    t9 = "seed 000 §5.2 Table 9 ('{}': {} busy); the share is assumed"
    return {
        "_about": "A co-running app as the time it takes on each processor and the DRAM "
        "bandwidth it uses (soc.h CostModel::with_co_runner)",
        "taking-photos": {
            "cpu_time_share": share(0.25, t9.format("taking photos", "ISP and CPU"), assumed=True),
            "dram_gbps": num(
                4, "GB/s", "assumed: a camera preview stream through the ISP", assumed=True
            ),
        },
        "watching-videos": {
            "cpu_time_share": share(
                0.15, t9.format("watching videos", "GPU and CPU"), assumed=True
            ),
            "gpu_time_share": share(
                0.15, t9.format("watching videos", "GPU and CPU"), assumed=True
            ),
            "dram_gbps": num(2, "GB/s", "assumed: video decode and composition", assumed=True),
        },
        "listening-to-music": {
            "cpu_time_share": share(0.05, t9.format("listening to music", "CPU"), assumed=True),
        },
        "browsing-shopping": {
            "cpu_time_share": share(0.2, t9.format("browsing shopping apps", "CPU"), assumed=True),
            "gpu_time_share": share(0.1, "assumed: UI rendering while browsing", assumed=True),
            "dram_gbps": num(2, "GB/s", "assumed", assumed=True),
        },
        "mobile-game": {
            "gpu_time_share": share(
                GAME_GPU_TIME_SHARE,
                "fitted: seed 002 §5.5 (League of Legends: Wild Rift at 60 FPS) Hetero-layer "
                "Llama-8B prefill at 256 tokens loses 9.57% with the game "
                "(scripts/heterollm_fidelity.py --fit)",
                fitted=True,
            ),
            "cpu_time_share": share(0.1, "assumed: the game's logic thread", assumed=True),
            "dram_gbps": num(8, "GB/s", "assumed: 60 FPS rendering traffic", assumed=True),
        },
    }


def gemma_2b_linear_params() -> dict:
    """Linear weights of the model the graph build/optimize times were measured on."""
    from ..configs import load_config

    c = load_config("gemma-2b")
    d, q, kv, ff = (
        c["d_model"],
        c["n_heads"] * c["head_dim"],
        c["n_kv_heads"] * c["head_dim"],
        c["d_ff"],
    )
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * ff
    return {
        "value": c["n_layers"] * per_layer,
        "unit": "parameters",
        "source": f"linear weights of Gemma-2B (python/socllm/configs/gemma-2b.json: "
        f"{c['n_layers']} layers x (q/k/v {d}x{q + 2 * kv} + o {q}x{d} + gate/up/down 3 x "
        f"{d}x{ff})), the model build_ms and optimize_ms were measured on (seed 001 §2.2-2.3); "
        "run-time graph build and optimize times of another model scale with its linear weight "
        "count (our choice: the seeds give one model's numbers only)",
    }


def attention_cost_model(profile: dict) -> tuple[dict, dict]:
    """Head-wise attention rates (seed 000, cpp/soc/cost_model.cpp attention_us): the NPU's
    fused Q·Kᵀ launches from §3.4's 1/2/4-head latencies, and one mid core's dense, estimation,
    top-k and sparse-attention rates from §2 Fig. 4a's breakdown on top of an assumed dense rate."""
    npu = profile["processors"]["npu"]
    pts = npu["qxk_graph_latency_ms"]["value"]
    heads = np.array([1.0, 2.0, 4.0])
    ms = np.array([pts["1_head"], pts["2_heads"], pts["4_heads"]], dtype=float)
    slope, intercept = _core.sim.polyfit(heads, ms, 1)
    shape = npu["qxk_graph_shape"]["value"]
    ops = 2.0 * shape["q_rows"] * shape["keys"] * shape["head_dim"]
    sync = profile["sync"]["cpu_npu_sync_us"]["value"]
    where = "seed 000 §3.4 (Q 128x64 · K 2048x64 INT8 on MI14: 2 / 3 / 4 ms for 1 / 2 / 4 heads)"
    npu_attn = {
        "launch_us": num(
            1e3 * intercept - sync,
            "us",
            f"derived: least-squares line through {where} = {intercept:.2f} ms + "
            f"{slope:.3f} ms/head; the intercept is one launch round trip, minus the simulator's "
            f"CPU-NPU sync ({sync:.0f} us, /cost_model/sync/cpu_npu_us) that every NPU result "
            "pays on its way to the CPU, so one launch + sync = the measured latency",
            derived=True,
        ),
        "int8_attn_matmul_gops": num(
            ops / (slope * 1e-3) / 1e9,
            "Gop/s",
            f"derived: {where}: one more fused head costs {slope:.3f} ms for 2 x 128 x 2048 x 64 "
            f"= {ops / 1e6:.1f} Mop (seed 000 calls ζnpu compute-bound); a small graph's "
            "effective rate, far below the 1.4 TOPS of the llm.npu Table 3 weight matmuls",
            derived=True,
        ),
    }
    mid = profile["processors"]["cpu_mid"]
    peak = mid["fp32_gflops"]["value"]
    eff = mid["attention_efficiency"]["value"]
    dense = peak * eff
    red = mid["attention_fig4a_latency_reduction"]["value"]
    keep = np.array([float(k) for k in red])
    lat = np.array([1.0 - v / 100.0 for v in red.values()])
    b, a = _core.sim.polyfit(keep, lat, 1)  # C/G-Sparse latency = a + b·keep, in C/G-Full units
    d = mid["attention_fig4a_head_dim"]["value"]
    topk_ns = mid["topk_ns_per_score"]["value"]
    pair_ns = 4.0 * d / dense  # a causal pair of dense attention: QK and PV, d dims
    est_ns = a * pair_ns - topk_ns
    fig4a = (
        "seed 000 §2 Fig. 4a (one 8 Gen 3 mid core): C/G-Sparse latency = "
        f"{a:.3f} + {b:.3f} x keep of C/G-Full (line through the 40/30/20% points; "
        f"{100 * a / (a + 0.2 * b):.1f}% estimation at 20%, the paper says 66.7%), head_dim {d}"
    )
    cpu_mid = {
        "fp32_attention_gops": num(
            dense,
            "Gop/s",
            f"derived: profile /processors/cpu_mid/fp32_gflops {peak} x attention_efficiency "
            f"{eff} (both assumed: no seed gives a per-core rate); counted as 4 x head_dim ops "
            "per causal (query, key) pair",
            derived=True,
            assumed=True,
        ),
        "topk_gscores": num(
            1.0 / topk_ns,
            "Gscore/s",
            f"profile /processors/cpu_mid/topk_ns_per_score: {topk_ns} ns per score, assumed",
            assumed=True,
        ),
        "fp32_attn_matmul_gops": num(
            2.0 * d / est_ns,
            "Gop/s",
            f"derived: {fig4a}: estimation + top-k = {a:.3f} x the dense time of a pair "
            f"({pair_ns:.2f} ns) = {a * pair_ns:.2f} ns, minus {topk_ns} ns of top-k, for "
            f"2 x {d} ops of Q·Kᵀ",
            derived=True,
        ),
        "fp32_sparse_attention_gops": num(
            4.0 * d / (b * pair_ns),
            "Gop/s",
            f"derived: {fig4a}: a kept pair costs {b:.3f} x a dense pair (gathered keys) for "
            f"4 x {d} ops",
            derived=True,
        ),
    }
    fused = mid["fused_sparse_attention_speedup"]["value"]
    cpu_mid["fp32_fused_sparse_attention_gops"] = num(
        fused * cpu_mid["fp32_sparse_attention_gops"]["value"],
        "Gop/s",
        f"derived: shadowAttn's own sparse attention kernel (seed 000 §4) at "
        f"profile /processors/cpu_mid/fused_sparse_attention_speedup {fused} x the vanilla "
        "kernel's rate above",
        derived=True,
        assumed=True,
    )
    return npu_attn, {"mid": cpu_mid}


def llama3_8b_linear_params() -> int:
    from ..configs import load_config

    c = load_config("llama-3-8b")
    q, kv = c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"]
    d, ff = c["d_model"], c["d_ff"]
    return c["n_layers"] * (d * (q + 2 * kv) + q * d + 3 * d * ff)


def cold_start_cost_model(cm: dict, profile: dict) -> None:
    """Unpacking rates and the flash read power of a profile with EdgeFlow's numbers (seed
    004): the whole-model unpack times of Llama3-8B on one thread, per weight."""
    cpu_all = profile.get("processors", {}).get("cpu_all", {})
    n = llama3_8b_linear_params()
    for fmt, key in (
        ("weightlet", "unpack_edgeflow_s_llama3_8b"),
        ("kquant", "unpack_kquant_s_llama3_8b"),
    ):
        if key in cpu_all:
            s = cpu_all[key]["value"]
            cm["cpu"][f"unpack_{fmt}_gweights_s"] = num(
                n / s / 1e9,
                "Gweights/s",
                f"derived: Llama3-8B's {n} linear weights / {s} s (profile "
                f"/processors/cpu_all/{key}: {cpu_all[key]['source']})",
                derived=True,
            )
    if "flash_read_power_w" in profile.get("memory", {}):
        cm["power"]["io_w"] = ref(profile, "/memory/flash_read_power_w", "W")
    count = cpu_all.get("count", {}).get("value")
    if count and "cpu_w" in cm["power"]:
        cm["power"]["cpu-aux_w"] = num(
            cm["power"]["cpu_w"]["value"] / count,
            "W",
            f"derived: the CPU's active power / its {count} cores (one core unpacking); "
            "assumed: the seeds give no per-core power",
            derived=True,
            assumed=True,
        )


def borrowed(cm: dict, device: str, profile: dict) -> dict:
    """The 8 Gen 3 cost model for a device without its own measurements, marked assumed;
    entries the device's own profile has (flash, sync) are taken from it."""
    out = copy.deepcopy(cm)

    def mark(group: dict) -> None:
        for v in group.values():
            if isinstance(v, dict) and "value" in v:
                v["source"] = f"assumed equal to snapdragon-8gen3: {v['source']}"
                v["assumed"] = True
            elif isinstance(v, dict):
                mark(v)  # nested groups (cpu_core/<core>)

    for group in out.values():
        if isinstance(group, dict):
            mark(group)
    out["memory"]["flash_gbps"] = ref(profile, "/memory/flash_read_gbps", "GB/s")
    cold_start_cost_model(out, profile)
    # a model's parameter count, not a device number
    out["graph"]["reference_linear_params"] = copy.deepcopy(cm["graph"]["reference_linear_params"])
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
