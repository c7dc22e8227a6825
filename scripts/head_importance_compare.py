#!/usr/bin/env python3
"""shadowAttn's head and layer importance (seed 000 Eq. 1-2) from several calibrations, side by
side (issue 40 item 4): the Spearman rank correlation of every pair's head importances
(n_layers x n_heads) and layer importances, the overlap of their 10 most important heads, and
what Eq. 3 makes of each at one keep ratio and clamp (heads at the floor ratio, heads at 1, the
rank correlation of the keep ratios).

A source is NAME=PATH: a calibration file (.h5, arrays head_importance / layer_importance), or a
JSON report holding them, with #KEY picking one method of a report that has several
(scripts/head_importance_taylor.py writes {"head_importance": {"ablation": ..., "taylor": ...}}):

    python scripts/head_importance_compare.py "ablation 128x64=calib.h5" \\
        "ablation 8x256=docs/results/head_importance_taylor_8x256.json#ablation" \\
        --json docs/results/head_importance_compare.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import h5py
import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from socllm.io.files import emit_json  # noqa: E402
from socllm.ops import head_keep_ratios  # noqa: E402


def load(source: str) -> tuple[str, np.ndarray, np.ndarray]:
    """(name, head importance [L, H], layer importance [L]) of NAME=PATH[#KEY]."""
    if "=" not in source:
        raise SystemExit(f"a source is NAME=PATH[#KEY], got {source!r}")
    name, path = source.split("=", 1)
    path, _, key = path.partition("#")
    if not Path(path).is_file():
        raise SystemExit(f"{name}: no file {path}")
    if path.endswith(".json"):
        d = json.loads(Path(path).read_text())
        try:
            heads, layers = d["head_importance"], d["layer_importance"]
            if key:
                heads, layers = heads[key], layers[key]
        except (KeyError, TypeError) as e:
            raise SystemExit(f"{name}: {path} has no head/layer importance {key!r} ({e})") from e
    else:
        with h5py.File(path, "r") as f:
            if "head_importance" not in f:
                raise SystemExit(f"{name}: {path} has no head_importance (step head-importance)")
            heads, layers = f["head_importance"][...], f["layer_importance"][...]
    heads, layers = np.asarray(heads, np.float64), np.asarray(layers, np.float64)
    if heads.ndim != 2 or layers.shape != (heads.shape[0],):
        raise SystemExit(f"{name}: shapes {heads.shape} and {layers.shape} do not match")
    return name, heads, layers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+", help="NAME=PATH[#KEY]")
    ap.add_argument("--keep", type=float, default=0.2, help="Eq. 3's global keep ratio")
    ap.add_argument("--clamp", type=float, default=0.95, help="Eq. 3's clamp_quantile")
    ap.add_argument("--json", default=None, metavar="PATH|-")
    a = ap.parse_args(argv)
    srcs = [load(s) for s in a.sources]
    shapes = {h.shape for _, h, _ in srcs}
    if len(shapes) != 1:
        raise SystemExit(f"the sources are of different models: {shapes}")
    L, H = shapes.pop()
    ratios = {
        n: np.asarray(
            head_keep_ratios(h.astype(np.float32), lay.astype(np.float32), a.keep, a.clamp)
        )  # fmt: skip
        for n, h, lay in srcs
    }
    out: dict = {"keep": a.keep, "clamp_quantile": a.clamp, "sources": a.sources, "each": {}}
    print(f"Eq. 3 at keep {a.keep}, clamp {a.clamp} ({L} layers x {H} heads)")
    for n, h, lay in srcs:
        r = ratios[n].ravel()
        floor = int(np.sum(np.isclose(r, r.min()))) if r.min() < a.keep else 0
        each = {
            "heads_at_floor": floor,
            "heads_at_one": int(np.sum(r >= 1.0 - 1e-12)),
            "floor_ratio": float(r.min()),
            "positive_layers": int(np.sum(lay > 0)),
            "positive_heads": int(np.sum(h > 0)),
            "top_layers": [int(i) for i in np.argsort(-lay)[:3]],
        }
        out["each"][n] = each
        print(
            f"  {n:24s} heads at the floor ({each['floor_ratio']:.3g}) {floor}, at 1 "
            f"{each['heads_at_one']}; positive heads {each['positive_heads']}/{L * H}, layers "
            f"{each['positive_layers']}/{L}; top layers {each['top_layers']}"
        )
    out["pairs"] = []
    print("pairs: Spearman heads / layers / keep ratios, top-10 heads shared")
    for (n1, h1, l1), (n2, h2, l2) in itertools.combinations(srcs, 2):
        top1 = set(np.argsort(-h1.ravel())[:10].tolist())
        top2 = set(np.argsort(-h2.ravel())[:10].tolist())
        pair = {
            "a": n1,
            "b": n2,
            "spearman_heads": float(spearmanr(h1.ravel(), h2.ravel()).statistic),
            "spearman_layers": float(spearmanr(l1, l2).statistic),
            "spearman_keep_ratios": float(
                spearmanr(ratios[n1].ravel(), ratios[n2].ravel()).statistic
            ),
            "top10_heads_shared": len(top1 & top2),
        }
        out["pairs"].append(pair)
        print(
            f"  {n1} vs {n2}: {pair['spearman_heads']:.3f} / {pair['spearman_layers']:.3f} / "
            f"{pair['spearman_keep_ratios']:.3f}, {pair['top10_heads_shared']} of 10"
        )
    if a.json:
        emit_json(out, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
