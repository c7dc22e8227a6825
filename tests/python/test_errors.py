"""Bad input through the public API: every error is a socllm exception of the documented class
whose message names the offending value, nothing crashes, and the model keeps working.

Checks that need no computation (ids, plans, sizes, context) run before any compute in the
engine, so these tests stay fast; the few real forward passes use one thread.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import socllm
from tiny_model import TINY, tiny_weights, write_tiny

V = 49152  # SmolLM2 vocabulary
CTX = 8192  # SmolLM2 context length
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def m():
    threads, level = socllm.num_threads(), socllm.log_level()
    socllm.set_log_level("warn")
    model = socllm.load("smollm2-135m", progress=False, threads=1)  # 2 shared cores: 1 thread
    yield model
    socllm.set_num_threads(threads)
    socllm.set_log_level(level)


@pytest.fixture(scope="module")
def baseline(m):
    """Logits of a short prompt before any error, compared at the end of the module."""
    ids = m.tokenize(PROMPT)
    return ids, m.logits(ids)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private conversion cache, so failed conversions of bad files touch nothing shared."""
    d = tmp_path / "cache"
    monkeypatch.setenv("SOCLLM_CACHE", str(d))
    return d


def assert_no_leftovers(directory: Path) -> None:
    assert not directory.exists() or list(directory.iterdir()) == []


def test_config_and_baseline(m, baseline):
    assert m.config["context_length"] == CTX and m.config["vocab_size"] == V
    with pytest.raises(TypeError):
        m.config["vocab_size"] = 1  # read-only mapping
    ids, lg = baseline
    assert lg.shape == (len(ids), V) and lg.dtype == np.float32 and np.isfinite(lg).all()


# ---------------------------------------------------------------------------------------------
# Exception classes


def test_exception_hierarchy():
    E = socllm
    assert issubclass(E.ShapeError, E.InvalidArgumentError)
    assert issubclass(E.ContextOverflowError, E.InvalidArgumentError)
    assert issubclass(E.InvalidArgumentError, ValueError)
    assert issubclass(E.FormatError, ValueError)
    assert not issubclass(E.FormatError, E.InvalidArgumentError)
    assert issubclass(E.MissingFileError, FileNotFoundError)
    assert issubclass(E.UnsupportedError, NotImplementedError)
    for cls in (
        E.InvalidArgumentError,
        E.ShapeError,
        E.ContextOverflowError,
        E.MissingFileError,
        E.FormatError,
        E.UnsupportedError,
    ):
        assert issubclass(cls, E.SocllmError), cls
        assert cls.__module__ == "socllm"
    assert issubclass(E.SocllmError, Exception)
    # One set of classes: the Python names are the C++ core's.
    from socllm import errors

    for name in (
        "SocllmError",
        "InvalidArgumentError",
        "ShapeError",
        "ContextOverflowError",
        "MissingFileError",
        "FormatError",
        "UnsupportedError",
    ):
        assert getattr(errors, name) is getattr(socllm, name)


def test_errors_raised_in_cpp_are_the_python_classes(tmp_path):
    with pytest.raises(socllm.InvalidArgumentError, match="'x'") as e:
        socllm.Plan("x")
    assert isinstance(e.value, ValueError) and isinstance(e.value, socllm.SocllmError)
    with pytest.raises(socllm.MissingFileError):
        socllm.io.GgufFile(str(tmp_path / "none.gguf"))
    with pytest.raises(socllm.ShapeError):
        socllm.io.dequantize("Q8_0", b"\0" * 34, 31)
    with pytest.raises(socllm.UnsupportedError):
        socllm.io.dequantize("IQ4_NL", b"\0" * 18, 32)
    with pytest.raises(socllm.MissingFileError):
        socllm.io.Model.load(str(tmp_path / "none.h5"))


# ---------------------------------------------------------------------------------------------
# socllm.load on bad sources


def smollm2_gguf() -> Path:
    return socllm.BUILTIN_MODELS["smollm2-135m"].path()


def test_load_missing_path(tmp_path, cache_dir):
    p = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(socllm.MissingFileError, match="model.gguf") as e:
        socllm.load(p, progress=False)
    assert isinstance(e.value, FileNotFoundError)
    assert_no_leftovers(cache_dir)


def test_load_unknown_builtin_name(cache_dir):
    with pytest.raises(socllm.MissingFileError, match=r"'smollm2-9000b'.*smollm2-135m"):
        socllm.load("smollm2-9000b", progress=False)


def test_load_text_file_named_gguf(tmp_path, cache_dir):
    p = tmp_path / "fake.gguf"
    p.write_text("this is not a GGUF file\n")
    with pytest.raises(socllm.FormatError, match="fake.gguf.*magic"):
        socllm.load(p, progress=False)
    assert_no_leftovers(cache_dir)


@pytest.mark.parametrize("n_bytes", [1000, 5_000_000])  # inside metadata / inside tensor data
def test_load_truncated_gguf(tmp_path, cache_dir, n_bytes):
    p = tmp_path / "cut.gguf"
    with open(smollm2_gguf(), "rb") as f:
        p.write_bytes(f.read(n_bytes))
    with pytest.raises(socllm.FormatError, match="truncated") as e:
        socllm.load(p, progress=False)
    assert str(p) in str(e.value)
    assert_no_leftovers(cache_dir)


def test_load_truncated_h5(m, tmp_path):
    for n_bytes in (0, 100, 1 << 20):  # empty, inside the superblock, inside the file
        p = tmp_path / f"cut{n_bytes}.h5"
        with open(m.path, "rb") as f:
            p.write_bytes(f.read(n_bytes))
        with pytest.raises(socllm.FormatError) as e:
            socllm.load(p, progress=False)
        assert str(p) in str(e.value), n_bytes


def test_load_hdf5_that_is_not_a_model(tmp_path):
    p = tmp_path / "other.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.arange(3)
        f.attrs["format"] = "something-else"
    with pytest.raises(socllm.FormatError, match="not a socllm model file") as e:
        socllm.load(p, progress=False)
    assert str(p) in str(e.value)


def test_tiny_model_is_valid(tmp_path):
    """The handmade file loads and runs, so the failures below are due to the one defect each."""
    tiny = socllm.load(write_tiny(tmp_path / "tiny.h5"), progress=False)
    assert tiny.config["vocab_size"] == 128
    ids = tiny.tokenize("hello")
    lg = tiny.logits(ids)
    assert lg.shape == (5, 128) and np.isfinite(lg).all()
    assert len(tiny.generate_ids(ids, 3, stop_at_eos=False)) == 3


@pytest.mark.parametrize(
    "tensor,index,value",
    [
        ("final_norm", 5, np.nan),
        ("layers/1/w_up", 77, np.inf),
        ("embed_tokens", 0, -np.inf),
    ],
)
def test_load_nonfinite_weights(tmp_path, tensor, index, value):
    ws = tiny_weights(TINY, np.random.default_rng(0))
    ws[tensor].reshape(-1)[index] = value
    p = write_tiny(tmp_path / "poisoned.h5", weights=ws)
    with pytest.raises(
        socllm.FormatError, match=rf"'{tensor}'.*NaN/Inf at flat index {index}\b"
    ) as e:
        socllm.load(p, progress=False)
    assert str(p) in str(e.value)


def test_load_poisoned_copy_of_real_weights(m, tmp_path):
    """The real model's own final_norm, poisoned (only that tensor is copied: the tiny config
    shares no shapes with SmolLM2, so the real norm goes into a d_model=576 variant)."""
    with h5py.File(m.path, "r") as f:
        norm = f["weights/final_norm"][()]
    assert norm.shape == (576,) and np.isfinite(norm).all()
    c = TINY | {"d_model": 576, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64, "d_ff": 8}
    ws = tiny_weights(c, np.random.default_rng(1))
    norm[123] = np.nan
    ws["final_norm"] = norm
    with pytest.raises(socllm.FormatError, match=r"'final_norm'.*flat index 123\b"):
        socllm.load(write_tiny(tmp_path / "real-norm.h5", config=c, weights=ws), progress=False)


def test_load_structural_defects(tmp_path):
    ws = tiny_weights(TINY, np.random.default_rng(0))
    bad_shape = dict(ws, lm_head=ws["lm_head"][:, :8])
    with pytest.raises(socllm.FormatError, match=r"lm_head'.*\[128, 8\].*expected \[128, 16\]"):
        socllm.load(write_tiny(tmp_path / "shape.h5", weights=bad_shape), progress=False)
    missing = {k: v for k, v in ws.items() if k != "layers/1/wv"}
    with pytest.raises(socllm.FormatError, match="layers/1/wv"):
        socllm.load(write_tiny(tmp_path / "missing.h5", weights=missing), progress=False)
    with pytest.raises(socllm.FormatError, match="tokenizer"):
        socllm.load(write_tiny(tmp_path / "notok.h5", tokenizer=False), progress=False)
    newer = socllm.io.Model.format_version + 1  # a version this socllm predates
    with pytest.raises(socllm.UnsupportedError, match=f"format version {newer}"):
        socllm.load(write_tiny(tmp_path / "newer.h5", version=newer), progress=False)
    # From version 2 on, a weight without its checksum is refused (a stripped filter).
    with h5py.File(write_tiny(tmp_path / "nosum.h5"), "a") as f:
        data = f["weights/final_norm"][()]
        del f["weights/final_norm"]
        f["weights/final_norm"] = data
    with pytest.raises(socllm.FormatError, match="final_norm.*no Fletcher-32 checksum"):
        socllm.load(tmp_path / "nosum.h5", progress=False)
    # Version 1 files (no checksums) still load.
    assert socllm.load(write_tiny(tmp_path / "v1.h5", version=1), progress=False)
    with pytest.raises(socllm.UnsupportedError, match="'mamba'"):
        socllm.load(write_tiny(tmp_path / "arch.h5", config={"arch": "mamba"}), progress=False)
    with pytest.raises(socllm.FormatError, match="'/config@vocab_size'.*not an integer"):
        socllm.load(
            write_tiny(tmp_path / "cfgtype.h5", config={"vocab_size": "many"}), progress=False
        )
    # An inconsistent config is reported with the offending value (as InvalidArgumentError).
    with pytest.raises((socllm.FormatError, socllm.InvalidArgumentError), match="n_kv_heads 3"):
        socllm.load(write_tiny(tmp_path / "heads.h5", config={"n_kv_heads": 3}), progress=False)
    with pytest.raises((socllm.FormatError, socllm.InvalidArgumentError), match="head_dim.*5"):
        socllm.load(write_tiny(tmp_path / "odd.h5", config={"head_dim": 5}), progress=False)


@pytest.mark.parametrize("defect", ["not-json", "group", "wrong-dtype"])
def test_load_bad_tokenizer(tmp_path, defect):
    p = write_tiny(tmp_path / f"tok-{defect}.h5")
    with h5py.File(p, "a") as f:
        del f["tokenizer/json"]
        if defect == "not-json":
            f["tokenizer"].create_dataset("json", data="{not json", dtype=h5py.string_dtype())
        elif defect == "group":
            f["tokenizer"].create_group("json")
        else:
            f["tokenizer"].create_dataset("json", data=np.arange(3))
    with pytest.raises(socllm.FormatError, match="tokenizer") as e:
        socllm.load(p, progress=False)
    assert str(p) in str(e.value)


CROSS_CACHE = """
import sys, socllm
socllm.set_log_level("warn")
a, b = (socllm.load(p, progress=False) for p in sys.argv[1:3])
cache = a.new_cache(4)
try:
    b.step(cache, [1])
except socllm.InvalidArgumentError as e:
    print("REJECTED", e)
    sys.exit(0)
print("ACCEPTED")
sys.exit(3)
"""


def test_cache_of_another_model(tmp_path):
    """Runs in a subprocess, so a regression to the former segfault fails the test, not the run."""
    big_cfg = TINY | {"n_layers": 4, "n_kv_heads": 4}
    small = write_tiny(tmp_path / "small.h5")
    big = write_tiny(
        tmp_path / "big.h5", config=big_cfg, weights=tiny_weights(big_cfg, np.random.default_rng(0))
    )
    r = subprocess.run(
        [sys.executable, "-c", CROSS_CACHE, str(small), str(big)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0 and "REJECTED" in r.stdout, (r.returncode, r.stdout, r.stderr[-500:])


# ---------------------------------------------------------------------------------------------
# Token ids

BAD_IDS = [V, -1, 2**40]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_out_of_vocabulary_ids(m, bad):
    pat = rf"token id {bad}\b"
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.logits([1, 2, bad])
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.logits(np.array([1, bad], dtype=np.int64))
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.logits_batch([[1, 2], [bad]])
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.generate_ids([1, bad], 2)
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.generate_ids([1, bad], 2, temperature=0.7, seed=0)
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.perplexity_eval(ids=[1, 2, bad], context=8)
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.detokenize([5, bad])
    c = m.new_cache(4)
    with pytest.raises(socllm.InvalidArgumentError, match=pat):
        m.step(c, [bad])
    assert c.length == 0


@pytest.mark.parametrize(
    "ids,name",
    [
        ([1.0, 2.0], "float"),
        ([1, 2.5], "float"),
        (["12"], "str"),
        (np.array([1.0, 2.0]), "float64"),
        ([None], "NoneType"),
    ],
    ids=["floats", "one-float", "str-id", "float-array", "none"],
)
def test_non_integer_ids(m, ids, name):
    """Non-integer ids are an InvalidArgumentError everywhere (never truncated or parsed)."""
    for call in (
        lambda: m.logits(ids),
        lambda: m.logits_batch([ids]),
        lambda: m.generate_ids(ids, 1),
        lambda: m.step(m.new_cache(4), ids),
        lambda: m.perplexity_eval(ids=ids, context=8),
        lambda: m.detokenize(ids),
    ):
        with pytest.raises(socllm.InvalidArgumentError, match=rf"integers, got {name}"):
            call()


def test_string_where_ids_expected(m):
    for call in (
        lambda: m.logits("123"),
        lambda: m.step(m.new_cache(4), "12"),
        lambda: m.generate_ids(b"12", 1),
        lambda: m.perplexity_eval(ids="123", context=8),
    ):
        with pytest.raises(socllm.InvalidArgumentError, match="sequence of token ids, got"):
            call()
    with pytest.raises(socllm.InvalidArgumentError, match="got int"):
        m.tokenize(123)
    # not a sequence at all, or an array of the wrong rank
    with pytest.raises(socllm.InvalidArgumentError, match="sequence of token ids, got int 5"):
        m.logits(5)
    for bad, shape in ((np.array(5), r"0-D array of shape \(\)"), (np.ones((1, 2), int), "2-D")):
        with pytest.raises(socllm.InvalidArgumentError, match=shape):
            m.logits(bad)


def test_empty_input(m):
    with pytest.raises(socllm.InvalidArgumentError, match="empty token sequence"):
        m.logits([])
    with pytest.raises(socllm.InvalidArgumentError, match="no sequences"):
        m.logits_batch([])
    with pytest.raises(socllm.InvalidArgumentError, match="empty token sequence"):
        m.logits_batch([[1, 2], []])
    with pytest.raises(socllm.InvalidArgumentError, match="2 counts for 1 sequences"):
        m.logits_batch([[1, 2]], last_rows=[1, 1])
    with pytest.raises(socllm.InvalidArgumentError, match=r"last_rows\[1\] = 3 is outside 1..2"):
        m.logits_batch([[1, 2, 3], [1, 2]], last_rows=[1, 3])
    with pytest.raises(socllm.InvalidArgumentError, match=r"last_rows\[0\] = 0"):
        m.logits_batch([[1, 2]], last_rows=[0])
    with pytest.raises(socllm.InvalidArgumentError, match="prompt is empty"):
        m.generate("", 4)
    with pytest.raises(socllm.InvalidArgumentError, match="prompt is empty"):
        m.generate_ids([], 4, temperature=1.0)
    c = m.new_cache(4)
    with pytest.raises(socllm.InvalidArgumentError, match="empty token sequence"):
        m.step(c, [])
    assert m.detokenize([]) == ""


# ---------------------------------------------------------------------------------------------
# Context length and caches


def test_prompt_longer_than_context(m):
    with pytest.raises(socllm.ContextOverflowError, match=rf"{CTX + 1} tokens.*{CTX}"):
        m.logits([1] * (CTX + 1))
    with pytest.raises(socllm.ContextOverflowError, match=rf"{CTX + 1} tokens.*{CTX}"):
        m.logits_batch([[1, 2], [1] * (CTX + 1)])
    for temperature in (0.0, 0.8):
        with pytest.raises(
            socllm.ContextOverflowError, match=rf"8000 tokens \+ 193 new tokens.*{CTX}"
        ):
            m.generate_ids([1] * 8000, 193, temperature=temperature)
    with pytest.raises(socllm.ContextOverflowError, match=rf"{CTX} new tokens"):
        m.generate("Hi", CTX)


def test_cache_overflow_leaves_cache_usable(m):
    c = m.new_cache(4)
    assert (c.length, c.capacity) == (0, 4)
    m.step(c, [1, 2, 3])
    with pytest.raises(socllm.ContextOverflowError, match="5 tokens exceeds the cache capacity 4"):
        m.step(c, [4, 5])
    assert c.length == 3
    last = m.step(c, [4])
    assert c.length == 4
    # Bit-identical to a cache that never saw the failed step.
    clean = m.new_cache(4)
    m.step(clean, [1, 2, 3])
    np.testing.assert_array_equal(last, m.step(clean, [4]))
    # and the same prediction as a full forward pass (fp32 summation order differs slightly)
    full = m.logits([1, 2, 3, 4])[-1:]
    np.testing.assert_allclose(last, full, rtol=0, atol=2e-3 * np.abs(full).max())
    assert last.argmax() == full.argmax()
    with pytest.raises(socllm.ContextOverflowError, match="capacity 4"):
        m.step(c, [5])
    assert c.length == 4


def test_new_cache_capacity(m):
    with pytest.raises(socllm.ContextOverflowError, match=rf"capacity {CTX + 1} exceeds.*{CTX}"):
        m.new_cache(CTX + 1)
    with pytest.raises(socllm.InvalidArgumentError, match="got -1"):
        m.new_cache(-1)


# ---------------------------------------------------------------------------------------------
# Plans


def test_unknown_plan(m):
    known = socllm.Plan.known()
    assert "fp32" in known
    ids = [1, 2, 3]
    calls = {
        "logits": lambda p: m.logits(ids, plan=p),
        "logits_batch": lambda p: m.logits_batch([ids], plan=p),
        "step": lambda p: m.step(m.new_cache(4), ids, plan=p),
        "generate": lambda p: m.generate("Hi", 2, plan=p),
        "generate-sampled": lambda p: m.generate("Hi", 2, plan=p, temperature=0.5),
        "perplexity": lambda p: m.perplexity("Hello there, world", plan=p, context=8),
        "Plan": lambda p: socllm.Plan(p),
    }
    for where, call in calls.items():
        for plan in ("int3", {"name": "int3"}):
            with pytest.raises(socllm.InvalidArgumentError, match="'int3'") as e:
                call(plan)
            assert all(k in str(e.value) for k in known), (where, str(e.value))
        with pytest.raises(socllm.InvalidArgumentError, match="plan 'fp32' has no option 'bits'"):
            call({"name": "fp32", "bits": 3})
        with pytest.raises(socllm.InvalidArgumentError, match="got int"):
            call(3)
        with pytest.raises(socllm.InvalidArgumentError, match="got NoneType"):
            call(None)
        with pytest.raises(socllm.InvalidArgumentError, match="string 'name'"):
            call({"bits": 3})
    with pytest.raises(socllm.InvalidArgumentError, match="'int3'"):
        socllm.Plan.describe("int3")


# ---------------------------------------------------------------------------------------------
# Perplexity, detokenize, generate arguments

TEXT = "The quick brown fox jumps over the lazy dog. " * 3


@pytest.mark.parametrize(
    "kw,pattern",
    [
        ({"context": 1}, r"context 1 must be in \[2, 8192\]"),
        ({"context": 0}, r"context 0 must be"),
        ({"context": 8193}, r"context 8193 must be in \[2, 8192\]"),
        ({"context": 8, "stride": 0}, r"stride 0 must be in \[1, context=8\]"),
        ({"context": 8, "stride": 9}, r"stride 9 must be in \[1, context=8\]"),
        ({"context": 8, "stride": -2}, r"stride -2"),
        ({"context": 8, "limit_tokens": 1}, r"limit_tokens must be >= 2, got 1"),
        ({"context": 8, "limit_tokens": 0}, r"limit_tokens must be >= 2, got 0"),
        # not truncated, parsed or counted
        ({"context": 3.5}, r"context must be an integer, got float 3.5"),
        ({"context": 8, "stride": "4"}, r"stride must be an integer, got str '4'"),
        ({"context": 8, "limit_tokens": 2.5}, r"limit_tokens must be an integer, got float"),
        ({"context": 8, "batch_size": True}, r"batch_size must be an integer, got True"),
    ],
)
def test_perplexity_arguments(m, kw, pattern):
    with pytest.raises(socllm.InvalidArgumentError, match=pattern):
        m.perplexity(TEXT, **kw)


def test_perplexity_too_little_text(m):
    assert len(m.tokenize("Hello")) == 1
    with pytest.raises(socllm.InvalidArgumentError, match="at least 2 tokens, got 1"):
        m.perplexity("Hello", context=8)
    with pytest.raises(socllm.InvalidArgumentError, match="at least 2 tokens, got 0"):
        m.perplexity("", context=8)
    with pytest.raises(socllm.InvalidArgumentError, match="exactly one of text or ids"):
        m.perplexity_eval(TEXT, ids=[1, 2])
    with pytest.raises(socllm.InvalidArgumentError, match="exactly one of text or ids"):
        m.perplexity_eval()


@pytest.mark.parametrize(
    "kw,pattern",
    [
        ({"max_new_tokens": -1}, r"max_new_tokens must be >= 0, got -1"),
        ({"max_new_tokens": -1, "temperature": 0.5}, r"max_new_tokens must be >= 0, got -1"),
        ({"temperature": -1.0}, r"temperature must be finite and >= 0, got -1"),
        ({"temperature": math.nan}, r"got nan"),
        ({"temperature": math.inf}, r"got inf"),
        ({"top_k": 0, "temperature": 0.5}, r"top_k must be >= 1, got 0"),
        ({"top_k": -3}, r"top_k must be >= 1, got -3"),
        # not truncated, parsed or counted
        ({"top_k": 1.5, "temperature": 0.5}, r"top_k must be an integer, got float 1.5"),
        ({"seed": "abc", "temperature": 0.5}, r"seed must be an integer, got str 'abc'"),
        ({"temperature": "0.5"}, r"temperature must be a number, got str '0.5'"),
        ({"max_new_tokens": 2.0}, r"max_new_tokens must be an integer, got float 2.0"),
    ],
)
def test_generate_arguments(m, kw, pattern):
    kw = {"max_new_tokens": 2} | kw
    with pytest.raises(socllm.InvalidArgumentError, match=pattern):
        m.generate("Hi", **kw)
    with pytest.raises(socllm.InvalidArgumentError, match=pattern):
        m.generate_ids([1, 2], **kw)


def test_generate_zero_tokens(m):
    assert m.generate("Hi", 0) == "" and m.generate_ids([1, 2], 0, temperature=0.5) == []


# ---------------------------------------------------------------------------------------------
# The command line


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "socllm.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_eval_unknown_plan(tmp_path):
    # --limit-tokens/--context bound the work in case the plan check ever stopped failing.
    r = run_cli(
        "eval",
        "--plan",
        "int3",
        "--quiet",
        "--threads",
        "1",
        "--limit-tokens",
        "64",
        "--context",
        "32",
        cwd=tmp_path,
    )
    assert r.returncode != 0, r.stdout
    assert "int3" in r.stderr and "fp32" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_cli_convert_missing_source(tmp_path):
    r = run_cli("convert", "/nonexistent", "-o", "out.h5", "--quiet", cwd=tmp_path)
    assert r.returncode != 0
    assert "/nonexistent" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Issue 37: validate before allocating or blocking; errors that name the field


def _device_file(tmp_path, edit=None, text=None) -> Path:
    import json

    from socllm.devices import _DIR

    path = tmp_path / "dev.json"
    if text is not None:
        path.write_bytes(text)
        return path
    profile = json.loads((_DIR / "snapdragon-8gen3.json").read_text())
    if edit:
        edit(profile)
    path.write_text(json.dumps(profile))
    return path


def test_device_file_that_is_a_fifo_or_not_utf8(tmp_path):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # read, it blocked forever
    with pytest.raises(socllm.InvalidArgumentError, match=f"'{fifo}' is not a regular file"):
        socllm.simulate("qwen2-0.5b", device=str(fifo), prompt_len=64)
    bad = _device_file(tmp_path, text=b'{"name": "x\xff"}')
    with pytest.raises(socllm.FormatError, match=f"'{bad}' is not UTF-8.*0xff at offset 11"):
        socllm.simulate("qwen2-0.5b", device=str(bad), prompt_len=64)


@pytest.mark.parametrize(
    "keys,plan",
    [
        (("cost_model", "memory", "dram_gbps"), "fp32"),
        (("cost_model", "npu", "int8_weight_gbps"), "w8a8"),
        (("cost_model", "cpu", "fp32_weight_gbps"), "fp32"),
    ],
)
def test_zero_rate_in_device_file_names_the_field(tmp_path, keys, plan):
    """A zero bandwidth used to surface as "task 0 has duration inf µs"."""

    def zero(profile):
        o = profile
        for k in keys[:-1]:
            o = o[k]
        o[keys[-1]]["value"] = 0

    path = _device_file(tmp_path, zero)
    pointer = "/" + "/".join(keys)
    with pytest.raises(
        socllm.InvalidArgumentError, match=f"\\({path}\\): {pointer} = 0.*a rate.*must be > 0"
    ):
        socllm.simulate("qwen2-0.5b", device=str(path), plan=plan, prompt_len=64)


def test_sizes_are_checked_before_allocating():
    """A config of 10^6 layers allocated until std::bad_alloc; a session of 10^5 decoding
    steps likewise (within the context). Both are refused at once, naming the sizes."""
    import time

    cfg = socllm.configs.load_config("qwen2-0.5b") | {"n_layers": 10**6}
    t = time.perf_counter()
    with pytest.raises(socllm.InvalidArgumentError, match="1000000 layers x 1 chunks.*limit"):
        socllm.simulate(cfg, prompt_len=64)
    with pytest.raises(socllm.InvalidArgumentError, match="24 layers x 100001 chunks"):
        socllm.simulate("qwen2-0.5b", prompt_len=64, phase="session", decode_tokens=10**5)
    assert time.perf_counter() - t < 10  # refused, not attempted


@pytest.mark.parametrize("name", ["prompt_len", "decode_tokens", "chunk"])
def test_int64_overflow_is_a_typed_error(name):
    """`--prompt-len 2**63` used to print pybind's TypeError with the whole config."""
    kw = {"prompt_len": 64, name: 2**63}
    if name == "decode_tokens":
        kw["phase"] = "session"
    with pytest.raises(socllm.InvalidArgumentError, match=f"{name} must be <= {2**63 - 1}"):
        socllm.simulate("qwen2-0.5b", **kw)


def test_cli_int64_overflow(tmp_path):
    r = run_cli("simulate", "--config", "qwen2-0.5b", "--prompt-len", str(2**63), cwd=tmp_path)
    assert r.returncode == 2
    assert f"--prompt-len: must be >= 1 and <= {2**63 - 1}" in r.stderr, r.stderr
    assert "Invoked with" not in r.stderr and "Traceback" not in r.stderr


def test_all_zero_calibration_keeps_the_previous_one(tmp_path):
    """A file whose act_absmax is all zeros loaded "successfully" and silently replaced the
    loaded calibration (the next static plan said none was loaded)."""
    import shutil

    from socllm.calibration import CalibrationData, save_calibration
    from tiny_model import seal

    model = socllm.load(write_tiny(tmp_path / "m.h5"), progress=False)
    cal = model.new_calibration()
    model.observe_activations([[1, 5, 9, 3, 7]], cal)
    good = save_calibration(tmp_path / "good.h5", CalibrationData(cal, {}), model)
    model.load_calibration(good)
    before = model.logits([1, 2, 3], "w8a8")
    zeros = tmp_path / "zeros.h5"
    shutil.copy(good, zeros)
    with h5py.File(zeros, "a") as f:
        for site in f["act_absmax"]:
            f["act_absmax"][site][...] = 0
    seal(zeros)  # consistent checksums: the check is about the values
    with pytest.raises(socllm.FormatError, match=f"'{zeros}': act_absmax holds only zeros"):
        model.load_calibration(zeros)
    assert model.calibration_path == good
    np.testing.assert_array_equal(model.logits([1, 2, 3], "w8a8"), before)


# ---------------------------------------------------------------------------------------------


def test_model_still_works_after_all_errors(m, baseline):
    """Run last: none of the errors above changed the model's state."""
    ids, before = baseline
    after = m.logits(ids)
    np.testing.assert_array_equal(after, before)
