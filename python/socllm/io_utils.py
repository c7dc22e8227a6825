"""Atomic file writes: a temp file in the target's directory, then rename, so an
interrupted write never leaves a partial file under the final name."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yields a temp path beside ``dest``; renames it to ``dest`` only if the block succeeds."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(dest: Path, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
