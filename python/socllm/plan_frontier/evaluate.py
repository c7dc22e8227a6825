"""A plan's objectives on the engine (issue 41 item 2): accuracy on held-out WikiText-2 windows
and the simulated request on a phone, both from the same numerics.

* Accuracy (:meth:`EngineEvaluator.score`): per window the mean NLL difference from fp32 on the
  true next tokens (``dnll``), KL(fp32 || plan) and top-1 agreement per token
  (eval.divergence.window_stats). Windows are the held-out text (after the calibration slice),
  so no calibration window is ever scored. Plans asked for the same window share its fp32
  logits.
* Time, energy, memory (:meth:`EngineEvaluator.simulate`): the engine runs a
  ``prompt_len``-token held-out prompt under the plan, planned for the device, then
  ``decode_tokens`` greedy steps; the task graph it executed is simulated
  (sim.timeline.simulate_model): TTFT, decode tokens/s, the request's energy, peak memory and
  the CPU's share of the busy time.

Results are cached per plan in ``cache_dir`` (one JSON file per plan and kind, written
atomically after every window), keyed by the content of the model file, the calibration file
and what the kind depends on (the accuracy on the window length and the plan as planned for
the device, so devices that plan it alike share it; the timing on the device profile, the
prompt, the decoded tokens, the policy and the NPU's reading if one is imposed), so a second
run, e.g. with a new budget or policy, scores nothing twice, and a killed run loses at most the
window in flight.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError, SocllmError
from ..eval.divergence import heldout_windows, window_stats
from ..io.files import atomic_write_text

CACHE_FORMAT = 1


def _file_digest(path) -> str:
    from ..registry import file_digest

    return file_digest(path) if path is not None else ""


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def request_objectives(summary: Mapping) -> dict[str, float]:
    """The frontier's simulated objectives from a simulated request's summary: TTFT, energy,
    peak memory, the CPU's share of the busy time and, for a session, decode tokens/s."""
    busy = summary["busy_ms"]
    total_busy = sum(busy.values())
    out = {
        "ttft_ms": float(summary["ttft_ms"]),
        "energy_mj": float(summary["energy_mj"]),
        "memory_mb": float(summary["peak_memory_bytes"]) / 1e6,
        "cpu_share": float(busy.get("cpu", 0.0)) / total_busy if total_busy else 0.0,
    }
    if "decode_tokens_per_s" in summary:
        out["decode_tokens_per_s"] = float(summary["decode_tokens_per_s"])
    return out


def plan_key(plan: str) -> str:
    """A plan's canonical form: its full JSON (two spellings of one plan share results)."""
    return json.dumps(_core.Plan(plan).to_json(), sort_keys=True)


def planned_key(plan: str, profile: Mapping) -> str:
    """What a plan's numerics depend on: its JSON as planned for ``profile``, less the device's
    name, so devices that plan it alike share its accuracy; with a partition (solved per
    device when it runs: the cut of each linear), the profile's content too."""
    planned = dict(_core.Plan(plan).on_device(profile).to_json())
    planned.pop("device", None)
    if planned.get("partition", {}).get("mode", "none") != "none":
        planned["device"] = _digest(profile)
    return json.dumps(planned, sort_keys=True)


def score_window(model, ids: Sequence[int], planned: Mapping[str, object]) -> dict[str, dict]:
    """Per plan (a core Plan, planned for the device): ``dnll``, ``kl``, ``top1`` per token on
    one window against fp32, whose logits the plans share."""
    targets = np.asarray(ids[1:], dtype=np.int64)
    ref = model.logits(ids, "fp32")[:-1]
    out = {}
    for plan, p in planned.items():
        s = window_stats(ref, model.logits(ids, p)[:-1], targets)
        out[plan] = {
            "dnll": (s["nll"] - s["nll_ref"]) / s["n"],
            "kl": s["kl"] / s["n"],
            "top1": s["top1"] / s["n"],
        }
    return out


def time_plan(
    model, prompt, profile, plan: str, *, decode_tokens: int, policy: str, characterization: str
):
    """The simulated request of ``plan``: the engine runs ``prompt`` and ``decode_tokens``
    greedy steps, planned for ``profile``; the graph it executed is simulated."""
    from ..sim.timeline import simulate_model

    chunk = _core.Plan(plan).chunk_len or None
    return simulate_model(
        model, prompt, profile, plan, chunk=chunk, policy=policy, decode_tokens=decode_tokens,
        characterization=characterization,
    )  # fmt: skip


class EngineEvaluator:
    """Scores and times plans of one loaded model on one device profile."""

    def __init__(
        self,
        model,
        device,
        *,
        prompt_len: int = 1024,
        decode_tokens: int = 16,
        context: int = 512,
        max_windows: int = 16,
        policy: str = "npu-stall-first",
        characterization: str = "",
        cache_dir: str | Path | None = None,
    ):
        from ..sim.timeline import _profile

        limit = model.config["context_length"]
        if prompt_len < 1 or prompt_len > limit:
            raise InvalidArgumentError(f"frontier: prompt_len {prompt_len} must be in [1, {limit}]")
        if decode_tokens < 1:
            raise InvalidArgumentError(
                f"frontier: decode_tokens must be >= 1 (decode tokens/s), got {decode_tokens}"
            )
        self.model = model
        self.profile = _profile(device)
        self.device = self.profile["name"]
        self.prompt_len, self.decode_tokens, self.policy = prompt_len, decode_tokens, policy
        self.characterization = characterization  # "": each plan's own reading of the NPU
        self.context = context
        self.windows = heldout_windows(model, context, max_windows)
        # the timed prompt: held-out text after the scored windows (timing reads no accuracy)
        from ..calibration.artifact import corpus_tokens, held_out_tokens

        rest = held_out_tokens(corpus_tokens(model))[context * max_windows :]
        if len(rest) < prompt_len:
            raise InvalidArgumentError(
                f"frontier: the held-out text has {len(rest)} tokens after {max_windows} windows "
                f"of {context}; a {prompt_len}-token prompt does not fit"
            )
        self.prompt = list(rest[:prompt_len])
        # what each kind of result depends on: the accuracy not on the timed request, the
        # timing not on the scored windows
        common = {
            "format": CACHE_FORMAT,
            "model": _file_digest(model.path),
            "calibration": _file_digest(model.calibration_path),
            "device": _digest(self.profile),
        }
        self.settings = {
            "accuracy": {**{k: v for k, v in common.items() if k != "device"}, "context": context},
            "timing": {
                **common, "prompt": _digest(self.prompt), "decode_tokens": decode_tokens,
                "policy": policy,
            },
        }  # fmt: skip
        if characterization:  # (absent: each plan's own, as in caches written before it)
            self.settings["timing"]["characterization"] = characterization
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._memo: dict[tuple[str, str], dict] = {}
        self.evaluations = {"windows": 0, "simulations": 0}  # work done by this evaluator
        self.timing_errors: dict[str, str] = {}  # plan -> why the device cannot run it

    # -- cache ----------------------------------------------------------------------------
    def _path(self, kind: str, key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / kind / f"{_digest([self.settings[kind], key])[:24]}.json"

    def _key(self, kind: str, plan: str) -> str:
        return planned_key(plan, self.profile) if kind == "accuracy" else plan_key(plan)

    def _entry(self, kind: str, plan: str) -> dict:
        """The cached results of one kind ("accuracy": per window, "timing") of ``plan``."""
        key = self._key(kind, plan)
        if (kind, key) not in self._memo:
            entry = {"plan": plan, "plan_json": json.loads(key), "windows": {}}
            path = self._path(kind, key)
            if path is not None and path.exists():
                try:
                    stored = json.loads(path.read_text())
                except ValueError:
                    stored = None  # a foreign or damaged file: recomputed and rewritten
                if stored and stored.get("settings") == self.settings[kind]:
                    entry = stored["entry"]
            self._memo[kind, key] = entry
        return self._memo[kind, key]

    def _save(self, kind: str, plan: str) -> None:
        key = self._key(kind, plan)
        path = self._path(kind, key)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            body = {"settings": self.settings[kind], "entry": self._memo[kind, key]}
            atomic_write_text(path, json.dumps(body, indent=1) + "\n")

    # -- objectives -----------------------------------------------------------------------
    def timeline(self, plan: str):
        """The simulated request of ``plan`` (a fresh engine run; its summary is
        :meth:`simulate`'s)."""
        return time_plan(
            self.model, self.prompt, self.profile, plan, decode_tokens=self.decode_tokens,
            policy=self.policy, characterization=self.characterization,
        )  # fmt: skip

    def simulate(self, plan: str) -> dict[str, float]:
        """TTFT, decode tokens/s, energy, peak memory and CPU share of ``plan`` on the device."""
        if plan in self.timing_errors:  # (found by prefetch)
            raise SocllmError(self.timing_errors[plan])
        entry = self._entry("timing", plan)
        if "simulated" not in entry:
            self._store_timing(plan, request_objectives(self.timeline(plan).summary()))
        return dict(entry["simulated"])

    def prefetch(self, plans: Sequence[str]) -> None:
        """Times ``plans`` ahead of :meth:`simulate` (here: nothing; in parallel on Ray)."""

    def _store_timing(self, plan: str, simulated: Mapping[str, float]) -> None:
        """Caches the simulated objectives of ``plan`` (this evaluator's or a Ray task's)."""
        self._entry("timing", plan)["simulated"] = dict(simulated)
        self.evaluations["simulations"] += 1
        self._save("timing", plan)

    def _windows(self, todo: Mapping[int, Sequence[str]]):
        """(window, {plan: stats}) for every window of ``todo`` (window -> plans), as each is
        scored (here, one after the other). Each plan runs as planned for the device
        (partitions solved there), as in the timed run."""
        planned = {p: _core.Plan(p).on_device(self.profile) for ps in todo.values() for p in ps}
        for w in sorted(todo):
            yield w, score_window(self.model, self.windows[w], {p: planned[p] for p in todo[w]})

    def score(self, need: Mapping[str, Sequence[int]]) -> dict[str, dict[int, dict]]:
        """Per plan, per window index: ``dnll``, ``kl``, ``top1`` (per token); cached windows
        are not scored again. Window by window, so every plan asked for a window shares its
        fp32 logits; each window's results are cached as it is scored."""
        out: dict[str, dict[int, dict]] = {p: {} for p in need}
        todo: dict[int, list[str]] = {}
        for plan, ws in need.items():
            cached = self._entry("accuracy", plan)["windows"]
            for w in ws:
                if not 0 <= w < len(self.windows):
                    raise InvalidArgumentError(
                        f"frontier: window {w} asked, {len(self.windows)} held out"
                    )
                if str(w) in cached:
                    out[plan][w] = cached[str(w)]
                else:
                    todo.setdefault(w, []).append(plan)
        for w, stats in self._windows(todo):
            for plan, st in stats.items():
                self._entry("accuracy", plan)["windows"][str(w)] = st
                out[plan][w] = st
                self.evaluations["windows"] += 1
            for plan in stats:
                self._save("accuracy", plan)
        return out
