"""The reference implementation: transformers + torch (CPU, fp32) on the same GGUF as a
built-in model, scored under socllm's perplexity protocol (:mod:`socllm.eval.perplexity`), so the
engine can be checked against it (tests/python/test_reference.py, scripts/agreement.py,
scripts/lmeval_agreement.py; CLI: scripts/reference_transformers.py).

Needs the optional dependencies of ``socllm[reference]`` (torch, transformers); they are
imported when a function is called, not with this module.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import math
import shutil
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .data import wikitext2_test_path
from .eval.perplexity import sliding_windows
from .io.files import atomic_dir
from .registry import BUILTIN_MODELS, cache_dir, file_digest


def load_reference(model: str = "smollm2-135m", *, cache: bool = True):
    """(tokenizer, model) of transformers for the GGUF file of built-in ``model``, fp32, in
    eval mode.

    With ``cache``, transformers' own conversion of the GGUF (its dequantized fp32 weights,
    config and tokenizer) is saved once under ``cache_dir()/reference`` and loaded from there
    afterwards: seconds instead of gguf-py's parse and dequantization (about 30 s for
    Gemma-3-270M). The entry is keyed on the GGUF's SHA-256 and the versions of transformers,
    torch, gguf-py and tokenizers, so it is the conversion this installation would make; it is
    written to a temp folder and renamed into place, so an interrupted save leaves no entry."""
    gguf = BUILTIN_MODELS[model].path()
    if not cache:
        return _convert_gguf(gguf)
    entry = _reference_cache_entry(gguf)
    if not (entry / _REFERENCE_WEIGHTS).is_file():
        # entries appear complete (renamed into place), so one without weights was damaged
        # by hand: it is replaced, not left to fail every later load
        shutil.rmtree(entry, ignore_errors=True)
        _save_reference(entry, *_convert_gguf(gguf))
    return _load_saved_reference(entry)


_REFERENCE_WEIGHTS = "weights.pt"
_REFERENCE_LIBRARIES = ("transformers", "torch", "gguf", "tokenizers")


def _convert_gguf(gguf: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ref = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    return tok, ref


# Bump when what _convert_gguf or _save_reference produce changes.
_REFERENCE_CACHE_FORMAT = 1


def _reference_cache_entry(gguf: Path) -> Path:
    """The entry's folder: keyed on the GGUF's content and every library in the conversion
    (gguf-py dequantizes the tensors, tokenizers builds the tokenizer)."""
    libs = "|".join(f"{m} {importlib.metadata.version(m)}" for m in _REFERENCE_LIBRARIES)
    key = f"{file_digest(gguf)}|{libs}|format {_REFERENCE_CACHE_FORMAT}"
    return (
        cache_dir() / "reference" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    )


def _save_reference(entry: Path, tok, ref) -> None:
    import torch

    with atomic_dir(entry) as tmp:
        config = copy.deepcopy(ref.config)
        if hasattr(config, "quantization_config"):  # the GGUF loader's marker, not a format
            del config.quantization_config
        config.to_json_file(tmp / "config.json")
        tok.save_pretrained(tmp)
        torch.save(ref.state_dict(), tmp / _REFERENCE_WEIGHTS)  # tied weights stay shared


def _load_saved_reference(entry: Path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(entry)
    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(entry), dtype=torch.float32)
    ref.load_state_dict(torch.load(entry / _REFERENCE_WEIGHTS, weights_only=True), strict=True)
    return tok, ref.eval()


def perplexity(ref, ids: list[int], context: int, stride: int, progress: bool = True) -> dict:
    """Perplexity of the token stream ``ids`` under transformers' model ``ref`` (protocol of
    :func:`socllm.eval.perplexity.sliding_windows`, log-softmax in float64): the keys of
    ``PerplexityResult.to_dict()``."""
    import torch

    nll_parts = []
    spans = sliding_windows(len(ids), context, stride)
    with torch.no_grad():
        for begin, end, keep in tqdm(spans, desc="transformers ppl", disable=not progress):
            window = torch.tensor([ids[begin:end]])
            logits = ref(window).logits[0, :-1].double()
            lp = torch.log_softmax(logits, dim=-1).gather(1, window[0, 1:, None]).squeeze(1)
            nll_parts.append(-lp[-keep:].numpy())
    nll = np.concatenate(nll_parts)
    return {
        "perplexity": math.exp(nll.mean()),
        "nll_mean": float(nll.mean()),
        "n_scored": int(nll.size),
        "n_tokens": len(ids),
        "n_windows": len(spans),
        "context": context,
        "stride": stride,
    }


def wikitext2_perplexity(
    model: str = "smollm2-135m",
    *,
    context: int = 2048,
    stride: int | None = None,
    limit_tokens: int | None = None,
    threads: int = 2,
    progress: bool = True,
) -> dict:
    """WikiText-2 test perplexity of the reference, the whole file tokenized once by
    transformers' tokenizer for the same GGUF (optionally its first ``limit_tokens`` tokens),
    with the implementation's versions and the seconds the scoring took."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    tok, ref = load_reference(model)
    ids = tok(wikitext2_test_path().read_text(encoding="utf-8"))["input_ids"]
    if limit_tokens:
        ids = ids[:limit_tokens]
    t0 = time.perf_counter()
    r = perplexity(ref, ids, context, stride or context, progress=progress)
    r.update(
        implementation=f"transformers {transformers.__version__} + torch {torch.__version__}",
        threads=threads,
        limit_tokens=limit_tokens,
        seconds=round(time.perf_counter() - t0, 1),
    )
    return r
