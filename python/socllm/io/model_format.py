"""Facts of the socllm model file (docs/MODEL_FORMAT.md) and of the sources converted into it,
shared by the converter (socllm.io.convert), the cache (socllm.registry) and the loader
(socllm.model) without importing one another."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .. import _core
from ..errors import FormatError

# The version `socllm convert` writes, part of the cache key so a new version converts again,
# and the first whose datasets carry checksums (required): the C++ loader's constants (model.h).
MODEL_FORMAT_VERSION = _core.Model.format_version
CHECKSUM_FORMAT_VERSION = _core.Model.checksum_format_version
# Attribute of tokenizer/json holding its checksum, named after the hashlib algorithm: HDF5's
# Fletcher-32 cannot cover a variable-length string.
TOKENIZER_JSON_DIGEST = "sha256"


def site_tensors(config) -> dict[str, tuple[str, ...]]:
    """The weight tensors of each linear site (the engine's fused linears) of a config's block, in
    row order, with their names under weights/layers/<i> and packed_linears/layers/<i>: read from
    the block table (``socllm.decoder_block(config)``, cpp/model/decoder_block.h)."""
    return {
        op["site"]: tuple(t["name"] for t in op["tensors"])
        for op in _core.decoder_block(config)
        if op["site"] is not None
    }


def linear_weights(path: str | os.PathLike, config) -> dict:
    """{(layer, name): fp32 [out, in]} of every linear weight tensor of an fp32 model file."""
    import h5py
    import numpy as np

    tensors = site_tensors(config)
    out = {}
    with h5py.File(path, "r") as f:
        layers = f["weights/layers"]
        for i in range(len(layers)):
            for names in tensors.values():
                for n in names:
                    out[(i, n)] = np.asarray(layers[str(i)][n][()], np.float32)
    return out


# What conversion reads from a Hugging Face directory.
HF_CONFIG, HF_TOKENIZER, HF_INDEX = "config.json", "tokenizer.json", "model.safetensors.index.json"


def tokenizer_json_digest(text: str) -> str:
    """The checksum stored with ``tokenizer/json``: hex digest of its UTF-8 bytes."""
    return hashlib.new(TOKENIZER_JSON_DIGEST, text.encode("utf-8")).hexdigest()


def safetensors_files(directory: str | os.PathLike) -> list[Path]:
    """The weight files of a Hugging Face directory: those its safetensors index names (present
    or not), else every ``*.safetensors``."""
    directory = Path(directory)
    index = directory / HF_INDEX
    if not index.is_file():
        return sorted(directory.glob("*.safetensors"))
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = sorted({directory / f for f in weight_map.values()})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise FormatError(f"{index}: not a safetensors index ({e})") from e
    # the index names files of this checkpoint: never one elsewhere ("/etc/x", "../y")
    inside = Path(os.path.realpath(directory))
    for f in files:
        if inside not in Path(os.path.realpath(f)).parents:
            raise FormatError(f"{index}: weight file {f.name!r} is outside {directory}")
    return files


def source_files(source: str | os.PathLike) -> list[Path]:
    """The files converting ``source`` reads: the file itself, or those of a Hugging Face
    directory that exist (config, tokenizer, safetensors index, weight files)."""
    source = Path(source)
    if not source.is_dir():
        return [source]
    files = [source / HF_CONFIG, source / HF_TOKENIZER, source / HF_INDEX]
    return [f for f in [*files, *safetensors_files(source)] if f.is_file()]
