"""EdgeFlow's offline steps (seed 004 §4.1): NPU-aware smoothing and per-channel bit-widths.

Step ``smoothing`` fixes, for every linear input of every layer, the exponent α of the input
smoothing S_I^α (S_I: the calibrated per-channel max |x|, step act-scales) by grid search over
α = 0, 0.1, ..., 1: the linear is built as plan ``edgeflow`` builds it (weights at ``bits`` per
tensor by Algorithm 1, output smoothing β = 1, static per-tensor int8 activations and
``output_quant`` outputs) with that α, run on calibration inputs, and the α with the smallest
relative output error ||Y_q - Y||² / ||Y||² against fp32 is kept. The paper searches α "per
linear"; the linears sharing an input (q/k/v, gate/up) share it here, because one divisor
folded into the preceding norm serves all of them. Samples: ``smoothing_rows`` random rows of
each of the first ``smoothing_windows`` act-scales windows (same corpus, length and seed).

Step ``bitwidths`` stores the bit-width of every output channel that plan ``edgeflow`` at
``bits`` allocates (per tensor, Algorithm 1 on the closed-form metric, on the smoothed weights)
and reports, per weight tensor, how well the closed form ranks channels against the exact
cosine distance (Spearman correlation at the average bit-width) and whether the heap's integer
optimum differs from the rounded water-filling solution the closed form implies (channels that
differ, summed-error gap); the report is the root attribute ``bitwidth_report`` (JSON).
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
from tqdm.auto import tqdm

from . import _core
from .calibrate import calibration_windows, corpus_tokens
from .errors import InvalidArgumentError
from .model_format import SITE_TENSORS, linear_weights

SMOOTHING_GRID = np.round(np.linspace(0.0, 1.0, int(_core.Calibration.smooth_alpha_grid)), 6)
SMOOTHING_OPTIONS = {
    "bits": 5.0,
    "output_quant": "int8",
    "smoothing_windows": 8,
    "smoothing_rows": 128,
}
BITWIDTH_OPTIONS = {"bits": 5.0}
SITES = tuple(_core.Calibration.sites())  # the linear input sites, in block order


@contextlib.contextmanager
def using_calibration(model, stats):
    """``model`` runs with ``stats`` inside the block, its previous calibration after it."""
    previous = (model.calibration, model.calibration_path, model.calibration_provenance)
    model.set_calibration(stats)
    try:
        yield
    finally:
        model.set_calibration(previous[0])
        model.calibration_path, model.calibration_provenance = previous[1], previous[2]


def _check_bits(bits: float) -> None:
    if not 1.0 <= bits <= 8.0:
        raise InvalidArgumentError(f"calibrate: --bits must be in [1, 8], got {bits}")


def linear_input_samples(model, provenance: dict, windows: int, rows: int, progress: bool):
    """{(layer, site): [n, width]} fp32 linear inputs at random rows of the first ``windows``
    calibration windows of act-scales."""
    p = provenance
    wins = calibration_windows(
        corpus_tokens(model, p["corpus"]), p["samples"], p["seqlen"], p["seed"]
    )[:windows]
    rng = np.random.default_rng(p["seed"])
    parts: dict = {}
    for w in tqdm(wins, desc="calibrate smoothing: samples", unit="win", disable=not progress):
        pick = np.sort(rng.choice(len(w), size=min(rows, len(w)), replace=False)).tolist()
        for layer, sites in enumerate(model.linear_inputs(w, pick)):
            for site, x in sites.items():
                parts.setdefault((layer, site), []).append(x)
    return {k: np.concatenate(v) for k, v in parts.items()}


def calibrate_smoothing(
    model,
    data,
    *,
    bits: float = 5.0,
    output_quant: str = "int8",
    smoothing_windows: int = 8,
    smoothing_rows: int = 128,
    progress: bool = True,
):
    """Adds smooth_alpha and smooth_alpha_error to ``data`` (module doc). Returns ``data``."""
    _check_bits(bits)
    if smoothing_windows < 1 or smoothing_rows < 1:
        raise InvalidArgumentError(
            "calibrate smoothing: smoothing_windows and smoothing_rows must be >= 1, got "
            f"{smoothing_windows}, {smoothing_rows}"
        )
    plan = f"edgeflow:bits={bits!r},output_quant={output_quant},alpha=0"
    _core.Plan(plan)  # a bad output_quant is reported before any work
    stats, n_layers = data.stats, data.stats.array("act_absmax", "attn_in").shape[0]
    X = linear_input_samples(model, data.provenance, smoothing_windows, smoothing_rows, progress)
    alpha = {s: np.zeros(n_layers, np.float32) for s in SITES}
    error = {s: np.zeros((n_layers, len(SMOOTHING_GRID)), np.float32) for s in SITES}
    with using_calibration(model, stats):
        todo = [(layer, site) for layer in range(n_layers) for site in SITES]
        for layer, site in tqdm(todo, desc="calibrate smoothing: alpha", disable=not progress):
            x = X[(layer, site)]
            y = model.linear_forward("fp32", layer, site, x).astype(np.float64)
            den = float((y * y).sum()) or 1.0
            for i, a in enumerate(SMOOTHING_GRID):
                yq = model.linear_forward(plan, layer, site, x, alpha=float(a))
                error[site][layer, i] = ((yq - y) ** 2).sum() / den
            alpha[site][layer] = SMOOTHING_GRID[int(np.argmin(error[site][layer]))]
    for site in SITES:
        stats.set_array("smooth_alpha", site, alpha[site])
        stats.set_array("smooth_alpha_error", site, error[site])
    data.provenance.update(
        smoothing_bits=bits,
        smoothing_output_quant=output_quant,
        smoothing_windows=smoothing_windows,
        smoothing_rows=smoothing_rows,
        smoothing_grid=json.dumps(SMOOTHING_GRID.tolist()),
    )
    return data


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def calibrate_bitwidths(model, data, *, bits: float = 5.0, progress: bool = True):
    """Adds channel_bits and the bitwidth_report attribute to ``data`` (module doc)."""
    _check_bits(bits)
    stats = data.stats
    n_layers = stats.array("act_absmax", "attn_in").shape[0]
    plan = f"edgeflow:bits={bits!r}"  # the calibrated smoothing of step smoothing
    weights = linear_weights(model.path)
    b_int = int(round(bits))
    rows = []
    per_site = {s: [] for s in SITES}
    with using_calibration(model, stats):
        todo = [(layer, site) for layer in range(n_layers) for site in SITES]
        for layer, site in tqdm(todo, desc="calibrate bitwidths", disable=not progress):
            info = model.linear_info(plan, layer, site)
            per_site[site].append(info["bits"].astype(np.int64))
            s_in = np.asarray(info["input_smoothing"], np.float32)
            start = 0
            for name in SITE_TENSORS[site]:
                W = weights[(layer, name)]
                Ws = W * s_in[None, :] if s_in.size else W  # what the allocation sees
                alloc = info["bits"][start : start + W.shape[0]]
                start += W.shape[0]
                closed = _core.quant.error_table(Ws, "closed-form")
                exact = _core.quant.error_table(Ws, "exact")
                total = int(alloc.astype(np.int64).sum())
                wf = _core.quant.allocate_bits_waterfill(Ws, total)
                idx = np.arange(W.shape[0])
                e_heap = float(closed[idx, alloc.astype(int) - 1].sum())
                e_wf = float(closed[idx, wf.astype(int) - 1].sum())
                rows.append(
                    {
                        "layer": layer,
                        "tensor": name,
                        "rows": int(W.shape[0]),
                        "mean_bits": float(alloc.mean()),
                        "spearman_closed_vs_exact": _spearman(
                            closed[:, b_int - 1], exact[:, b_int - 1]
                        ),
                        "heap_vs_waterfill_channels": int((wf != alloc).sum()),
                        "waterfill_error_over_heap": e_wf / e_heap if e_heap > 0 else 1.0,
                    }
                )
    for site in SITES:
        stats.set_array("channel_bits", site, np.stack(per_site[site]))
    rho = np.array([r["spearman_closed_vs_exact"] for r in rows], np.float64)
    summary = {
        "bits": bits,
        "plan": plan,
        "tensors": len(rows),
        "spearman_median": float(np.nanmedian(rho)),
        "spearman_min": float(np.nanmin(rho)),
        "tensors_where_heap_differs_from_waterfill": int(
            sum(r["heap_vs_waterfill_channels"] > 0 for r in rows)
        ),
        "max_waterfill_error_over_heap": float(max(r["waterfill_error_over_heap"] for r in rows)),
        "per_tensor": rows,
    }
    data.provenance["bitwidth_report"] = json.dumps(summary)
    data.provenance["bitwidth_bits"] = bits
    return data
