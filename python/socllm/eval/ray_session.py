"""A Ray session for socllm's drivers (the sweep, the frontier): a local cluster in a temp
folder of its own with a reaper that kills what is left of it once the driver has gone
(:mod:`socllm.eval.sweep_watchdog`), or a running cluster joined at an address; and a failed
task's error as the user needs it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _error_text(ray, e: BaseException) -> str:
    """A failed task's error as the user needs it: a worker's exception unwrapped from Ray's
    RayTaskError (its own type, message and notes), else Ray's error and its first line."""
    while isinstance(e, ray.exceptions.RayTaskError) and getattr(e, "cause", None) is not None:
        if e.cause is e:
            break
        e = e.cause
    if isinstance(e, ray.exceptions.RayError):
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    notes = "".join(f" ({n})" for n in getattr(e, "__notes__", ()))
    return f"{type(e).__name__}: {e}{notes}"


# -- the local Ray cluster ------------------------------------------------------------------------

WATCHDOG = Path(__file__).with_name("sweep_watchdog.py")
RAY_TEMP_PREFIX = "socllm-ray-"  # short: Ray's socket paths under it have a length limit
REAPER_EXIT_SECONDS = 90.0  # its give-up time and a margin; it takes well under 1 s


@dataclass
class _LocalRay:
    """A local Ray cluster's temp folder and the reaper watching it (module doc)."""

    temp_dir: Path
    reaper: subprocess.Popen | None

    def close(self, keep_logs: bool) -> str | None:
        """After ``ray.shutdown()``: the reaper kills what is left, deletes the folder unless
        ``keep_logs`` (a failed cell's worker logs are there; then it is returned) and ends.
        (A driver killed never gets here: the reaper deletes the folder.)"""
        from .sweep_watchdog import KEEP

        if self.reaper is None:
            if not keep_logs:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
        else:
            with contextlib.suppress(BrokenPipeError), self.reaper.stdin:
                if keep_logs:
                    self.reaper.stdin.write(KEEP)
            try:
                self.reaper.wait(timeout=REAPER_EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                self.reaper.kill()
                self.reaper.wait()
            self.reaper.stdout.close()
        return str(self.temp_dir) if keep_logs else None


def _starts_local_cluster(address: str | None) -> bool:
    """Whether ``ray.init(address=address)`` would start a local cluster rather than join one
    (``RAY_ADDRESS``, or a cluster ``ray start`` left running here): Ray's own resolution."""
    if address is not None and str(address).startswith("ray://"):  # Ray Client
        return False
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(address) is None
    except Exception:  # an address ray.init itself will refuse, or a Ray without this function
        return False


def _start_ray(ray, address: str | None) -> _LocalRay | None:
    """``ray.init`` as before; a local cluster in a temp folder of its own with a reaper
    started first (:mod:`socllm.eval.sweep_watchdog`), so that it dies with this process."""
    from .sweep_watchdog import READY

    # log_to_driver off: worker output would garble the progress bar
    options = {"include_dashboard": False, "logging_level": "warning", "log_to_driver": False}
    if not _starts_local_cluster(address):
        ray.init(address=address, **options)
        return None
    session = _LocalRay(Path(tempfile.mkdtemp(prefix=RAY_TEMP_PREFIX)), None)
    try:
        session.reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", str(WATCHDOG), str(session.temp_dir), str(os.getpid())]
            + [str(Path(ray.__file__).resolve().parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # not in this process group: Ctrl-C or killpg spare it
        )
        if session.reaper.stdout.readline() != READY:
            session.reaper.kill()
            session.reaper.wait()
            session.reaper = None
            print(
                "socllm: the reaper of the local Ray cluster did not start: if this process is "
                f"killed, Ray's processes keep running (those with files under {session.temp_dir})",
                file=sys.stderr,
                flush=True,
            )
        ray.init(address="local", _temp_dir=str(session.temp_dir), **options)
    except BaseException:
        session.close(keep_logs=False)
        raise
    return session
