"""The paper numbers socllm reproduces (issue 40): each with its seed and table/figure, value,
unit and conditions, and how the SoC model predicts it. Ranges the papers give ("18.17-38.4x")
are targets whose error is the distance to the nearer end (0 inside).

Every prediction runs the simulator on a :class:`~socllm.fidelity.model.SocModel`'s profiles:
llm.npu's and shadowAttn's rows on the 8 Gen 3 as is (seed 001 Table 3's reading of the NPU,
``llmnpu-table3``), HeteroLLM's on the 8 Gen 3 under variant ``heterollm`` (seed 002's reading
of the same NPU's FP16 path, 5000x faster: the two seeds disagree about FP16 and both readings
stay), energy tables on the phones they were measured on (8 Gen 2: llm.npu §4.2 and shadowAttn
Table 8), EdgeFlow's on the 8 Elite.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ..configs import load_config
from ..sim.timeline import simulate, simulate_cold_start, simulate_hetero
from .model import ELITE, GEN2, GEN3, SocModel, scale_rates


@dataclass(frozen=True)
class Target:
    id: str  # seed and table/figure, then what
    paper: str  # a key of model.PAPERS
    value: float
    unit: str
    conditions: str
    predict: Callable[[SocModel], float] | None
    lo: float | None = None  # a range the paper states (value is its midpoint)
    hi: float | None = None
    why_not_modelled: str = ""

    @property
    def modelled(self) -> bool:
        return self.predict is not None


def _sim(m: SocModel, device: str, cfg, plan: str, n: int, **kw) -> dict:
    key = ("sim", device, str(cfg), str(plan), n, tuple(sorted(kw.items())))
    return m.timing(key, lambda: simulate(cfg, m.profile(device), plan, n, **kw).summary())


# ---- llm.npu (seed 001) and what seed 002 says of it -------------------------------------------

LLMNPU_MODELS = ("qwen1.5-1.8b", "gemma-2b", "llama-2-7b")
# seed 001 §4.7 Fig. 19's ablation, step by step, as simulate's arguments (chunk None: the whole
# prompt at once; processor "cpu": every op class on the CPU). Its last step is llm.npu itself
# and its first llama.cpp, the two systems of every llm.npu row (scripts/reproduce_llmnpu.py).
LLMNPU_LADDER: dict[str, dict] = {
    "llama.cpp-CPU": {"plan": "w8-group", "processor": "cpu", "policy": "in-order", "chunk": None},
    "naive NPU": {
        "plan": "w8-group", "policy": "in-order", "chunk": None, "runtime_graph_build": True
    },
    "+ chunk graphs": {"plan": "w8-group", "policy": "in-order", "chunk": 256},
    "+ shadow outliers": {"plan": "shadow-outlier", "policy": "in-order", "chunk": 256},
    "+ out-of-order": {"plan": "shadow-outlier", "policy": "npu-stall-first", "chunk": 256},
}  # fmt: skip
LLMNPU_RUN = LLMNPU_LADDER["+ out-of-order"]
LLAMACPP_RUN = LLMNPU_LADDER["llama.cpp-CPU"]
# what each step changes and the paper's range over the three models (Fig. 19)
LLMNPU_LADDER_PAPER = {
    "naive NPU": ("slowdown vs llama.cpp-CPU", 2.55, 2.68),
    "+ chunk graphs": ("speedup over naive", 1.46, 5.09),
    "+ shadow outliers": ("speedup over + chunk", 3.91, 8.68),
    "+ out-of-order": ("latency reduction", 0.18, 0.44),
}
# seed 001 §4.4 Fig. 16 (K70 Pro): prefill tokens/s at pruning rates 0 / 80 / 100%, 1024 tokens
LLMNPU_PRUNING_TOK_S = {
    "qwen1.5-1.8b": {0.0: 156, 0.8: 544, 1.0: 596},
    "gemma-2b": {0.0: 102, 0.8: 285, 1.0: 345},
}
# seed 001 §4.2 Fig. 14: llm.npu's speedup over llama.cpp-CPU, the range over the three models
LLMNPU_VS_LLAMACPP = {1024: (18.17, 38.4), 64: (7.1, 14.86)}
# seed 001 §1: '21.7 seconds for automated email replies' over LongBench's 1168-1835 tokens
# (midpoint 1501); the target is the speed as the table shows it, 69.2 tok/s
LLAMACPP_QWEN_TOKENS, LLAMACPP_QWEN_S = 1501, 21.7
LLAMACPP_QWEN_TOK_S = round(LLAMACPP_QWEN_TOKENS / LLAMACPP_QWEN_S, 1)


def ladder_ratios(ms: dict[str, float]) -> dict[str, float]:
    """Each ablation step's effect (LLMNPU_LADDER_PAPER) from the steps' prefill times."""
    return {
        "naive NPU": ms["naive NPU"] / ms["llama.cpp-CPU"],
        "+ chunk graphs": ms["naive NPU"] / ms["+ chunk graphs"],
        "+ shadow outliers": ms["+ chunk graphs"] / ms["+ shadow outliers"],
        "+ out-of-order": 1 - ms["+ out-of-order"] / ms["+ shadow outliers"],
    }


def _run(m: SocModel, device: str, cfg: str, n: int, run: dict) -> dict:
    kw = dict(run)
    return _sim(m, device, cfg, kw.pop("plan"), n, **kw)


def _llmnpu(m: SocModel, cfg: str, n: int, pruning=None, policy="npu-stall-first", dev=GEN3):
    plan = "shadow-outlier" if pruning is None else f"shadow-outlier:pruning_rate={pruning}"
    return _run(m, dev, cfg, n, {**LLMNPU_RUN, "plan": plan, "policy": policy})


def _llamacpp(m: SocModel, cfg: str, n: int, dev=GEN3):
    return _run(m, dev, cfg, n, LLAMACPP_RUN)


def _ladder(m: SocModel, cfg: str) -> dict:
    """seed 001 §4.7's ablation at 1024 tokens."""
    return ladder_ratios(
        {k: _run(m, GEN3, cfg, 1024, r)["prefill_ms"] for k, r in LLMNPU_LADDER.items()}
    )


def _mean(xs) -> float:
    return float(statistics.fmean(xs))


def llmnpu_targets() -> list[Target]:
    t: list[Target] = []
    q = "qwen1.5-1.8b"
    t.append(
        Target(
            "001 abstract/§1: Qwen1.5-1.8B prefill at 1024 tokens", "llmnpu", 1000, "tok/s",
            "K70 Pro (8 Gen 3), shadow-outlier, chunks of 256, out-of-order; '>1000 tokens/s'",
            lambda m: _llmnpu(m, q, 1024)["prefill_tokens_per_s"],
        )
    )  # fmt: skip
    for cfg, curve in LLMNPU_PRUNING_TOK_S.items():
        for r, v in curve.items():
            t.append(
                Target(
                    f"001 §4.4 Fig. 16: {cfg} prefill at pruning {int(100 * r)}%", "llmnpu", v,
                    "tok/s", "1024 tokens, K70 Pro",
                    lambda m, cfg=cfg, r=r: _llmnpu(m, cfg, 1024, r)["prefill_tokens_per_s"],
                )
            )  # fmt: skip
    t.append(
        Target(
            "001 §1: llama.cpp-CPU prefill, Qwen1.5-1.8B", "llmnpu", LLAMACPP_QWEN_TOK_S,
            "tok/s",
            "derived: '21.7 seconds for automated email replies' over LongBench's 1168-1835 "
            "tokens (midpoint 1501); simulated at 1024",
            lambda m: _llamacpp(m, q, 1024)["prefill_tokens_per_s"],
        )
    )  # fmt: skip
    for n, (lo, hi) in LLMNPU_VS_LLAMACPP.items():
        t.append(
            Target(
                f"001 §4.2 Fig. 14: speedup over llama.cpp-CPU at {n} tokens, mean of 3 models",
                "llmnpu", (lo + hi) / 2, "x",
                "Qwen1.5-1.8B, Gemma-2B, Llama-2-7B; the paper's range over models",
                lambda m, n=n: _mean(
                    _llamacpp(m, c, n)["prefill_ms"] / _llmnpu(m, c, n)["prefill_ms"]
                    for c in LLMNPU_MODELS
                ),
                lo, hi,
            )
        )  # fmt: skip
    t.append(
        Target(
            "001 §3.4: NPU time of one 256-token chunk, Qwen1.5-1.8B", "llmnpu", 315, "ms",
            "in order, 256 tokens",
            lambda m: _llmnpu(m, q, 256, policy="in-order")["busy_ms"]["npu"],
        )
    )  # fmt: skip
    t.append(
        Target(
            "002 §5.2.1: llm.npu (mllm-NPU) prefill of a 1.8B model at 256 tokens", "llmnpu", 564,
            "tok/s", "seed 002's measurement of llm.npu; Qwen1.5-1.8B",
            lambda m: _llmnpu(m, q, 256)["prefill_tokens_per_s"],
        )
    )  # fmt: skip
    t.append(
        Target(
            "002 §5.2.2: llm.npu's chunked prefill at 256 over 1024 tokens", "llmnpu", 0.5, "x",
            "'degraded to half when the sequence length is shortened to 256'; Qwen1.5-1.8B",
            lambda m: _llmnpu(m, q, 256)["prefill_tokens_per_s"]
            / _llmnpu(m, q, 1024)["prefill_tokens_per_s"],
        )
    )  # fmt: skip
    for step, (what, lo, hi) in LLMNPU_LADDER_PAPER.items():
        t.append(
            Target(
                f"001 §4.7 Fig. 19: {step}, {what}, mean of 3 models", "llmnpu", (lo + hi) / 2,
                "share" if step == "+ out-of-order" else "x",
                "1024 tokens; the paper's range over models",
                lambda m, step=step: _mean(_ladder(m, c)[step] for c in LLMNPU_MODELS), lo, hi,
            )
        )  # fmt: skip
    t.append(
        Target(
            "001 §4.2 Fig. 15: energy saving over llama.cpp-CPU at 1024, mean of 3 models",
            "llmnpu", (35.6 + 59.5) / 2, "x", "K60 Pro (8 Gen 2); the paper's range over models",
            lambda m: _mean(
                m.energy_mj(GEN2, _llamacpp(m, c, 1024, GEN2))
                / m.energy_mj(GEN2, _llmnpu(m, c, 1024, dev=GEN2))
                for c in LLMNPU_MODELS
            ),
            35.6, 59.5,
        )
    )  # fmt: skip
    return t


# ---- HeteroLLM (seed 002) ----------------------------------------------------------------------

HETERO_MODELS = {
    "Llama-8B": "llama-3-8b",
    "Llama-7B": "llama-2-7b",
    "Llama-3B": "llama-3.2-3b",
    "InternLM-1.8B": "internlm-1.8b",
}


def _hetero(m: SocModel, cfg, engine, n, phase="prefill", fast=True, **kw) -> dict:
    key = ("hetero", cfg, engine, n, phase, fast, tuple(sorted(kw.items())))
    return m.timing(
        key,
        lambda: simulate_hetero(
            cfg, m.profile(GEN3), engine, n, phase=phase, fast_sync=fast, **kw
        ).summary(),
    )


def _tok_s(m, cfg, engine, n, phase="prefill", fast=True, **kw) -> float:
    s = _hetero(m, cfg, engine, n, phase, fast, **kw)
    return s["decode_tokens_per_s" if phase == "decode" else "prefill_tokens_per_s"]


def _game_loss(m, engine, **kw) -> float:
    clean = _tok_s(m, "llama-3-8b", engine, 256)
    return 1.0 - _tok_s(m, "llama-3-8b", engine, 256, co_runner="mobile-game", **kw) / clean


def _energy_mj(m, engine) -> float:
    return m.energy_mj(GEN3, _hetero(m, "llama-3-8b", engine, 256))


def _power_w(m, engine) -> float:
    return _energy_mj(m, engine) / _hetero(m, "llama-3-8b", engine, 256)["prefill_ms"]


def heterollm_targets() -> list[Target]:
    L8 = "llama-3-8b"
    t = [
        Target(
            "002 §5.2.1 Fig. 12: Hetero-tensor prefill, Llama-8B, 1024", "heterollm", 247.9,
            "tok/s", "W4A16, fast sync", lambda m: _tok_s(m, L8, "hetero-tensor", 1024),
        ),
        Target(
            "002 §5.2.1: Hetero-tensor prefill, InternLM-1.8B, 256", "heterollm", 1092, "tok/s",
            "W4A16, fast sync", lambda m: _tok_s(m, "internlm-1.8b", "hetero-tensor", 256),
        ),
        Target(
            "002 §5.2.1 Fig. 12: Hetero-tensor over Hetero-layer, mean of 4 models x 64/256/1024",
            "heterollm", 1.302, "x", "prefill, fast sync",
            lambda m: _mean(
                _tok_s(m, c, "hetero-tensor", n) / _tok_s(m, c, "hetero-layer", n)
                for c in HETERO_MODELS.values() for n in (64, 256, 1024)
            ),
        ),
    ]  # fmt: skip
    for base, v in (("npu-online-prepare", 2.24), ("npu-padding", 2.21), ("npu-pipe", 1.35)):
        t.append(
            Target(
                f"002 §5.2.2 Fig. 14: Hetero-tensor over {base} at 525 tokens", "heterollm", v,
                "x", "Llama-8B prefill, misaligned length",
                lambda m, base=base: _tok_s(m, L8, "hetero-tensor", 525) / _tok_s(m, L8, base, 525),
            )
        )  # fmt: skip
    for engine, v in (("hetero-layer", 1.158), ("hetero-tensor", 1.243)):
        t.append(
            Target(
                f"002 §5.4 Fig. 17: fast sync gain, {engine}, Llama-8B prefill", "heterollm", v,
                "x", "mean of 64/256/1024 tokens",
                lambda m, e=engine: _mean(
                    _tok_s(m, L8, e, n) / _tok_s(m, L8, e, n, fast=False) for n in (64, 256, 1024)
                ),
            )
        )  # fmt: skip
    t.append(
        Target(
            "002 §5.4: Hetero-tensor prefill without fast sync, Llama-8B 256", "heterollm",
            196.44, "tok/s", "conventional sync",
            lambda m: _tok_s(m, L8, "hetero-tensor", 256, fast=False),
        )
    )  # fmt: skip
    for cfg, v in (("llama-3-8b", 14.01), ("llama-3.2-3b", 29.9), ("internlm-1.8b", 51.12)):
        t.append(
            Target(
                f"002 §5.3 Fig. 15: Hetero-tensor decode, {cfg}", "heterollm", v, "tok/s",
                "prompt 256, fast sync",
                lambda m, c=cfg: _tok_s(m, c, "hetero-tensor", 256, "decode"),
            )
        )  # fmt: skip
    for cfg, v in (("llama-3-8b", 1.234), ("llama-3.2-3b", 1.0852), ("internlm-1.8b", 1.1338)):
        t.append(
            Target(
                f"002 §5.3: decode over GPU-only (PPL-OpenCL), {cfg}", "heterollm", v, "x",
                "prompt 256, fast sync",
                lambda m, c=cfg: _tok_s(m, c, "hetero-tensor", 256, "decode")
                / _tok_s(m, c, "gpu-only", 256, "decode"),
            )
        )  # fmt: skip
    t += [
        Target(
            "002 §5.4: decode with fast sync over without, Llama-8B", "heterollm", 4.01, "x",
            "Hetero-tensor, prompt 256",
            lambda m: _tok_s(m, L8, "hetero-tensor", 256, "decode")
            / _tok_s(m, L8, "hetero-tensor", 256, "decode", fast=False),
        ),
        Target(
            "002 §5.4: decode with fast sync over without, other models", "heterollm", 2.2, "x",
            "Hetero-tensor, prompt 256, mean of Llama-7B, Llama-3B and InternLM-1.8B ('comparable "
            "improvements of 2.2x')",
            lambda m: _mean(
                _tok_s(m, c, "hetero-tensor", 256, "decode")
                / _tok_s(m, c, "hetero-tensor", 256, "decode", fast=False)
                for c in ("llama-2-7b", "llama-3.2-3b", "internlm-1.8b")
            ),
        ),
        Target(
            "002 §5.5: prefill loss with a game, Hetero-layer", "heterollm", 0.0957, "share",
            "Llama-8B, 256 tokens, Wild Rift at 60 FPS", lambda m: _game_loss(m, "hetero-layer"),
        ),
        Target(
            "002 §5.5: prefill loss with a game, Hetero-tensor", "heterollm", 0.0726, "share",
            "Llama-8B, 256 tokens; partitions re-solved for the game",
            lambda m: _game_loss(m, "hetero-tensor", solve_for_co_runner=True),
        ),
        Target(
            "002 §5.6 Fig. 19: power of Hetero-layer", "heterollm", 2.23, "W",
            "Llama-8B prefill, 256 tokens, whole phone", lambda m: _power_w(m, "hetero-layer"),
        ),
        Target(
            "002 §5.6 Fig. 19: power of PPL-OpenCL (GPU only)", "heterollm", 4.34, "W",
            "derived: 2.23 W x 1.232 / (1 - 0.367)", lambda m: _power_w(m, "gpu-only"),
        ),
        Target(
            "002 §5.6: power, Hetero-tensor over Hetero-layer", "heterollm", 1.232, "x",
            "Llama-8B prefill, 256 tokens",
            lambda m: _power_w(m, "hetero-tensor") / _power_w(m, "hetero-layer"),
        ),
        Target(
            "002 §5.6: energy, Hetero-tensor over Hetero-layer", "heterollm", 1.033, "x",
            "Llama-8B prefill, 256 tokens",
            lambda m: _energy_mj(m, "hetero-tensor") / _energy_mj(m, "hetero-layer"),
        ),
        Target(
            "002 §5.6: energy efficiency, Hetero-tensor over PPL-OpenCL", "heterollm", 5.87, "x",
            "Llama-8B prefill, 256 tokens",
            lambda m: _energy_mj(m, "gpu-only") / _energy_mj(m, "hetero-tensor"),
        ),
    ]  # fmt: skip
    return t


# ---- shadowAttn (seed 000) ---------------------------------------------------------------------

SHADOW_MODELS = ("phonelm-0.5b", "phonelm-1.5b", "qwen2-0.5b", "qwen2-1.5b")
SHADOW_VARIANTS = ("C/G-Full", "C/G-Sparse", "C/G-Block-Sparse", "NPU-Full", "shadowAttn")
ATTN_KINDS = ("attention", "estimate", "topk", "sparse_attention")
# seed 000 Table 8 (J, one kernel at 1024 tokens, Redmi K60 Champion Edition)
TABLE8_J = {
    "phonelm-0.5b": (3.72, 2.81, 1.10, 0.85, 0.66),
    "phonelm-1.5b": (8.59, 5.16, 1.51, 1.29, 1.12),
    "qwen2-0.5b": (3.38, 2.35, 0.88, 0.85, 0.56),
    "qwen2-1.5b": (5.29, 3.28, 0.85, 1.10, 0.71),
}


def shadow_variant_plan(variant: str, base: str = "w8a8"):
    """seed 000's attention variant on a linear scheme ``base``: a plan name or a Plan."""
    from .. import Plan

    if variant == "C/G-Full":
        return Plan(base).placed("attention", "cpu", "fp32")
    return {
        "C/G-Sparse": f"{base}:attention=sparse",
        "C/G-Block-Sparse": f"{base}:attention=block-sparse",
        "NPU-Full": f"{base}:attention=npu-int8",
        "shadowAttn": f"{base}:attention=shadow-attn,ratios=uniform",
    }[variant]


def shadow_config(name: str, layers: int | None = None) -> dict:
    """A config as seed 000 times it: ``layers`` of it, a context of at least 8192."""
    c = load_config(name)
    if layers:
        c["n_layers"] = layers
    c["context_length"] = max(c["context_length"], 8192)  # seed 000 runs PhoneLM at 4096
    return c


def attention_kernel_span(tl, cost) -> tuple[float, dict[str, float]]:
    """Span (ms) of layer 0's attention tasks over the whole prompt, rope excluded, and each
    processor's busy ms in it: seed 000's kernel (also scripts/shadow_attn_timing.py's)."""
    start, end, busy = float("inf"), 0.0, {}
    for t in tl.tasks:
        if t["layer"] != 0 or t["chunk"] != 0 or t["kind"] not in ATTN_KINDS:
            continue
        rope = sum(cost.latency_us(o, t["processor"]) for o in t["ops"] if o.get("name") == "rope")
        s, e = tl.spans_us[t["id"], 0] + rope, tl.spans_us[t["id"], 1]
        if e <= s:  # the rope alone
            continue
        start, end = min(start, s), max(end, e)
        busy[t["processor"]] = busy.get(t["processor"], 0.0) + (e - s) / 1e3
    return (end - start) / 1e3, busy


def _kernel(m: SocModel, device: str, cfg: str, variant: str, n: int) -> tuple[float, float]:
    """Latency (ms) and energy (J) of layer 0's attention over the whole prompt, rope excluded
    (scripts/shadow_attn_timing.py). Energy by the component model: the static floor over the
    kernel's span, each task's processor power above it (one mid core for CPU tasks)."""

    def spans():  # durations only
        from ..sim import CostModel, DeviceProfile

        prof = m.profile(device)
        tl = simulate(
            shadow_config(cfg, 1), prof, shadow_variant_plan(variant), n, chunk=None,
            attention_cpu_core="mid",
        )  # fmt: skip
        return attention_kernel_span(tl, CostModel(DeviceProfile.from_json(prof, device)))

    span_ms, busy = m.timing(("kernel", device, cfg, variant, n), spans)
    pw = m.profile(device)["cost_model"]["power"]
    watts = {p: pw["cpu_mid_w" if p == "cpu" else f"{p}_w"]["value"] for p in busy}
    joules = (span_ms * pw["static_w"]["value"] + sum(busy[p] * watts[p] for p in busy)) / 1e3
    return span_ms, joules


def _kernel_speedups(m: SocModel) -> tuple[list[float], list[float]]:
    full, lossy = [], []
    for c in SHADOW_MODELS:
        for n in (1024, 2048, 4096):
            ms = {v: _kernel(m, GEN3, c, v, n)[0] for v in SHADOW_VARIANTS}
            full.append(ms["C/G-Full"] / ms["shadowAttn"])
            lossy.append(max(ms[v] for v in SHADOW_VARIANTS[1:4]) / ms["shadowAttn"])
    return full, lossy


def _e2e_speedups(m: SocModel) -> list[float]:
    out = []
    for c in SHADOW_MODELS:
        for n in (3840, 4096, 1792):  # ArxivSum, Octopus, DroidCall (§5.1)
            ms = {
                v: _sim(
                    m, GEN3, shadow_config(c), shadow_variant_plan(v, "shadow-outlier"), n,
                    chunk=256, attention_cpu_core="mid",
                )["prefill_ms"]
                for v in ("C/G-Full", "shadowAttn")
            }  # fmt: skip
            out.append(ms["C/G-Full"] / ms["shadowAttn"])
    return out


def shadowattn_targets() -> list[Target]:
    t = [
        Target(
            "000 §5.2 Fig. 10: kernel speedup over C/G-Full, max", "shadowattn", 6.9, "x",
            "one layer, 4 models x 1024/2048/4096 tokens, one mid core, keep 0.2",
            lambda m: max(_kernel_speedups(m)[0]),
        ),
        Target(
            "000 §5.2 Fig. 10: kernel speedup over C/G-Full, mean", "shadowattn", 3.5, "x",
            "as above", lambda m: _mean(_kernel_speedups(m)[0]),
        ),
        Target(
            "000 §5.2 Fig. 10: kernel speedup over the lossy baselines, max", "shadowattn", 4.0,
            "x", "C/G-Sparse, C/G-Block-Sparse, NPU-Full", lambda m: max(_kernel_speedups(m)[1]),
        ),
        Target(
            "000 §5.3 Fig. 11: end-to-end speedup over C/G-Full, max", "shadowattn", 4.5, "x",
            "llm.npu's linears, 4 models x 3 datasets, prefill",
            lambda m: max(_e2e_speedups(m)),
        ),
        Target(
            "000 §5.3 Fig. 11: end-to-end speedup over C/G-Full, mean", "shadowattn", 2.9, "x",
            "as above", None,
            why_not_modelled="the paper's end-to-end time includes 10-50 decoding steps with full "
            "attention in every variant, whose count per dataset it does not give",
        ),
    ]  # fmt: skip
    for c, js in TABLE8_J.items():
        for v, j in zip(SHADOW_VARIANTS, js, strict=True):
            t.append(
                Target(
                    f"000 §5.4 Table 8: kernel energy, {c}, {v}", "shadowattn", j, "J",
                    "1024 tokens, one layer, Redmi K60 Champion (8 Gen 2)",
                    lambda m, c=c, v=v: _kernel(m, GEN2, c, v, 1024)[1],
                )
            )  # fmt: skip
    return t


# ---- EdgeFlow (seed 004) -----------------------------------------------------------------------

EF_CONFIGS = ("llama-3-8b", "mistral-7b", "phi-3-mini-3.8b", "qwen1.5-1.8b")
# the middle of seed 004 Table 3's prompt ranges
EF_PROMPTS = {"LAMBADA": 78, "WinoGrande": 138, "OBQA": 210, "MMLU": 471, "HellaSwag": 985}
# seed 004 §5.2 Fig. 10: EdgeFlow's mean TTFT speedup over each baseline, by bits
EF_PAPER_SPEEDUP = {
    7: {"llama.cpp": 3.92, "mnn": 2.28, "llm.npu+": 1.47},
    4: {"llama.cpp": 4.24, "mnn": 2.53, "llm.npu+": 1.63},
}
EF_PAPER_LONG_PROMPT = (1.37, 1.41)  # §5.2: 7-bit over llm.npu+ on MMLU and HellaSwag
EF_PAPER_LLMNPU_TTFT_S = 9.1  # Fig. 1: llm.npu+ cold start, Llama3-8B, 128 tokens
# §5.4.3 Fig. 14: the pipeline ablation (Llama3-8B, 512 tokens, chunks of 128): each step as
# (plan, policy) and its latency change in %
EF_ABLATION = {
    "llm.npu": ("w8a8", "in-order", None),
    "+Place": ("edgeflow", "in-order", -4.2),
    "+Priority": ("edgeflow", "position-first", -5.2),
    "+Steal": ("edgeflow", "position-steal", -11.3),
}


def edgeflow_system_profile(
    profile: dict, system: str, mnn_speed: float, llmnpu_graph_bytes: float
) -> dict:
    """The 8 Elite profile as a cold-start ``system`` sees it (a copy): MNN's CPU kernels at
    ``mnn_speed`` x llama.cpp's, llm.npu+ reading ``llmnpu_graph_bytes`` per INT8 byte."""
    import copy

    prof = copy.deepcopy(profile)
    cm = prof["cost_model"]
    if system == "mnn":  # unpacking was measured on the phone itself (seed 004 Fig. 4b)
        for table in (cm["cpu"], *cm.get("cpu_core", {}).values()):
            scale_rates(table, 1.0 / mnn_speed, lambda k: not k.startswith("unpack_"))
    elif system == "llm.npu+":
        cm["memory"]["flash_gbps"]["value"] /= llmnpu_graph_bytes
    return prof


def _cold(m: SocModel, cfg: str, system: str, bits: float, prompt: int) -> dict:
    """One cold start on the 8 Elite (scripts/edgeflow_coldstart.py): MNN's kernels run at
    mnn_speed x llama.cpp's, llm.npu+ reads llmnpu_graph_bytes per INT8 byte, and both NPU
    systems pay npu_setup_s first."""

    def run():
        prof = m.profile(ELITE)
        if system in ("mnn", "llm.npu+"):
            prof = edgeflow_system_profile(
                prof, system, m.knob(ELITE, "mnn_speed"), m.knob(ELITE, "llmnpu_graph_bytes")
            )
        return simulate_cold_start(cfg, prof, system, bits=bits, prompt_len=prompt).summary()

    s = dict(m.timing(("cold", cfg, system, bits, prompt), run))
    s["energy_mj"] = m.energy_mj(ELITE, s)
    if "npu" in s["processors"]:
        # the setup runs on one CPU core, the rest of the phone at its floor
        setup_ms = 1e3 * m.knob(ELITE, "npu_setup_s")
        s["ttft_ms"] += setup_ms
        pw = m.profile(ELITE)["cost_model"]["power"]
        s["energy_mj"] += setup_ms * (pw["static_w"]["value"] + pw["cpu-aux_w"]["value"])
    return s


def _ef_speedup(m: SocModel, bits: int, base: str, tasks=tuple(EF_PROMPTS)) -> list[float]:
    return [
        _cold(m, c, base, 8, EF_PROMPTS[k])["ttft_ms"]
        / _cold(m, c, "edgeflow", bits, EF_PROMPTS[k])["ttft_ms"]
        for c in EF_CONFIGS
        for k in tasks
    ]


def _ef_energy_ratio(m: SocModel, power: bool = False) -> float:
    """EdgeFlow 5-bit's cold-start energy (or average power) over llm.npu+'s at 512 tokens,
    mean of Mistral-7B and Qwen1.5-1.8B (seed 004 §5.5.2)."""

    def per(c, system, bits):
        s = _cold(m, c, system, bits, 512)
        return s["energy_mj"] / (s["ttft_ms"] if power else 1.0)

    return _mean(
        per(c, "edgeflow", 5) / per(c, "llm.npu+", 8) for c in ("mistral-7b", "qwen1.5-1.8b")
    )


def _ef_step(m: SocModel, i: int, key: str, proc: str | None = None) -> float:
    """Ablation step i's latency (or a processor's bubble rate) over step i - 1's."""
    a, b = _ef_ablation(m)[i - 1], _ef_ablation(m)[i]
    return b[key][proc] / a[key][proc] if proc else b[key] / a[key]


def _ef_ablation(m: SocModel) -> list[dict]:
    return [
        _sim(m, ELITE, "llama-3-8b", plan, 512, chunk=128, policy=policy)
        for plan, policy, _ in EF_ABLATION.values()
    ]


def edgeflow_targets() -> list[Target]:
    t = [
        Target(
            "004 Fig. 1: llm.npu+ cold-start TTFT, Llama3-8B", "edgeflow",
            EF_PAPER_LLMNPU_TTFT_S, "s",
            "128 tokens, Xiaomi 15 Pro (8 Elite)",
            lambda m: _cold(m, "llama-3-8b", "llm.npu+", 8, 128)["ttft_ms"] / 1e3,
        )
    ]  # fmt: skip
    for bits, vals in EF_PAPER_SPEEDUP.items():
        for base, v in vals.items():
            t.append(
                Target(
                    f"004 §5.2 Fig. 10: EdgeFlow {bits}-bit TTFT speedup over {base}", "edgeflow",
                    v, "x", "mean over 4 models x 5 tasks (Table 3's prompts)",
                    lambda m, bits=bits, base=base: _mean(_ef_speedup(m, bits, base)),
                )
            )  # fmt: skip
    t.append(
        Target(
            "004 §5.2: EdgeFlow 7-bit over llm.npu+ on long prompts (MMLU, HellaSwag)",
            "edgeflow", 1.39, "x",
            "mean over 4 models; the paper's range 1.37-1.41x",
            lambda m: _mean(_ef_speedup(m, 7, "llm.npu+", ("MMLU", "HellaSwag"))),
            *EF_PAPER_LONG_PROMPT,
        )
    )  # fmt: skip
    # signed changes as the ratio after / before, so errors are relative like every other row
    steps = [(k, v) for k, (_, _, v) in EF_ABLATION.items() if v is not None]
    for i, (step, v) in enumerate(steps):
        t.append(
            Target(
                f"004 §5.4.3 Fig. 14: pipeline ablation {step}, latency after / before", "edgeflow",
                1 + v / 100, "x", f"Llama3-8B, 512 tokens, chunks of 128 (paper {v:+.1f}%)",
                lambda m, i=i: _ef_step(m, i + 1, "prefill_ms"),
            )
        )  # fmt: skip
    for step, proc, i, v in (("+Priority", "npu", 2, -82.2), ("+Steal", "cpu", 3, -61.6)):
        t.append(
            Target(
                f"004 §5.4.3: {proc.upper()} bubble rate after / before {step}", "edgeflow",
                1 + v / 100, "x", f"Llama3-8B, 512 tokens, chunks of 128 (paper {v:+.1f}%)",
                lambda m, i=i, proc=proc: _ef_step(m, i, "bubble_rate", proc),
            )
        )  # fmt: skip
    # §4.3 sets the stealing threshold "according to the ratio between the execution time of CPU
    # and NPU matmul operators and set it to 5": the same ratio, as the simulator derives it
    t.append(
        Target(
            "004 §4.3: CPU over NPU matmul time (the stealing threshold)", "edgeflow",
            5.0, "x", "Llama3-8B, 512 tokens, chunks of 128: the NPU tasks' CPU over NPU time",
            lambda m: _ef_ablation(m)[-1]["steal_cpu_over_npu_time_ratio"],
        )
    )  # fmt: skip
    t.append(
        Target(
            "004 §5.5.2 Fig. 16: cold-start energy, EdgeFlow 5-bit over llm.npu+", "edgeflow",
            0.871, "x", "512 tokens, mean of Mistral-7B and Qwen1.5-1.8B (paper -12.9%)",
            lambda m: _ef_energy_ratio(m),
        )
    )  # fmt: skip
    t.append(
        Target(
            "004 §5.5.2 Fig. 16: cold-start average power, EdgeFlow 5-bit over llm.npu+",
            "edgeflow", 1.176, "x", "512 tokens, mean of Mistral-7B and Qwen1.5-1.8B",
            lambda m: _ef_energy_ratio(m, power=True),
        )
    )  # fmt: skip
    return t


def all_targets() -> list[Target]:
    return llmnpu_targets() + shadowattn_targets() + heterollm_targets() + edgeflow_targets()
