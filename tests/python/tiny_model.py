"""Random weights of a tiny llama model, shared by the tests that build model files by hand
(test_errors: socllm HDF5 files; test_hardening_files: GGUF files under llama.cpp's names;
test_calibration_steps: head importance by hand)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import socllm
from socllm.io.model_format import (
    CHECKSUM_FORMAT_VERSION,
    MODEL_FORMAT_VERSION,
    TOKENIZER_JSON_DIGEST,
    tokenizer_json_digest,
)


def tiny_weights(c: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """socllm dataset name (docs/MODEL_FORMAT.md) -> float32 weights for config ``c``, with an
    ``lm_head`` (drop it for tied embeddings)."""
    d, v, ff = c["d_model"], c["vocab_size"], c["d_ff"]
    q, kv = c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"]

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {"embed_tokens": w(v, d), "final_norm": 1 + w(d), "lm_head": w(v, d)}
    for i in range(c["n_layers"]):
        out |= {
            f"layers/{i}/attn_norm": 1 + w(d),
            f"layers/{i}/wq": w(q, d),
            f"layers/{i}/wk": w(kv, d),
            f"layers/{i}/wv": w(kv, d),
            f"layers/{i}/wo": w(d, q),
            f"layers/{i}/ffn_norm": 1 + w(d),
            f"layers/{i}/w_gate": w(ff, d),
            f"layers/{i}/w_up": w(ff, d),
            f"layers/{i}/w_down": w(d, ff),
        }
    return out


# A tiny socllm model file written by hand (docs/MODEL_FORMAT.md), to corrupt cheaply.
TINY = {
    "arch": "llama",
    "name": "tiny",
    "vocab_size": 128,
    "d_model": 16,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 4,
    "d_ff": 32,
    "context_length": 64,
    "rope_theta": 10000.0,
    "rms_eps": 1e-5,
    "tie_embeddings": 0,
    "qkv_bias": 0,
    "bos_id": 1,
    "eos_id": 2,
}


def tiny_tokenizer_json() -> str:
    """Character-level BPE (ids 0..97), as in test_convert.py."""
    from tokenizers import Tokenizer, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {chr(c): 3 + c - 32 for c in range(32, 127)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok.to_str()


def write_tiny(
    path: Path, *, config=None, weights=None, tokenizer=True, version=MODEL_FORMAT_VERSION
) -> Path:
    """A handmade model file as `socllm convert` writes it (checksums from version 2 on)."""
    checksums = version >= CHECKSUM_FORMAT_VERSION
    c = TINY | (config or {})
    ws = tiny_weights(TINY, np.random.default_rng(0)) if weights is None else weights
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "socllm-model"
        f.attrs["format_version"] = version
        f.attrs["socllm_version"] = socllm.__version__
        f.attrs["source"] = "handmade"
        f.attrs["source_kind"] = "hf"
        f.create_group("config").attrs.update(c)
        if tokenizer:
            t = f.create_group("tokenizer")
            text = tiny_tokenizer_json()
            js = t.create_dataset("json", data=text, dtype=h5py.string_dtype("utf-8"))
            if checksums:
                js.attrs[TOKENIZER_JSON_DIGEST] = tokenizer_json_digest(text)
            t.attrs.update({"model": "hf", "pre": "hf", "add_bos": 0, "bos_id": 1, "eos_id": 2})
        g = f.create_group("weights")
        for name, arr in ws.items():
            g.create_dataset(name, data=arr, fletcher32=checksums)
    if version >= socllm.io.Model.attribute_checksum_format_version:
        seal(path)
    return path


def seal(path: Path) -> Path:
    """Recomputes a file's attribute checksums (after a test edited its attributes on purpose:
    the loader should then reach the check the test is about)."""
    socllm.io.seal_h5_attributes(str(path))
    return path


def numpy_logprobs(c: dict, ws: dict, ids: list[int], zero_heads=()) -> np.ndarray:
    """[len(ids) - 1] log p(ids[t + 1] | ids[:t + 1]) of a llama config in float64 numpy (HF
    Llama: RMSNorm, rotate-half RoPE, GQA causal attention, SiLU-gated MLP), with the attention
    output of each (layer, head) in ``zero_heads`` zeroed before o_proj (shadowAttn's head
    ablation, seed 000 Eq. 1)."""
    T, H, KV, hd = len(ids), c["n_heads"], c["n_kv_heads"], c["head_dim"]
    W = {k: v.astype(np.float64) for k, v in ws.items()}

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["rms_eps"]) * w

    inv = c["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rope(x):  # [T, heads, hd]
        rot = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
        return x * cos[:, None, :] + rot * sin[:, None, :]

    x = W["embed_tokens"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(c["n_layers"]):
        p = f"layers/{i}/"
        h = norm(x, W[p + "attn_norm"])
        q = rope((h @ W[p + "wq"].T).reshape(T, H, hd))
        k = rope((h @ W[p + "wk"].T).reshape(T, KV, hd))
        v = (h @ W[p + "wv"].T).reshape(T, KV, hd)
        out = np.zeros((T, H, hd))
        for j in range(H):
            if (i, j) in zero_heads:
                continue
            g = j // (H // KV)
            s = q[:, j] @ k[:, g].T / np.sqrt(hd) + mask
            a = np.exp(s - s.max(1, keepdims=True))
            out[:, j] = (a / a.sum(1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(T, H * hd) @ W[p + "wo"].T
        h = norm(x, W[p + "ffn_norm"])
        gate, up = h @ W[p + "w_gate"].T, h @ W[p + "w_up"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "w_down"].T
    logits = norm(x, W["final_norm"]) @ W["lm_head"].T
    logits -= logits.max(1, keepdims=True)
    lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return lp[np.arange(T - 1), ids[1:]]
