"""Fuzzing of socllm's readers (issue 12, item 17): the GGUF reader (``socllm.io.GgufFile``,
``socllm.io.convert``), the HDF5 model loader (``socllm.load`` of an .h5), the calibration loader
(``socllm.calibration.load_calibration``) and the plan parser (``socllm.Plan`` of a
string or a dict, ``Plan.placed``, ``all_on``, ``with_chunk_len``).

Property: every input either loads (and then runs) or raises a socllm exception
(``socllm.SocllmError``); never a crash, a hang, a MemoryError or another exception.

Inputs start from small valid files built by the other tests' helpers (test_gguf.py's writers,
test_convert.py's tiny llama GGUF, converted to .h5, and a calibration file for it) and are
mutated by hypothesis: byte flips, truncation, header and index fields set to extreme values
(0, 2**31, 2**32-1, 2**62, 2**64-1, NaN, inf ...), metadata keys re-typed (arrays, strings in
numeric keys, invalid UTF-8), HDF5 attributes and datasets replaced (array-valued attributes,
wrong dtypes, strings in numeric datasets, shapes claiming gigabytes). Each input runs in a
worker process (fuzz_targets.py), so a crash or a hang fails the test with the input saved
(under pytest's temp dir, or $SOCLLM_FUZZ_OUT) instead of ending pytest.

Tiers: the default run tries a few hundred inputs per target, derandomized (the same inputs
every run); ``--runslow`` adds long random campaigns (thousands per target; reproduce one with
``--hypothesis-seed``). ``test_corpus`` replays every input saved in fuzz_corpus/<target>/;
inputs of open bugs are xfail (CORPUS_XFAIL) and their signatures are in KNOWN, which lets the
campaigns go on past them: remove both when the fix lands. scripts/test_sanitized.sh runs this
file under ASan/UBSan too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
pytest.importorskip("hypothesis")
pytest.importorskip("socllm", reason="socllm's C++ module is not built")
import socllm
from fuzz_targets import observed_calibration
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "fuzz_corpus"
RUNNER = HERE / "fuzz_targets.py"
TARGETS = ("gguf", "convert", "model", "calibration", "plan")
SUFFIX = {
    "gguf": ".gguf",
    "convert": ".gguf",
    "model": ".h5",
    "calibration": ".h5",
    "plan": ".json",
}
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
# Seconds one input may take; the tiny inputs take milliseconds, ASan slows them ~5x.
INPUT_TIMEOUT = 60 if UNDER_ASAN else 20

# SOCLLM_FUZZ_COLLECT=1: a campaign saves the smallest input of each kind of failure (with its
# report, .txt) in $SOCLLM_FUZZ_OUT and goes on, instead of failing at the first.
COLLECT = os.environ.get("SOCLLM_FUZZ_COLLECT") == "1"
# Inputs per target: default tier (derandomized) and --runslow.
SHORT = {"gguf": 300, "convert": 200, "model": 300, "calibration": 300, "plan": 400}
LONG = {t: 10 * n for t, n in SHORT.items()}

EXTREME_INTS = [0, 1, 2, 3, 7, 255, 2**15, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**62,
                2**63 - 1, 2**63, 2**64 - 1, -1, -2, -(2**31), -(2**63)]  # fmt: skip
EXTREME_FLOATS = [0.0, -0.0, 5e-324, 1e-30, 0.5, 1.0, -1.0, 3.0e38, 1e300, math.inf, -math.inf,
                  math.nan]  # fmt: skip
EXTREME_STRINGS = ["", "llama", "qwen2", "gpt2", "socllm-model", "socllm-calibration", "0", "-1",
                   "nan", "1e999", "x" * 300, "\u00e9\u65e5", "\ud800", "a\x00b"]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Open bugs: the signatures the campaigns tolerate (each has a corpus input, xfail below)


@dataclass(frozen=True)
class Known:
    targets: tuple[str, ...]
    outcome: str  # "bad", "crash" or "hang"
    pattern: str  # regex searched in "<type> <where> <message>" (bad) or the stderr tail
    note: str


# Empty while no bug is open: every finding so far is fixed (f4b903c). Add one as
# Known(targets, outcome, pattern, note) next to its corpus input in CORPUS_XFAIL.
KNOWN: list[Known] = []

# fuzz_corpus/<target>/<file> -> why it fails today (remove when fixed). A sanitizer finding
# fails only under scripts/test_sanitized.sh: say so in the reason.
CORPUS_XFAIL: dict[str, str] = {}


def known_bug(target: str, result: dict) -> Known | None:
    text = (
        result.get("stderr", "")
        if result["outcome"] != "bad"
        else f"{result['type']} {result['where']} {result['message']}"
    )
    for k in KNOWN:
        if target in k.targets and k.outcome == result["outcome"] and re.search(k.pattern, text):
            return k
    return None


# ---------------------------------------------------------------------------------------------
# The worker process


class Worker:
    """A ``fuzz_targets.py --serve`` process: one input at a time, restarted after a crash or a
    hang. The environment is inherited (a sanitized run's LD_PRELOAD, PYTHONPATH ...)."""

    def __init__(self, model: Path | None, tmp: Path):
        self.model = model
        self.tmp = tmp  # under pytest's temp dir: a crashed worker's scratch is swept with it
        self.proc: subprocess.Popen | None = None
        self.stderr = tempfile.TemporaryFile()
        self.buf = b""

    def _env(self) -> dict:
        env = dict(os.environ)
        if UNDER_ASAN:  # RLIMIT_AS cannot bound ASan's address space: bound allocations instead
            env["ASAN_OPTIONS"] = (
                env.get("ASAN_OPTIONS", "")
                + ":max_allocation_size_mb=4096:allocator_may_return_null=1:hard_rss_limit_mb=8000"
            )
        return env

    def _start(self) -> None:
        cmd = [sys.executable, str(RUNNER), "--serve", "--tmp", str(self.tmp)]
        if self.model:
            cmd += ["--model", str(self.model)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=self._env()
        )
        self.buf = b""
        line = self._readline(300)
        if line != "READY":
            raise RuntimeError(f"fuzz worker did not start: {line!r}\n{self._stderr_tail(0)}")

    def _readline(self, timeout: float) -> str | None:
        """One stdout line; None on timeout, "" at EOF."""
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return ""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def _stderr_tail(self, start: int) -> str:
        self.stderr.seek(start)
        out = self.stderr.read().decode(errors="replace")
        self.stderr.seek(0, os.SEEK_END)
        return out[-6000:]

    def run(self, target: str, path: Path) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc and self.proc.stdin
        err_pos = self.stderr.seek(0, os.SEEK_END)
        self.proc.stdin.write(f"{target}\t{path}\n".encode())
        self.proc.stdin.flush()
        line = self._readline(INPUT_TIMEOUT)
        if line and line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
        if line is None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return {"outcome": "hang", "stderr": self._stderr_tail(err_pos)}
        code = self.proc.wait()
        self.proc = None
        return {"outcome": "crash", "returncode": code, "stderr": self._stderr_tail(err_pos)}

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


# ---------------------------------------------------------------------------------------------
# Seeds: small valid inputs built by the other tests' helpers


@dataclass
class Seeds:
    gguf: dict[str, bytes]  # name -> a valid GGUF: "written", "handmade", "llama" (convert's)
    gguf_layout: dict[str, tuple]  # name -> gguf_layout()
    model: Path  # the tiny llama converted
    calibration: Path  # statistics of a short run of it, outliers step included
    h5_layout: dict[str, tuple]  # "model", "calibration" -> h5_layout()

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis prints a failing example's arguments
        p.text(f"Seeds(model={self.model})")


@pytest.fixture(scope="session")
def seeds(tmp_path_factory) -> Seeds:
    import test_convert as tc  # its tiny llama GGUF writer (skips without torch)
    import test_gguf as tg
    from socllm.calibration import CalibrationData, save_calibration
    from socllm.io.convert import convert

    socllm.set_log_level("warn")
    d = tmp_path_factory.mktemp("fuzz-seeds")
    written = tg.write_gguf(d / "written.gguf", tg.written_tensors(np.random.default_rng(7)))
    handmade = tg._gguf_bytes(
        [("t", [4, 2], 0, 0)],
        [
            tg._kv("general.alignment", tg.U32, struct.pack("<I", 32)),
            tg._kv("s", tg.STR, tg._s("x")),
        ],
        data=np.arange(8, dtype=np.float32).tobytes(),
    )
    tc._write_gguf(d / "tiny-llama.gguf", "llama")
    llama = (d / "tiny-llama.gguf").read_bytes()
    model = convert(d / "tiny-llama.gguf", d / "tiny-llama.h5", progress=False)

    stats = observed_calibration(m := socllm.load(model, progress=False))
    provenance = {"corpus": "fuzz", "samples": 1, "seqlen": 8, "seed": 0}
    calib = save_calibration(d / "calib.h5", CalibrationData(stats, provenance), m)
    gguf = {"written": written.read_bytes(), "handmade": handmade, "llama": llama}
    return Seeds(
        gguf=gguf,
        gguf_layout={k: gguf_layout(b, d / f"layout-{k}.gguf") for k, b in gguf.items()},
        model=model,
        calibration=calib,
        h5_layout={"model": h5_layout(model), "calibration": h5_layout(calib)},
    )


@pytest.fixture(scope="session")
def worker(seeds, tmp_path_factory):
    w = Worker(seeds.model, tmp_path_factory.mktemp("fuzz-worker"))
    yield w
    w.close()


@pytest.fixture(scope="session")
def failures_dir(tmp_path_factory) -> Path:
    out = os.environ.get("SOCLLM_FUZZ_OUT")
    d = Path(out) if out else tmp_path_factory.mktemp("fuzz-failures")
    d.mkdir(parents=True, exist_ok=True)
    return d


def materialize(seeds: Seeds, recipe: dict, tmp: Path) -> bytes:
    """The input a recipe describes: {"seed": a GGUF seed, "mutations": [...]} (apply_gguf) or
    {"seed": "model" | "calibration", "edits": [...]} (apply_h5)."""
    name = recipe["seed"]
    if name in seeds.gguf:
        return apply_gguf(seeds.gguf[name], seeds.gguf_layout[name], recipe["mutations"])
    seed = {"model": seeds.model, "calibration": seeds.calibration}[name]
    return apply_h5(seed, tmp / f"recipe-{name}.h5", recipe["edits"], recipe.get("seal", True))


class Campaign:
    """Runs the inputs of one target, checks the property, tallies outcomes and the open bugs
    hit (printed at the end: pytest -s)."""

    def __init__(self, target: str, worker: Worker, out: Path, tmp: Path):
        self.target, self.worker, self.out = target, worker, out
        self.path = tmp / f"input{SUFFIX[target]}"
        self.outcomes: dict[str, int] = {}
        self.known: dict[str, int] = {}
        self.collected: dict[str, int] = {}
        self.errors: dict[str, int] = {}  # refusals by message (digits, quotes elided)

    def check(self, data: bytes, recipe: dict | None = None) -> None:
        """Runs one input; a failure is saved (the input, and its recipe if given, which is what
        goes into fuzz_corpus/ for inputs built from a large seed)."""
        self.path.write_bytes(data)
        r = self.worker.run(self.target, self.path)
        self.outcomes[r["outcome"]] = self.outcomes.get(r["outcome"], 0) + 1
        if r["outcome"] == "error":
            msg = re.sub(r"'[^']*'|\d+", "_", r["type"] + " " + r["message"])[:70]
            self.errors[msg] = self.errors.get(msg, 0) + 1
        if r["outcome"] in ("ok", "error"):
            return
        if k := known_bug(self.target, r):
            self.known[k.note] = self.known.get(k.note, 0) + 1
            return
        # One file per kind of failure: hypothesis shrinks by failing again, and the last input
        # it fails with is the smallest.
        if r["outcome"] == "bad":
            head = re.sub(r"0x\w+|\d+|'[^']*'", "", r["message"])[:40]
            kind = f"bad-{r['type']}-{r['where']}-{head}"
        else:  # the sanitizer's summary or the first runtime error, if any
            pattern = (
                r"(\w+\.\w+:\d+):\d+: runtime error: (\w+ \w+)|SUMMARY: \w+: ([\w-]+)"
                r"|AddressSanitizer: (hard rss limit) exhausted"
            )
            m = re.search(pattern, r.get("stderr", ""))
            kind = f"{r['outcome']}-{'-'.join(g for g in m.groups() if g) if m else ''}"
        kind = re.sub(r"[^\w.]+", "_", kind)
        saved = self.out / f"{self.target}-{kind}{SUFFIX[self.target]}"
        if COLLECT and saved.exists() and len(data) >= saved.stat().st_size:
            self.collected[kind] = self.collected.get(kind, 0) + 1
            return
        saved.write_bytes(data)
        saved.with_suffix(".txt").write_text(json.dumps(r, indent=1))
        if recipe is not None:
            recipe_text = json.dumps(recipe, allow_nan=True)
            saved.with_suffix(".recipe.json").write_text(recipe_text)
        if COLLECT:  # keep the smallest input of each kind and go on
            self.collected[kind] = self.collected.get(kind, 0) + 1
            return
        __tracebackhide__ = True
        detail = r.get("traceback") or r.get("stderr", "")
        raise AssertionError(
            f"{self.target}: {r['outcome']} on the input saved as {saved}: "
            f"{r.get('type', '')} {r.get('where', '')} {r.get('message', '')}\n{detail}"
        )

    def report(self) -> None:
        print(f"\n[fuzz {self.target}] outcomes {self.outcomes}; open bugs hit {self.known}")
        for kind, n in sorted(self.collected.items()):
            print(f"[fuzz {self.target}]   new: {kind} x{n}")
        if COLLECT:
            for msg, n in sorted(self.errors.items(), key=lambda kv: -kv[1])[:25]:
                print(f"[fuzz {self.target}]   refused x{n}: {msg}")


@pytest.fixture
def campaign(request, worker, failures_dir, tmp_path):
    """campaign(target): the test's Campaign of that target (the same for every example)."""
    made: dict[str, Campaign] = {}

    def get(target: str) -> Campaign:
        if target not in made:
            made[target] = Campaign(target, worker, failures_dir, tmp_path)
            request.addfinalizer(made[target].report)
        return made[target]

    return get


# ---------------------------------------------------------------------------------------------
# GGUF mutations


def gguf_layout(blob: bytes, path: Path) -> tuple:
    """(slots, kv_end, index_end, data_start, alignment) of a valid GGUF, from gguf-py's reader:
    a slot is (kind, offset, width) of one header, metadata or tensor-index field ("int",
    "float", or "bytes" for string contents and the magic)."""
    from gguf import GGUFReader

    path.write_bytes(blob)
    r = GGUFReader(path)
    slots: list[tuple[str, int, int]] = [("bytes", 0, 4)]
    fields = list(r.fields.values()) + [t.field for t in r.tensors]
    for f in fields:
        off = f.offset
        for part in f.parts:
            kind = part.dtype.kind
            if kind in "iub" and part.dtype.itemsize == 1 and part.size > 1:
                slots.append(("bytes", off, part.nbytes))
            elif kind in "iub":
                slots += [("int", off + i * part.itemsize, part.itemsize) for i in range(part.size)]
            elif kind == "f":
                slots += [
                    ("float", off + i * part.itemsize, part.itemsize) for i in range(part.size)
                ]
            off += part.nbytes
    if r.tensors:
        kv_end = r.tensors[0].field.offset
        last = r.tensors[-1].field
        index_end = last.offset + sum(int(p.nbytes) for p in last.parts)
    else:
        kv_end = index_end = r.data_offset
    return slots, kv_end, index_end, int(r.data_offset), int(r.alignment)


GGUF_TYPES = {
    "u8": (0, "<B"),
    "i8": (1, "<b"),
    "u16": (2, "<H"),
    "i16": (3, "<h"),
    "u32": (4, "<I"),
    "i32": (5, "<i"),
    "f32": (6, "<f"),
    "bool": (7, "<B"),
    "u64": (10, "<Q"),
    "i64": (11, "<q"),
    "f64": (12, "<d"),
}
LLAMA_KEYS = [
    "general.architecture",
    "general.alignment",
    "general.name",
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.rope.freq_base",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.rope.dimension_count",
    "llama.attention.key_length",
    "llama.vocab_size",
    "llama.rope.scaling.type",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
]


def _pack_scalar(fmt: str, value) -> bytes:
    """``value`` in ``fmt``, wrapped to the field's width (2**64-1 as i8 is -1) or NaN-safe."""
    if fmt in ("<f", "<d"):
        with np.errstate(over="ignore"):
            return np.array([value], dtype=fmt.replace("<f", "<f4").replace("<d", "<f8")).tobytes()
    bits = struct.calcsize(fmt) * 8
    v = int(value) % (1 << bits)
    if fmt[1].islower() and v >= 1 << (bits - 1):
        v -= 1 << bits
    return struct.pack(fmt, v)


def gguf_value(draw) -> tuple[int, bytes]:
    """A metadata value of any type: (value type id, payload)."""
    import test_gguf as tg

    kind = draw(st.sampled_from(["scalar", "string", "array", "array-str", "nested", "badtype"]))
    if kind == "scalar":
        name = draw(st.sampled_from(sorted(GGUF_TYPES)))
        vid, fmt = GGUF_TYPES[name]
        pool = EXTREME_FLOATS if fmt in ("<f", "<d") else EXTREME_INTS
        return vid, _pack_scalar(fmt, draw(st.sampled_from(pool)))
    if kind == "string":
        text = draw(
            st.sampled_from(EXTREME_STRINGS).map(lambda s: s.encode("utf-8", "surrogatepass"))
            | st.binary(max_size=12)
        )
        return tg.STR, tg._s(text)
    if kind == "array":
        name = draw(st.sampled_from(sorted(GGUF_TYPES)))
        vid, fmt = GGUF_TYPES[name]
        pool = EXTREME_FLOATS if fmt in ("<f", "<d") else EXTREME_INTS
        items = draw(st.lists(st.sampled_from(pool), max_size=4))
        count = draw(st.sampled_from([len(items)] * 4 + [len(items) + 1, 2**32, 2**62, 2**64 - 1]))
        payload = b"".join(_pack_scalar(fmt, x) for x in items)
        return tg.ARR, struct.pack("<IQ", vid, count) + payload
    if kind == "array-str":
        items = draw(st.lists(st.binary(max_size=6), max_size=4))
        return tg.ARR, struct.pack("<IQ", tg.STR, len(items)) + b"".join(tg._s(b) for b in items)
    if kind == "nested":
        return tg.ARR, struct.pack("<IQ", tg.ARR, 1) + struct.pack("<IQ", 4, 1) + b"\0" * 4
    return draw(st.sampled_from([13, 99, 2**31, 2**32 - 1])), b"\0" * 8


@st.composite
def gguf_mutation(draw, keys: list[str]):
    kind = draw(st.sampled_from(["flip", "truncate", "slot", "slot", "slot", "kv", "kv"]))
    where = draw(st.integers(0, 2**32))
    if kind == "flip":
        return ("flip", where, draw(st.integers(1, 255)))
    if kind == "truncate":
        return ("truncate", where)
    if kind == "slot":
        return (
            "slot",
            where,
            draw(st.sampled_from(EXTREME_INTS)),
            draw(st.sampled_from(EXTREME_FLOATS)),
            draw(st.binary(min_size=1, max_size=4)).hex(),
        )
    key = draw(st.sampled_from(keys) | st.sampled_from(["", "\udcff"]))
    vid, payload = gguf_value(draw)
    return ("kv", key, vid, payload.hex())


def apply_gguf(blob: bytes, layout, mutations) -> bytes:
    """The seed with the mutations applied: first the ``kv`` records, appended after the last
    metadata record (socllm keeps a key's last value, so they override the seed's) with the
    index and the data moved to stay aligned; then flips, truncations and slot writes in order
    (slots refer to the seed's fields, moved with them)."""
    import test_gguf as tg

    slots, kv_end, index_end, data_start, alignment = layout
    records = b"".join(
        tg._kv(m[1].encode("utf-8", "surrogatepass"), m[2], bytes.fromhex(m[3]))
        for m in mutations
        if m[0] == "kv"
    )
    out = bytearray(blob)
    if records:
        head = bytearray(blob[:kv_end])
        n_kv = struct.unpack_from("<Q", head, 16)[0]
        struct.pack_into("<Q", head, 16, (n_kv + sum(m[0] == "kv" for m in mutations)) % 2**64)
        body = head + records + blob[kv_end:index_end]
        out = body + b"\0" * (-len(body) % alignment) + blob[data_start:]
    for m in mutations:
        if m[0] == "flip" and out:
            out[m[1] % len(out)] ^= m[2]
        elif m[0] == "truncate":
            del out[m[1] % (len(out) + 1) :]
        elif m[0] == "slot":
            kind, off, width = slots[m[1] % len(slots)]
            off += len(records) if off >= kv_end else 0
            if kind == "int":
                b = (int(m[2]) % (1 << (8 * width))).to_bytes(width, "little")
            elif kind == "float":  # 1e300 as float32 is inf
                with np.errstate(over="ignore"):
                    b = np.array([m[3]], dtype="<f4" if width == 4 else "<f8").tobytes()
            else:
                b = (bytes.fromhex(m[4]) * width)[:width]
            if off + width <= len(out):
                out[off : off + width] = b
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# HDF5 mutations (model and calibration files), applied with h5py


# Edits are JSON-able descriptions (a failing input is saved as its recipe: the seeds are
# rebuilt by the fixtures, the files are too large for the corpus); apply_h5 makes them.


def _attr_value(draw) -> list:
    kind = draw(st.sampled_from(["int", "float", "str", "bytes", "array", "bool", "scalar"]))
    if kind == "int":
        return ["int", draw(st.sampled_from(EXTREME_INTS))]
    if kind == "float":
        return ["float", draw(st.sampled_from(EXTREME_FLOATS))]
    if kind == "str":
        return ["str", draw(st.sampled_from(EXTREME_STRINGS) | st.text(max_size=8))]
    if kind == "bytes":  # a fixed-length string, maybe not UTF-8
        return ["bytes", draw(st.binary(min_size=1, max_size=8)).hex()]
    if kind == "array":  # array-valued attributes
        dtype = draw(st.sampled_from(["i8", "f8", "u1", "f4", "S3"]))
        return ["array", dtype, draw(st.sampled_from([[0], [1], [2], [2, 2]]))]
    if kind == "bool":
        return ["bool", draw(st.booleans())]
    return ["scalar", *draw(st.sampled_from([["c8", 1.5], ["f2", 1.5], ["i1", -1], ["u1", 255]]))]


def _attr_make(v: list):
    kind, *a = v
    if kind == "int":
        return np.uint64(a[0] % 2**64) if a[0] >= 2**63 else np.int64(a[0])
    if kind == "float":
        return np.float64(a[0])
    if kind == "bytes":
        return np.bytes_(bytes.fromhex(a[0]))
    if kind == "array":
        return np.full(a[1], b"1" if a[0] == "S3" else 1, dtype=a[0])
    if kind == "bool":
        return np.bool_(a[0])
    if kind == "scalar":
        return np.dtype(a[0]).type(a[1])
    return a[0]


def _dataset_value(draw, shape: tuple[int, ...], dtype: np.dtype) -> list:
    kinds = [
        "shape",
        "dtype",
        "values",
        "values",
        "strings",
        "empty",
        "huge",
        "group",
        "dangling",
        "external",
        "delete",
    ]
    kind = draw(st.sampled_from(kinds))
    numeric = dtype.str if dtype.kind in "iuf" else "<f4"
    if kind == "shape":
        options = [
            [],
            [0],
            [1],
            [3, 0],
            [1, 1, 1],
            list(shape[:-1]),
            [*shape, 1],
            [x + 1 for x in shape],
        ]
        return ["ones", draw(st.sampled_from(options)), numeric]
    if kind == "dtype":
        return [
            "ones",
            list(shape),
            draw(st.sampled_from(["i4", "i8", "u1", "f2", "f8", "?", "c8", "S4"])),
        ]
    if kind == "values":  # non-finite, negative or huge values in the dataset's own dtype
        if dtype.kind in "iu":
            pool = [-1, -(2**31), -(2**63), 2**31 - 1, 2**62, 2**63 - 1]
        else:
            pool = [math.nan, math.inf, -math.inf, 3.0e38, -1.0, 0.0, 5e-324]
        at = draw(st.integers(0, 2**32))
        return [
            "values",
            list(shape),
            numeric,
            at,
            draw(st.sampled_from(pool)),
            draw(st.booleans()),
        ]
    if kind == "huge":  # claims rows x 65536 values, stores none
        return ["huge", draw(st.sampled_from([2**16, 60000, 2**31, 2**40])), draw(st.booleans())]
    return [kind, list(shape)]


@st.composite
def h5_edit(draw, attrs: list[tuple[str, str]], datasets: dict[str, tuple]) -> list:
    kind = draw(st.sampled_from(["attr", "attr", "attr", "attr-delete", "dataset", "dataset"]))
    if kind.startswith("attr"):
        obj, name = draw(st.sampled_from(attrs))
        return [kind, obj, name, None if kind == "attr-delete" else _attr_value(draw)]
    path = draw(st.sampled_from(sorted(datasets)))
    return ["dataset", path, _dataset_value(draw, *datasets[path])]


def apply_h5(seed: Path, dest: Path, edits, seal: bool = True) -> bytes:
    """A copy of ``seed`` with the edits made by h5py; an edit h5py itself refuses is left out.
    ``seal``: the attribute checksums are recomputed afterwards (a writer's consistent but bad
    values, which the checks behind the checksum must refuse); without it any attribute edit
    must fail the checksum (damage after writing). Edit ["dataset-scale", path, factor]
    multiplies a dataset's values in place (0: all zeros)."""
    shutil.copy(seed, dest)
    with h5py.File(dest, "r+") as f:
        for e in edits:
            try:
                if e[0] == "attr":
                    f[e[1]].attrs[e[2]] = _attr_make(e[3])
                elif e[0] == "attr-delete":
                    if e[2] in f[e[1]].attrs:
                        del f[e[1]].attrs[e[2]]
                elif e[0] == "dataset-scale":
                    f[e[1]][...] = f[e[1]][()] * e[2]
                else:
                    _replace_dataset(f, e[1], e[2])
            except (TypeError, ValueError, OverflowError, OSError, KeyError):
                pass
    if seal:
        with contextlib.suppress(socllm.SocllmError):  # a type the checksum cannot cover
            socllm.io.seal_h5_attributes(str(dest))
    return dest.read_bytes()


def _replace_dataset(f, path: str, v: list) -> None:
    kind, *a = v
    if f.get(path, getlink=True) is not None:
        del f[path]
    if kind == "ones":
        f.create_dataset(path, data=np.ones(a[0], dtype=a[1]))
    elif kind == "values":
        shape, dtype, at, value, everywhere = a
        x = np.ones(shape or [1], dtype=dtype)
        with np.errstate(all="ignore"):  # 2**63-1 in an int32 dataset wraps
            new = np.array([value], dtype="u8" if value >= 2**63 else None).astype(dtype)[0]
        if everywhere:
            x[...] = new
        elif x.size:
            x.flat[at % x.size] = new
        f.create_dataset(path, data=x.reshape(shape) if shape else x[0])
    elif kind == "strings":  # strings in a numeric dataset (or the tokenizer's)
        x = np.full(a[0] or [1], "ab", dtype=object)
        f.create_dataset(path, data=x, dtype=h5py.string_dtype())
    elif kind == "empty":  # a null dataspace
        f.create_dataset(path, data=h5py.Empty("f4"))
    elif kind == "huge":
        rows, compressed = a
        f.create_dataset(
            path,
            shape=(rows, 2**16),
            dtype="f4",
            chunks=(1, 1024),
            compression="gzip" if compressed else None,
        )
    elif kind == "group":
        f.create_group(path)
    elif kind == "dangling":
        f[path] = h5py.SoftLink("/nowhere/at/all")
    elif kind == "external":
        f[path] = h5py.ExternalLink("/nonexistent/file.h5", "/x")


def h5_layout(path: Path) -> tuple[list[tuple[str, str]], dict[str, tuple]]:
    """Every (object, attribute) and dataset -> (shape, dtype) of an HDF5 file."""
    attrs: list[tuple[str, str]] = []
    datasets: dict[str, tuple] = {}
    with h5py.File(path) as f:

        def visit(name, obj):
            attrs.extend((f"/{name}", a) for a in obj.attrs)
            if isinstance(obj, h5py.Dataset):
                datasets[f"/{name}"] = (obj.shape, obj.dtype)

        attrs.extend(("/", a) for a in f.attrs)
        f.visititems(visit)
    return attrs, datasets


# ---------------------------------------------------------------------------------------------
# Plan specs (fuzz_targets.decode_value's JSON)

OPTION_KEYS = [
    "alpha",
    "threshold",
    "pruning_rate",
    "hot_share",
    "weights",
    "group_size",
    "chunk_len",
    "placement",
    "ops",
    "name",
]
PROCESSORS = ["npu", "cpu", "gpu", "NPU", "dsp", ""]
FORMATS = ["fp16", "fp32", "int8", "int4", "bf16"]


def _json_leaf(draw):
    kind = draw(st.sampled_from(["int", "float", "str", "none", "bool", "special"]))
    if kind == "int":
        return draw(st.sampled_from(EXTREME_INTS) | st.integers(-(2**70), 2**70))
    if kind == "float":
        return draw(st.sampled_from(EXTREME_FLOATS) | st.floats())
    if kind == "str":
        return draw(
            st.sampled_from(
                EXTREME_STRINGS
                + PROCESSORS
                + FORMATS
                + socllm.Plan.known()
                + ["per-tensor", "per-channel", "per-group"]
            )
            | st.text(max_size=6)
        )
    if kind == "none":
        return None
    if kind == "bool":
        return draw(st.booleans())
    # values a caller might pass that JSON has no form for
    return draw(
        st.sampled_from(
            [
                {"$bytes": "6869"},
                {"$np": ["float32", 0.5]},
                {"$np": ["int64", 7]},
                {"$set": [1]},
                {"$pairs": [[[1, 2], 3]]},
            ]
        )
    )


@st.composite
def json_value(draw, depth: int = 2):
    if depth == 0 or draw(st.integers(0, 2)) > 0:
        return _json_leaf(draw)
    keys = st.sampled_from(
        OPTION_KEYS
        + list(socllm.Plan.op_classes())
        + ["processor", "format", "weights", "activations", "smoothing_alpha", "shadow_outliers"]
    ) | st.text(max_size=4)
    if draw(st.booleans()):
        return draw(st.lists(json_value(depth - 1), max_size=3))
    return draw(st.dictionaries(keys, json_value(depth - 1), max_size=3))


def _leaf_paths(obj, prefix=()) -> list[tuple]:
    if isinstance(obj, dict) and obj and not any(k.startswith("$") for k in obj):  # not a tag
        return [p for k, v in obj.items() for p in _leaf_paths(v, (*prefix, k))]
    return [prefix]


def _set_path(obj, path: tuple, value, delete: bool):
    if not path:
        return value
    head, *rest = path
    obj = dict(obj)
    if delete and not rest:
        obj.pop(head, None)
    else:
        obj[head] = _set_path(obj.get(head, {}), tuple(rest), value, delete)
    return obj


@st.composite
def plan_spec(draw):
    """A plan spec: the plan (text, JSON text, a dict, or a valid plan's to_json() with leaves
    replaced or deleted), then placed / all_on / with_chunk_len calls."""
    known = socllm.Plan.known()
    name = draw(st.sampled_from(known + ["custom"]) | st.sampled_from(known) | st.text(max_size=5))
    op = draw(st.sampled_from(list(socllm.Plan.op_classes())))
    kind = draw(st.sampled_from(["text", "json-text", "dict", "mutated", "mutated", "mutated"]))
    if kind == "text":  # "name:key=value,..."
        keys = st.sampled_from([*OPTION_KEYS, op, "", "="]) | st.text(max_size=4)
        values = st.sampled_from(
            EXTREME_STRINGS + PROCESSORS + FORMATS + [str(x) for x in EXTREME_INTS + EXTREME_FLOATS]
        ) | st.text(max_size=6)
        pairs = draw(st.lists(st.tuples(keys, values), max_size=3))
        plan = name + (":" + ",".join(f"{k}={v}" for k, v in pairs) if pairs else "")
    elif kind == "json-text":
        options = draw(st.dictionaries(st.sampled_from(OPTION_KEYS), json_value(), max_size=2))
        plan = json.dumps({"name": name, **options}, allow_nan=True)
        if draw(st.booleans()):  # broken JSON
            plan = plan[: draw(st.integers(1, len(plan)))] + draw(st.text(max_size=3))
    elif kind == "dict":
        plan = draw(st.dictionaries(st.sampled_from([*OPTION_KEYS, op]), json_value(), max_size=3))
        plan["name"] = draw(st.sampled_from([name, name, name, 1, None]))
    else:  # a valid plan's JSON form, one or two leaves replaced or deleted
        plan = socllm.Plan(draw(st.sampled_from(known))).to_json()
        for _ in range(draw(st.integers(1, 2))):
            path = draw(st.sampled_from(_leaf_paths(plan)))
            plan = _set_path(plan, path, draw(json_value()), delete=draw(st.integers(0, 4)) == 0)
    spec: dict = {"plan": plan}
    placed = draw(
        st.lists(
            st.tuples(
                st.sampled_from(list(socllm.Plan.op_classes()) + ["", "lm-head"]),
                st.sampled_from(PROCESSORS),
                st.sampled_from(FORMATS + [None]),
            ),
            max_size=2,
        )
    )
    if placed:
        spec["placed"] = placed
    if draw(st.booleans()):
        spec["all_on"] = draw(st.sampled_from(PROCESSORS))
    if draw(st.booleans()):
        spec["chunk_len"] = draw(st.sampled_from([0, 1, 2, 3, 7, 64, 10**6, 2**31, 2**62, -1]))
    return spec


# ---------------------------------------------------------------------------------------------
# Campaigns

FUZZ_SETTINGS = dict(
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


def short(target: str):
    return settings(max_examples=SHORT[target], derandomize=True, **FUZZ_SETTINGS)


def long(target: str):
    def wrap(fn):
        return pytest.mark.slow(
            settings(max_examples=LONG[target], derandomize=False, **FUZZ_SETTINGS)(fn)
        )

    return wrap


def _gguf_campaign(seeds, campaign, data, target: str, seed_names: list[str]):
    name = data.draw(st.sampled_from(seed_names), label="seed")
    keys = LLAMA_KEYS + ["test.u32", "test.arr_str", "s"]
    mutations = data.draw(st.lists(gguf_mutation(keys), min_size=1, max_size=4), label="mutations")
    recipe = {"seed": name, "mutations": mutations}
    campaign(target).check(materialize(seeds, recipe, None), recipe)


@short("gguf")
@given(data=st.data())
def test_fuzz_gguf(seeds, campaign, data):
    _gguf_campaign(seeds, campaign, data, "gguf", ["written", "handmade", "llama"])


@long("gguf")
@given(data=st.data())
def test_fuzz_gguf_long(seeds, campaign, data):
    _gguf_campaign(seeds, campaign, data, "gguf", ["written", "handmade", "llama"])


@short("convert")
@given(data=st.data())
def test_fuzz_convert(seeds, campaign, data):
    _gguf_campaign(seeds, campaign, data, "convert", ["llama"])


@long("convert")
@given(data=st.data())
def test_fuzz_convert_long(seeds, campaign, data):
    _gguf_campaign(seeds, campaign, data, "convert", ["llama"])


def _h5_campaign(seeds, campaign, data, target: str, tmp: Path):
    attrs, datasets = seeds.h5_layout[target]
    edits = data.draw(st.lists(h5_edit(attrs, datasets), min_size=1, max_size=3), label="edits")
    # Mostly sealed: the validators behind the attribute checksum are what the edits probe.
    seal = data.draw(st.sampled_from([True, True, True, False]), label="seal")
    recipe = {"seed": target, "edits": edits, "seal": seal}
    campaign(target).check(materialize(seeds, recipe, tmp), recipe)


@short("model")
@given(data=st.data())
def test_fuzz_model(seeds, campaign, data, tmp_path):
    _h5_campaign(seeds, campaign, data, "model", tmp_path)


@long("model")
@given(data=st.data())
def test_fuzz_model_long(seeds, campaign, data, tmp_path):
    _h5_campaign(seeds, campaign, data, "model", tmp_path)


@short("calibration")
@given(data=st.data())
def test_fuzz_calibration(seeds, campaign, data, tmp_path):
    _h5_campaign(seeds, campaign, data, "calibration", tmp_path)


@long("calibration")
@given(data=st.data())
def test_fuzz_calibration_long(seeds, campaign, data, tmp_path):
    _h5_campaign(seeds, campaign, data, "calibration", tmp_path)


@short("plan")
@given(spec=plan_spec())
def test_fuzz_plan(campaign, spec):
    campaign("plan").check(json.dumps(spec, allow_nan=True).encode())


@long("plan")
@given(spec=plan_spec())
def test_fuzz_plan_long(campaign, spec):
    campaign("plan").check(json.dumps(spec, allow_nan=True).encode())


# ---------------------------------------------------------------------------------------------
# The saved corpus: every input found misbehaving, replayed


def _corpus_cases() -> list:
    """fuzz_corpus/<target>/<name>: an input file, or <name>.recipe.json (see materialize)."""
    cases = []
    for target in TARGETS:
        for f in sorted((CORPUS / target).glob("*")) if (CORPUS / target).is_dir() else []:
            key = f"{target}/{f.name}"
            reason = CORPUS_XFAIL.get(key)
            marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
            cases.append(pytest.param(target, f, id=key, marks=marks))
    return cases


@pytest.mark.parametrize("target,path", _corpus_cases())
def test_corpus(seeds, worker, tmp_path, target: str, path: Path):
    recipe_or_file: dict = {}
    if path.name.endswith(".recipe.json"):
        recipe = recipe_or_file = json.loads(path.read_text())
        path = tmp_path / f"input{SUFFIX[target]}"
        path.write_bytes(materialize(seeds, recipe, tmp_path))
    r = worker.run(target, path)
    if "expect" in recipe_or_file:  # a silent wrong result once: "ok" is the bug
        assert r["outcome"] == recipe_or_file["expect"], r
    assert r["outcome"] in ("ok", "error"), (
        f"{r['outcome']}: {r.get('type', '')} {r.get('where', '')} {r.get('message', '')}\n"
        f"{r.get('traceback') or r.get('stderr', '')}"
    )


@pytest.mark.skipif(not os.environ.get("SOCLLM_EXPECT_CORE"), reason="not a sanitized run")
def test_sanitized_module_is_loaded():
    """Under scripts/test_sanitized.sh: this process imports the module it built."""
    expect = Path(os.environ["SOCLLM_EXPECT_CORE"]).resolve()
    assert Path(socllm.build_info()["module"]).resolve() == expect


def test_corpus_xfail_entries_exist():
    """Every CORPUS_XFAIL entry names a saved input (a renamed file would silently pass)."""
    missing = [k for k in CORPUS_XFAIL if not (CORPUS / k).is_file()]
    assert not missing
