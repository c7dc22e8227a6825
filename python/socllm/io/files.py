"""Output files: checked before the work, written atomically, where they point; input text files
read only when they are regular files (:func:`read_input_text`).

* :func:`check_output_path` runs before a command's work: it refuses a directory, a path whose
  parent cannot hold a new file, a FIFO or device where a regular file is needed (HDF5 must
  seek), and an output that is one of the command's inputs (the same file after symlinks and
  hard links).
* :func:`atomic_path` / :func:`atomic_write_text`: a temp file beside the target, renamed over
  it only when the write succeeded, so an interrupted write never leaves a partial file under the
  final name. A symlink is written through (the atomic write happens on its target; the link
  stays a link). FIFOs, devices and this process's own descriptors (``/dev/stdout`` is a link to
  ``/proc/self/fd/1``) are written in place: replacing them would leave their reader waiting and
  the shell's redirection empty.
* :func:`write_output` / :func:`emit_json`: the same, with ``-`` meaning stdout.

Temp files are named ``.{DEST.name}.{pid}-{8 hex}.tmp`` beside DEST (the C++ writer of
calibration files uses the same convention). One whose pid is no live process on this machine
was left by a killed writer: the next write of DEST removes it (:func:`remove_stale_temps`).
:func:`atomic_dir` builds a folder the same way: a temp folder of that name, renamed into place.

Permissions: a new file gets ``0o666 & ~umask`` (what ``open(path, "w")`` would give), a file
that replaces an existing one keeps that file's permission bits (not its owner or group).
``tempfile.mkstemp`` would give 0600 whatever the umask, so the temp names are made here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import InvalidArgumentError, SocllmError

_ATTEMPTS = 100  # unique names tried before giving up (tempfile.TMP_MAX is 10000)
_TEMP_HEX_BYTES = 4  # 8 hex digits after the pid
_TEMP_NAME = re.compile(r"\.(?P<dest>.+)\.(?P<pid>\d+)-[0-9a-f]{8}\.tmp")
_MAX_SYMLINKS = 40  # Linux's MAXSYMLINKS: longer chains are loops
# Where a path names a descriptor of the process that opens it (/dev/stdout -> /proc/self/fd/1):
# what it resolves to is what the descriptor has open, so it must be written through the fd.
_PROCESS_FD_PREFIXES = ("/proc/", "/dev/fd/")
STDOUT = "-"


def _unique(parent: Path, prefix: str, suffix: str, create: Callable[[str], None]) -> Path:
    """``create(path)`` on a fresh random name in ``parent``; it must fail if the name exists."""
    for _ in range(_ATTEMPTS):
        path = parent / f"{prefix}{secrets.token_hex(_TEMP_HEX_BYTES)}{suffix}"
        try:
            create(str(path))
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, f"no unused temporary name in {parent}")


def _create_file(path: str) -> None:
    # mode 0o666: the kernel applies the umask, as for open(path, "w")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def make_temp_dir(parent: Path, prefix: str = ".tmp-", suffix: str = "") -> Path:
    """A new empty directory in ``parent`` with mode ``0o777 & ~umask`` (``tempfile.mkdtemp``
    gives 0700), for building a folder that is then renamed into place."""
    return _unique(Path(parent), prefix, suffix, lambda p: os.mkdir(p, 0o777))


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike) -> Iterator[Path]:
    """Yields a new empty folder beside ``dest``, named as temp files are (so a killed
    writer's is removed by the next build of ``dest``), and renames it to ``dest`` if the block
    succeeds. A ``dest`` folder that another process renamed into place first is kept, and
    this one dropped; on any failure the temp folder is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(dest.parent, dest.name)
    tmp = make_temp_dir(dest.parent, f".{dest.name}.{os.getpid()}-", ".tmp")
    try:
        yield tmp
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# What a path is


def _link_chain(path: Path) -> list[str]:
    """``path`` (absolute) and every path its final symlinks lead through, in order."""
    p = os.path.abspath(path)
    chain = [p]
    for _ in range(_MAX_SYMLINKS):
        try:
            p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
        except OSError:  # not a link (or gone)
            break
        chain.append(p)
    return chain


def _writes_in_place(path: Path) -> bool:
    """A FIFO, a device, or one of this process's descriptors: written where it is."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return True
    return any(p.startswith(_PROCESS_FD_PREFIXES) for p in _link_chain(path))


def _existing_ancestor(path: Path) -> Path:
    """The nearest of ``path``'s ancestors that exists (the folder new ones are made in)."""
    for parent in path.parents:
        if os.path.lexists(parent):
            return parent
    return Path(path.anchor or ".")


def _same_file(a: Path, b: Path) -> bool:
    """The same file: one inode (through symlinks and hard links) or, for a file still to be
    written, the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def read_input_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of an input file. A FIFO, device or directory is an InvalidArgumentError
    naming ``what`` and the path before anything is opened (a FIFO would block forever), text
    that is not UTF-8 a FormatError with the byte's position."""
    from ..errors import FormatError

    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise InvalidArgumentError(f"{what} {str(path)!r}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgumentError(f"{what} {str(path)!r} is not a regular file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(
            f"{what} {str(path)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
            f"offset {e.start})"
        ) from None
    except OSError as e:
        raise InvalidArgumentError(f"{what} {str(path)!r}: {e.strerror}") from None


def check_output_path(
    path: str | os.PathLike,
    *,
    inputs: Iterable[str | os.PathLike] = (),
    what: str = "output",
    streams: bool = True,
) -> None:
    """Refuses, before any work, an output ``path`` that cannot be written or would replace one of
    ``inputs`` (InvalidArgumentError naming ``what`` and the path). ``streams``: whether ``-``
    (stdout), a FIFO or a device is acceptable (not for HDF5, which seeks)."""
    if str(path) == STDOUT:
        if not streams:
            raise InvalidArgumentError(f"{what} {STDOUT}: this output cannot be written to stdout")
        return
    path = Path(path)
    if os.path.isdir(path):
        raise InvalidArgumentError(f"{what} {path} is a directory")
    if _writes_in_place(path):
        if not streams:
            raise InvalidArgumentError(
                f"{what} {path} is not a regular file (a FIFO, a device or a descriptor); "
                "this output is HDF5 and needs one"
            )
        if not os.access(path, os.W_OK):
            raise InvalidArgumentError(f"{what} {path} is not writable")
        return
    if os.path.lexists(path) and not os.path.isfile(path) and not os.path.islink(path):
        raise InvalidArgumentError(f"{what} {path} is neither a regular file nor a FIFO or device")
    for source in inputs:
        if _same_file(path, Path(source)):
            raise InvalidArgumentError(
                f"{what} {path} is the same file as the input {source}: it would be replaced"
            )
    target = Path(os.path.realpath(path))
    folder = _existing_ancestor(target)
    if not folder.is_dir():
        raise InvalidArgumentError(f"{what} {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"{what} {path}: cannot create files in {folder}")


def check_distinct_outputs(outputs: dict[str, str | os.PathLike | None]) -> None:
    """Two outputs of one command (``{flag: path}``; None = not given) must not be one file, or
    one stream: the second write would replace or interleave with the first."""
    given = [(flag, p) for flag, p in outputs.items() if p is not None]
    for i, (flag_a, a) in enumerate(given):
        for flag_b, b in given[i + 1 :]:
            if str(a) == STDOUT == str(b):
                raise InvalidArgumentError(f"{flag_a} and {flag_b} both go to stdout (-)")
            if STDOUT not in (str(a), str(b)) and _same_file(Path(a), Path(b)):
                raise InvalidArgumentError(f"{flag_a} {a} and {flag_b} {b} are the same file")


# ---------------------------------------------------------------------------------------------
# Temp files


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (unknown counts as alive)."""
    if os.name != "posix" or pid <= 0:  # Windows' os.kill would terminate it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; or not a pid at all
        return True
    return True


def remove_stale_temps(folder: str | os.PathLike, dest_name: str | None = None) -> None:
    """Deletes the temp files in ``folder`` (of the output named ``dest_name``, or of any) whose
    writer process is gone: a killed conversion leaves hundreds of MB under a hidden name.
    A live writer's temp file is never touched; a temp file written from another machine (a
    network folder) by a pid unknown here counts as stale."""
    for p in Path(folder).glob(".*.tmp"):
        m = _TEMP_NAME.fullmatch(p.name)
        if m is None or (dest_name is not None and m["dest"] != dest_name):
            continue
        if not pid_alive(int(m["pid"])):
            if p.is_dir() and not p.is_symlink():  # a killed atomic_dir's folder
                shutil.rmtree(p, ignore_errors=True)
                continue
            with contextlib.suppress(OSError):  # gone already, or not ours to delete
                p.unlink()


def _about_dest(e: OSError, tmp: Path, dest: Path) -> OSError:
    """A write error about ``dest``: one naming the temp file (deleted by now), or an OS error
    naming no file (a full disk). Any other error, about an input say, is left as it is."""
    names_tmp = e.filename == str(tmp) or str(tmp) in str(e)
    nameless = e.filename is None and e.errno is not None
    if isinstance(e, SocllmError) or not (names_tmp or nameless):
        return e
    reason = str(e).replace(str(tmp), str(dest))
    if e.errno:
        return OSError(e.errno, e.strerror or reason, str(dest))  # the errno's subclass
    return OSError(reason)  # h5py: the name is in the message


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yields a temp path beside ``dest``'s target (an empty file, permissions as in the module
    doc) and renames it over the target only if the block succeeds; its folders are created. A
    FIFO, device or descriptor is yielded itself, to be written in place. Errors are OSErrors
    about ``dest`` (as ``open(dest, "w")`` would raise), never about the temp file; commands
    call :func:`check_output_path` first for a clear message before any work."""
    dest = Path(dest)
    if _writes_in_place(dest):
        yield dest
        return
    target = Path(os.path.realpath(dest))  # through symlinks: the link stays a link
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(dest))
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target.parent, target.name)
    try:
        tmp = _unique(target.parent, f".{target.name}.{os.getpid()}-", ".tmp", _create_file)
    except OSError as e:  # it names a random temp file: about dest instead
        raise OSError(e.errno, e.strerror, str(dest)) from e
    try:
        yield tmp
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))  # replacing: keep its mode
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and (about := _about_dest(e, tmp, dest)) is not e:
            raise about from e
        raise


def atomic_write_text(dest: str | os.PathLike, text: str) -> None:
    """``text`` (UTF-8) into the file ``dest``: atomically, or in place for a FIFO or device."""
    with atomic_path(dest) as tmp:
        # "a": on a descriptor redirected to a regular file, after what was printed before
        with open(tmp, "a" if tmp == Path(dest) else "w", encoding="utf-8") as fh:
            fh.write(text)


def write_output(dest: str | os.PathLike, text: str, *, what: str = "output") -> None:
    """``text`` to an output option's value: stdout if ``dest`` is "-", else the file ``dest``
    (:func:`check_output_path`, then :func:`atomic_write_text`)."""
    if str(dest) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    check_output_path(dest, what=what)
    atomic_write_text(dest, text)


def emit_json(obj, dest: str | os.PathLike | None) -> None:
    """``obj`` as indented JSON to ``dest`` (:func:`write_output`); nothing if ``dest`` is None
    (the commands' ``--json PATH|-`` option)."""
    if dest is not None:
        write_output(dest, json.dumps(obj, indent=2) + "\n", what="--json")
