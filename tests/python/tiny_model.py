"""Random weights of a tiny llama model, shared by the tests that build model files by hand
(test_errors: socllm HDF5 files; test_hardening_files: GGUF files under llama.cpp's names)."""

from __future__ import annotations

import numpy as np


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
