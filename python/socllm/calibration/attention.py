"""shadowAttn's offline profiling (seed 000 §3.2-3.3): head and layer importance, Q/K scales.

Step ``head-importance`` (:func:`calibrate_head_importance`) measures, on WikiText-2 calibration
windows, the loss increase when one head's attention output is zeroed (Eq. 1, ``headImp``) and
when a layer's whole attention output is zeroed (Eq. 2, ``layerImp``); the plans turn them into
per-head keep ratios by Eq. 3 (``attention_scheme.h``: ``head_keep_ratios``). Loss is the mean
next-token NLL (nats) of the window. The fp32 residual stream entering every layer is computed
once per window and each ablation runs only the layers from the ablated one on (the n_heads + 1
ablations of a layer as one batch), instead of the whole model per ablation.

Sample count: the paper profiles 128 samples (on a cloud GPU, §3.2). Here the default is what
finishes for SmolLM2-135M within 15 minutes on 2 cores (``importance_samples`` = 8 windows of
``importance_seqlen`` = 256 tokens: 8 x 30 layers x 10 ablations; docs/RESULTS.md has the
measured time); ``importance_samples=128`` is the paper's setting, run as a script.

Step ``qk-scales`` (:func:`calibrate_qk_scales`) records per calibration window the max |x| of
every head's post-RoPE Q and K (and V, for npu-int8's static V scale); a head's scale is
max / 127 (per-tensor = per-head INT8, §3.3 Fig. 7). The bucket grid is derived at plan time
from the mean scale of each head times powers of the step (``bucket_offsets``), so the bucket
count and step are plan options, not calibration output. It uses the calibration windows of
``samples`` x ``seqlen`` (default 128 x 512, the paper's 128 samples).
"""

from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from .. import _core
from .calibrate import CALIB_SLICE_FRACTION, CalibrationData, calibration_windows, corpus_tokens

DEFAULT_IMPORTANCE_SAMPLES = 8
DEFAULT_IMPORTANCE_SEQLEN = 256


def _data_for(model, data: CalibrationData | None, corpus: str) -> CalibrationData:
    """``data``, or empty statistics for ``model`` when no earlier step ran."""
    if data is not None:
        return data
    provenance = {
        "corpus": corpus,
        "slice": f"first {CALIB_SLICE_FRACTION:g} of the tokenized wiki.test.raw",
    }
    return CalibrationData(_core.Calibration.empty_for(model._model), provenance)


def _with_provenance(data, step, samples, seqlen, seed, corpus) -> CalibrationData:
    """Records a step's windows (``{step}_samples`` ...) in ``data.provenance``."""
    for key, value in (
        ("samples", samples),
        ("seqlen", seqlen),
        ("seed", seed),
        ("corpus", corpus),
    ):
        data.provenance[f"{step}_{key}"] = value
    return data


def head_importance(model, windows: list[list[int]], progress: bool = True):
    """(head_importance [n_layers, n_heads], layer_importance [n_layers]) float32: the mean over
    windows of loss(ablated) - loss(fp32), in nats per token (Eq. 1, Eq. 2)."""
    cfg = model.config
    n_layers, n_heads = cfg["n_layers"], cfg["n_heads"]
    masks = np.ones((n_heads + 1, n_heads), dtype=np.float32)
    masks[np.arange(n_heads), np.arange(n_heads)] = 0.0  # one head zeroed per row ...
    masks[n_heads] = 0.0  # ... and the whole layer's attention in the last
    heads = np.zeros((n_layers, n_heads), dtype=np.float64)
    layers = np.zeros(n_layers, dtype=np.float64)
    bar = tqdm(
        total=len(windows) * n_layers,
        desc="calibrate head-importance",
        unit="layer",
        disable=not progress,
    )
    for w in windows:
        xs = model._engine.layer_inputs(w)
        base = -float(np.mean(model.token_logprobs([w], "fp32")[0], dtype=np.float64))
        for layer in range(n_layers):
            lp = model._engine.ablation_logprobs(w, layer, xs[layer], masks)
            loss = -lp.astype(np.float64).mean(axis=1)
            heads[layer] += loss[:n_heads] - base
            layers[layer] += loss[n_heads] - base
            bar.update()
    bar.close()
    n = max(len(windows), 1)
    return (heads / n).astype(np.float32), (layers / n).astype(np.float32)


def calibrate_head_importance(
    model,
    data: CalibrationData | None,
    *,
    corpus: str = "wikitext2",
    samples: int = DEFAULT_IMPORTANCE_SAMPLES,
    seqlen: int = DEFAULT_IMPORTANCE_SEQLEN,
    seed: int = 0,
    progress: bool = True,
) -> CalibrationData:
    """Adds head_importance and layer_importance to ``data`` (created if None)."""
    data = _data_for(model, data, corpus)
    windows = calibration_windows(corpus_tokens(model, corpus), samples, seqlen, seed)
    h, layer = head_importance(model, windows, progress)
    data.stats.set_array("head_importance", None, h)
    data.stats.set_array("layer_importance", None, layer)
    return _with_provenance(data, "head_importance", samples, seqlen, seed, corpus)


def calibrate_qk_scales(
    model,
    data: CalibrationData | None,
    *,
    corpus: str = "wikitext2",
    samples: int = 128,
    seqlen: int = 512,
    seed: int = 0,
    progress: bool = True,
) -> CalibrationData:
    """Adds q_absmax, k_absmax, v_absmax ([windows, n_layers, heads]) to ``data``."""
    data = _data_for(model, data, corpus)
    windows = calibration_windows(corpus_tokens(model, corpus), samples, seqlen, seed)
    fresh = _core.Calibration.empty_for(model._model)
    for w in tqdm(windows, desc="calibrate qk-scales", unit="win", disable=not progress):
        model._engine.observe_attention_scales([w], fresh)
    for name in ("q_absmax", "k_absmax", "v_absmax"):
        data.stats.set_array(name, None, fresh.array(name))
    return _with_provenance(data, "qk_scales", samples, seqlen, seed, corpus)
