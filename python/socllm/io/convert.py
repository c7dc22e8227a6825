"""`socllm convert`: a GGUF file or a Hugging Face checkpoint -> one socllm HDF5 model file.

The output layout is docs/MODEL_FORMAT.md: fp32 weights in Hugging Face orientation, the config
as attributes, and a `tokenizers` JSON. The file is written beside the target under a temporary
name and renamed at the end, so an interrupted or failed conversion never leaves a partial model.
Every numeric dataset carries HDF5's Fletcher-32 checksum, which HDF5 verifies on every read;
the tokenizer JSON (a variable-length string, which HDF5 filters cannot cover) carries its
SHA-256 as an attribute, which the loader checks. The config is checked with the C++ core's own
validation before anything is written, so a file convert writes is one `socllm.load` accepts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from tqdm import tqdm

from socllm import _core
from socllm.errors import (
    FormatError,
    InvalidArgumentError,
    MissingFileError,
    SocllmError,
    UnsupportedError,
)
from socllm.io.files import atomic_path, check_output_path
from socllm.io.model_format import (
    MODEL_FORMAT_VERSION,
    TOKENIZER_JSON_DIGEST,
    safetensors_files,
    source_files,
    tokenizer_json_digest,
)
from socllm.tokenizer import load_tokenizer_json, tokenizer_from_gguf_vocab

__all__ = ["FORMAT", "FORMAT_VERSION", "convert"]

FORMAT = "socllm-model"
FORMAT_VERSION = MODEL_FORMAT_VERSION  # one constant: the cache key carries it too
# Bytes per HDF5 chunk (one Fletcher-32 checksum each). h5py's own choice (~20-60 KB chunks)
# doubles SmolLM2's load time in chunk lookups; at 4 MiB they cost ~15%, and the temporary
# buffer HDF5 reads a filtered chunk into stays small.
CHUNK_BYTES = 4 << 20
SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3")  # GGUF
HF_ARCHS = ("llama", "qwen2")  # Hugging Face directories
# Gemma 3 values its GGUF does not store: llama.cpp's and transformers' defaults for the
# architecture (every 6th layer global, local layers' RoPE base 10000).
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_ROPE_THETA_LOCAL = 10000.0
DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's and transformers' default RoPE base

# Per-layer weights: socllm name -> (GGUF name in llama.cpp's `blk.N.` namespace,
# Hugging Face name in `model.layers.N.`).
_LAYER_TENSORS: dict[str, tuple[str, str]] = {
    "attn_norm": ("attn_norm.weight", "input_layernorm.weight"),
    "wq": ("attn_q.weight", "self_attn.q_proj.weight"),
    "wk": ("attn_k.weight", "self_attn.k_proj.weight"),
    "wv": ("attn_v.weight", "self_attn.v_proj.weight"),
    "bq": ("attn_q.bias", "self_attn.q_proj.bias"),
    "bk": ("attn_k.bias", "self_attn.k_proj.bias"),
    "bv": ("attn_v.bias", "self_attn.v_proj.bias"),
    "wo": ("attn_output.weight", "self_attn.o_proj.weight"),
    "ffn_norm": ("ffn_norm.weight", "post_attention_layernorm.weight"),
    "w_gate": ("ffn_gate.weight", "mlp.gate_proj.weight"),
    "w_up": ("ffn_up.weight", "mlp.up_proj.weight"),
    "w_down": ("ffn_down.weight", "mlp.down_proj.weight"),
    # Gemma 3 (GGUF only): head norms and the norms after attention and the MLP
    "q_norm": ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    "k_norm": ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    "post_attn_norm": ("post_attention_norm.weight", "post_attention_layernorm.weight"),
    "post_ffn_norm": ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
}
_GLOBAL_TENSORS: dict[str, tuple[str, str]] = {
    "embed_tokens": ("token_embd.weight", "model.embed_tokens.weight"),
    "final_norm": ("output_norm.weight", "model.norm.weight"),
    "lm_head": ("output.weight", "lm_head.weight"),
}
_GGUF, _HF = 0, 1


def hf_tensor_names() -> tuple[dict[str, str], dict[str, str]]:
    """socllm weight names -> Hugging Face state-dict names: the model's globals, and each
    layer's (under ``model.layers.N.``)."""
    return (
        {k: v[_HF] for k, v in _GLOBAL_TENSORS.items()},
        {k: v[_HF] for k, v in _LAYER_TENSORS.items()},
    )


@dataclass
class _Tensor:
    name: str  # dataset name under `weights/`
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]


@dataclass
class _Model:
    kind: str  # "gguf" | "hf"
    path: Path
    config: dict[str, Any]
    tensors: list[_Tensor]
    tokenizer_json: str
    tokenizer_attrs: dict[str, Any]
    tokenizer_arrays: dict[str, Any] = field(default_factory=dict)


def convert(source: str | Path, out_path: str | Path, *, progress: bool = True) -> Path:
    """Convert `source` (a `.gguf` file or a HF model directory) to the socllm file `out_path`.

    Raises MissingFileError, FormatError or UnsupportedError; InvalidArgumentError, before any
    work, for an output that is a directory, a FIFO or device, one of the files converted, or
    cannot be created. On any error no output (and no temporary file) is left behind.
    """
    out = Path(out_path)
    check_output_path(out, inputs=source_files(source), what="convert output", streams=False)
    model = _open_source(Path(source))
    with atomic_path(out) as tmp:
        _write(model, tmp, progress)
        _core.seal_h5_attributes(str(tmp))  # attributes' CRC-32 (MODEL_FORMAT.md, Integrity)
    return out


# ---------------------------------------------------------------------------------------------
# Source detection


def _open_source(path: Path) -> _Model:
    if not path.exists():
        raise MissingFileError(f"[convert] no such file or directory: {path}")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FormatError(
                f"[convert] {path} is a directory without config.json "
                "(expected a Hugging Face model directory)"
            )
        return _open_hf(path)
    if path.suffix.lower() == ".gguf" or _has_gguf_magic(path):
        return _open_gguf(path)
    raise FormatError(
        f"[convert] {path} is neither a .gguf file nor a Hugging Face model directory"
    )


def _has_gguf_magic(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"GGUF"


def _expected_shapes(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Dataset name -> shape for a config, in file order (docs/MODEL_FORMAT.md)."""
    d, v, ff = c["d_model"], c["vocab_size"], c["d_ff"]
    q, kv = c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens": (v, d)}
    for i in range(c["n_layers"]):
        p = f"layers/{i}/"
        shapes |= {p + "attn_norm": (d,), p + "wq": (q, d), p + "wk": (kv, d), p + "wv": (kv, d)}
        if c["qkv_bias"]:
            shapes |= {p + "bq": (q,), p + "bk": (kv,), p + "bv": (kv,)}
        if c.get("qk_norm"):
            shapes |= {p + "q_norm": (c["head_dim"],), p + "k_norm": (c["head_dim"],)}
        if c.get("post_norms"):
            shapes |= {p + "post_attn_norm": (d,), p + "post_ffn_norm": (d,)}
        shapes |= {
            p + "wo": (d, q),
            p + "ffn_norm": (d,),
            p + "w_gate": (ff, d),
            p + "w_up": (ff, d),
            p + "w_down": (d, ff),
        }
    shapes["final_norm"] = (d,)
    if not c["tie_embeddings"]:
        shapes["lm_head"] = (v, d)
    return shapes


def _source_name(dataset: str, which: int) -> str:
    """Name of a socllm dataset's tensor in a GGUF (`which=_GGUF`) or HF checkpoint."""
    if dataset.startswith("layers/"):
        _, i, short = dataset.split("/")
        prefix = f"blk.{i}." if which == _GGUF else f"model.layers.{i}."
        return prefix + _LAYER_TENSORS[short][which]
    return _GLOBAL_TENSORS[dataset][which]


def _check_shape(path: Path, name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise FormatError(
            f"[convert] {path}: tensor {name!r} has shape {tuple(got)}, expected {tuple(want)}"
        )


def _typed(where: str, key: str, value: Any, kind: type) -> Any:
    """``value`` of config key ``key`` as ``kind`` (int, float or str); anything else (a string
    where a number belongs, a bool, a list) is a FormatError naming it. ``where``: the file."""
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise FormatError(f"[convert] {where}: {key} is {value!r}, expected a {kind.__name__}")
    return kind(value)


def _check_layer_count(path: Path, n_layers: int, names: set[str], prefix: str) -> None:
    """The config's layer count against the layers the tensors are for (``prefix`` + N + "."),
    before anything is sized from it."""
    layers = set()
    for name in names:
        if name.startswith(prefix):
            index = name[len(prefix) :].split(".", 1)[0]
            if index.isdigit():
                layers.add(int(index))
    # compared by count first: n_layers comes from the file and may be 2**32 - 1
    if len(layers) != n_layers or layers != set(range(n_layers)):
        raise FormatError(
            f"[convert] {path}: the config has {n_layers} layers, the tensors are for "
            f"{len(layers)} (layer indices {sorted(layers)[:3]}{' ...' if len(layers) > 3 else ''})"
        )


def _validate_config(path: Path, c: dict[str, Any]) -> None:
    """The C++ core's check of a model config (what Model.load runs), before anything is
    written, so a file load would refuse is never made."""
    flags = {  # JSON booleans in C++
        k: bool(c[k])
        for k in ("tie_embeddings", "qkv_bias", "qk_norm", "post_norms", "embed_scale")
        if k in c
    }
    try:
        _core.Model.check_config(c | flags)
    except InvalidArgumentError as e:
        raise FormatError(f"[convert] {path}: invalid model config: {e}") from e


# ---------------------------------------------------------------------------------------------
# GGUF


def _unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved rotary pairs -> HF rotate-half).

    llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` is
    `w.reshape(n_head, 2, dim // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)`; this is
    transformers' `LlamaTensorProcessor._reverse_permute_weights` (modeling_gguf_pytorch_utils.py).
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_vocabulary(path: Path, md: dict[str, Any]) -> tuple[list[str], list[str], list[int]]:
    """Tokens, merges and token types, checked: strings that are valid Unicode (the model file
    stores them as UTF-8) without NUL, merges of two parts, integer types."""
    if "tokenizer.ggml.tokens" not in md:
        raise FormatError(f"[convert] {path}: GGUF metadata key 'tokenizer.ggml.tokens' is missing")

    def strings(key: str, what: str, parts: int | None) -> list[str]:
        values = md.get(key, [])
        if not isinstance(values, (list, tuple)):
            raise FormatError(f"[convert] {path}: {key} is not a list")
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise FormatError(f"[convert] {path}: {what} {i} is {v!r}, not a string")
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise FormatError(f"[convert] {path}: {what} {i} is not valid UTF-8 ({e})") from e
            if "\x00" in v:  # HDF5 strings end at NUL; no tokenizer has one in a token
                raise FormatError(f"[convert] {path}: {what} {i} {v!r} contains a NUL character")
            if parts is not None and len(v.split(" ")) != parts:
                raise FormatError(f"[convert] {path}: {what} {i} {v!r} is not two tokens")
        return list(values)

    tokens = strings("tokenizer.ggml.tokens", "token", None)
    merges = strings("tokenizer.ggml.merges", "merge", 2)
    token_type = md.get("tokenizer.ggml.token_type", [])
    int32 = np.iinfo(np.int32)  # stored as int32 (llama.cpp's enum)
    if not isinstance(token_type, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and int32.min <= t <= int32.max
        for t in token_type
    ):
        raise FormatError(
            f"[convert] {path}: tokenizer.ggml.token_type must be a list of int32 values"
        )
    return tokens, merges, list(token_type)


def _open_gguf(path: Path) -> _Model:
    from . import GgufFile  # the C++ reader; raises MissingFile/Format/Unsupported

    g = GgufFile(str(path))
    md: dict[str, Any] = g.metadata  # strings that are not UTF-8 come as surrogate escapes
    missing = object()

    def meta(key: str, kind: type, default: Any = missing) -> Any:
        if key not in md:
            if default is missing:
                raise FormatError(f"[convert] {path}: GGUF metadata key {key!r} is missing")
            return default
        return _typed(str(path), f"GGUF metadata {key!r}", md[key], kind)

    arch = meta("general.architecture", str)
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedError(
            f"[convert] {path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    scaling = md.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or meta(f"{arch}.rope.scale_linear", float, 1.0) != 1.0:
        raise UnsupportedError(f"[convert] {path}: RoPE scaling {scaling!r} is not supported")

    tokens, merges, token_type = _gguf_vocabulary(path, md)
    d_model = meta(f"{arch}.embedding_length", int)
    n_heads = meta(f"{arch}.attention.head_count", int)
    # zero heads: no default head size (the config check below names n_heads); the rotary
    # dims default to the head size (Gemma 3 stores key_length only)
    head_dim = meta(
        f"{arch}.attention.key_length",
        int,
        meta(f"{arch}.rope.dimension_count", int, d_model // n_heads if n_heads else 0),
    )
    rope_dims = meta(f"{arch}.rope.dimension_count", int, head_dim)
    if rope_dims != head_dim:
        raise UnsupportedError(
            f"[convert] {path}: partial rotary ({rope_dims} of {head_dim} "
            "head dims) is not supported"
        )
    names = set(g.tensor_names())
    bos_id = meta("tokenizer.ggml.bos_token_id", int, -1)
    eos_id = meta("tokenizer.ggml.eos_token_id", int, -1)
    config: dict[str, Any] = {
        "arch": arch,
        "name": meta("general.name", str, "") or path.stem,
        "vocab_size": len(tokens) if tokens else meta(f"{arch}.vocab_size", int),
        "d_model": d_model,
        "n_layers": meta(f"{arch}.block_count", int),
        "n_heads": n_heads,
        # llama.cpp: head_count_kv defaults to head_count (no GQA).
        "n_kv_heads": meta(f"{arch}.attention.head_count_kv", int, n_heads),
        "head_dim": head_dim,
        "d_ff": meta(f"{arch}.feed_forward_length", int),
        "context_length": meta(f"{arch}.context_length", int),
        "rope_theta": meta(f"{arch}.rope.freq_base", float, DEFAULT_ROPE_THETA),
        "rms_eps": meta(f"{arch}.attention.layer_norm_rms_epsilon", float),
        # llama.cpp: no `output.weight` means the output projection reuses the embedding.
        "tie_embeddings": int("output.weight" not in names),
        # llama.cpp's qwen2 graph always has Q/K/V biases; we do not implement them for llama.
        "qkv_bias": int(arch == "qwen2"),
        "bos_id": bos_id,
        "eos_id": eos_id,
    }
    if arch == "gemma3":
        # transformers Gemma3TextModel; the GGUF stores norm weights with Gemma's 1 + w folded in
        # (llama.cpp's converter), which is what a plain RMSNorm multiplies by.
        config |= {
            "activation": "gelu_tanh",
            "sliding_window": meta(f"{arch}.attention.sliding_window", int),
            "sliding_window_pattern": GEMMA3_SLIDING_WINDOW_PATTERN,
            "rope_theta_local": GEMMA3_ROPE_THETA_LOCAL,
            "qk_norm": True,
            "post_norms": True,
            "embed_scale": True,
        }
    if arch == "llama" and any(
        n.endswith(("attn_q.bias", "attn_k.bias", "attn_v.bias")) for n in names
    ):
        raise UnsupportedError(
            f"[convert] {path}: attention biases in a llama GGUF are not supported"
        )
    _check_layer_count(path, config["n_layers"], names, "blk.")
    _validate_config(path, config)

    shapes = _expected_shapes(config)
    src_names = {ds: _source_name(ds, _GGUF) for ds in shapes}
    for ds, src in src_names.items():
        if src not in names:
            raise FormatError(f"[convert] {path}: tensor {src!r} is missing")
        _check_shape(path, src, tuple(g.tensor_info(src)["shape"]), shapes[ds])
    if extra := sorted(names - set(src_names.values())):
        raise UnsupportedError(
            f"[convert] {path}: tensors socllm does not implement: "
            f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        )

    def loader(ds: str) -> Callable[[], np.ndarray]:
        src = src_names[ds]
        heads = {"wq": config["n_heads"], "wk": config["n_kv_heads"]}.get(ds.rsplit("/", 1)[-1])
        if arch == "llama" and heads is not None:
            return lambda: _unpermute_qk(g.dequantize(src), heads)
        return lambda: g.dequantize(src)

    tensors = [_Tensor(ds, shape, loader(ds)) for ds, shape in shapes.items()]

    model_kind = meta("tokenizer.ggml.model", str)
    pre = meta("tokenizer.ggml.pre", str, "default")
    # transformers (gguf_tokenizer_mapping.get_gguf_tokenizer): no BOS for byte-level BPE unless the
    # file says so.
    add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False))
    try:
        tok = tokenizer_from_gguf_vocab(
            tokens,
            merges,
            token_type,
            model_kind,
            pre,
            bos_id,
            eos_id,
            add_bos,
            unk_id=meta("tokenizer.ggml.unknown_token_id", int, -1),
            pad_id=meta("tokenizer.ggml.padding_token_id", int, -1),
            arch=arch,
        )
    except UnsupportedError as e:
        raise UnsupportedError(f"[convert] {path}: {e}") from e
    except SocllmError:
        raise
    except Exception as e:  # tokenizers raises bare Exceptions and TypeErrors on bad input
        raise FormatError(f"[convert] {path}: the GGUF vocabulary makes no tokenizer: {e}") from e
    return _Model(
        kind="gguf",
        path=path,
        config=config,
        tensors=tensors,
        tokenizer_json=tok.to_str(),
        tokenizer_attrs={
            "model": model_kind,
            "pre": pre,
            "add_bos": int(add_bos),
            "bos_id": bos_id,
            "eos_id": eos_id,
        },
        tokenizer_arrays={
            "tokens": tokens,
            "merges": merges,
            "token_type": np.asarray(token_type, dtype=np.int32),
        },
    )


# ---------------------------------------------------------------------------------------------
# Hugging Face safetensors checkpoints


def _read_bf16(file: Path, name: str) -> np.ndarray:
    """A BF16 safetensors tensor as float32 (exact: bf16 is the top half of an fp32).

    numpy has no bfloat16, so safetensors' numpy path refuses it; read the raw bytes using the
    safetensors layout: u64 little-endian header size, JSON header, then the data.
    """
    with open(file, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        info = json.loads(fh.read(n))[name]
        begin, end = info["data_offsets"]
        fh.seek(8 + n + begin)
        raw = np.frombuffer(fh.read(end - begin), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])


class _Safetensors:
    """Tensor index over the `*.safetensors` files of a checkpoint (sharded or not)."""

    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open

        self._safe_open = safe_open
        files = safetensors_files(directory)
        if not files:
            raise FormatError(f"[convert] {directory}: no *.safetensors files")
        self.where: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
        for file in files:
            if not file.is_file():
                raise MissingFileError(f"[convert] {directory}: shard {file.name} is missing")
            try:
                with safe_open(str(file), framework="np") as f:
                    for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                        sl = f.get_slice(key)
                        self.where.setdefault(key, (file, sl.get_dtype(), tuple(sl.get_shape())))
            except Exception as e:  # safetensors raises its own error types for corrupt files
                raise FormatError(f"[convert] {file}: not a readable safetensors file: {e}") from e

    def load(self, name: str) -> np.ndarray:
        file, dtype, _ = self.where[name]
        if dtype == "BF16":
            return _read_bf16(file, name)
        if dtype not in ("F16", "F32", "F64"):
            raise UnsupportedError(f"[convert] {file}: tensor {name!r} has dtype {dtype}")
        with self._safe_open(str(file), framework="np") as f:
            return f.get_tensor(name).astype(np.float32, copy=False)


# transformers' config defaults where a config.json may omit a key.
_HF_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6},
}


def _first_id(where: str, key: str, value: Any) -> int:
    """A token id from config.json, where it may be null or a list (first wins)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return -1 if value is None else _typed(where, key, value, int)


def _open_hf(path: Path) -> _Model:
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise FormatError(f"[convert] {path / 'config.json'}: invalid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise FormatError(f"[convert] {path / 'config.json'}: not a JSON object")
    if not isinstance(cfg.get("rope_parameters") or {}, dict):
        raise FormatError(f"[convert] {path / 'config.json'}: rope_parameters is not an object")
    model_type = cfg.get("model_type")
    if model_type not in HF_ARCHS:
        # mistral is llama-shaped but windows every layer, which socllm does not run; Gemma 3
        # converts from its GGUF only.
        raise UnsupportedError(
            f"[convert] {path}: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(HF_ARCHS)}; gemma3 from its GGUF)"
        )
    _check_hf_features(path, cfg)

    where = str(path / "config.json")

    def req(key: str, kind: type = int) -> Any:
        if key in cfg and cfg[key] is not None:
            return _typed(where, key, cfg[key], kind)
        if key in _HF_DEFAULTS[model_type]:
            return _HF_DEFAULTS[model_type][key]
        raise FormatError(f"[convert] {where}: key {key!r} is missing")

    def opt(key: str, kind: type, default: Any) -> Any:
        value = cfg.get(key)
        return default if value is None else _typed(where, key, value, kind)

    d_model, n_heads = req("hidden_size"), req("num_attention_heads")
    rope = cfg.get("rope_parameters") or {}  # transformers >= 5 moves rope_theta here
    rope_theta = DEFAULT_ROPE_THETA
    if rope.get("rope_theta") is not None:
        rope_theta = _typed(where, "rope_parameters.rope_theta", rope["rope_theta"], float)
    tie = bool(cfg.get("tie_word_embeddings", False))

    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise FormatError(f"[convert] {path}: tokenizer.json is missing")
    try:
        tok_json = tok_file.read_text(encoding="utf-8")
        tok = load_tokenizer_json(tok_json)
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON; or not UTF-8
        raise FormatError(f"[convert] {tok_file}: not a tokenizers JSON: {e}") from e
    bos_id = _first_id(where, "bos_token_id", cfg.get("bos_token_id"))
    eos_id = _first_id(where, "eos_token_id", cfg.get("eos_token_id"))
    # Whether encoding prepends BOS is the tokenizer's post-processor's business: ask it.
    probe = tok.encode("a")
    add_bos = bool(probe.special_tokens_mask[:1] == [1])
    if add_bos and bos_id < 0:
        bos_id = probe.ids[0]

    config: dict[str, Any] = {
        "arch": model_type,
        "name": path.resolve().name,
        "vocab_size": req("vocab_size"),
        "d_model": d_model,
        "n_layers": req("num_hidden_layers"),
        "n_heads": n_heads,
        "n_kv_heads": opt("num_key_value_heads", int, n_heads),
        # 0 means unset, as in transformers (`config.head_dim or hidden_size // num_heads`);
        # zero heads: no default head size (the config check below names n_heads)
        "head_dim": opt("head_dim", int, 0) or (d_model // n_heads if n_heads else 0),
        "d_ff": req("intermediate_size"),
        "context_length": req("max_position_embeddings"),
        "rope_theta": opt("rope_theta", float, rope_theta),
        "rms_eps": req("rms_norm_eps", float),
        "tie_embeddings": int(tie),
        "qkv_bias": int(model_type == "qwen2"),  # transformers Qwen2Attention: q/k/v bias=True
        "bos_id": bos_id,
        "eos_id": eos_id,
    }

    st = _Safetensors(path)
    _check_layer_count(path, config["n_layers"], set(st.where), "model.layers.")
    _validate_config(path, config)
    shapes = _expected_shapes(config)
    src_names = {ds: _source_name(ds, _HF) for ds in shapes}
    for ds, src in src_names.items():
        if src not in st.where:
            raise FormatError(f"[convert] {path}: tensor {src!r} is missing")
        _check_shape(path, src, st.where[src][2], shapes[ds])
    # A tied checkpoint may still store lm_head; rotary caches are recomputed, not weights.
    ignored = {"lm_head.weight"} if tie else set()
    extra = sorted(
        k
        for k in set(st.where) - set(src_names.values()) - ignored
        if not k.endswith("rotary_emb.inv_freq")
    )
    if extra:
        raise UnsupportedError(
            f"[convert] {path}: tensors socllm does not implement: "
            f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}"
        )

    tensors = [
        _Tensor(ds, shape, lambda src=src_names[ds]: st.load(src)) for ds, shape in shapes.items()
    ]
    return _Model(
        kind="hf",
        path=path,
        config=config,
        tensors=tensors,
        tokenizer_json=tok_json,
        tokenizer_attrs={
            "model": "hf",
            "pre": "hf",
            "add_bos": int(add_bos),
            "bos_id": bos_id,
            "eos_id": eos_id,
        },
    )


def _check_hf_features(path: Path, cfg: dict[str, Any]) -> None:
    """Reject config options that change the numerics in ways socllm does not implement."""

    def unsupported(what: str) -> UnsupportedError:
        return UnsupportedError(f"[convert] {path}: {what} is not supported")

    scaling = cfg.get("rope_scaling")
    rope_type = (cfg.get("rope_parameters") or {}).get("rope_type", "default")
    if scaling is not None or rope_type != "default":
        raise unsupported(f"RoPE scaling {scaling or rope_type!r}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise unsupported(f"hidden_act {cfg['hidden_act']!r}")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):  # llama options (o_proj / MLP biases)
        raise unsupported("llama attention_bias/mlp_bias")
    layer_types = cfg.get("layer_types") or []
    if cfg.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        raise unsupported("sliding-window attention")


# ---------------------------------------------------------------------------------------------
# Writing


def _socllm_version() -> str:
    try:
        from socllm._version import __version__
    except ImportError:
        return "0.1.0"
    return str(__version__)


def _chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...] | bool:
    """Chunks of whole rows, about CHUNK_BYTES each, the rows split evenly among them (an edge
    chunk is stored full size). ``True`` (h5py's choice) for an empty dataset."""
    if not shape or 0 in shape:
        return True
    row_bytes = itemsize * math.prod(shape[1:])
    n_chunks = max(1, math.ceil(shape[0] * row_bytes / CHUNK_BYTES))
    return (math.ceil(shape[0] / n_chunks), *shape[1:])


def _write(model: _Model, path: Path, progress: bool) -> None:
    strings = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["socllm_version"] = _socllm_version()
        f.attrs["source"] = str(model.path.resolve())
        f.attrs["source_kind"] = model.kind
        cfg = f.create_group("config")
        for key, value in model.config.items():
            cfg.attrs[key] = int(value) if isinstance(value, bool) else value

        tok = f.create_group("tokenizer")
        tok_json = tok.create_dataset("json", data=model.tokenizer_json, dtype=strings)
        tok_json.attrs[TOKENIZER_JSON_DIGEST] = tokenizer_json_digest(model.tokenizer_json)
        for key, value in model.tokenizer_attrs.items():
            tok.attrs[key] = value
        for key, value in model.tokenizer_arrays.items():
            if isinstance(value, np.ndarray):
                chunks = _chunks(value.shape, value.itemsize)
                tok.create_dataset(key, data=value, chunks=chunks, fletcher32=True)
            else:  # provenance copies of the GGUF vocabulary, not read by the loader
                tok.create_dataset(
                    key, data=np.array(value, dtype=object), shape=(len(value),), dtype=strings
                )

        weights = f.create_group("weights")
        with tqdm(
            model.tensors, desc=f"convert {model.path.name}", unit="tensor", disable=not progress
        ) as bar:
            for t in bar:
                arr = np.ascontiguousarray(t.load(), dtype=np.float32)
                _check_shape(model.path, t.name, arr.shape, t.shape)
                chunks = _chunks(arr.shape, arr.itemsize)
                weights.create_dataset(t.name, data=arr, chunks=chunks, fletcher32=True)
