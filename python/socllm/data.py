"""Where socllm finds benchmark data: ``SOCLLM_DATA_DIR`` or the shared datasets folder.

Our machines are offline, so the data sets are local files (``../shared/datasets`` beside the
repository); users point elsewhere with one setting, ``SOCLLM_DATA_DIR``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .errors import MissingFileError

# SHA-256 of WikiText-2 raw test as published (wikitext-2-raw-v1, test split).
WIKITEXT2_TEST_SHA256 = "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"


def data_dir() -> Path:
    """The datasets folder: $SOCLLM_DATA_DIR, else ``shared/datasets`` beside the repository."""
    env = os.environ.get("SOCLLM_DATA_DIR")
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise MissingFileError(f"SOCLLM_DATA_DIR={env!r} is not a directory")
        return p
    candidates = [
        Path(__file__).resolve().parents[3] / "shared" / "datasets",  # <repo>/../shared/datasets
        Path.cwd().parent / "shared" / "datasets",
    ]
    for c in candidates:
        if c.is_dir():
            return c
    raise MissingFileError(
        "no datasets folder found; set SOCLLM_DATA_DIR (looked in "
        + ", ".join(str(c) for c in candidates)
        + ")"
    )


def wikitext2_test_path(verify: bool = True) -> Path:
    """Path of WikiText-2 raw test; ``verify`` checks its SHA-256 against the published one."""
    p = data_dir() / "wikitext-2-raw" / "wiki.test.raw"
    if not p.is_file():
        raise MissingFileError(f"WikiText-2 test file not found at {p}")
    if verify:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        if digest != WIKITEXT2_TEST_SHA256:
            raise MissingFileError(f"{p} has SHA-256 {digest}, expected {WIKITEXT2_TEST_SHA256}")
    return p


def wikitext2_test_text() -> str:
    return wikitext2_test_path().read_text(encoding="utf-8")
