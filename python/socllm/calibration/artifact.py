"""Calibration data (seed 001 §2.3): the text windows steps observe, and the artifact.

Calibration text: WikiText-2 raw test, tokenized once (:func:`corpus_tokens`). Windows of
``seqlen`` tokens start at positions drawn (numpy ``default_rng(seed)``, without replacement)
from the first ``CALIB_SLICE_FRACTION`` of the token stream only; :func:`held_out_tokens` gives
the rest, on which perplexity is reported next to the whole-file number
(../shared/datasets/README.md).

The statistics (``CalibrationData.stats``, a :class:`socllm.calibration.Calibration`) are written
to one HDF5 artifact whose schema the C++ core owns (``cpp/calibration/calibration.h``); the
steps that fill it are in :mod:`socllm.calibration.steps`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _core
from .._version import __version__
from ..errors import InvalidArgumentError
from ..io.files import atomic_path

CALIB_SLICE_FRACTION = 0.25  # calibration windows come from the first quarter of the tokens
# The smoothing step's grid of input exponents α (cpp/calibrate/smoothing.cpp).
SMOOTHING_GRID = np.round(np.linspace(0.0, 1.0, int(_core.Calibration.smooth_alpha_grid)), 6)


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
    """The whole corpus tokenized by the model's tokenizer: ``wikitext2`` (WikiText-2 raw test)
    or the path of a UTF-8 text file (your own WikiText-style text). Cached: in memory per model,
    and on disk in the socllm cache keyed by the tokenizer and the text's SHA-256 (tokenizing
    WikiText-2 takes over a second; calibration, evaluation and the tests ask for it often)."""
    memo = model.__dict__.setdefault("_corpus_tokens", {})
    if corpus in memo:
        return list(memo[corpus])  # a copy: callers may edit theirs
    from ..data import WIKITEXT2_TEST_SHA256, wikitext2_test_text
    from ..registry import cache_dir

    if corpus == "wikitext2":
        text_sha, read_text = WIKITEXT2_TEST_SHA256, wikitext2_test_text
    elif Path(corpus).is_file():
        try:
            text = Path(corpus).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"calibrate: cannot read corpus {corpus!r}: {e}") from None
        if not text.strip():
            raise InvalidArgumentError(f"calibrate: corpus {corpus!r} is empty")
        text_sha, read_text = hashlib.sha256(text.encode()).hexdigest(), lambda: text
    else:
        raise InvalidArgumentError(
            f"calibrate: unknown corpus {corpus!r} (wikitext2, or the path of a text file)"
        )
    tok_hash = hashlib.sha256(model.tokenizer.to_str().encode()).hexdigest()[:16]
    path = cache_dir() / f"tokens-{text_sha[:16]}-{tok_hash}.npy"
    if path.is_file():
        try:
            memo[corpus] = np.load(path).tolist()
            return list(memo[corpus])
        except (OSError, ValueError):
            pass  # unreadable cache: tokenize again and replace it
    ids = model.tokenize(read_text())
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


def held_out_tokens(tokens: list[int]) -> list[int]:
    """The tokens after the calibration slice (evaluation never sees calibration text)."""
    return tokens[calibration_split(len(tokens)) :]


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
    model or schema version is an InvalidArgumentError naming the value (checked in C++). Its
    ``stats.rotation`` says which rotation of the model it was made on."""
    stats, provenance = _core.Calibration.load(str(Path(path)), model._model)
    return CalibrationData(stats, provenance)
