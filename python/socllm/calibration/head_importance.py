"""``importance_method=taylor`` of step head-importance: the first-order (Taylor) estimate of
shadowAttn's head and layer importance (seed 000 §3.2, Eq. 1-2), as Michel et al. 2019 ("Are
Sixteen Heads Really Better than One?", §4.1) estimate it.

Eq. 1 is the increase of the window's mean next-token NLL when head h's attention output (the
input of ``o_proj``, viewed as ``[n_heads, head_dim]``) is zeroed; the exact step
(``cpp/calibrate/head_importance.cpp``) runs that ablation for every head and layer, about 155
forward passes a window. Put a gate xi_{l,h} (1 everywhere) on each head's output: zeroing the
head is xi_{l,h}: 1 -> 0, so to first order

    headImp_{l,h} ~ L(xi with xi_{l,h} = 0) - L(1) ~ -dL/dxi_{l,h},
    layerImp_l    ~ -sum_h dL/dxi_{l,h}   (every gate of the layer 1 -> 0),

signed like the exact numbers, and one backward pass gives every gate's derivative. L is what
the C++ step differentiates by ablation: each window's mean NLL over its predicted tokens, and
the importances are averaged over windows, so the gradient of the mean of the windows' losses
is the average of the windows' estimates.

The derivatives are taken in torch, on the transformers model of the same weights, built from
the socllm file (:func:`reference_model`); weights need no gradient, so the backward pass
computes activation gradients only (about one forward pass more). It needs socllm's optional
extra ``reference`` (torch, transformers); nothing here imports them before it is called.
"""

from __future__ import annotations

import re

import numpy as np
from tqdm.auto import tqdm

from ..errors import InvalidArgumentError, UnsupportedError

# Windows per forward/backward pass: for SmolLM2-135M at 512 tokens on 2 (busy) cores, 4.72,
# 4.20 and 4.59 s a window with 1, 2 and 4 (and 8.8 with 8 on a busier machine).
TAYLOR_BATCH = 2

# The architectures whose torch model is built from the socllm file. Gemma 3 is not among them
# for a reason beyond the builder: its attention output passes a norm (post_attention_layernorm)
# before the residual, so scaling all of a layer's heads is invisible to first order and every
# layerImp_l is ~0 (measured on transformers' Gemma-3-270M: per-layer sums ~1e-7 against head
# gradients ~1e-2); its importance needs the ablation.
TAYLOR_ARCHS = ("llama", "qwen2")

# The reference must score the first window as the engine does (mean NLL, nats/token): a larger
# gap means it is another model, not rounding (SmolLM2-135M: ~1e-5).
_SAME_MODEL_TOLERANCE = 1e-3

_INSTALL = "pip install -e '.[reference]' in a socllm checkout (torch==2.13.0 CPU first)"


def _require_torch(what: str):
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        raise UnsupportedError(
            f"{what} needs torch and transformers (socllm's optional extra 'reference'), "
            f"which are not installed ({e.name or e}): {_INSTALL}"
        ) from None
    return torch


def _from_model_file(model, torch):
    """transformers' model of a llama or qwen2 socllm .h5 file (fp32 weights in Hugging Face
    orientation, docs/MODEL_FORMAT.md): its config and its weights, no conversion."""
    import h5py
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from ..io.convert import hf_tensor_names

    c = dict(model.config)
    if c["arch"] not in TAYLOR_ARCHS:
        raise UnsupportedError(
            f"head-importance: importance_method=taylor builds the torch model of a llama or "
            f"qwen2 model file, not of {model.path} ({c['arch']!r}): use "
            f"importance_method=ablation"
        )
    bias = bool(c["qkv_bias"])
    kwargs = dict(
        vocab_size=c["vocab_size"],
        hidden_size=c["d_model"],
        intermediate_size=c["d_ff"],
        num_hidden_layers=c["n_layers"],
        num_attention_heads=c["n_heads"],
        num_key_value_heads=c["n_kv_heads"],
        head_dim=c["head_dim"],
        max_position_embeddings=c["context_length"],
        rope_theta=float(c["rope_theta"]),
        rms_norm_eps=float(c["rms_eps"]),
        tie_word_embeddings=bool(c["tie_embeddings"]),
        hidden_act="silu",
    )
    # q/k/v biases without an o_proj bias are Qwen2's layout (llama's attention_bias adds both)
    config = Qwen2Config(**kwargs) if bias else LlamaConfig(**kwargs, attention_bias=False)
    cls = Qwen2ForCausalLM if bias else LlamaForCausalLM
    names, per_layer = hf_tensor_names()
    state = {}
    with h5py.File(model.path, "r") as f:
        w = f["weights"]
        for ours, theirs in names.items():
            if ours in w:
                state[theirs] = torch.from_numpy(w[ours][()])
        for i in range(c["n_layers"]):
            g = w[f"layers/{i}"]
            for ours, theirs in per_layer.items():
                if ours in g:
                    state[f"model.layers.{i}.{theirs}"] = torch.from_numpy(g[ours][()])
    ref = cls(config)  # (its random initialization is replaced below)
    expected = set(ref.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(state))
    if missing:
        raise UnsupportedError(
            f"head-importance: importance_method=taylor needs the fp32 weights of {model.path}, "
            f"which has no {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
            f"(a prequantized file runs only its packed plan): use importance_method=ablation "
            f"or the original model"
        )
    ref.load_state_dict(state, strict=False)
    if config.tie_word_embeddings:
        ref.tie_weights()
    return ref.float().eval()


def reference_model(model):
    """The transformers model (fp32, eval mode, no weight gradients) of socllm ``model``, built
    from its socllm file's config and fp32 weights: the weights the engine runs (llama, qwen2).
    An UnsupportedError says what is missing (torch, transformers, an architecture, fp32
    weights).

    (Not :func:`socllm.reference.load_reference`: it covers only the built-in models, and this
    package importing it would close the import cycle calibration -> reference ->
    eval.perplexity -> calibration.)"""
    torch = _require_torch("head-importance with importance_method=taylor")
    ref = _from_model_file(model, torch)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _o_projs(ref, n_layers: int, width: int) -> list:
    """The ``o_proj`` of every layer, in layer order, checked against the socllm model."""
    found = {}
    for name, module in ref.named_modules():
        m = re.search(r"layers\.(\d+)\.self_attn\.o_proj$", name)
        if m:
            found[int(m[1])] = module
    if sorted(found) != list(range(n_layers)) or any(
        getattr(found[i], "in_features", width) != width for i in found
    ):
        raise UnsupportedError(
            f"head-importance: the torch reference has o_proj in layers {sorted(found)}, not "
            f"one of width {width} in each of the model's {n_layers} layers"
        )
    return [found[i] for i in range(n_layers)]


class GatedReference:
    """A transformers model with a gate xi [n_layers, n_heads] on every head's attention output
    (the input of ``o_proj``, scaled per head): :meth:`window_nll` is each window's mean
    next-token NLL as a function of the gate, :meth:`gate_gradient` the derivative of their sum
    at 1."""

    def __init__(self, ref, n_layers: int, n_heads: int, head_dim: int):
        import torch

        self.torch, self.ref = torch, ref
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.gate = None  # [n_layers, n_heads], set by loss()
        self._hooks = [
            o.register_forward_pre_hook(self._hook(layer))
            for layer, o in enumerate(_o_projs(ref, n_layers, n_heads * head_dim))
        ]

    def _hook(self, layer: int):
        def scale(module, args):
            (x, *rest) = args
            g = self.gate[layer].to(x.dtype)
            y = x.reshape(*x.shape[:-1], self.n_heads, self.head_dim) * g[:, None]
            return (y.reshape(x.shape), *rest)

        return scale

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def window_nll(self, windows: list[list[int]], gate):
        """[len(windows)] each window's mean next-token NLL (nats/token) under ``gate``
        (windows of one length)."""
        torch = self.torch
        self.gate = gate
        ids = torch.tensor(windows, dtype=torch.long)
        logits = self.ref(input_ids=ids).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        return nll.view(len(windows), -1).mean(1)

    def gate_gradient(self, windows: list[list[int]]):
        """(d/dxi of the sum of the windows' mean NLL at xi = 1, [n_layers, n_heads] float64
        numpy; the windows' mean NLL at xi = 1, numpy)."""
        torch = self.torch
        dtype = next(self.ref.parameters()).dtype
        gate = torch.ones(self.n_layers, self.n_heads, dtype=dtype, requires_grad=True)
        nll = self.window_nll(windows, gate)
        (grad,) = torch.autograd.grad(nll.sum(), gate)
        return grad.double().numpy(), nll.detach().double().numpy()


def taylor_importance(
    model,
    windows: list[list[int]],
    *,
    ref=None,
    batch: int = TAYLOR_BATCH,
    threads: int | None = None,
    progress: bool = True,
    check_engine: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(head importance [n_layers, n_heads], layer importance [n_layers]), float64: the
    first-order estimates of the exact step's numbers on ``windows`` (module docstring),
    ``batch`` windows of one length per forward/backward pass, torch on ``threads`` threads
    (default socllm's). ``ref``: the transformers model (default :func:`reference_model`).
    With ``check_engine``, the reference's NLL of the first window must be the engine's fp32
    one (an InvalidArgumentError otherwise: it is another model)."""
    from .. import _core

    torch = _require_torch("head-importance with importance_method=taylor")
    if not windows:
        raise InvalidArgumentError("head-importance: no windows")
    for i, w in enumerate(windows):
        if len(w) < 2:
            raise InvalidArgumentError(
                f"[calibrate] head-importance: window {i} has {len(w)} tokens (needs at least 2)"
            )
    c = model.config
    L, H = int(c["n_layers"]), int(c["n_heads"])
    if ref is None:
        ref = reference_model(model)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads or _core.num_threads())
    gated = GatedReference(ref, L, H, int(c["head_dim"]))
    grad = np.zeros((L, H))
    by_length: dict[int, list[list[int]]] = {}
    for w in windows:
        by_length.setdefault(len(w), []).append(list(w))
    bar = tqdm(
        total=len(windows),
        desc="calibrate head-importance (taylor)",
        unit=" windows",
        disable=not progress,
    )
    engine = None
    if check_engine:  # the engine's NLL of the first window batched (before any torch work)
        w0 = next(iter(by_length.values()))[0]
        engine = -float(np.mean(model.token_logprobs([w0], "fp32")[0], dtype=np.float64))
    try:
        for group in by_length.values():
            for b in range(0, len(group), batch):
                g, nll = gated.gate_gradient(group[b : b + batch])
                if engine is not None:
                    if not abs(engine - nll[0]) <= _SAME_MODEL_TOLERANCE:
                        raise InvalidArgumentError(
                            f"head-importance: the torch model of {model.path} scores a window "
                            f"at {nll[0]:.6f} nats/token, the engine at {engine:.6f}: not the "
                            f"same model"
                        )
                    engine = None
                grad += g
                bar.update(len(group[b : b + batch]))
    finally:
        bar.close()
        gated.close()
        torch.set_num_threads(previous_threads)
    heads = -grad / len(windows)
    return heads, heads.sum(1)
