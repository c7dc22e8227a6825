"""HeteroLLM's performance profiler and the partition solver's evaluation (seed 002 §4.3).

The profiler has the paper's two modes:

* real execution: the cost model's time of an operator on a processor of the device profile
  (what a phone measurement would give), or for the host CPU a measurement of this machine's
  kernel (:meth:`PartitionProfiler.measure_host`);
* prediction: a decision-tree regressor (scikit-learn) per processor trained on sampled shapes,
  and for the GPU also the paper's fixed-rate estimate ("a fixed TFLOPS rate").

:func:`solver_regret` compares the solver deciding on predicted times with the optimum under
the real times; :func:`grid_regret` the aligned grid (256 columns, 32 rows) with a finer one.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from ..devices import load_profile
from ..errors import InvalidArgumentError, int_arg, ints_arg, not_applicable, real_arg, str_arg

Op = dict
Predictor = Callable[[Op, str], float]

# The models HeteroLLM evaluates (seed 002 §5.1), whose linears' widths shapes are sampled from.
HETEROLLM_MODELS = ("llama-3-8b", "llama-2-7b", "llama-3.2-3b", "internlm-1.8b")


def model_widths(models: Sequence[str] = HETEROLLM_MODELS) -> tuple[int, ...]:
    """The input and output widths of the linears of `models`' blocks (fused qkv and gate/up),
    read from the block table (``socllm.decoder_block(config)``)."""
    from ..configs import load_config

    widths = set()
    for name in models:
        for op in _core.decoder_block(load_config(name)):
            if op["site"] is not None:
                widths.update((op["in_width"], op["out_width"]))
    return tuple(sorted(widths))


def _w4a16_scheme() -> dict:
    lin = dict(_core.Plan("w4a16").to_json()["ops"]["linear"])
    lin.pop("processor")
    lin.pop("format")
    return lin


def matmul(m: int, k: int, n: int, dtype: str = "fp16") -> Op:
    """A W4A16 linear's op dict (soc.h OpDesc) as a plan times it: the weight bytes the scheme
    stores (socllm.quant.stored_weight_bytes: 4-bit codes and an fp16 scale per group of 32,
    4.5 bits per weight) and fp16 activations."""
    return {
        "op": "matmul",
        "dtype": dtype,
        "op_class": "linear",
        "m": int(m),
        "k": int(k),
        "n": int(n),
        "weight_bytes": int(_core.quant.stored_weight_bytes(_w4a16_scheme(), int(n), int(k))),
        "activation_bytes": int(2 * m * (k + n)),
    }


def sample_shapes(count: int, seed: int = 0, decode_share: float = 0.1) -> list[Op]:
    """Shapes a solver meets: rows from static graph sizes, aligned and misaligned lengths and
    decode (1); k from the model widths; n from whole widths and 256-aligned parts of them."""
    rng = np.random.default_rng(seed)
    widths = model_widths()
    out = []
    for _ in range(count):
        u = rng.random()
        if u < decode_share:
            m = 1
        elif u < 0.5:
            m = int(2 ** rng.integers(5, 11))  # 32 .. 1024
        else:
            m = int(rng.integers(1, 1025))
        k = int(rng.choice(widths))
        full = int(rng.choice(widths))
        n = full if rng.random() < 0.3 else int(256 * rng.integers(1, full // 256 + 1))
        out.append(matmul(m, k, n))
    return out


def _features(ops: Sequence[Op], tile: tuple[int, int]) -> np.ndarray:
    m = np.array([o["m"] for o in ops], dtype=float)
    k = np.array([o["k"] for o in ops], dtype=float)
    n = np.array([o["n"] for o in ops], dtype=float)
    # the NPU's stage tiles (the profile's; seed 002 §4.3: 32 rows, 256 columns) as the padded
    # sizes
    mp, np_ = np.ceil(m / tile[0]) * tile[0], np.ceil(n / tile[1]) * tile[1]
    return np.column_stack(
        [
            np.log2(m),
            np.log2(k),
            np.log2(n),
            np.log2(m * k * n),
            np.log2(n / k),
            np.log2(mp * k * np_),
            np.log2(k * n),
        ]
    )


@dataclass
class PartitionProfiler:
    """The profiler of one device under a characterization (soc.h): ``real`` times from the
    cost model (``mode="cost-model"``) or measured on this machine's CPU (``mode="host"``: the
    processor is the host, whatever it is called), ``fit`` a decision tree per processor,
    ``predict`` from it."""

    device: str | dict = "snapdragon-8gen3"
    mode: str = "cost-model"
    characterization: str = "heterollm"
    fast_sync: bool = True
    decode: bool = False
    profile: dict = field(init=False, repr=False)
    tile: tuple = field(init=False, repr=False)  # the NPU's (rows, columns) tile
    models: dict = field(default_factory=dict, repr=False)
    gpu_gflops: float | None = None  # the fixed-rate GPU estimate, once fitted

    def __post_init__(self):
        if self.mode not in ("cost-model", "host"):
            raise InvalidArgumentError(
                f"PartitionProfiler: mode must be cost-model or host, got {self.mode!r}"
            )
        self._measured: dict = {}
        self.profile = self.device if isinstance(self.device, dict) else load_profile(self.device)
        dev = _core.sim.DeviceProfile.from_json(self.profile, self.profile["name"])
        rules = _core.sim.partition_rules(self.profile)
        self.tile = (rules["npu_row_align"], rules["npu_col_align"])
        self._cost = _core.sim.CostModel(
            dev.with_characterization(self.characterization),
            fast_sync=self.fast_sync,
            gpu_queue_kept=self.decode and self.fast_sync,
        )

    def real(self, op: Op, processor: str) -> float:
        """Real-execution mode: the cost model's µs, or the host's measured µs (cached)."""
        if self.mode == "host":
            key = (op["m"], op["k"], op["n"])
            if key not in self._measured:
                self._measured[key] = self.measure_host(op)
            return self._measured[key]
        return self._cost.latency_us(op, processor)

    @staticmethod
    def measure_host(op: Op, repeats: int = 3, seed: int = 0) -> float:
        """Real-execution mode on this machine: the best of ``repeats`` runs of the engine's
        fp32 linear kernel (OpenBLAS) for the op's shape, in µs."""
        from .. import ops as _ops

        rng = np.random.default_rng(seed)
        x = rng.standard_normal((op["m"], op["k"]), dtype=np.float32)
        w = rng.standard_normal((op["n"], op["k"]), dtype=np.float32)
        best = math.inf
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            _ops.linear_f32(x, w)
            best = min(best, (time.perf_counter() - t0) * 1e6)
        return best

    def fit(self, shapes: Sequence[Op], processors: Iterable[str] = ("npu", "gpu"), **tree):
        """Trains one decision-tree regressor per processor on log(µs) of ``shapes`` (real
        times), and the GPU's fixed rate (least squares on compute-bound shapes)."""
        try:
            from sklearn.tree import DecisionTreeRegressor
        except ImportError as e:  # pragma: no cover - the profiler extra installs it
            raise InvalidArgumentError(
                "the profiler's prediction mode needs scikit-learn (pip install socllm[profiler])"
            ) from e
        if not shapes:
            raise InvalidArgumentError("PartitionProfiler.fit: no training shapes")
        X = _features(shapes, self.tile)
        params = {"min_samples_leaf": 2, "random_state": 0, **tree}
        for p in processors:
            y = np.log([self.real(o, p) for o in shapes])
            self.models[p] = DecisionTreeRegressor(**params).fit(X, y)
        if "gpu" in processors:
            flops = np.array([2.0 * o["m"] * o["k"] * o["n"] for o in shapes])
            t = np.array([self.real(o, "gpu") for o in shapes])
            big = flops >= np.quantile(flops, 0.5)
            self.gpu_gflops = float(np.sum(flops[big] ** 2) / np.sum(flops[big] * t[big]) / 1e3)
        return self

    def predict(self, op: Op, processor: str) -> float:
        """Prediction mode: µs from the processor's tree (raises if it was not fitted)."""
        if processor not in self.models:
            raise InvalidArgumentError(
                f"PartitionProfiler: no model for processor {processor!r} "
                f"(fitted: {sorted(self.models)})"
            )
        return float(np.exp(self.models[processor].predict(_features([op], self.tile))[0]))

    def predict_gpu_rate(self, op: Op) -> float:
        """The paper's GPU estimate: flops at the fitted fixed rate."""
        if self.gpu_gflops is None:
            raise InvalidArgumentError("PartitionProfiler: fit() the GPU first")
        return 2.0 * op["m"] * op["k"] * op["n"] / (self.gpu_gflops * 1e3)

    def accuracy(self, shapes: Sequence[Op], processor: str, gpu_rate: bool = False) -> dict:
        """Mean absolute percentage error and the share within ±10% on (held-out) shapes."""
        real = np.array([self.real(o, processor) for o in shapes])
        pred = np.array(
            [self.predict_gpu_rate(o) if gpu_rate else self.predict(o, processor) for o in shapes]
        )
        err = np.abs(pred - real) / real
        return {
            "processor": processor,
            "model": "fixed rate" if gpu_rate else "decision tree",
            "shapes": len(shapes),
            "mape": float(err.mean()),
            "within_10pct": float((err <= 0.10).mean()),
            "max_ape": float(err.max()),
        }


def noisy(profiler: PartitionProfiler, sigma: float, seed: int = 0) -> Predictor:
    """Real times with a log-normal error of ``sigma`` per (shape, processor): the solver's
    sensitivity to a predictor of that accuracy (the same op always gets the same error)."""

    def predict(op: Op, processor: str) -> float:
        key = repr((op["m"], op["k"], op["n"], processor, seed)).encode()
        eps = np.random.default_rng(zlib.crc32(key)).standard_normal()
        return profiler.real(op, processor) * math.exp(sigma * eps)

    return predict


def linear_shapes(config: dict, prompt_len: int, plan: str = "w4a16") -> list[Op]:
    """The four linears of a config's block (fused qkv and gate/up; a plain MLP's up alone) for
    ``prompt_len`` rows, as ``plan`` times them (Plan.linear_op: the block table's widths)."""
    p = _core.Plan(plan)
    sites = [op["site"] for op in _core.decoder_block(config) if op["site"] is not None]
    return [p.linear_op(config, site, prompt_len) for site in sites]


def solver_regret(
    profiler: PartitionProfiler, ops: Sequence[Op], predictor: Predictor | None
) -> list[dict]:
    """Per op: the solver's choice on predicted times, timed with the real ones, against the
    optimum under the real times (regret = chosen / best - 1; 0 for a perfect predictor)."""
    out = []
    for op in ops:
        kw = {
            "characterization": profiler.characterization,
            "fast_sync": profiler.fast_sync,
            "decode": op["m"] == 1 and profiler.decode,
        }
        best = _core.sim.solve_partition(op, profiler.profile, **kw)
        chosen = _core.sim.solve_partition(op, profiler.profile, predictor=predictor, **kw)
        real = _core.sim.partition_time(op, chosen["partition"], profiler.profile, **kw)
        out.append(
            {
                "m": op["m"],
                "k": op["k"],
                "n": op["n"],
                "best_us": best["time"]["total_us"],
                "chosen_us": real["total_us"],
                "predicted_us": chosen["time"]["total_us"],
                "regret": real["total_us"] / best["time"]["total_us"] - 1.0,
                "best_kind": best["partition"]["kind"],
                "chosen_kind": chosen["partition"]["kind"],
            }
        )
    return out


def grid_regret(profiler: PartitionProfiler, ops: Sequence[Op], col_step: int = 32) -> list[dict]:
    """The aligned grid's optimum against a finer column grid's (both with real times): what
    pruning the search to 256-aligned cuts loses (§4.3)."""
    out = []
    for op in ops:
        kw = {"characterization": profiler.characterization, "fast_sync": profiler.fast_sync}
        aligned = _core.sim.solve_partition(op, profiler.profile, **kw)
        fine = _core.sim.solve_partition(op, profiler.profile, col_step=col_step, **kw)
        out.append(
            {
                "m": op["m"],
                "k": op["k"],
                "n": op["n"],
                "aligned_us": aligned["time"]["total_us"],
                "fine_us": fine["time"]["total_us"],
                "candidates": [aligned["candidates"], fine["candidates"]],
                "regret": aligned["time"]["total_us"] / fine["time"]["total_us"] - 1.0,
            }
        )
    return out


# -- a whole session, and re-partitioning at run time -----------------------------------------


@dataclass
class Session:
    """A prefill and ``len(steps) - 1`` decoding steps of one request, one after another on one
    timeline (a step starts when the previous one's LM head has given its token)."""

    steps: list  # socllm.Timeline per phase: the prefill, then each decoding step
    co_runner: list[str]  # the co-running app during each step ("" none)
    resolved: list[bool]  # whether the step's partitions were re-solved

    def offsets_us(self) -> list[float]:
        out, t = [], 0.0
        for s in self.steps:
            out.append(t)
            t += s.core.makespan_us
        return out

    def summary(self) -> dict:
        tpot = np.array([s.core.makespan_us / 1e3 for s in self.steps[1:]])
        busy: dict = {}
        for s in self.steps:
            for p, v in s.summary()["busy_ms"].items():
                busy[p] = busy.get(p, 0.0) + v
        total_ms = sum(s.core.makespan_us for s in self.steps) / 1e3
        return {
            "ttft_ms": self.steps[0].core.makespan_us / 1e3,
            "new_tokens": len(tpot),
            "tpot_ms_mean": float(tpot.mean()) if len(tpot) else 0.0,
            "tpot_ms_p50": float(np.quantile(tpot, 0.5)) if len(tpot) else 0.0,
            "tpot_ms_p99": float(np.quantile(tpot, 0.99)) if len(tpot) else 0.0,
            "tpot_ms_max": float(tpot.max()) if len(tpot) else 0.0,
            "decode_tokens_per_s": float(len(tpot) / (tpot.sum() / 1e3)) if len(tpot) else 0.0,
            "session_ms": total_ms,
            "energy_mj": sum(s.core.energy_mj for s in self.steps),
            "busy_ms": busy,
            "re_solved_steps": int(sum(self.resolved)),
        }

    def to_perfetto(self, path):
        """One Chrome / Perfetto trace of the whole session (one track per processor)."""
        from pathlib import Path as _Path

        from ..io.files import write_output

        events = []
        for i, (s, off) in enumerate(zip(self.steps, self.offsets_us(), strict=True)):
            tr = _core.sim.to_trace_json(s.graph, s.core)
            for e in tr["traceEvents"]:
                if e.get("ph") == "M":
                    if i == 0:
                        events.append(e)
                    continue
                e = dict(e)
                e["ts"] += off
                e["name"] = f"{'prefill' if i == 0 else f'token{i}'}.{e['name']}"
                events.append(e)
        trace = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": self.summary()}
        write_output(path, json.dumps(trace) + "\n")
        return _Path(path)


def _measured_slowdown(step, cost_alone) -> dict:
    """Per processor: the time its tasks took in a timed step over what the profile (no
    co-runner) predicts for them: what a runtime measures to notice drift."""
    spans = step.core.spans
    took, predicted = {}, {}
    for t in step.graph.to_json()["tasks"]:
        p = t["processor"]
        took[p] = took.get(p, 0.0) + float(spans[t["id"], 1] - spans[t["id"], 0])
        predicted[p] = predicted.get(p, 0.0) + sum(cost_alone.latency_us(o, p) for o in t["ops"])
    return {p: took[p] / predicted[p] for p in took if predicted[p] > 0}


def simulate_session(
    config,
    device: str | dict = "snapdragon-8gen3",
    engine: str = "hetero-tensor",
    prompt_len: int = 256,
    new_tokens: int = 32,
    *,
    co_runner: str = "",
    co_runner_steps: tuple[int, int] = (0, 0),
    repartition: str = "static",
    drift_threshold: float = 0.1,
    fast_sync: bool = True,
    characterization: str = "heterollm",
) -> Session:
    """A session of a HeteroLLM engine: the prefill of ``prompt_len`` tokens, then
    ``new_tokens`` decoding steps (KV length growing by one each). ``co_runner`` runs during
    decoding steps ``co_runner_steps = (first, end)`` (1-based, end exclusive).

    ``repartition`` (beyond the paper, issue 15 item 10): ``static`` keeps the partitions the
    profile gives; ``adaptive`` measures each step's per-processor time against what the
    profile predicts for its tasks, relative to the same ratio on a step without the co-runner
    (contention between the GPU and NPU is expected, not drift), and when a processor drifts by
    more than ``drift_threshold`` scales the predictor by it and re-solves the next step's
    partitions (one step late, as a runtime that measures must be); ``oracle`` solves every step
    knowing the co-runner exactly. Options that would change nothing are refused (issue 37):
    ``co_runner`` with an empty ``co_runner_steps`` window and the window without a co-runner,
    ``repartition`` other than static without a co-runner, ``drift_threshold`` off its default
    unless ``repartition="adaptive"``."""
    fn = "simulate_session"
    if repartition not in ("static", "adaptive", "oracle"):
        raise InvalidArgumentError(
            f"repartition must be static, adaptive or oracle, got {repartition!r}"
        )
    new_tokens = int_arg(fn, "new_tokens", new_tokens)
    if new_tokens < 0:
        raise InvalidArgumentError(f"new_tokens must be >= 0, got {new_tokens}")
    co_runner = str_arg(fn, "co_runner", co_runner)
    steps = ints_arg(fn, "co_runner_steps", co_runner_steps)
    if len(steps) != 2:
        raise InvalidArgumentError(
            f"{fn}: co_runner_steps must be (first, end), got {tuple(co_runner_steps)!r}"
        )
    first, end = steps
    drift_threshold = real_arg(fn, "drift_threshold", drift_threshold)
    if co_runner and not max(first, 1) < min(end, new_tokens + 1):
        raise not_applicable(
            fn,
            f"co_runner={co_runner!r}",
            "the decoding steps co_runner_steps=(first, end) names (1-based, end exclusive)",
            f"co_runner_steps={tuple(steps)!r} names none of steps 1..{new_tokens}",
        )
    if not co_runner:
        for option, value, default in (
            ("co_runner_steps", tuple(steps), (0, 0)),
            ("repartition", repartition, "static"),
        ):
            if value != default:
                raise not_applicable(
                    fn, f"{option}={value!r}", "a session with a co-runner", "no co_runner is given"
                )
    if drift_threshold != 0.1 and repartition != "adaptive":
        raise not_applicable(
            fn,
            f"drift_threshold={drift_threshold!r}",
            'repartition="adaptive"',
            f"repartition is {repartition!r}",
        )
    from .timeline import _profile, simulate_hetero

    profile = _profile(device)
    dev = _core.sim.DeviceProfile.from_json(profile, profile["name"])
    alone = _core.sim.CostModel(
        dev.with_characterization(characterization), fast_sync=fast_sync, gpu_queue_kept=fast_sync
    )
    kw = {"fast_sync": fast_sync, "characterization": characterization}
    steps = [simulate_hetero(config, profile, engine, prompt_len, **kw)]
    runner, resolved = [""], [False]
    factor: dict = {}  # the adaptive runtime's current drift per processor
    if repartition == "adaptive":  # the profiled ratio of a clean step (offline)
        clean = simulate_hetero(config, profile, engine, prompt_len, phase="decode", **kw)
        baseline = _measured_slowdown(clean, alone)

    def predictor(op, p):
        return alone.latency_us(op, p) * factor.get(p, 1.0)

    for i in range(1, new_tokens + 1):
        app = co_runner if first <= i < end else ""
        args = {"phase": "decode", "co_runner": app, **kw}
        if repartition == "oracle":
            args["solve_for_co_runner"] = True
        elif repartition == "adaptive" and any(
            abs(f - 1.0) > drift_threshold for f in factor.values()
        ):
            args["predictor"] = predictor
        step = simulate_hetero(config, profile, engine, prompt_len + i - 1, **args)
        steps.append(step)
        runner.append(app)
        resolved.append("predictor" in args or "solve_for_co_runner" in args)
        if repartition == "adaptive":
            ratio = _measured_slowdown(step, alone)
            factor = {p: r / baseline.get(p, r) for p, r in ratio.items()}
    return Session(steps, runner, resolved)
