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

With ``bit_scope="global-ttft"`` (beyond the paper, issue 14 item 6) the stored bit-widths come
instead from one heap over every output channel of the model (``allocate_bits_budgeted``) with
a cold-start time budget: the modelled time of the per-tensor allocation at ``bits``, so the
two are compared at equal TTFT. A channel's cost at B bits is its flash bytes over the device's
flash bandwidth plus its unpacking time (``cold_start_cost_table``). Its error is the closed
form weighted by what the channel contributes to its tensor's output,
e_i(B) = RE_i(B) · ||W'_i||² · mean_j E[x'_j²] / E[||y||²] (W', x': the smoothed weights and
inputs; E over the smoothing step's samples): the uniform-rounding estimate of the channel's
share of its tensor's relative output error ||ΔY||² / ||Y||² up to a constant, the quantity
step smoothing minimises, so summing it over the model weighs every tensor's relative output
error equally (our choice: the paper allocates within a tensor only). ``bit_importance``
selects this (``output-share``), the absolute output error without the per-tensor division
(``output-absolute``) or the plain closed form, every channel alike (``none``).
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
from tqdm.auto import tqdm

from .. import _core
from ..errors import InvalidArgumentError
from ..io.model_format import linear_weights, site_tensors
from .calibrate import calibration_windows, corpus_tokens

SMOOTHING_GRID = np.round(np.linspace(0.0, 1.0, int(_core.Calibration.smooth_alpha_grid)), 6)
SMOOTHING_OPTIONS = {
    "bits": 5.0,
    "output_quant": "int8",
    "smoothing_windows": 8,
    "smoothing_rows": 128,
}
BITWIDTH_SCOPES = ("per-tensor", "global-ttft")
# What a channel's error is weighted by in the global heap (module doc): its share of its
# tensor's output error (default), its absolute output error, or nothing (plain RE).
BIT_IMPORTANCE = ("output-share", "output-absolute", "none")
BITWIDTH_OPTIONS = {
    "bits": 5.0,
    "bit_scope": "per-tensor",
    "cost_device": "snapdragon-8elite",
    "bit_importance": "output-share",
    "smoothing_windows": 8,
    "smoothing_rows": 128,
}
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


def cold_start_cost_table(in_features: np.ndarray, device: str) -> tuple[np.ndarray, dict]:
    """[channels, 8] modelled cold-start seconds of a channel of ``in_features`` weights at
    1..8 bits on ``device``: (B/8 bytes per weight + its fp32 scale + 3 bits of width
    metadata) / flash bandwidth, plus unpacking at the profile's weightlet rate (its number is
    for the paper's mix; we take it as the 5-bit rate) times the measured time of a B-bit
    weightlet mix relative to 5 bits. Returns the table and the inputs with their sources."""
    from ..devices import load_profile

    prof = load_profile(device)
    try:
        flash = prof["cost_model"]["memory"]["flash_gbps"]
        rate = prof["cost_model"]["cpu"]["unpack_weightlet_gweights_s"]
        rel = prof["processors"]["cpu_all"]["unpack_weightlet_relative_time_by_bits"]
    except KeyError as e:
        raise InvalidArgumentError(
            f"calibrate bitwidths: device {device!r} has no cold-start costs (missing {e}); "
            "bit_scope global-ttft needs flash_gbps, unpack_weightlet_gweights_s and "
            "unpack_weightlet_relative_time_by_bits"
        ) from None
    b = np.arange(1, 9, dtype=np.float64)
    n = np.asarray(in_features, np.float64)[:, None]
    flash_s_per_byte = 1.0 / (flash["value"] * 1e9)
    unpack_s_per_weight = np.asarray(rel["value"], np.float64) / (rate["value"] * 1e9)
    table = n * (b / 8.0 * flash_s_per_byte + unpack_s_per_weight) + (4.0 + 3.0 / 8.0) * (
        flash_s_per_byte
    )
    sources = {
        k: {"value": v["value"], "source": v["source"]}
        for k, v in (("flash_gbps", flash), ("unpack_gweights_s", rate), ("unpack_relative", rel))
    }
    return table, sources


def _global_ttft_bits(
    model, data, tensors, device: str, importance: str, windows: int, rows: int, progress: bool
) -> tuple[dict, dict]:
    """Channel bits per (layer, tensor) from one heap over every channel at the per-tensor
    allocation's modelled cold-start time, and the report (module doc)."""
    X = linear_input_samples(model, data.provenance, windows, rows, progress)
    errors, widths, per_tensor = [], [], []
    for t in tqdm(tensors, desc="calibrate bitwidths: weights", disable=not progress):
        x = X[(t["layer"], t["site"])].astype(np.float64)
        if t["s_in"].size:
            x = x / t["s_in"][None, :]
        Ws = t["Ws"].astype(np.float64)
        weight = (Ws * Ws).sum(1) * float((x * x).mean())  # E||ΔY_i||² / RE_i, up to 1/3
        if importance == "output-share":
            weight /= float(((x @ Ws.T) ** 2).sum(1).mean()) or 1.0
        elif importance == "none":
            weight = np.ones_like(weight)
        errors.append(t["closed"] * weight[:, None])
        widths.append(np.full(Ws.shape[0], Ws.shape[1]))
        per_tensor.append(t["alloc"])
    E, n_in = np.concatenate(errors), np.concatenate(widths)
    C, sources = cold_start_cost_table(n_in, device)
    pt = np.concatenate(per_tensor).astype(np.uint8)
    budget = float(_core.quant.allocation_cost(C, pt))
    g = _core.quant.allocate_bits_budgeted(E, C, budget)
    out, kinds, start = {}, {}, 0
    for t in tensors:
        n_out, n_in_t = t["Ws"].shape
        gb = out[(t["layer"], t["tensor"])] = g[start : start + n_out]
        start += n_out
        k = kinds.setdefault(t["tensor"], {"weights": 0, "per_tensor": 0.0, "global": 0.0})
        k["weights"] += t["Ws"].size
        k["per_tensor"] += float(t["alloc"].astype(np.float64).sum() * n_in_t)
        k["global"] += float(gb.astype(np.float64).sum() * n_in_t)
    w = n_in.astype(np.float64)
    report = {
        "device": device,
        "importance": importance,
        "cost_inputs": sources,
        "budget_s": budget,
        "global_s": float(_core.quant.allocation_cost(C, g)),
        "per_tensor_mean_bits": float((pt * w).sum() / w.sum()),
        "global_mean_bits": float((g * w).sum() / w.sum()),
        "per_tensor_weighted_error": float(_core.quant.allocation_error(E, pt)),
        "global_weighted_error": float(_core.quant.allocation_error(E, g)),
        "weight_share_by_bits": {
            "per_tensor": [float(w[pt == b].sum() / w.sum()) for b in range(1, 9)],
            "global": [float(w[g == b].sum() / w.sum()) for b in range(1, 9)],
        },
        "mean_bits_by_tensor": {
            name: {
                "per_tensor": k["per_tensor"] / k["weights"],
                "global": k["global"] / k["weights"],
            }
            for name, k in kinds.items()
        },
    }
    return out, report


def calibrate_bitwidths(
    model,
    data,
    *,
    bits: float = 5.0,
    bit_scope: str = "per-tensor",
    cost_device: str = "snapdragon-8elite",
    bit_importance: str = "output-share",
    smoothing_windows: int = 8,
    smoothing_rows: int = 128,
    progress: bool = True,
):
    """Adds channel_bits and the bitwidth_report attribute to ``data`` (module doc)."""
    _check_bits(bits)
    if bit_scope not in BITWIDTH_SCOPES:
        raise InvalidArgumentError(
            f"calibrate bitwidths: bit_scope must be one of {', '.join(BITWIDTH_SCOPES)}, "
            f"got {bit_scope!r}"
        )
    if bit_importance not in BIT_IMPORTANCE:
        raise InvalidArgumentError(
            f"calibrate bitwidths: bit_importance must be one of {', '.join(BIT_IMPORTANCE)}, "
            f"got {bit_importance!r}"
        )
    stats = data.stats
    n_layers = stats.array("act_absmax", "attn_in").shape[0]
    plan = f"edgeflow:bits={bits!r}"  # the calibrated smoothing of step smoothing
    weights = linear_weights(model.path, model.config)
    tensors_of = site_tensors(model.config)
    b_int = int(round(bits))
    rows, tensors = [], []
    per_site = {s: [] for s in SITES}
    with using_calibration(model, stats):
        todo = [(layer, site) for layer in range(n_layers) for site in SITES]
        for layer, site in tqdm(todo, desc="calibrate bitwidths", disable=not progress):
            info = model.linear_info(plan, layer, site)
            per_site[site].append(info["bits"].astype(np.int64))
            s_in = np.asarray(info["input_smoothing"], np.float32)
            start = 0
            for name in tensors_of[site]:
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
                if bit_scope == "global-ttft":
                    tensors.append(
                        dict(
                            layer=layer,
                            site=site,
                            tensor=name,
                            Ws=Ws,
                            s_in=s_in,
                            closed=closed,
                            alloc=alloc.copy(),
                        )
                    )
    global_report = None
    if bit_scope == "global-ttft":
        chosen, global_report = _global_ttft_bits(
            model,
            data,
            tensors,
            cost_device,
            bit_importance,
            smoothing_windows,
            smoothing_rows,
            progress,
        )
        per_site = {
            site: [
                np.concatenate([chosen[(layer, n)] for n in tensors_of[site]]).astype(np.int64)
                for layer in range(n_layers)
            ]
            for site in SITES
        }
        for r in rows:
            r["global_mean_bits"] = float(chosen[(r["layer"], r["tensor"])].mean())
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
        "bit_scope": bit_scope,
        "global_ttft": global_report,
        "per_tensor": rows,
    }
    data.provenance["bitwidth_report"] = json.dumps(summary)
    data.provenance["bitwidth_bits"] = bits
    data.provenance["bitwidth_scope"] = bit_scope
    return data
