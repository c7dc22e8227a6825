"""One SoC model for all four papers (issue 40): the device profiles as they are, plus one vector
of free parameters, each a named change to the profiles' cost models with its bounds, unit and
reason. A :class:`SocModel` is the profiles under one parameter vector; every paper target is
predicted from it, so llm.npu's, shadowAttn's, HeteroLLM's and EdgeFlow's rows come from the
same device parameters.

Which device a parameter changes: the 8 Gen 2 and 8 Elite profiles borrow the 8 Gen 3's cost
model (python/socllm/devices/README.md), so a parameter of the 8 Gen 3's software stack (how
much slower llama.cpp's whole model runs than Table 3's matmuls, say) applies to all three;
parameters that only one phone's paper can see name that phone.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..devices import load_profile

GEN3, GEN2, ELITE = "snapdragon-8gen3", "snapdragon-8gen2", "snapdragon-8elite"
DEVICES = (GEN3, GEN2, ELITE)
PAPERS = {
    "llmnpu": "seed 001 llm.npu",
    "shadowattn": "seed 000 shadowAttn",
    "heterollm": "seed 002 HeteroLLM",
    "edgeflow": "seed 004 EdgeFlow",
}


@dataclass(frozen=True)
class Parameter:
    """A free parameter of the SoC model. ``apply(profile, value)`` changes a deep copy of a
    device profile in place; ``initial`` is where every fit starts and the prior pulls to. It
    must not come from any paper number that is a target, or cross-validation would see the
    held-out rows through it: a neutral value (1 for a scale, 1 W for a power, a square shape)
    or a device figure no target restates."""

    name: str
    initial: float
    lower: float
    upper: float
    unit: str
    about: str
    apply: Callable[[dict, float], None]
    devices: tuple[str, ...] = DEVICES
    energy: bool = False  # changes energies only, never a duration


def scale_rates(table: dict, time_scale: float, keys: Callable[[str], bool]) -> None:
    """Every rate of ``table`` whose key passes ``keys`` divided by ``time_scale``, every
    overhead multiplied: the processor's times x time_scale."""
    for key, entry in table.items():
        if not isinstance(entry, dict) or "value" not in entry or not keys(key):
            continue
        if key.endswith("_overhead_us"):
            entry["value"] *= time_scale
        elif key.endswith(("_gops", "_gbps", "_gelems", "_gscores")):
            entry["value"] /= time_scale


def _set(profile: dict, pointer: str, value: float, unit: str, source: str) -> None:
    node = profile
    parts = pointer.strip("/").split("/")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = {"value": float(value), "unit": unit, "source": source, "fitted": True}


FIT_SOURCE = "fitted by socllm fidelity (issue 40) to the four papers' numbers"


def _npu_int8(p: dict, s: float) -> None:
    scale_rates(
        p["cost_model"]["npu"],
        s,
        lambda k: (
            (k.startswith("int8_") and "attn" not in k and k != "int8_compute_gops")
            or k == "elementwise_gelems"
        ),
    )


# The 8 Gen 3's NPU figures the compute roof starts from and is bounded by (the profile's data).
_NPU = load_profile(GEN3)
_ROOF_START = float(_NPU["cost_model"]["npu"]["int8_compute_gops"]["value"])  # assumed, 10 TOPS
_ROOF_LOWER = float(_NPU["processors"]["npu"]["int8_matmul_gops_effective"]["value"])  # Table 3
_ROOF_UPPER = 1e3 * _NPU["processors"]["npu"]["int8_tops_peak"]["value"]  # peak, Gop/s


def _npu_int8_roof(p: dict, gops: float) -> None:
    _set(p, "/cost_model/npu/int8_compute_gops", gops, "Gop/s", FIT_SOURCE)


def _cpu(p: dict, s: float) -> None:
    scale_rates(p["cost_model"]["cpu"], s, lambda k: k.split("_")[0] in ("int8", "fp16", "fp32"))


def _mid_core(p: dict, s: float) -> None:
    scale_rates(p["cost_model"]["cpu_core"]["mid"], s, lambda k: k != "topk_gscores")


def _topk(p: dict, ns: float) -> None:
    _set(p, "/cost_model/cpu_core/mid/topk_gscores", 1.0 / ns, "Gscore/s", FIT_SOURCE)


def _fused_sparse(p: dict, speedup: float) -> None:
    rate = p["cost_model"]["cpu_core"]["mid"]["fp32_fused_sparse_attention_gops"]
    rate["value"] *= speedup


def _shadow_fixed(p: dict, us: float) -> None:
    _set(p, "/cost_model/cpu/outlier_fixed_us", us, "us", FIT_SOURCE)


def _shadow_merge(p: dict, gelems: float) -> None:
    _set(p, "/cost_model/cpu/outlier_merge_gelems", gelems, "Gelem/s", FIT_SOURCE)


def _r_half(p: dict, r: float) -> None:
    char = p["characterizations"]["heterollm"]["cost_model"]["npu"]
    char["fp16_shape_ratio_half"]["value"] = r


def _game(p: dict, share: float) -> None:
    p["scenarios"]["mobile-game"]["gpu_time_share"]["value"] = share


def _game_dram(p: dict, gbps: float) -> None:
    p["scenarios"]["mobile-game"]["dram_gbps"]["value"] = gbps


def _power(key: str) -> Callable[[dict, float], None]:
    def apply(p: dict, w: float) -> None:
        unit = "pJ/byte" if key == "dram_pj_per_byte" else "W"
        _set(p, f"/cost_model/power/{key}", w, unit, FIT_SOURCE)

    return apply


def _mnn(p: dict, s: float) -> None:
    p.setdefault("_fidelity", {})["mnn_speed"] = s


def _llmnpu_bytes(p: dict, s: float) -> None:
    p.setdefault("_fidelity", {})["llmnpu_graph_bytes"] = s


def _npu_setup(p: dict, s: float) -> None:
    p.setdefault("_fidelity", {})["npu_setup_s"] = s


PARAMETERS: tuple[Parameter, ...] = (
    Parameter(
        "npu_int8_time_scale", 1.0, 0.3, 10.0, "x",
        "a whole model's NPU INT8 graphs (matmuls' launch overheads and weight streams, "
        "element-wise ops) over Table 3's isolated matmuls (seed 001 §2.2): QNN graph overheads "
        "no micro-benchmark holds",
        _npu_int8,
    ),
    Parameter(
        "npu_int8_compute_gops", _ROOF_START, _ROOF_LOWER, _ROOF_UPPER, "Gop/s",
        "the NPU's INT8 matmul compute roof at a prefill chunk's rows: Table 3's 32- and 64-row "
        f"matmuls stream their weights and cannot show it (starts at the profile's assumed "
        f"{_ROOF_START / 1e3:g} TOPS, seed 002 §1's 'in actual' FP16; bounds: Table 3's best "
        f"measured {_ROOF_LOWER:,.0f} Gop/s and the {_ROOF_UPPER / 1e3:g} TOPS peak)",
        _npu_int8_roof,
    ),
    Parameter(
        "cpu_time_scale", 1.0, 0.3, 10.0, "x",
        "a whole model's CPU kernels (llama.cpp, llm.npu's shadow parts) over Table 3's CPU INT8 "
        "matmuls: dequantization, threading and attention the micro-benchmark leaves out",
        _cpu,
    ),
    Parameter(
        "shadow_fixed_us", 400.0, 1.0, 1e5, "us",
        "what one shadow-outlier part costs beyond its arithmetic (seed 001 §3.3: a CPU graph "
        "call and the scatter of its result; starts at seed 002 §4.2's >=400 us sync, which no "
        "target restates)",
        _shadow_fixed,
    ),
    Parameter(
        "shadow_merge_gelems", 3.3, 0.01, 100.0, "Gelem/s",
        "the rate at which a shadow part's [rows, outputs] result is added into the NPU's "
        "output (seed 001 §3.3); the initial value streams 12 bytes per element at 40 GB/s",
        _shadow_merge,
    ),
    Parameter(
        "mid_core_attention_time_scale", 1.0, 0.1, 10.0, "x",
        "one mid core's attention kernels over the assumed 25% of the A720's NEON peak (seed 000 "
        "§2 Fig. 4a gives only ratios)",
        _mid_core,
    ),
    Parameter(
        "topk_ns_per_score", 2.0, 0.2, 20.0, "ns",
        "the mid core's per-row top-k cost per score (seed 000 §3.2; no seed measures it)",
        _topk,
    ),
    Parameter(
        "fused_sparse_attention_speedup", 1.0, 0.25, 4.0, "x",
        "shadowAttn's own sparse attention kernel over C/G-Sparse's vanilla fp32 one, per kept "
        "pair (seed 000 §4 fuses RoPE, quantization, matmul and softmax and multiplies in half "
        "precision; no seed measures the gain)",
        _fused_sparse,
    ),
    Parameter(
        "npu_fp16_shape_ratio_half", 1.0, 0.05, 100.0, "rows/columns",
        "the half point of the NPU's FP16 efficiency in the streamed weight's aspect ratio "
        "(seed 002 Fig. 5 is only a plot; starts at a square weight); variant heterollm",
        _r_half,
        (GEN3,),
    ),
    Parameter(
        "game_gpu_time_share", 0.3, 0.02, 0.95, "share",
        "the GPU time a 60-FPS game takes (seed 002 §5.5 gives only its effect)",
        _game,
        (GEN3,),
    ),
    Parameter(
        "game_dram_gbps", 8.0, 0.5, 50.0, "GB/s",
        "the DRAM bandwidth a 60-FPS game takes (seed 002 §5.5 gives only its effect)",
        _game_dram,
        (GEN3,),
    ),
    *(
        Parameter(
            f"static_w_{dev.removeprefix('snapdragon-')}", 1.0, 0.05, 8.0, "W",
            f"the {dev.removeprefix('snapdragon-')} phone's static power while a request runs "
            "(rails, DRAM refresh, idle cores, the screen if the paper's meter saw it): charged "
            "over the whole span; per phone, since each paper measured its own",
            _power("static_w"),
            (dev,),
            energy=True,
        )
        for dev in DEVICES
    ),
    Parameter(
        "npu_active_w", 1.0, 0.05, 10.0, "W",
        "the NPU's power above the static floor while it computes",
        _power("npu_w"),
        energy=True,
    ),
    Parameter(
        "gpu_active_w", 1.0, 0.05, 10.0, "W",
        "the GPU's power above the static floor while it computes",
        _power("gpu_w"),
        energy=True,
    ),
    Parameter(
        "cpu_active_w", 1.0, 0.05, 10.0, "W",
        "the CPU's power above the static floor while all its big cores compute",
        _power("cpu_w"),
        energy=True,
    ),
    Parameter(
        "mid_core_active_w", 0.25, 0.02, 5.0, "W",
        "one mid core's power above the static floor (seed 000's CPU budget; starts at a "
        "quarter of the 1 W every processor starts at)",
        _power("cpu_mid_w"),
        energy=True,
    ),
    Parameter(
        "mnn_speed", 1.0, 0.25, 10.0, "x",
        "MNN's CPU kernels over llama.cpp's (seed 004 §5.2 compares both)",
        _mnn,
        (ELITE,),
    ),
    Parameter(
        "llmnpu_graph_bytes", 1.0, 1.0, 10.0, "x",
        "what llm.npu+ reads from flash per INT8 weight byte: its materialized QNN graphs hold "
        "the weights in their own layout (seed 004 Fig. 1)",
        _llmnpu_bytes,
        (ELITE,),
    ),
    Parameter(
        "npu_setup_s", 0.5, 0.01, 10.0, "s",
        "the serial start cost of an NPU system's cold start (QNN environment and context "
        "setup, the first step of seed 004 Fig. 1)",
        _npu_setup,
        (ELITE,),
    ),
)  # fmt: skip

# The DRAM energy per byte is not fitted: no paper's number isolates it. LPDDR5X moves a bit
# for about 4-5 pJ including its interface (public JEDEC-class figures), so 40 pJ per byte.
DRAM_PJ_PER_BYTE = 40.0
# written by socllm fidelity --write
FITTED_PARAMETERS = Path(__file__).resolve().parent / "fitted_parameters.json"


def parameter(name: str) -> Parameter:
    for p in PARAMETERS:
        if p.name == name:
            return p
    raise KeyError(name)


# Simulated timelines shared by every SocModel whose duration parameters are equal: power
# parameters change no duration, so their Jacobian columns reuse the timelines (energy is
# recomputed from busy times, SocModel.energy_mj). Bounded: cleared when full.
_TIMING_CACHE: dict = {}
_TIMING_CACHE_MAX = 20000


@dataclass
class SocModel:
    """The device profiles under one parameter vector, built once per device, with a memo of
    the simulations the targets share (several targets read one run)."""

    values: dict[str, float]
    _profiles: dict[str, dict] = field(default_factory=dict)
    memo: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.values = {p.name: float(self.values.get(p.name, p.initial)) for p in PARAMETERS}
        self._timing_key = tuple(self.values[p.name] for p in PARAMETERS if not p.energy)

    def timing(self, key, fn):
        """``fn()``'s result (a simulation whose durations are all it is read for), shared
        with every model of the same duration parameters."""
        full = (self._timing_key, key)
        if full not in _TIMING_CACHE:
            if len(_TIMING_CACHE) >= _TIMING_CACHE_MAX:
                _TIMING_CACHE.clear()
            _TIMING_CACHE[full] = fn()
        return _TIMING_CACHE[full]

    def energy_mj(self, device: str, summary: dict) -> float:
        """A timeline summary's energy under this model's powers (the simulator's own sum,
        soc.h EnergyModel): the floor over the span, each processor's busy time at its active
        power, the DRAM energy (not a parameter) as simulated."""
        pw = self.profile(device)["cost_model"]["power"]
        span = summary.get("total_ms", summary.get("makespan_ms"))
        e = pw["static_w"]["value"] * span + summary["dram_energy_mj"]
        for proc, u in summary["processors"].items():
            e += u["busy_ms"] * pw[f"{proc}_w"]["value"]
        return e

    @classmethod
    def fitted(cls, path=None) -> SocModel:
        """The model under the vector ``socllm fidelity --write`` stored (by default the
        committed python/socllm/fidelity/fitted_parameters.json), e.g.
        ``socllm.simulate(cfg, SocModel.fitted().profile("snapdragon-8gen3"), plan, n)``."""
        import json

        from ..errors import FormatError

        path = Path(path) if path else FITTED_PARAMETERS
        try:
            params = json.loads(path.read_text())["parameters"]
            values = {k: float(v["value"]) for k, v in params.items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise FormatError(f"fitted SoC-model parameters {path}: {e}") from e
        names = {p.name for p in PARAMETERS}
        if set(values) != names:  # another model's vector: a silent start would mislead
            raise FormatError(
                f"fitted SoC-model parameters {path}: unknown {sorted(set(values) - names)}, "
                f"missing {sorted(names - set(values))}"
            )
        for p in PARAMETERS:
            if not p.lower <= values[p.name] <= p.upper:
                raise FormatError(
                    f"fitted SoC-model parameters {path}: {p.name} = {values[p.name]} is outside "
                    f"[{p.lower}, {p.upper}]"
                )
        return cls(values)

    def profile(self, device: str) -> dict:
        if device not in self._profiles:
            prof = copy.deepcopy(load_profile(device))
            _power("dram_pj_per_byte")(prof, DRAM_PJ_PER_BYTE)
            prof["cost_model"]["power"]["dram_pj_per_byte"]["source"] = (
                "assumed: LPDDR5X about 5 pJ per bit with its interface (public figures); "
                "not fitted"
            )
            for p in PARAMETERS:
                if device in p.devices:
                    p.apply(prof, self.values[p.name])
            if "cpu-aux_w" in prof["cost_model"]["power"]:  # one of the CPU's cores
                n = prof["processors"]["cpu_all"]["count"]["value"]
                prof["cost_model"]["power"]["cpu-aux_w"]["value"] = self.values["cpu_active_w"] / n
            self._profiles[device] = prof
        return self._profiles[device]

    def knob(self, device: str, name: str) -> float:
        """A parameter a target reads itself (not a profile number): MNN's speed, etc."""
        return float(self.profile(device).get("_fidelity", {}).get(name, parameter(name).initial))

    def cached(self, key, fn):
        if key not in self.memo:
            self.memo[key] = fn()
        return self.memo[key]


def log_params(values: dict[str, float], names: list[str]) -> list[float]:
    return [math.log(values[n]) for n in names]
