"""What the issue-12 safeguards cost, measured in one run on this machine (docs/RESULTS.md):

* the conversion cache key: SHA-256 of the default GGUF (uncached), and the memoized lookup;
* model checksums: file size and ``Model.load`` time of the converted model (format 2, Fletcher-32
  on every weight) next to a format-1 copy of the same weights without checksums;
* Ctrl-C: seconds from SIGINT to KeyboardInterrupt during long fp32 forwards.

Usage: ``python scripts/bench_reliability.py [--json PATH|-]``.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import socllm
from socllm import registry
from socllm.eval.bench_utils import cpu_model, machine_line
from socllm.io.files import check_output_path, emit_json

LOAD_REPEATS = 5
# (prompt tokens, seconds into the forward when SIGINT is sent)
INTERRUPTS = [(3000, d) for d in (0.5, 1.0, 1.5, 2.0, 2.5)] + [(8000, d) for d in (3.0, 6.0)]

_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import socllm
m = socllm.load("smollm2-135m", progress=False)
print("ready", flush=True)
try:
    m.logits([1] * int(sys.argv[1]))
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def load_seconds(path: Path) -> list[float]:
    out = []
    for _ in range(LOAD_REPEATS):
        t0 = time.perf_counter()
        socllm.io.Model.load(str(path))
        out.append(time.perf_counter() - t0)
    return out


def format1_copy(src: Path, dst: Path) -> None:
    """The same file as format 1 wrote it: contiguous datasets, no checksums (neither the
    datasets' Fletcher-32 nor the attribute CRCs of format 4)."""

    def attrs(obj) -> dict:
        return {k: v for k, v in obj.attrs.items() if k != socllm.io.H5_ATTRIBUTES_CHECKSUM}

    with h5py.File(src, "r") as fi, h5py.File(dst, "w") as fo:
        fo.attrs.update(attrs(fi))
        fo.attrs["format_version"] = 1

        def copy(name, obj):
            if isinstance(obj, h5py.Group):
                fo.require_group(name).attrs.update(attrs(obj))
            else:
                fo.create_dataset(name, data=obj[()], dtype=obj.dtype).attrs.update(attrs(obj))

        fi.visititems(copy)


def interrupt_latency(tokens: int, delay: float) -> dict:
    p = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tokens)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert p.stdout.readline().strip() == "ready"
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    t0 = time.perf_counter()
    outcome = p.stdout.readline().strip()
    latency = time.perf_counter() - t0
    p.wait()
    return {"tokens": tokens, "after_s": delay, "outcome": outcome, "latency_s": round(latency, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, metavar="PATH|-")
    args = ap.parse_args()
    if args.json:
        check_output_path(args.json, what="--json")
    socllm.set_log_level("warn")
    out: dict = {"machine": machine_line(), "cpu": cpu_model(), "isa": socllm.ops.isa()}
    print(out["machine"], flush=True)
    gguf = registry.source_path(registry.DEFAULT_MODEL)
    model = registry.resolve_model_file(registry.DEFAULT_MODEL, progress=False)

    t0 = time.perf_counter()
    registry._hash_file(gguf)  # the uncached digest, as a first load computes it
    out["gguf_mb"] = round(gguf.stat().st_size / 1e6, 1)
    out["sha256_s"] = round(time.perf_counter() - t0, 3)
    registry.file_digest(gguf)  # fills the memo
    t0 = time.perf_counter()
    registry.file_digest(gguf)
    out["memoized_digest_ms"] = round(1e3 * (time.perf_counter() - t0), 2)

    with tempfile.TemporaryDirectory(dir=model.parent) as tmp:
        v1 = Path(tmp) / "format1.h5"
        format1_copy(model, v1)
        socllm.io.Model.load(str(model))  # both files in the page cache before timing
        socllm.io.Model.load(str(v1))
        for name, path in (("format2", model), ("format1", v1)):
            s = load_seconds(path)
            out[name] = {
                "mb": round(path.stat().st_size / 1e6, 1),
                "load_median_s": round(statistics.median(s), 3),
                "load_min_s": round(min(s), 3),
            }
    out["interrupts"] = [interrupt_latency(n, d) for n, d in INTERRUPTS]

    f1, f2 = out["format1"], out["format2"]
    print(
        f"SHA-256 of the {out['gguf_mb']} MB GGUF: {out['sha256_s']} s; "
        f"memoized: {out['memoized_digest_ms']} ms"
    )
    print(
        f"model file {f1['mb']} -> {f2['mb']} MB with checksums; Model.load median "
        f"{f1['load_median_s']} -> {f2['load_median_s']} s (of {LOAD_REPEATS})"
    )
    for r in out["interrupts"]:
        print(
            f"SIGINT {r['after_s']} s into a {r['tokens']}-token forward: "
            f"{r['outcome']} {r['latency_s']} s later"
        )
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
