"""Shape-only model configs (JSON, numbers from the public model cards, source in `_source`):
the graph census and the simulator use them without weights."""

from __future__ import annotations

import json
from pathlib import Path

_DIR = Path(__file__).parent


def known() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.json"))


def load_config(name: str) -> dict:
    """The config dict (without `_source`) of a shape-only model, e.g. ``qwen1.5-1.8b``."""
    from ..errors import InvalidArgumentError

    path = _DIR / f"{name}.json"
    if not path.exists():
        raise InvalidArgumentError(f"unknown model config {name!r} (known: {', '.join(known())})")
    cfg = json.loads(path.read_text())
    cfg.pop("_source", None)
    return cfg


def graph_census(
    name_or_config,
    prompt_len: int,
    chunk_len: int,
    *,
    plan="w8a8",
    sharing: bool = True,
) -> dict:
    """Static graphs one chunked prefill under ``plan`` builds (seed 001 §3.2), from the block
    description (cpp/block/block.h), with per-chunk subgraph counts:
    ``subgraphs_per_chunk`` and ``shareable_per_chunk`` are the paper's 144 and 120 for
    Qwen1.5-1.8B. ``name_or_config``: a name of :func:`known`, a config dict or a loaded model."""
    from .. import _core

    if isinstance(name_or_config, str):
        cfg = load_config(name_or_config)
    elif isinstance(name_or_config, dict):
        cfg = name_or_config
    else:
        cfg = dict(name_or_config.config)
    stats = _core.graph_census(cfg, plan, prompt_len, chunk_len, sharing)
    subgraphs = {op["subgraph"] for op in _core.decoder_block()}
    per_layer = len(subgraphs)  # attn_in, attention, o_proj, mlp_in, mlp_act, down
    stats["subgraphs_per_chunk"] = per_layer * cfg["n_layers"]
    stats["shareable_per_chunk"] = (per_layer - 1) * cfg["n_layers"]  # attention is per chunk
    rows = _core.prefill_graph_rows(prompt_len, chunk_len)
    stats["chunks"] = -(-prompt_len // rows)
    return stats
