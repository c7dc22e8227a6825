"""`socllm convert MODEL --calib FILE --edgeflow-bits B`: a socllm model file whose linears are
stored prequantized for one plan (EdgeFlow's packed format, seed 004 §4.2).

The model is prepared under the plan (default ``edgeflow:bits=B``) with the calibration, exactly
as the engine prepares it; what each prepared linear holds (its INT8 codes, row scales, the
multipliers after dequantization, static scales, folded norm gains) is written per weight tensor
(wq, wk, wv, wo, w_gate, w_up, w_down): the codes as weightlets at their rows' bit-widths
(``WeightletTensor``, groups of ``group`` weights), or as raw int8 when every row has 8 bits
(an INT8 model file). Each tensor carries a CRC-32 of its stored bytes (data, bit-width
metadata, scales, post, output scales, bias), checked on load, on top of HDF5's per-chunk
Fletcher-32. Everything else (config, tokenizer, embeddings, norms) is copied from the model's
socllm file. ``socllm.load`` of the result unpacks the linears to INT8 rows and runs that plan
with exactly the logits the plan gives on the original model with the same calibration.

The file is written under a temporary name and renamed at the end (no partial output).
Layout: docs/MODEL_FORMAT.md, "Prequantized linears".
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import h5py
import numpy as np
from tqdm.auto import tqdm

from .. import _core
from .._version import __version__
from ..errors import InvalidArgumentError, int_arg, not_applicable
from .files import atomic_path, check_output_path
from .model_format import site_tensors

DEFAULT_GROUP = 128  # R: a 128-bit NEON/SSE register's worth of weights


def packed_crc(data: np.ndarray, meta: np.ndarray | None, extras: list) -> int:
    """CRC-32 of a tensor's stored bytes in the order the loader checks them."""
    crc = zlib.crc32(np.ascontiguousarray(data).tobytes())
    if meta is not None:
        crc = zlib.crc32(meta.tobytes(), crc)
    for v in extras:
        if v is not None:
            crc = zlib.crc32(np.ascontiguousarray(v, np.float32).tobytes(), crc)
    return crc


def _dataset(g, name: str, data: np.ndarray) -> None:
    g.create_dataset(name, data=data, fletcher32=True, chunks=True if data.size else None)


def convert_packed(
    model,
    out_path: str | Path,
    *,
    plan: str,
    group: int | None = None,
    progress: bool = True,
) -> Path:
    """Writes ``model`` (a LanguageModel with its calibration loaded) prepared under ``plan``
    to ``out_path`` (module doc). Returns the path. ``group``: the weightlet group (None:
    DEFAULT_GROUP), refused for a plan whose linears are all INT8 (stored as INT8 rows)."""
    out = Path(out_path)
    check_output_path(out, inputs=[model.path], what="convert output", streams=False)
    given = group is not None
    group = DEFAULT_GROUP if group is None else int_arg("convert", "group", group)
    if group < 8 or group % 8:
        raise InvalidArgumentError(
            f"convert: --group must be a positive multiple of 8, got {group}"
        )
    state = model._engine.prepared_state(plan)
    all8 = all(int(site["bits"].min()) == 8 for layer in state["layers"] for site in layer.values())
    storage = "int8" if all8 else "weightlet"
    if given and storage == "int8":
        raise not_applicable(
            "convert",
            f"--group {group}",
            "weightlet storage (linears below 8 bits)",
            f"plan {plan!r} keeps every linear at 8 bits, stored as INT8 rows",
        )
    src_path = model.path
    with atomic_path(out) as tmp:
        with h5py.File(src_path, "r") as src, h5py.File(tmp, "w") as f:
            for k, v in src.attrs.items():
                f.attrs[k] = v
            f.attrs["format_version"] = int(_core.Model.format_version)
            f.attrs["socllm_version"] = __version__
            f.attrs["source"] = str(src_path)
            for name in ("config", "tokenizer"):
                src.copy(src[name], f, name)
            w = f.create_group("weights")
            for name in ("embed_tokens", "final_norm", "lm_head"):
                if name in src["weights"]:
                    src.copy(src["weights"][name], w, name)
            for i in range(len(src["weights/layers"])):
                for name in ("attn_norm", "ffn_norm"):
                    src.copy(src[f"weights/layers/{i}/{name}"], w, f"layers/{i}/{name}")
            pk = f.create_group("packed_linears")
            pk.attrs["scheme"] = json.dumps(state["scheme"], sort_keys=True)
            options = {k: v for k, v in state["plan"].items() if k != "ops"}  # name and options
            pk.attrs["plan"] = json.dumps(options, sort_keys=True)
            pk.attrs["group"] = group if storage == "weightlet" else 0
            pk.attrs["storage"] = storage
            pk.attrs["calibration"] = str(model.calibration_path or "")
            layers = state["layers"]
            for i, sites in enumerate(tqdm(layers, desc="convert: pack", disable=not progress)):
                lg = pk.create_group(f"layers/{i}")
                if state["norm_gains"] is not None:
                    _dataset(lg, "attn_norm_folded", state["norm_gains"][i][0])
                    _dataset(lg, "ffn_norm_folded", state["norm_gains"][i][1])
                for site, names in site_tensors(model.config).items():
                    s = sites[site]
                    lg.attrs[f"act_scale_{site}"] = float(s["act_scale"])
                    if s["input_smooth"] is not None:
                        _dataset(lg, f"input_smooth_{site}", s["input_smooth"])
                    r0 = 0
                    for name in names:
                        # each tensor's rows as the model file stores them
                        r1 = r0 + src[f"weights/layers/{i}/{name}"].shape[0]
                        part = slice(r0, r1)
                        r0 = r1
                        codes = np.ascontiguousarray(s["codes"][part])
                        tg = lg.create_group(name)
                        tg.attrs["rows"], tg.attrs["cols"] = codes.shape
                        extras = [
                            None if s[k] is None else s[k][part]
                            for k in ("scales", "post", "out_scale", "bias")
                        ]
                        if storage == "weightlet":
                            t = _core.ops.WeightletTensor.pack(codes, s["bits"][part], group)
                            data, meta = t.data, t.bit_metadata
                            _dataset(tg, "data", data)
                            _dataset(tg, "bits", meta)
                        else:
                            data, meta = codes, None
                            _dataset(tg, "codes", codes)
                        for key, v in zip(
                            ("scales", "post", "out_scale", "bias"), extras, strict=True
                        ):
                            if v is not None:
                                _dataset(tg, key, np.asarray(v, np.float32))
                        tg.attrs["crc32"] = packed_crc(data, meta, extras)
        _core.seal_h5_attributes(str(tmp))  # attributes' CRC-32 (MODEL_FORMAT.md)
    return out
