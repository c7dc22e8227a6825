"""The frontier's evaluations as Ray tasks (issue 41 item 3), in the sweep's Ray session
(eval/ray_session.py: a local cluster with a reaper that dies with the driver, or a running
cluster at ``address``); workers load the model and calibration once.

* One task per held-out window scores every plan that needs it (sharing its fp32 logits); one
  task per plan times it. The driver writes each result into the per-plan cache as its task
  returns (frontier/evaluate.py), so a killed driver loses only the tasks in flight and a rerun
  resumes from the cache.
* A worker that dies (killed, out of memory) has its task run again by Ray, up to ``retries``
  times: it loses nothing. An error the engine raises is not retried (it would raise again): it
  ends the run with the worker's own message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import _core
from .evaluate import EngineEvaluator, request_objectives, score_window, time_plan

DEFAULT_RETRIES = 3


def _crash_once(marker: str | None) -> None:
    """The first task that sees no file at ``marker`` creates it and kills its worker (the
    test of a killed worker; None in normal runs)."""
    if marker is not None and not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)


_MODEL: dict[tuple[str, str], object] = {}  # this worker's model: (path, calibration digest)


def _model(model_path: str, calib: bytes | None):
    """The model with the calibration ``calib`` (the driver's file's bytes), loaded once per
    worker process (a worker serves one frontier: the last model only)."""
    import hashlib
    import tempfile

    from ..model import load

    key = (model_path, hashlib.sha256(calib).hexdigest() if calib else "")
    if key not in _MODEL:
        _MODEL.clear()
        _core.set_num_threads(1)
        _core.set_log_level("warn")
        model = load(model_path, progress=False)
        if calib:  # the engine keeps what it loads: the file lives only while it is read
            with tempfile.TemporaryDirectory(prefix="socllm-frontier-calib-") as d:
                path = Path(d) / "calib.h5"
                path.write_bytes(calib)
                model.load_calibration(path)
        _MODEL[key] = model
    return _MODEL[key]


def window_task(
    model_path: str, calib: bytes | None, ids: Sequence[int], plans: Sequence[str],
    profile: Mapping, crash_marker: str | None = None,
) -> dict[str, dict]:  # fmt: skip
    """Ray task: :func:`score_window` of ``plans`` (planned for ``profile``) on ``ids``."""
    _crash_once(crash_marker)
    model = _model(model_path, calib)
    planned = {p: _core.Plan(p).on_device(dict(profile)) for p in plans}
    return score_window(model, list(ids), planned)


def timing_task(
    model_path: str, calib: bytes | None, prompt: Sequence[int], plan: str, profile: Mapping,
    settings: Mapping, crash_marker: str | None = None,
) -> dict[str, float]:  # fmt: skip
    """Ray task: the simulated objectives of ``plan``'s request (:func:`time_plan`), or
    ``{"error": message}`` when the engine refuses it on this device."""
    from ..errors import SocllmError

    _crash_once(crash_marker)
    model = _model(model_path, calib)
    try:
        tl = time_plan(model, list(prompt), dict(profile), plan, **settings)
    except SocllmError as e:
        return {"error": str(e)}
    return request_objectives(tl.summary())


class RayEvaluator(EngineEvaluator):
    """:class:`EngineEvaluator` whose windows and timings run as Ray tasks (module doc); use as
    a context manager (Ray starts on entry, stops on exit if it started it)."""

    def __init__(
        self, model, device, *, address: str | None = None, retries: int = DEFAULT_RETRIES,
        crash_marker: str | None = None, **kw,
    ):  # fmt: skip
        super().__init__(model, device, **kw)
        self.address, self.retries, self.crash_marker = address, retries, crash_marker
        self._ray = self._session = None
        self._started_here = False

    def __enter__(self):
        import ray

        from ..eval.ray_session import _start_ray

        self._ray = ray
        self._started_here = not ray.is_initialized()
        if self._started_here:
            self._session = _start_ray(ray, self.address)
        calib = self.model.calibration_path
        self._calib = ray.put(Path(calib).read_bytes() if calib else None)
        opts = {"num_cpus": 1, "max_retries": self.retries, "retry_exceptions": False}
        self._window = ray.remote(window_task).options(**opts)
        self._timing = ray.remote(timing_task).options(**opts)
        return self

    def __exit__(self, *exc):
        if self._started_here:
            self._ray.shutdown()
            if self._session is not None:
                self._session.close(keep_logs=False)
        self._ray = None

    def _results(self, refs: dict):
        """(key, value) of each task as it finishes; a task that failed ends the run with the
        worker's own error."""
        from ..errors import SocllmError
        from ..eval.ray_session import _error_text

        ray = self._ray
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                value = ray.get(done[0])
            except Exception as e:
                for r in pending:
                    ray.cancel(r, force=True)
                raise SocllmError(f"frontier: a Ray task failed: {_error_text(ray, e)}") from None
            yield refs[done[0]], value

    def prefetch(self, plans: Sequence[str]) -> None:
        """Times every plan of ``plans`` not cached yet, one task each, in parallel."""
        settings = {
            "decode_tokens": self.decode_tokens, "policy": self.policy,
            "characterization": self.characterization,
        }  # fmt: skip
        missing = [p for p in plans if "simulated" not in self._entry("timing", p)]
        refs = {
            self._timing.remote(
                str(self.model.path), self._calib, self.prompt, p, self.profile, settings,
                self.crash_marker,
            ): p
            for p in missing
        }  # fmt: skip
        for plan, simulated in self._results(refs):
            if "error" in simulated:
                self.timing_errors[plan] = simulated["error"]
            else:
                self._store_timing(plan, simulated)

    def _windows(self, todo: Mapping[int, Sequence[str]]):
        refs = {
            self._window.remote(
                str(self.model.path), self._calib, self.windows[w], list(plans), self.profile,
                self.crash_marker,
            ): w
            for w, plans in todo.items()
        }  # fmt: skip
        yield from self._results(refs)
