"""Offline calibration (seed 001 §2.3, §3.3): static activation scales and outlier profiling.

Step ``act-scales`` (:func:`calibrate_act_scales`) runs the fp32 model over calibration windows
and records, for every linear input of every layer, the per-channel maximum of |x| and a
histogram of |x|. Plans with static per-tensor scales (``w8a8``, ``smoothquant``...) fix their
scales from these maxima when their graphs are built (symmetric max-min: scale = max|x| / 127).

Step ``outliers`` (:func:`calibrate_outliers`, llm.npu's shadow outlier execution) fixes each
linear input's outlier threshold t (the NPU's scale is then t / 127):

* ``percentile`` (default, p = 99.99): the p-th percentile of |x| over all calibration values
  of that input, read off the histogram. This is our choice where the paper only says the
  threshold comes from "profiling a large corpora": it makes ~0.01% of values outliers, which
  on SmolLM2 puts 1-25 channels per 512-token window on the CPU, the sparsity of seed 001
  Fig. 10 (0.1-0.3% of channels);
* ``maxmin``: t = the calibration maximum (plain symmetric max-min, w8a8's scale): values
  beyond it exist only when an input exceeds the calibration range.

It then runs the same windows again and counts, per input channel, the values beyond t. From
these counts come the hot channels (smallest set covering a share of the outliers, Fig. 11),
and from max|x| / (t / 127) the outlier importance of each input (Fig. 12) that decides which
inputs' CPU part is pruned; both are recomputed for any share / pruning rate a plan asks for,
and stored in the file for the defaults (80%, 85%).

Calibration data: WikiText-2 raw test, tokenized once. Windows of ``seqlen`` tokens start at
positions drawn (numpy ``default_rng(seed)``, without replacement) from the first
``CALIB_SLICE_FRACTION`` of the token stream only; ``held_out_tokens`` gives the rest, on which
perplexity is reported next to the whole-file number (../shared/datasets/README.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
from tqdm.auto import tqdm

from . import _core
from ._version import __version__
from .errors import FormatError, InvalidArgumentError, MissingFileError
from .io_utils import atomic_path

CALIB_SLICE_FRACTION = 0.25  # calibration windows come from the first quarter of the tokens
FORMAT = "socllm-calibration"
FORMAT_VERSION = 2  # 2: |x| histograms and the optional outlier statistics
OUTLIER_METHODS = ("percentile", "maxmin")
DEFAULT_OUTLIER_PERCENTILE = 99.99
DEFAULT_HOT_SHARE = 0.8
DEFAULT_PRUNING_RATE = 0.85
# arrays of a _core.Calibration per site, as stored in the file (group/site datasets)
STAT_ARRAYS = ("act_absmax", "abs_hist")
OUTLIER_ARRAYS = ("outlier_threshold", "outlier_count", "outlier_seq_channels", "outlier_seqs")


@dataclass
class CalibrationData:
    """Activation statistics (``stats``: a ``_core.Calibration``) and their provenance."""

    stats: object
    provenance: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return int(self.stats.tokens)

    def absmax(self, site: str) -> np.ndarray:
        """[n_layers, width] per-channel max |x| of a linear input site."""
        return self.stats.get(site)


def model_fingerprint(model) -> str:
    """Hash of the model's configuration: a calibration file only fits the model it came from."""
    cfg = json.dumps(dict(model.config), sort_keys=True)
    return hashlib.sha256(cfg.encode()).hexdigest()[:16]


def corpus_tokens(model, corpus: str = "wikitext2") -> list[int]:
    if corpus != "wikitext2":
        raise InvalidArgumentError(f"calibrate: unknown corpus {corpus!r} (known: wikitext2)")
    from .data import wikitext2_test_text

    return model.tokenize(wikitext2_test_text())


def calibration_split(n_tokens: int) -> int:
    """Index of the first token after the calibration slice."""
    return int(n_tokens * CALIB_SLICE_FRACTION)


def calibration_windows(tokens: list[int], samples: int, seqlen: int, seed: int) -> list[list[int]]:
    end = calibration_split(len(tokens))
    if samples < 1 or seqlen < 2:
        raise InvalidArgumentError(
            f"calibrate: need samples >= 1 and seqlen >= 2, got {samples}, {seqlen}"
        )
    starts_avail = end - seqlen + 1
    if starts_avail < samples:
        raise InvalidArgumentError(
            f"calibrate: the calibration slice has {end} tokens, too few for {samples} windows "
            f"of {seqlen}"
        )
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.choice(starts_avail, size=samples, replace=False))
    return [tokens[s : s + seqlen] for s in starts]


def held_out_tokens(tokens: list[int]) -> list[int]:
    """The tokens after the calibration slice (evaluation never sees calibration text)."""
    return tokens[calibration_split(len(tokens)) :]


def calibrate_act_scales(
    model,
    *,
    corpus: str = "wikitext2",
    samples: int = 128,
    seqlen: int = 512,
    seed: int = 0,
    progress: bool = True,
):
    """Per-channel activation absmax of every linear input, as :class:`CalibrationData`."""
    windows = calibration_windows(corpus_tokens(model, corpus), samples, seqlen, seed)
    cal = _observe(model, windows, None, "calibrate act-scales", progress)
    provenance = {
        "corpus": corpus,
        "samples": samples,
        "seqlen": seqlen,
        "seed": seed,
        "slice": f"first {CALIB_SLICE_FRACTION:g} of the tokenized wiki.test.raw",
        "steps": "act-scales",
    }
    return CalibrationData(cal, provenance)


def _observe(model, windows, thresholds: dict | None, desc: str, progress: bool):
    """A fresh _core.Calibration with every window observed (fp32 model); ``thresholds``
    ({site: [n_layers]}) also counts the values beyond them."""
    cal = _core.Calibration.empty_for(model._model)
    for site, t in (thresholds or {}).items():
        cal.set_outlier_thresholds(site, t)
    for w in tqdm(windows, desc=desc, unit="win", disable=not progress):
        model._engine.observe_activations([w], cal)
    return cal


def outlier_thresholds(
    cal: CalibrationData, method: str = "percentile", percentile: float = DEFAULT_OUTLIER_PERCENTILE
) -> dict[str, np.ndarray]:
    """{site: [n_layers] float32} outlier thresholds from act-scales statistics (module doc)."""
    if method not in OUTLIER_METHODS:
        raise InvalidArgumentError(
            f"calibrate: unknown outlier threshold method {method!r} (known: "
            f"{', '.join(OUTLIER_METHODS)})"
        )
    if not 0.0 < percentile <= 100.0:
        raise InvalidArgumentError(f"calibrate: percentile must be in (0, 100], got {percentile}")
    frac = 1.0 if method == "maxmin" else percentile / 100.0
    n_layers = cal.stats.array("act_absmax", "attn_in").shape[0]
    out = {}
    for site in _core.Calibration.sites():
        t = [cal.stats.abs_percentile(layer, site, frac) for layer in range(n_layers)]
        out[site] = np.asarray(t, dtype=np.float32)
        if not np.all(out[site] > 0):
            raise InvalidArgumentError(
                f"calibrate: site {site} has a zero outlier threshold (all-zero activations?)"
            )
    return out


def calibrate_outliers(
    model,
    cal: CalibrationData,
    *,
    method: str = "percentile",
    percentile: float = DEFAULT_OUTLIER_PERCENTILE,
    progress: bool = True,
) -> CalibrationData:
    """Adds the outlier statistics to ``cal`` (from :func:`calibrate_act_scales` on the same
    model): thresholds, then a second pass over the same windows counting per channel the
    values beyond them. Returns ``cal``."""
    p = cal.provenance
    thresholds = outlier_thresholds(cal, method, percentile)
    windows = calibration_windows(
        corpus_tokens(model, p["corpus"]), p["samples"], p["seqlen"], p["seed"]
    )
    counted = _observe(model, windows, thresholds, "calibrate outliers", progress)
    for site in _core.Calibration.sites():
        for name in OUTLIER_ARRAYS:
            cal.stats.set_array(name, site, counted.array(name, site))
    p["steps"] = "act-scales,outliers"
    p["outlier_method"] = method
    p["outlier_percentile"] = percentile if method == "percentile" else 100.0
    return cal


def save_calibration(path: str | os.PathLike, cal, model) -> Path:
    """Writes the statistics atomically (temp file, then rename) with provenance attributes."""
    path = Path(path)
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["format"] = FORMAT
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["socllm_version"] = __version__
        f.attrs["model_name"] = model.config.get("name", "") or ""
        f.attrs["model_fingerprint"] = model_fingerprint(model)
        f.attrs["tokens"] = cal.tokens
        for k, v in cal.provenance.items():
            f.attrs[k] = v
        names = STAT_ARRAYS + (OUTLIER_ARRAYS if cal.stats.has_outlier_stats else ())
        for name in names:
            g = f.create_group(name)
            for site in _core.Calibration.sites():
                g.create_dataset(site, data=cal.stats.array(name, site), compression="gzip")
        if cal.stats.has_outlier_stats:
            _save_shadow_defaults(f, cal)
    return path


def _save_shadow_defaults(f, cal) -> None:
    """What the shadow-outlier plan builds at its default options, for inspection: importance
    [n_layers, 4], pruned [n_layers, 4] and per site a hot-channel mask [n_layers, width]."""
    sites = list(_core.Calibration.sites())
    g = f.create_group("shadow_defaults")
    g.attrs["hot_share"] = DEFAULT_HOT_SHARE
    g.attrs["pruning_rate"] = DEFAULT_PRUNING_RATE
    g.attrs["sites"] = ",".join(sites)
    g.create_dataset("importance", data=cal.stats.outlier_importance())
    cfgs = cal.stats.shadow_configs(DEFAULT_PRUNING_RATE, DEFAULT_HOT_SHARE)
    n_layers = len(cfgs) // len(sites)
    pruned = np.zeros((n_layers, len(sites)), dtype=bool)
    hot = {s: np.zeros_like(cal.absmax(s), dtype=bool) for s in sites}
    for c in cfgs:
        pruned[c["layer"], sites.index(c["site"])] = c["pruned"]
        hot[c["site"]][c["layer"], c["hot_channels"]] = True
    g.create_dataset("pruned", data=pruned)
    for s in sites:
        g.create_dataset(f"hot_mask/{s}", data=hot[s], compression="gzip")


def load_calibration(path: str | os.PathLike, model):
    """Reads a calibration file (:class:`CalibrationData`) for ``model``; a file from another
    model is an InvalidArgumentError."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"calibration file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise FormatError(f"{path} is not a readable HDF5 calibration file ({e})") from e
    with f:
        if f.attrs.get("format") != FORMAT:
            raise FormatError(f"{path} is not a socllm calibration file (format attribute missing)")
        fp = f.attrs.get("model_fingerprint")
        if fp != model_fingerprint(model):
            raise InvalidArgumentError(
                f"{path} was calibrated on model {f.attrs.get('model_name')!r} "
                f"(fingerprint {fp}), not on this one ({model_fingerprint(model)})"
            )
        cal = _core.Calibration.empty_for(model._model)
        optional = ("abs_hist",) + (OUTLIER_ARRAYS if "outlier_threshold" in f else ())
        for name in ("act_absmax",) + optional:
            for site in _core.Calibration.sites():
                if f"{name}/{site}" not in f:
                    if name == "abs_hist":  # format 1 files have no histograms
                        continue
                    raise FormatError(f"{path} lacks {name}/{site}")
                cal.set_array(name, site, np.asarray(f[f"{name}/{site}"]))
        cal.tokens = int(f.attrs.get("tokens", 0))
        provenance = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
    return CalibrationData(cal, provenance)
