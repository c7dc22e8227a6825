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
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .. import _core
from .._version import __version__
from ..errors import InvalidArgumentError
from ..io.files import atomic_path

CALIB_SLICE_FRACTION = 0.25  # calibration windows come from the first quarter of the tokens
OUTLIER_METHODS = ("percentile", "maxmin")
DEFAULT_OUTLIER_PERCENTILE = 99.99
# arrays the outliers step writes (the artifact schema is the C++ core's, calibration.h)
OUTLIER_ARRAYS = tuple(a["name"] for a in _core.Calibration.schema() if a["step"] == "outliers")


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


def corpus_tokens(model, corpus: str = "wikitext2") -> list[int]:
    """The whole corpus tokenized by the model's tokenizer. Cached: in memory per model, and on
    disk in the socllm cache keyed by the tokenizer and the corpus file's SHA-256 (tokenizing
    WikiText-2 takes over a second; calibration, evaluation and the tests ask for it often)."""
    if corpus != "wikitext2":
        raise InvalidArgumentError(f"calibrate: unknown corpus {corpus!r} (known: wikitext2)")
    memo = model.__dict__.setdefault("_corpus_tokens", {})
    if corpus in memo:
        return list(memo[corpus])  # a copy: callers may edit theirs
    from ..data import WIKITEXT2_TEST_SHA256, wikitext2_test_text
    from ..registry import cache_dir

    tok_hash = hashlib.sha256(model.tokenizer.to_str().encode()).hexdigest()[:16]
    path = cache_dir() / f"tokens-{corpus}-{WIKITEXT2_TEST_SHA256[:16]}-{tok_hash}.npy"
    if path.is_file():
        try:
            memo[corpus] = np.load(path).tolist()
            return list(memo[corpus])
        except (OSError, ValueError):
            pass  # unreadable cache: tokenize again and replace it
    ids = model.tokenize(wikitext2_test_text())
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, np.asarray(ids, dtype=np.int32))
    except OSError:
        pass  # an unwritable cache only costs the next tokenization
    memo[corpus] = ids
    return list(ids)


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
    """Writes the statistics atomically (temp file, then rename) with provenance attributes; the
    file's schema is the C++ core's (``_core.Calibration.schema()``, calibration.h)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = {**cal.provenance, "socllm_version": __version__}
    cal.stats.save(str(path), model._model, prov)
    return path


def load_calibration(path: str | os.PathLike, model):
    """Reads a calibration file (:class:`CalibrationData`) for ``model``: a file from another
    model or schema version is an InvalidArgumentError naming the value (checked in C++)."""
    stats, provenance = _core.Calibration.load(str(Path(path)), model._model)
    return CalibrationData(stats, provenance)
