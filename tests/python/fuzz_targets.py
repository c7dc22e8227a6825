"""The fuzz targets of tests/python/test_fuzz.py, run in a worker process so that a crash (a
segfault, a sanitizer abort) or a hang is reported as a failing input instead of killing pytest.

A target takes one input file and uses it the way a user would; its outcome is ``ok``, ``error``
(a socllm exception: the input was refused properly) or ``bad`` (any other exception: the bug
the fuzzing looks for). The worker also runs under the sanitized module
(scripts/test_sanitized.sh), whose environment it inherits.

Targets: ``gguf`` (socllm.io.GgufFile), ``convert`` (socllm.io.convert of a .gguf, then loading
the result), ``model`` (socllm.load of an .h5 model), ``calibration`` (load_calibration of an .h5
for the tiny model given with --model, then the plans that use it) and ``plan`` (a plan spec in
the JSON form of :func:`decode_value`: Plan(...), placed, all_on, with_chunk_len, and a forward
pass of the tiny model with it).

Usage: ``python fuzz_targets.py [--model M] --serve`` reads ``target<TAB>path`` lines on stdin and
answers one ``RESULT {json}`` line each; ``python fuzz_targets.py [--model M] TARGET FILE...``
runs files once and exits 1 if one is ``bad``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

# Enough for every valid tiny input; an allocation sized by a corrupt header fails fast as
# MemoryError instead of swapping. ASan reserves terabytes of address space, so under ASan the
# parent passes max_allocation_size_mb in ASAN_OPTIONS instead.
MEMORY_LIMIT = 4 << 30
# Dequantize only tensors a tiny valid file could hold (a corrupt index may claim gigabytes).
MAX_TENSOR_BYTES = 64 << 20
SITES = ("attn_in", "attn_out", "mlp_in", "mlp_act")
CALIBRATED_PLANS = ("w8a8", "smoothquant", "shadow-outlier")


def asan_loaded() -> bool:
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


def limit_memory() -> None:
    if not asan_loaded():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


# ---------------------------------------------------------------------------------------------
# Plan specs: JSON with tags for the Python values JSON has no form for


def decode_value(v):
    """JSON -> the Python value a caller might pass: {"$bytes": hex}, {"$np": [dtype, value]},
    {"$set": [...]}, {"$pairs": [[key, value], ...]} (a dict whose keys need not be strings,
    e.g. a tuple given as a list); NaN and infinities are Python json's own extension."""
    if isinstance(v, list):
        return [decode_value(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "$bytes" in v:
        return bytes.fromhex(v["$bytes"])
    if "$np" in v:
        dtype, x = v["$np"]
        return np.dtype(dtype).type(x)
    if "$set" in v:
        return frozenset(decode_value(x) for x in v["$set"])
    if "$pairs" in v:
        return {
            tuple(k) if isinstance(k, list) else decode_value(k): decode_value(x)
            for k, x in v["$pairs"]
        }
    return {k: decode_value(x) for k, x in v.items()}


def observed_calibration(m):
    """Statistics of one short sequence, outliers step included (half the max is the threshold),
    for the plans that need them; also the seed of the calibration campaigns."""
    cal = m.new_calibration()
    m.observe_activations([[3, 4, 5, 6, 7, 8, 9, 10]], cal)
    for site in SITES:
        cal.set_outlier_thresholds(site, cal.get(site).max(axis=1) * 0.5 + 1e-3)
    m.observe_activations([[3, 4, 5, 6, 7, 8, 9, 10]], cal)
    return cal


# ---------------------------------------------------------------------------------------------
# Targets


class Targets:
    def __init__(self, model_path: str | None, tmp: Path):
        self.model_path = model_path
        self._model = None
        self.tmp = tmp  # convert's output

    def model(self):
        """The tiny model (--model), with act-scales and outlier statistics of a short run."""
        if self._model is None:
            import socllm

            if not self.model_path:
                raise SystemExit("this target needs --model")
            m = socllm.load(self.model_path, progress=False)
            m.set_calibration(observed_calibration(m))
            self._model = m
        return self._model

    def gguf(self, path: Path) -> None:
        import socllm

        f = socllm.io.GgufFile(str(path))
        _ = (f.version, f.alignment, f.data_offset, f.metadata)
        for name in f.tensor_names():
            info = f.tensor_info(name)
            f.has_tensor(name)
            if info["n_bytes"] <= MAX_TENSOR_BYTES:
                try:
                    f.raw(name)
                    f.dequantize(name)
                except socllm.UnsupportedError:  # listed, but a ggml type socllm does not decode
                    pass

    def convert(self, path: Path) -> None:
        import socllm
        from socllm.io.convert import convert

        out = self.tmp / "converted.h5"
        try:
            convert(path, out, progress=False)
            self._use_model(socllm.load(out, progress=False))
        finally:
            out.unlink(missing_ok=True)

    def model_file(self, path: Path) -> None:
        import socllm

        self._use_model(socllm.load(path, progress=False))

    @staticmethod
    def _use_model(m) -> None:
        v = int(m.config["vocab_size"])
        ids = [i % v for i in (1, 2, 3, 5)]
        m.logits(ids)
        m.new_cache()  # capacity: the context length the file claims
        cache = m.new_cache(8)
        m.step(cache, ids[:2])
        m.step(cache, ids[2:3])
        m.generate_ids(ids[:2], max_new_tokens=2)
        m.detokenize(ids)

    def calibration(self, path: Path) -> None:
        from socllm.calibration import load_calibration

        m = self.model()
        kept = m.calibration
        try:
            cal = load_calibration(path, m)
            st = cal.stats
            for layer in range(int(m.config["n_layers"])):
                for site in SITES:
                    for p in (0.5, 0.9999, 1.0):
                        st.abs_percentile(layer, site, p)
            m.set_calibration(st)
            if st.has_outlier_stats:
                st.outlier_importance()
                st.shadow_configs(0.85, 0.8)
            for plan in CALIBRATED_PLANS:
                if plan != "shadow-outlier" or st.has_outlier_stats:
                    m.logits([1, 2, 3], plan)
        finally:
            m.set_calibration(kept)

    def plan(self, path: Path) -> None:
        import socllm

        spec = decode_value(json.loads(path.read_text()))
        p = socllm.Plan(spec["plan"])
        j = p.to_json()
        if socllm.Plan(j).to_json() != j:
            raise AssertionError(f"Plan(to_json()) differs: {j}")
        _ = (p.name, p.chunk_len, p.needs_calibration, p.placement, repr(p))
        for op, proc, fmt in spec.get("placed", []):
            p = p.placed(op, proc, fmt)
        if "all_on" in spec:
            p = p.all_on(spec["all_on"])
        if "chunk_len" in spec:
            p = p.with_chunk_len(spec["chunk_len"])
        if self.model_path:
            m = self.model()
            m.logits([1, 2, 3, 4, 5], p)
            m.prefill([1, 2, 3, 4, 5], p)  # in the plan's chunks
            m.prefill([1, 2, 3, 4, 5], p, chunk_len=2)

    def run(self, target: str, path: Path) -> dict:
        fn = {
            "gguf": self.gguf,
            "convert": self.convert,
            "model": self.model_file,
            "calibration": self.calibration,
            "plan": self.plan,
        }[target]
        import socllm

        try:
            fn(path)
        except socllm.SocllmError as e:
            return {"outcome": "error", "type": type(e).__name__, "message": str(e)[:500]}
        except Exception as e:
            # where: the innermost frame, to tell bugs apart (convert.py:207 vs model.py:80)
            tb = traceback.extract_tb(e.__traceback__)
            where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
            return {
                "outcome": "bad",
                "type": f"{type(e).__module__}.{type(e).__qualname__}",
                "message": str(e)[:500],
                "where": where,
                "traceback": "".join(traceback.format_exception(e))[-3000:],
            }
        return {"outcome": "ok"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="the tiny model .h5 (targets calibration, plan)")
    ap.add_argument("--serve", action="store_true", help="read target<TAB>path lines on stdin")
    ap.add_argument("--tmp", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("target", nargs="?")
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    limit_memory()
    import socllm

    # scripts/test_sanitized.sh names the sanitized module: never fuzz another one by mistake
    expect = os.environ.get("SOCLLM_EXPECT_CORE")
    if expect and Path(socllm.build_info()["module"]).resolve() != Path(expect).resolve():
        got = socllm.build_info()["module"]
        raise SystemExit(f"socllm's C++ module is {got}, expected {expect}")

    socllm.set_log_level("off")
    socllm.set_num_threads(1)  # workers run beside pytest on a shared machine
    with tempfile.TemporaryDirectory(prefix="socllm-fuzz-", dir=args.tmp) as tmp:
        targets = Targets(args.model, Path(tmp))
        if args.serve:
            print("READY", flush=True)
            for line in sys.stdin:
                target, path = line.rstrip("\n").split("\t")
                print("RESULT " + json.dumps(targets.run(target, Path(path))), flush=True)
            return 0
        bad = 0
        for f in args.files:
            r = targets.run(args.target, f)
            bad += r["outcome"] == "bad"
            print(f"{f}: {json.dumps(r)}", flush=True)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
