"""Offline calibration of static activation scales (seed 001 §2.3, §3.3).

``calibrate_act_scales`` runs the fp32 model over calibration windows and records, for every
linear input of every layer, the per-channel maximum of |x|. Plans with static per-tensor
scales (``w8a8``, ``smoothquant``...) fix their scales from these maxima when their graphs are
built (symmetric max-min: scale = max|x| / 127).

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

from . import __version__, _core
from .errors import FormatError, InvalidArgumentError, MissingFileError
from .io_utils import atomic_path

CALIB_SLICE_FRACTION = 0.25  # calibration windows come from the first quarter of the tokens
FORMAT = "socllm-calibration"
FORMAT_VERSION = 1


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
    cal = _core.Calibration.empty_for(model._model)
    for w in tqdm(windows, desc="calibrate act-scales", unit="win", disable=not progress):
        model._engine.observe_activations([w], cal)
    provenance = {
        "corpus": corpus,
        "samples": samples,
        "seqlen": seqlen,
        "seed": seed,
        "slice": f"first {CALIB_SLICE_FRACTION:g} of the tokenized wiki.test.raw",
        "steps": "act-scales",
    }
    return CalibrationData(cal, provenance)


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
        g = f.create_group("act_absmax")
        for site in _core.Calibration.sites():
            g.create_dataset(site, data=cal.absmax(site))
    return path


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
        for site in _core.Calibration.sites():
            if f"act_absmax/{site}" not in f:
                raise FormatError(f"{path} lacks act_absmax/{site}")
            cal.set(site, np.asarray(f[f"act_absmax/{site}"]))
        cal.tokens = int(f.attrs.get("tokens", 0))
        provenance = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
    return CalibrationData(cal, provenance)
