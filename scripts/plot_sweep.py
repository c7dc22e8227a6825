"""Draws the forest plot of a sweep table from its sweep.json (or a copy in docs/results/sweep):
``<json stem>.png`` next to each file (``<json stem>-<model>.png`` when it has several models),
for each model with a finished non-fp32 cell.

    python scripts/plot_sweep.py docs/results/sweep/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from socllm.eval.sweep_plot import write_sweep_plots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", type=Path, help="sweep.json files")
    args = ap.parse_args()
    for path in args.tables:
        rows = json.loads(path.read_text())["rows"]
        for png in write_sweep_plots(rows, path.parent, stem=path.stem, model_suffix=False):
            print(png)


if __name__ == "__main__":
    main()
