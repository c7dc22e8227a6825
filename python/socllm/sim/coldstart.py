"""Cold start measured on this machine (seed 004 §3.1, §5.2): time to first token of a model file
that is not in memory, split into reading, unpacking, preparing the plan's linears and prefill.

For each model file: its pages are evicted from the page cache (``posix_fadvise(DONTNEED)`` on
the file; a file another process keeps mapped may stay resident, and the measured read speed
shows it), then the file is loaded, the plan's linears prepared, and a prompt prefilled to the
first token's logits:

* ``read_s``: loading the file minus unpacking (HDF5 reads, checksums, tokenizer);
* ``unpack_s``: turning a packed file's weightlets into INT8 rows (0 for other files);
* ``prepare_s``: building the plan's linears (quantizing and allocating bits for a plan run on
  an fp32 file, packing INT8 rows for the GEMM on a prequantized one): the graph preparation
  step of a cold start;
* ``prefill_s``: the prompt's prefill to the first token.

TTFT is their sum. A prequantized file runs the plan it was converted under; an fp32 file runs
``plan`` (default fp32). Files are measured in the order given, ``repeats`` times each,
interleaved, and the fastest repeat is reported.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tqdm.auto import tqdm

from .. import _core
from ..errors import InvalidArgumentError


def evict(path: str | os.PathLike) -> None:
    """Drops the file's pages from the page cache (they are clean: nothing is lost)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure_once(path: Path, plan: str | None, prompt: list[int], calib=None) -> dict:
    from ..model import LanguageModel

    evict(path)
    t0 = time.perf_counter()
    m = LanguageModel(path, calib=calib)
    load_s = time.perf_counter() - t0
    pk = m._model.packed_linears
    # A prequantized file runs the plan it was converted under (another one is refused,
    # naming both); an fp32 file the plan asked for.
    if plan is not None:
        p = _core.Plan(plan)
    else:
        p = _core.Plan(pk["plan"] if pk is not None else "fp32")
    unpack_s = pk["unpack_seconds"] if pk is not None else 0.0
    t0 = time.perf_counter()
    m._engine.prepare(p)
    prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    m._engine.prefill(prompt, p)
    prefill_s = time.perf_counter() - t0
    size = os.path.getsize(path)
    return {
        "file": str(path),
        "bytes": size,
        "plan": p.name,
        "read_s": load_s - unpack_s,
        "unpack_s": unpack_s,
        "prepare_s": prepare_s,
        "prefill_s": prefill_s,
        "ttft_s": load_s + prepare_s + prefill_s,
        "read_gb_s": size / max(load_s - unpack_s, 1e-9) / 1e9,
    }


def cold_start(
    paths: list[str | os.PathLike],
    *,
    prompt: list[int],
    plan: str | None = None,
    calib: str | os.PathLike | None = None,
    repeats: int = 3,
    progress: bool = True,
) -> list[dict]:
    """The cold-start breakdown of every file (module doc): the fastest of ``repeats`` runs."""
    if repeats < 1:
        raise InvalidArgumentError(f"cold start: repeats must be >= 1, got {repeats}")
    if not prompt:
        raise InvalidArgumentError("cold start: the prompt is empty")
    files = [Path(p) for p in paths]
    best: dict[Path, dict] = {}
    todo = [(r, f) for r in range(repeats) for f in files]
    for _, f in tqdm(todo, desc="cold start", unit="run", disable=not progress):
        row = measure_once(f, plan, prompt, calib)
        if f not in best or row["ttft_s"] < best[f]["ttft_s"]:
            best[f] = row
    return [best[f] for f in files]
