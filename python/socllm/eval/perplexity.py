"""The perplexity protocol (README "Perplexity protocol"), written once: the sliding windows
that socllm's engine (:meth:`socllm.LanguageModel.perplexity_eval`) and the transformers
reference (:mod:`socllm.reference`) both score, and the WikiText-2 evaluation of ``socllm eval``
and ``socllm run``.

This module imports no model: functions take a loaded :class:`socllm.LanguageModel`.
"""

from __future__ import annotations

import time

from ..calibration import corpus_tokens, held_out_tokens
from ..data import wikitext2_test_path

DEFAULT_CONTEXT = 2048  # tokens per window: Hugging Face's perplexity recipe (README, protocol)


def sliding_windows(n_tokens: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, keep)`` per scored window of a ``n_tokens`` stream, in the order of
    Hugging Face's loop: windows ``[begin, end)`` of ``context`` tokens start every ``stride``
    tokens; each scores its last ``keep`` predictions, the tokens no earlier window scored (a
    window's first token has no prediction). Windows that would score nothing are left out."""
    out: list[tuple[int, int, int]] = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        keep = min(end - prev_end, end - begin - 1)
        if keep > 0:
            out.append((begin, end, keep))
        prev_end = end
        if end == n_tokens:
            break
    return out


def eval_wikitext2(
    model,
    plan: str,
    *,
    context: int,
    stride: int | None,
    limit_tokens: int | None,
    batch_size: int = 1,
    progress: bool = False,
    heldout: bool = False,
):
    """WikiText-2 test perplexity: (JSON-ready summary, PerplexityResult with per-token NLL).
    ``heldout``: only the tokens after the calibration slice
    (:func:`socllm.calibration.held_out_tokens`)."""
    path = wikitext2_test_path()
    t0 = time.perf_counter()
    ids = corpus_tokens(model)  # the whole file tokenized once (cached)
    kw = {"ids": held_out_tokens(ids) if heldout else ids}
    r = model.perplexity_eval(
        plan=plan,
        **kw,
        context=context,
        stride=stride,
        limit_tokens=limit_tokens,
        batch_size=batch_size,
        progress=progress,
    )
    summary = {
        "task": "wikitext2-heldout" if heldout else "wikitext2",
        "file": str(path),
        "plan": plan if isinstance(plan, str) else plan.name,
        **r.to_dict(),
        "limit_tokens": limit_tokens,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    return summary, r
