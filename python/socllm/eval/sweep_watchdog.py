"""The reaper of a sweep's local Ray cluster (:func:`socllm.eval.sweep.run_sweep` starts it).

Ray starts its processes from the driver; ``kill -9`` of the driver leaves Ray 2.60's dashboard
and runtime-env agents running (they notice the raylet is gone, then block reporting it to the
dead GCS). This process is started before ``ray.init``, in its own session, and reads its stdin,
a pipe whose other end only the driver holds: end of file means the driver has gone (it exited
or was killed). It then kills every process of the session: the processes running Python or a
Ray binary that hold a file (or their working directory) under the Ray temp folder the driver
gave ``ray.init``. Then it deletes that folder, unless the driver wrote :data:`KEEP` first (a
failed cell's worker logs are there).

Run by path (``python -I -S sweep_watchdog.py TEMP_DIR DRIVER_PID RAY_DIR``) so that it imports
nothing but the standard library: it is ready at once and does not depend on socllm's build.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sys
import time

READY = b"ready\n"
KEEP = b"keep"  # from the driver: leave the temp folder (it names it to the user)
POLL_SECONDS = 0.2  # between scans of /proc once the driver has gone
QUIET_SCANS = 3  # scans finding nothing in a row before the session counts as gone
GIVE_UP_SECONDS = 60.0  # a process that keeps coming back (it cannot) is left, not chased forever


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _holds_files_under(pid: int, root: str) -> bool:
    proc = f"/proc/{pid}"
    try:
        if _under(os.readlink(f"{proc}/cwd"), root):
            return True
        for fd in os.listdir(f"{proc}/fd"):
            try:
                if _under(os.readlink(f"{proc}/fd/{fd}"), root):
                    return True
            except OSError:  # closed meanwhile
                continue
    except OSError:  # gone, or another user's
        return False
    return False


def _session_processes(root: str, executables: set[str], ray_dir: str, spare: set[int]):
    """Pids of the processes of the Ray session under ``root``."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spare:
            continue
        pid = int(name)
        try:
            exe = os.path.realpath(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
        if (exe in executables or _under(exe, ray_dir)) and _holds_files_under(pid, root):
            yield pid


def _kill(pid: int, root: str) -> None:
    """SIGKILL through a pidfd, checked again once held, so that a pid reused meanwhile by an
    unrelated process is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except OSError as e:
        if e.errno == errno.ENOSYS:  # a kernel before 5.3: a plain kill, with its small race
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return  # otherwise: already gone
    try:
        if _holds_files_under(pid, root):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def reap(root: str, executables: set[str], ray_dir: str, spare: set[int]) -> int:
    """Kills the session's processes until none is left; returns how many were killed."""
    killed: set[int] = set()
    quiet = 0
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while quiet < QUIET_SCANS and time.monotonic() < deadline:
        found = list(_session_processes(root, executables, ray_dir, spare))
        for pid in found:
            _kill(pid, root)
        killed.update(found)
        quiet = 0 if found else quiet + 1
        time.sleep(POLL_SECONDS)
    return len(killed)


def main(argv: list[str]) -> int:
    root, driver, ray_dir = os.path.realpath(argv[0]), int(argv[1]), os.path.realpath(argv[2])
    executables = {os.path.realpath(sys.executable)}
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    said = b""
    while chunk := sys.stdin.buffer.read(1 << 16):  # waits for the driver's end
        said += chunk
    reap(root, executables, ray_dir, spare={os.getpid(), driver})
    if KEEP not in said:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
