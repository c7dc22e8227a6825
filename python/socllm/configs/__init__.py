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
    name_or_config: str | dict,
    prompt_len: int,
    chunk_len: int,
    *,
    sharing: bool = True,
    weight_bytes_per_param: float = 1.0,
    activation_bytes_per_value: int = 1,
) -> dict:
    """Static graphs one chunked prefill builds (seed 001 §3.2), with per-chunk subgraph
    counts: ``subgraphs_per_chunk`` and ``shareable_per_chunk`` are the paper's 144 and 120
    for Qwen1.5-1.8B."""
    from .. import _core

    cfg = load_config(name_or_config) if isinstance(name_or_config, str) else name_or_config
    stats = _core.chunk_graph_census(
        cfg, prompt_len, chunk_len, sharing, weight_bytes_per_param, activation_bytes_per_value
    )
    per_layer = 6  # npu::kSubgraphsPerLayer: attn_in, attention, o_proj, mlp_in, mlp_act, down
    stats["subgraphs_per_chunk"] = per_layer * cfg["n_layers"]
    stats["shareable_per_chunk"] = (per_layer - 1) * cfg["n_layers"]
    stats["chunks"] = -(-prompt_len // chunk_len)
    return stats
