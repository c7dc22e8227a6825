"""Atomic file writes: a temp file in the target's directory, then rename, so an
interrupted write never leaves a partial file under the final name.

Permissions: a new file gets ``0o666 & ~umask`` (what ``open(path, "w")`` would give), a file
that replaces an existing one keeps that file's permission bits (not its owner or group).
``tempfile.mkstemp`` would give 0600 whatever the umask, so the temp names are made here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

_ATTEMPTS = 100  # unique names tried before giving up (tempfile.TMP_MAX is 10000)


def _unique(parent: Path, prefix: str, suffix: str, create: Callable[[str], None]) -> Path:
    """``create(path)`` on a fresh random name in ``parent``; it must fail if the name exists."""
    for _ in range(_ATTEMPTS):
        path = parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            create(str(path))
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, f"no unused temporary name in {parent}")


def _create_file(path: str) -> None:
    # mode 0o666: the kernel applies the umask, as for open(path, "w")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def make_temp_dir(parent: Path, prefix: str = ".tmp-") -> Path:
    """A new empty directory in ``parent`` with mode ``0o777 & ~umask`` (``tempfile.mkdtemp``
    gives 0700), for building a folder that is then renamed into place."""
    return _unique(Path(parent), prefix, "", lambda p: os.mkdir(p, 0o777))


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yields a temp path beside ``dest`` (an empty file, permissions as in the module doc);
    renames it to ``dest`` only if the block succeeds."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unique(dest.parent, f".{dest.name}.", ".tmp", _create_file)
    try:
        yield tmp
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(os.stat(dest).st_mode))  # replacing: keep its mode
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(dest: Path, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def emit_json(obj, dest: str | None) -> None:
    """``obj`` as indented JSON: to stdout if ``dest`` is "-", else atomically to the file
    ``dest``; nothing if ``dest`` is None (the commands' ``--json PATH|-`` option)."""
    if dest is None:
        return
    text = json.dumps(obj, indent=2)
    if dest == "-":
        print(text)
    else:
        atomic_write_text(Path(dest), text + "\n")
