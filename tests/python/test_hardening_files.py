"""Files in and out (issue 12): an output never replaces an input of its command, FIFOs,
devices and symlinks are written where they point, stale temp files are swept, outputs get the
umask's mode, the conversion cache is keyed on content, model files carry checksums, and bad
configs, arguments and text are socllm errors (one line on the command line).

Unit tier: tiny synthetic GGUF files written with gguf-py, monkeypatched commands (no real
work runs: the checks must come before it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import socllm
from socllm import cli, registry
from socllm.calibration import CalibrationData, load_calibration, save_calibration
from socllm.errors import FormatError, InvalidArgumentError
from socllm.io import convert as convert_mod
from socllm.io import files as io_utils
from socllm.io import model_format
from socllm.io.convert import convert
from socllm.io.files import atomic_path, atomic_write_text, emit_json
from socllm.model import FileTokenizer
from socllm.tokenizer import bytes_to_unicode
from tiny_model import seal, tiny_weights, write_tiny

gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX files")

# A tiny llama GGUF: byte-level vocabulary, 2 layers.
TOKENS = ["<|endoftext|>", "<s>", *bytes_to_unicode().values()]
D, FF, HEADS, KV_HEADS, HEAD_DIM, LAYERS, CTX = 16, 32, 4, 2, 4, 2, 64
BOS, EOS = 1, 0


def _metadata() -> dict:
    return {
        "general.name": "tiny",
        "llama.block_count": LAYERS,
        "llama.context_length": CTX,
        "llama.embedding_length": D,
        "llama.feed_forward_length": FF,
        "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS,
        "llama.rope.dimension_count": HEAD_DIM,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.bos_token_id": BOS,
        "tokenizer.ggml.eos_token_id": EOS,
    }


def _weights(seed: int) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 values in Hugging Face orientation."""
    c = {"d_model": D, "vocab_size": len(TOKENS), "d_ff": FF, "n_layers": LAYERS}
    c |= {"n_heads": HEADS, "n_kv_heads": KV_HEADS, "head_dim": HEAD_DIM}
    ws = tiny_weights(c, np.random.default_rng(seed))
    return {convert_mod._source_name(name, convert_mod._GGUF): w for name, w in ws.items()}


def write_gguf(path: Path, *, seed: int = 0, tokens=TOKENS, **metadata) -> dict[str, np.ndarray]:
    """A tiny llama GGUF; ``metadata`` overrides keys of :func:`_metadata` (None drops one)."""
    weights = _weights(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (_metadata() | metadata).items():
        if value is None:
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif value < 0:
            w.add_int32(key, value)
        else:
            w.add_uint32(key, value)
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    for name, value in weights.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    p = tmp_path / "tiny.gguf"
    write_gguf(p)
    return p


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """A private conversion cache (also for the digests the output checks compute)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("SOCLLM_CACHE", str(d))
    return d


@pytest.fixture
def no_work(monkeypatch):
    """Every command's first piece of real work fails the test: checks must come before it."""

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the argument and output checks")

    import socllm.model
    import socllm.sim.timeline

    monkeypatch.setattr(socllm.model, "load", forbidden)
    monkeypatch.setattr(socllm.sim.timeline, "simulate", forbidden)
    monkeypatch.setattr(convert_mod, "_open_source", forbidden)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``socllm ARGV`` in this process: (exit status, stderr)."""
    try:
        rc = cli.main([*argv, "--quiet"])
    except SystemExit as e:  # argparse
        rc = e.code
    return rc, capsys.readouterr().err


def assert_one_line(err: str, *fragments: str) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and "error" in lines[-1], err
    for f in fragments:
        assert f in lines[-1], (f, err)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


# ---------------------------------------------------------------------------------------------
# Item 7: an output that is an input of the same command is refused, before any work


def test_convert_refuses_its_source_as_output(tiny_gguf, tmp_path):
    before = tiny_gguf.read_bytes()
    hard = tmp_path / "hard.gguf"
    os.link(tiny_gguf, hard)
    soft = tmp_path / "soft.gguf"
    soft.symlink_to(tiny_gguf)
    for out in (tiny_gguf, hard, soft, tmp_path / "." / "tiny.gguf"):
        with pytest.raises(InvalidArgumentError, match=re.escape(str(out))):
            convert(tiny_gguf, out, progress=False)
    assert tiny_gguf.read_bytes() == before and soft.is_symlink()


def test_convert_refuses_a_file_of_its_hf_source(tmp_path, no_work):
    src = tmp_path / "hf"
    src.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (src / name).write_text("{}")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        with pytest.raises(InvalidArgumentError, match=name):
            convert(src, src / name, progress=False)
    # a new file inside the directory is no input of the conversion
    io_utils.check_output_path(src / "model.h5", inputs=model_format.source_files(src))


def test_cli_convert_same_file(tiny_gguf, capsys, no_work):
    rc, err = run_cli(["convert", str(tiny_gguf), "-o", str(tiny_gguf)], capsys)
    assert rc == 2
    assert_one_line(err, str(tiny_gguf))


@pytest.fixture
def model_file(tmp_path) -> Path:
    """Stands for a model (the checks under test run before anything reads it)."""
    p = tmp_path / "m.h5"
    p.write_bytes(b"model")
    return p


def test_cli_calibrate_out_is_the_model(model_file, tmp_path, capsys, no_work):
    hard = tmp_path / "hard.h5"
    os.link(model_file, hard)
    for out in (model_file, hard):
        rc, err = run_cli(["calibrate", "--model", str(model_file), "--out", str(out)], capsys)
        assert rc == 2
        assert_one_line(err, str(out), "--out")
    assert model_file.read_bytes() == b"model"


def test_cli_calibrate_out_may_be_its_calib_input(model_file, tmp_path, capsys, monkeypatch):
    """Continuing from --calib FILE into --out FILE updates it (documented in --help)."""
    import socllm.calibration
    import socllm.model

    calib = tmp_path / "c.h5"
    calib.write_bytes(b"calib")
    saved = []

    class Cal:
        tokens, provenance = 1, {}

    class Model:
        path = model_file

    monkeypatch.setattr(socllm.model, "load", lambda *a, **k: Model())

    class Loaded:  # a continued file made on the plain model
        class stats:
            rotation = "none"

    monkeypatch.setattr(socllm.calibration, "load_calibration", lambda *a: Loaded())

    def run_steps(*a, after_step, **k):  # the CLI saves each finished step through after_step
        after_step(Cal())
        return Cal()

    monkeypatch.setattr(socllm.calibration, "run_steps", run_steps)
    monkeypatch.setattr(socllm.calibration, "save_calibration", lambda p, *a: saved.append(p))
    argv = ["calibrate", "--model", str(model_file), "--calib", str(calib), "--out", str(calib)]
    rc, err = run_cli([*argv, "--steps", "pruning-rate"], capsys)
    assert rc == 0, err
    assert saved == [str(calib)]
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--help"])
    assert "update" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--model", "{model}", "--json", "{model}"],
        ["eval", "--model", "{model}", "--calib", "{calib}", "--json", "{calib}"],
        ["simulate", "--model", "{model}", "--trace", "{model}"],
        ["simulate", "--model", "{model}", "--calib", "{calib}", "--json", "{calib}"],
        ["run", "--model", "{model}", "--json", "{model}"],
        ["calibrate", "--model", "{model}", "--out", "{tmp}/c.h5", "--json", "{model}"],
    ],
)
def test_cli_json_or_trace_is_an_input(argv, model_file, tmp_path, capsys, no_work):
    calib = tmp_path / "calib.h5"
    calib.write_bytes(b"calib")
    values = {"model": model_file, "calib": calib, "tmp": tmp_path}
    rc, err = run_cli([a.format(**values) for a in argv], capsys)
    assert rc == 2
    assert_one_line(err, "same file")
    assert model_file.read_bytes() == b"model" and calib.read_bytes() == b"calib"


def test_cli_two_outputs_are_one_file(tmp_path, capsys, no_work):
    out = str(tmp_path / "x.json")
    rc, err = run_cli(["simulate", "--config", "qwen2-0.5b", "--trace", out, "--json", out], capsys)
    assert rc == 2
    assert_one_line(err, "--trace", "--json", out)


# ---------------------------------------------------------------------------------------------
# Item 8: FIFOs, devices and symlinks; directories and unwritable parents refused early


def test_emit_json_into_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is waiting
    try:
        emit_json({"a": 1}, str(fifo))
        assert os.read(reader, 1 << 16) == b'{\n  "a": 1\n}\n'
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_emit_json_into_a_character_device(tmp_path):
    """A private null device (a regression would replace it, not the system's /dev/null)."""
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("cannot create a device node here")
    emit_json({"a": 1}, str(null))
    atomic_write_text(null, "x")
    assert stat.S_ISCHR(os.stat(null).st_mode)
    io_utils.check_output_path(null)


def test_write_to_this_process_stdout_through_a_link(tmp_path):
    """/dev/stdout is a link to /proc/self/fd/1; with stdout redirected to a file, that file gets
    the text (after what was printed before) and stays the file the shell opened."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    out = tmp_path / "captured.txt"
    code = (
        "import sys; from socllm.io.files import emit_json; print('first', flush=True); "
        "emit_json({'a': 1}, sys.argv[1])"
    )
    with open(out, "w") as fh:
        subprocess.run([sys.executable, "-c", code, str(link)], stdout=fh, check=True, timeout=60)
    assert out.read_text() == 'first\n{\n  "a": 1\n}\n'
    assert link.is_symlink()


def test_write_through_a_symlink(tmp_path):
    target = tmp_path / "real" / "r.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    emit_json({"a": 1}, str(link))
    assert link.is_symlink() and target.read_text() == '{\n  "a": 1\n}\n'
    with atomic_path(link) as tmp:
        assert tmp.parent == target.parent  # the atomic write happens beside the target
        tmp.write_text("new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "created.json")
    atomic_write_text(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "created.json").read_text() == "made"


def test_hdf5_output_refuses_special_files(tiny_gguf, tmp_path, capsys, no_work):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InvalidArgumentError, match="pipe.*(FIFO|regular file)"):
        convert(tiny_gguf, fifo, progress=False)
    with pytest.raises(InvalidArgumentError, match="stdout"):
        convert(tiny_gguf, "-", progress=False)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    rc, err = run_cli(["calibrate", "--model", str(tiny_gguf), "--out", str(fifo)], capsys)
    assert rc == 2
    assert_one_line(err, str(fifo))


def test_directories_and_bad_parents_refused_early(tiny_gguf, tmp_path, capsys, no_work):
    d = tmp_path / "dir"
    d.mkdir()
    a_file = tmp_path / "file"
    a_file.write_text("")
    for out in (d, a_file / "x.h5"):
        with pytest.raises(InvalidArgumentError, match=re.escape(str(out))):
            convert(tiny_gguf, out, progress=False)
        with pytest.raises(InvalidArgumentError, match=re.escape(str(out))):
            emit_json({}, str(out))
        rc, err = run_cli(["simulate", "--config", "qwen2-0.5b", "--json", str(out)], capsys)
        assert rc == 2
        assert_one_line(err, str(out))
    rc, err = run_cli(["run", "--model", str(tiny_gguf), "--out", str(a_file)], capsys)
    assert rc == 2
    assert_one_line(err, str(a_file))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_parent_refused_early(tiny_gguf, tmp_path, capsys, no_work):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    try:
        rc, err = run_cli(["convert", str(tiny_gguf), "-o", str(ro / "m.h5")], capsys)
        assert rc == 2
        assert_one_line(err, str(ro))
        assert ".tmp" not in err
    finally:
        ro.chmod(0o700)


def test_timeline_trace_goes_through_io_utils(tmp_path):
    from socllm.sim.timeline import simulate

    tl = simulate("qwen2-0.5b", prompt_len=16, chunk=16)
    target = tmp_path / "t.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    tl.to_perfetto(link)
    assert link.is_symlink() and target.read_text().startswith("{")
    with pytest.raises(InvalidArgumentError, match="directory"):
        tl.to_perfetto(tmp_path)


# ---------------------------------------------------------------------------------------------
# Item 9: stale temp files of our naming are swept


def test_temp_names_carry_the_writer_pid(tmp_path):
    with atomic_path(tmp_path / "out.h5") as tmp:
        assert re.fullmatch(rf"\.out\.h5\.{os.getpid()}-[0-9a-f]{{8}}\.tmp", tmp.name)


def test_stale_temps_are_removed(tmp_path):
    dest = tmp_path / "out.json"
    dead = _dead_pid()
    stale = tmp_path / f".out.json.{dead}-0123abcd.tmp"
    mine = tmp_path / f".out.json.{os.getpid()}-0123abcd.tmp"  # a live writer's
    other_dest = tmp_path / f".other.json.{dead}-0123abcd.tmp"  # not this output's
    not_ours = tmp_path / ".out.json.x.tmp"
    for p in (stale, mine, other_dest, not_ours):
        p.write_bytes(b"partial")
    atomic_write_text(dest, "{}")
    assert not stale.exists()
    assert mine.exists() and other_dest.exists() and not_ours.exists()


def test_loading_sweeps_stale_temps_in_the_cache(tiny_gguf, cache):
    out = registry.resolve_model_file(tiny_gguf, progress=False)
    stale = cache / f".{out.name}.{_dead_pid()}-0123abcd.tmp"
    orphan = cache / f".gone-123.h5.{_dead_pid()}-0123abcd.tmp"  # an entry never written again
    stale.write_bytes(b"partial")
    orphan.write_bytes(b"partial")
    assert registry.resolve_model_file(tiny_gguf, progress=False) == out
    assert not stale.exists() and not orphan.exists()


# ---------------------------------------------------------------------------------------------
# Item 10: outputs get 0o666 & ~umask


MASK = 0o027  # a mask that 0600 and 0644 would both fail


def test_output_modes(tiny_gguf, tmp_path, cache, umask):
    umask(MASK)
    want = 0o666 & ~MASK
    assert _mode(convert(tiny_gguf, tmp_path / "c.h5", progress=False)) == want
    emit_json({}, str(tmp_path / "e.json"))
    assert _mode(tmp_path / "e.json") == want
    assert _mode(registry.resolve_model_file(tiny_gguf, progress=False)) == want

    from socllm.eval.report import plot_token_loss
    from socllm.sim.timeline import simulate

    assert _mode(simulate("qwen2-0.5b", prompt_len=16, chunk=16).to_perfetto(tmp_path / "t")) == (
        want
    )
    plot_token_loss(np.ones(8), tmp_path / "loss.png", "t")
    assert _mode(tmp_path / "loss.png") == want


# ---------------------------------------------------------------------------------------------
# Item 12: the conversion cache is keyed on content


def test_cache_follows_content_not_size_and_mtime(tmp_path, cache):
    src = tmp_path / "m.gguf"
    write_gguf(src, seed=0)
    first = registry.resolve_model_file(src, progress=False)
    st = os.stat(src)
    other = tmp_path / "other.gguf"
    new = write_gguf(other, seed=1)  # same layout, other weights: same size
    shutil.copyfile(other, src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    st2 = os.stat(src)
    assert (st2.st_size, st2.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = registry.resolve_model_file(src, progress=False)
    assert second != first
    with h5py.File(second) as f:
        np.testing.assert_array_equal(f["weights/embed_tokens"][()], new["token_embd.weight"])


def test_cache_key_of_hf_directory_is_the_files_conversion_reads(tmp_path, cache):
    src = tmp_path / "hf"
    src.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (src / name).write_text(name)
    key = registry.cached_model_path(src)
    (src / "README.md").write_text("notes")
    (src / "m.h5").write_bytes(b"an output")
    assert registry.cached_model_path(src) == key
    st = os.stat(src / "model.safetensors")
    (src / "model.safetensors").write_text("model.safetensorZ")
    os.utime(src / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert registry.cached_model_path(src) != key


def test_content_digest_memo(tmp_path, cache, monkeypatch):
    """The digest is memoized on (path, device, inode, size, mtime, ctime): a second look does
    not read the file; a change (which moves ctime) does."""
    p = tmp_path / "f.bin"
    p.write_bytes(b"a" * 1000)
    monkeypatch.setattr(registry, "RACY_SECONDS", 0.0)  # the file was just written
    reads = []
    real = registry._hash_file
    monkeypatch.setattr(registry, "_hash_file", lambda path: reads.append(path) or real(path))
    first = registry.file_digest(p)
    assert first == hashlib.sha256(b"a" * 1000).hexdigest()
    assert registry.file_digest(p) == first and len(reads) == 1
    st = os.stat(p)
    p.write_bytes(b"b" * 1000)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert registry.file_digest(p) == hashlib.sha256(b"b" * 1000).hexdigest()
    assert len(reads) == 2


def test_recent_files_are_not_memoized(tmp_path, cache):
    """A file changed within the timestamp granularity could change again unseen."""
    p = tmp_path / "f.bin"
    p.write_bytes(b"a")
    registry.file_digest(p)
    assert not list((cache / registry.DIGEST_MEMO_DIR).glob("*"))


# ---------------------------------------------------------------------------------------------
# Item 13: checksums in model files


def test_format_version_is_one_constant():
    assert convert_mod.FORMAT_VERSION == registry.MODEL_FORMAT_VERSION == 4


def test_converted_datasets_have_fletcher32(tiny_gguf, tmp_path):
    out = convert(tiny_gguf, tmp_path / "m.h5", progress=False)
    with h5py.File(out) as f:
        assert f.attrs["format_version"] == registry.MODEL_FORMAT_VERSION
        datasets = []
        f.visititems(lambda n, o: datasets.append((n, o)) if isinstance(o, h5py.Dataset) else None)
        weights = [(n, o) for n, o in datasets if n.startswith("weights/")]
        assert len(weights) == 3 + 9 * LAYERS
        for name, ds in datasets:
            if h5py.check_string_dtype(ds.dtype) is None:  # HDF5 filters no vlen strings
                assert ds.fletcher32, name
        tok = f["tokenizer/json"]
        assert tok.attrs["sha256"] == hashlib.sha256(tok[()]).hexdigest()


def _flip_stored_bytes(path: Path, dataset: str) -> None:
    with h5py.File(path) as f:
        info = f[dataset].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        b = fh.read(4)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(x ^ 0xFF for x in b))


def test_flipped_weight_bytes_fail_the_checksum(tiny_gguf, tmp_path):
    out = convert(tiny_gguf, tmp_path / "m.h5", progress=False)
    _flip_stored_bytes(out, "weights/layers/0/wq")
    with h5py.File(out) as f, pytest.raises(OSError):
        f["weights/layers/0/wq"][()]


def test_load_of_flipped_weight_bytes_is_a_format_error(tiny_gguf, tmp_path):
    out = convert(tiny_gguf, tmp_path / "m.h5", progress=False)
    _flip_stored_bytes(out, "weights/layers/0/wq")
    with pytest.raises(socllm.FormatError, match="layers/0/wq.*checksum") as e:
        socllm.load(out, progress=False)
    assert str(out) in str(e.value)


def test_tokenizer_json_checksum(tiny_gguf, tmp_path):
    out = convert(tiny_gguf, tmp_path / "m.h5", progress=False)
    with h5py.File(out, "a") as f:
        text = f["tokenizer/json"][()].decode()
        digest = f["tokenizer/json"].attrs["sha256"]
        del f["tokenizer/json"]
        tampered = text.replace('"<s>"', '"<S>"', 1)
        assert tampered != text
        ds = f["tokenizer"].create_dataset("json", data=tampered, dtype=h5py.string_dtype())
        ds.attrs["sha256"] = digest
    with pytest.raises(FormatError, match="tokenizer/json.*checksum"):
        socllm.load(out, progress=False)


# ---------------------------------------------------------------------------------------------
# Issue 37: attribute checksums (HDF5's Fletcher-32 covers datasets only)

CRC = socllm.io.H5_ATTRIBUTES_CHECKSUM


def _reference_canonical(object_path: str, attrs) -> bytes:
    """docs/MODEL_FORMAT.md's canonical attribute text, written again from the spec with h5py."""
    rows = []
    for name in sorted(attrs, key=str.encode):
        if name == CRC:
            continue
        v = attrs[name]
        if isinstance(v, (str, bytes)):
            value = b"s:" + (v.encode() if isinstance(v, str) else v)
        else:
            a = np.atleast_1d(np.asarray(v))
            if a.dtype.kind in "iub":
                value = b"i:" + b",".join(str(int(x)).encode() for x in a)
            else:
                assert a.dtype.kind == "f", (object_path, name, a.dtype)
                bits = [struct.unpack("<Q", struct.pack("<d", float(x)))[0] for x in a]
                value = b"f:" + b",".join(f"{b:016x}".encode() for b in bits)
        rows.append(name.encode() + b"\0" + value + b"\n")
    return object_path.encode() + b"\n" + b"".join(rows) if rows else b""


def _objects(path):
    with h5py.File(path) as f:
        out = [("/", dict(f.attrs))]
        f.visititems(lambda n, o: out.append(("/" + n, dict(o.attrs))))
    return out


@pytest.fixture
def tiny_calibration(tmp_path):
    """A calibration file of the tiny model, with provenance of every attribute type."""
    model = socllm.load(write_tiny(tmp_path / "m.h5"), progress=False)
    cal = model.new_calibration()
    model.observe_activations([[1, 5, 9, 3, 7]], cal)
    prov = {"corpus": "test", "samples": 3, "alpha": 0.5, "steps": "act-scales"}
    path = save_calibration(tmp_path / "cal.h5", CalibrationData(cal, prov), model)
    return model, path


def test_attribute_checksums_match_an_independent_implementation(tiny_gguf, tmp_path):
    """Every object with attributes of a converted model (Python writer, sealed by the core) and
    of a calibration file (the C++ writer) carries the CRC-32 of the canonical text."""
    model = convert(tiny_gguf, tmp_path / "m.h5", progress=False)
    loaded = socllm.load(model, progress=False)
    cal = loaded.new_calibration()
    loaded.observe_activations([[1, 2, 3]], cal)
    calib = save_calibration(tmp_path / "c.h5", CalibrationData(cal, {"alpha": 0.25}), loaded)
    for path in (model, calib):
        sealed = 0
        for obj, attrs in _objects(path):
            ref = _reference_canonical(obj, attrs)
            assert socllm.io.h5_canonical_attributes(str(path), obj) == ref, obj
            if ref:
                assert attrs[CRC] == zlib.crc32(ref), obj
                sealed += 1
            else:
                assert CRC not in attrs, obj
        assert sealed >= 1
        assert socllm.io.verify_h5_attributes(str(path)) == sealed


def test_flipped_config_bit_is_a_format_error(tiny_gguf, tmp_path):
    """One flipped bit of /config@rope_theta in the file's bytes used to load and change the
    logits; now it is a FormatError naming the object and the file."""
    out = convert(tiny_gguf, tmp_path / "m.h5", progress=False)
    with h5py.File(out) as f:
        pattern = struct.pack("<d", float(f["config"].attrs["rope_theta"]))
    data = bytearray(out.read_bytes())
    assert data.count(pattern) == 1
    data[data.index(pattern) + 6] ^= 0x10  # the exponent's lowest bit: rope_theta doubles
    out.write_bytes(bytes(data))
    with h5py.File(out) as f:  # the flip reached the attribute, and HDF5 itself cannot tell
        assert f["config"].attrs["rope_theta"] == 2 * struct.unpack("<d", pattern)[0]
    with pytest.raises(FormatError, match=f"'/config' in '{out}'.*CRC-32"):
        socllm.load(out, progress=False)
    # The tokenizer alone (no weights) is read through the same check.
    with pytest.raises(FormatError, match="'/config'.*CRC-32"):
        FileTokenizer(out)


@pytest.mark.parametrize(
    "obj,name,value",
    [("/tokenizer", "bos_id", 7), ("/weights/layers/0/wq", "note", "x"), ("/", "source", "y")],
)
def test_any_changed_or_added_attribute_is_caught(obj, name, value, tmp_path):
    path = write_tiny(tmp_path / "m.h5")
    with h5py.File(path, "a") as f:
        f[obj].attrs[name] = value
    with pytest.raises(FormatError, match=f"'{obj}' in '{path}'"):
        socllm.load(path, progress=False)


def test_attribute_checksum_required_from_version_4_old_files_warn(tmp_path, capfd):
    path = write_tiny(tmp_path / "m.h5")
    with h5py.File(path, "a") as f:
        del f["config"].attrs[CRC]
    with pytest.raises(FormatError, match=f"'/config' in '{path}' have no {CRC}"):
        socllm.load(path, progress=False)
    capfd.readouterr()
    old = write_tiny(tmp_path / "v3.h5", version=3)  # format 3: no attribute checksums
    assert socllm.load(old, progress=False)
    assert "attributes (config, scales) carry no checksums" in capfd.readouterr().err


def test_calibration_attributes_are_checked(tiny_calibration, tmp_path, capfd):
    model, path = tiny_calibration
    assert load_calibration(path, model)  # as written
    bad = tmp_path / "bad.h5"
    shutil.copy(path, bad)
    with h5py.File(bad, "a") as f:
        f.attrs["tokens"] = int(f.attrs["tokens"]) ^ 1
    with pytest.raises(FormatError, match=f"'/' in '{bad}'.*CRC-32"):
        load_calibration(bad, model)
    # A format 3 file (before attribute checksums) loads, with a warning.
    old = tmp_path / "v3.h5"
    shutil.copy(path, old)
    with h5py.File(old, "a") as f:
        f.attrs["format_version"] = 3
        f.visititems(lambda n, o: o.attrs.__delitem__(CRC) if CRC in o.attrs else None)
        del f.attrs[CRC]
    capfd.readouterr()
    assert load_calibration(old, model)
    assert "calibration format version 3" in capfd.readouterr().err


def test_seal_recomputes_after_a_deliberate_edit(tmp_path):
    """What the tests that need a consistent but wrong value use (tiny_model.seal)."""
    path = write_tiny(tmp_path / "m.h5")
    with h5py.File(path, "a") as f:
        f["config"].attrs["n_kv_heads"] = 3
    with pytest.raises(FormatError, match="CRC-32"):
        socllm.load(path, progress=False)
    with pytest.raises((FormatError, InvalidArgumentError), match="n_kv_heads 3"):
        socllm.load(seal(path), progress=False)


# ---------------------------------------------------------------------------------------------
# Item 15: bad configs, text, counts; one-line errors


@pytest.mark.parametrize(
    "key,value,pattern",
    [
        ("llama.attention.head_count", 0, r"n_heads\b.*\bgot 0$"),
        ("llama.context_length", 0, r"context_length\b.*\bgot 0$"),
        ("llama.embedding_length", -16, r"d_model\b.*\bgot -16$"),
        ("llama.attention.layer_norm_rms_epsilon", math.nan, r"rms_eps\b.*\bnan$"),
        ("llama.attention.layer_norm_rms_epsilon", math.inf, r"rms_eps\b.*\binf$"),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5, r"rms_eps\b.*\bgot -0\.00001"),
        ("llama.rope.freq_base", 0.0, r"rope_theta\b.*\bgot 0"),
        ("llama.attention.head_count_kv", 3, r"n_kv_heads 3$"),
        ("tokenizer.ggml.eos_token_id", 100000, r"eos_id\b.*\bgot 100000$"),
        ("llama.block_count", 1000, r"has 1000 layers"),
        ("llama.context_length", "long", r"context_length' is 'long'"),
    ],
)
def test_convert_rejects_bad_configs(key, value, pattern, tmp_path, cache):
    src = tmp_path / "bad.gguf"
    write_gguf(src, **{key: value})
    with pytest.raises(FormatError, match=pattern) as e:
        convert(src, tmp_path / "out.h5", progress=False)
    assert str(src) in str(e.value)
    assert not (tmp_path / "out.h5").exists()
    with pytest.raises(FormatError) as e:  # through load: the error names the GGUF, no cache
        socllm.load(src, progress=False)
    assert str(src) in str(e.value)
    assert not list(cache.glob("*.h5"))


def test_convert_hf_zero_heads(tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    cfg = {
        "model_type": "llama",
        "hidden_size": 16,
        "num_attention_heads": 0,
        "num_hidden_layers": 1,
        "intermediate_size": 32,
        "vocab_size": 8,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
    }
    (src / "config.json").write_text(json.dumps(cfg))
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models

    (src / "tokenizer.json").write_text(Tokenizer(models.BPE({"a": 0}, [])).to_str())
    save_file(
        {"model.layers.0.input_layernorm.weight": np.ones(16, np.float32)}, src / "w.safetensors"
    )
    with pytest.raises(FormatError, match=r"n_heads\b.*\bgot 0$"):
        convert(src, tmp_path / "out.h5", progress=False)


_GgufFile = socllm.io.GgufFile


class _FakeGguf:
    """The C++ GgufFile with edited metadata (what a binding handing out undecodable strings
    or a hand-edited file would give)."""

    edits: dict = {}

    def __init__(self, path):
        self._g = _GgufFile(path)
        self.metadata = dict(self._g.metadata) | self.edits

    def __getattr__(self, name):
        return getattr(self._g, name)


@pytest.mark.parametrize(
    "edits,fragment",
    [
        ({"tokenizer.ggml.tokens": [*TOKENS[:5], "bad\udcff", *TOKENS[6:]]}, "token 5"),
        ({"tokenizer.ggml.tokens": [*TOKENS[:5], b"\xff", *TOKENS[6:]]}, "token 5"),
        ({"tokenizer.ggml.merges": ["Ġ"]}, "merge 0"),
        ({"tokenizer.ggml.merges": ["Ġ \udcff"]}, "merge 0"),
        ({"tokenizer.ggml.token_type": ["x"]}, "token_type"),
    ],
)
def test_convert_survives_corrupt_tokenizer_metadata(
    edits, fragment, tiny_gguf, tmp_path, monkeypatch
):
    import socllm

    monkeypatch.setattr(_FakeGguf, "edits", edits)
    monkeypatch.setattr(socllm.io, "GgufFile", _FakeGguf)
    with pytest.raises(FormatError, match=re.escape(fragment)) as e:
        convert(tiny_gguf, tmp_path / "out.h5", progress=False)
    assert str(tiny_gguf) in str(e.value)


def test_convert_gguf_with_invalid_utf8_token(tmp_path):
    """The binding hands undecodable bytes out as surrogate escapes; convert refuses them."""
    src = tmp_path / "bad.gguf"
    write_gguf(src, tokens=[t.encode() for t in TOKENS[:5]] + [b"\xff\xfe"] + TOKENS[6:])
    with pytest.raises(FormatError, match="token 5 is not valid UTF-8") as e:
        convert(src, tmp_path / "out.h5", progress=False)
    assert str(src) in str(e.value)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_gguf(d / "tiny.gguf")
    return socllm.load(convert(d / "tiny.gguf", d / "tiny.h5", progress=False), progress=False)


@pytest.mark.parametrize("text", ["\ud800", "ok \udcff then"])
def test_tokenize_lone_surrogate(tiny_model, text):
    with pytest.raises(InvalidArgumentError, match="surrogate"):
        tiny_model.tokenize(text)
    with pytest.raises(InvalidArgumentError, match="surrogate"):
        tiny_model.perplexity(text, context=8)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True])
def test_perplexity_batch_size(tiny_model, batch_size):
    with pytest.raises(InvalidArgumentError, match=f"batch_size.*{batch_size!r}"):
        tiny_model.perplexity_eval("hello world, hello", context=8, batch_size=batch_size)


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["eval", "--batch-size", "0"], "--batch-size"),
        (["eval", "--limit", "0"], "--limit"),
        (["eval", "--limit-tokens", "-5"], "--limit-tokens"),
        (["eval", "--context", "0"], "--context"),
        (["eval", "--stride", "0"], "--stride"),
        (["eval", "--threads", "0"], "--threads"),
        (["calibrate", "--out", "c.h5", "--samples", "0"], "--samples"),
        (["calibrate", "--out", "c.h5", "--seqlen", "0"], "--seqlen"),
        (["calibrate", "--out", "c.h5", "--percentile", "0"], "--percentile"),
        (["calibrate", "--out", "c.h5", "--hot-share", "2"], "--hot-share"),
        (["calibrate", "--out", "c.h5", "--budget", "-1"], "--budget"),
        (["calibrate", "--out", "c.h5", "--validation-tokens", "0"], "--validation-tokens"),
        (["simulate", "--config", "qwen2-0.5b", "--prompt-len", "0"], "--prompt-len"),
        (["simulate", "--config", "qwen2-0.5b", "--chunk", "-1"], "--chunk"),
        (["run", "--limit-tokens", "-1"], "--limit-tokens"),
        (["run", "--calib-samples", "0"], "--calib-samples"),
    ],
)
def test_cli_nonpositive_counts(argv, flag, capsys, no_work):
    rc, err = run_cli(argv, capsys)
    assert rc == 2
    assert_one_line(err, flag)


@pytest.mark.parametrize(
    "exc",
    [OSError(28, "No space left on device", "out.h5"), ValueError("bad value 7"), FormatError("x")],
)
def test_cli_user_errors_are_one_line(exc, tiny_gguf, tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(convert_mod, "convert", fail)
    rc, err = run_cli(["convert", str(tiny_gguf), "-o", str(tmp_path / "o.h5")], capsys)
    assert rc == 2
    assert_one_line(err, "socllm convert: error:", str(exc))


def test_late_write_errors_name_the_output_not_the_temp(tmp_path, monkeypatch):
    """An OSError while writing (a full disk) is about the output: the temp file is gone."""
    dest = tmp_path / "o.bin"

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as e, atomic_path(dest) as tmp:
        monkeypatch.setattr(os, "replace", full)
        tmp.write_bytes(b"x")
    monkeypatch.undo()
    assert e.value.errno == 28 and str(dest) in str(e.value) and ".tmp" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
    # an error about an input (a socllm error that is also an OSError) passes unchanged
    with pytest.raises(socllm.MissingFileError, match="shard 2"), atomic_path(dest):
        raise socllm.MissingFileError("shard 2 is missing")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "token_type", [5, [1, 2**40], [1, "x"], [True]], ids=["scalar", "int64", "str", "bool"]
)
def test_convert_token_types_must_be_int32_lists(token_type):
    # a scalar raised TypeError and 2**40 OverflowError (np.int32) from convert
    md = {"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.token_type": token_type}
    with pytest.raises(FormatError, match="token_type must be a list of int32"):
        convert_mod._gguf_vocabulary(Path("x.gguf"), md)


def test_convert_hf_config_types(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    for cfg, pattern in [
        ({"model_type": "llama", "rope_parameters": [1]}, "rope_parameters is not an object"),
    ]:
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(FormatError, match=pattern):
            convert(d, tmp_path / "out.h5", progress=False)
    with pytest.raises(FormatError, match="bos_token_id is 'abc'"):
        convert_mod._first_id("config.json", "bos_token_id", "abc")


def test_safetensors_index_cannot_point_outside(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / model_format.HF_INDEX).write_text(json.dumps({"weight_map": {"w": "/etc/x.safetensors"}}))
    with pytest.raises(FormatError, match="outside"):
        model_format.safetensors_files(d)
