"""scripts/bench_attention.py at a tiny size on random tensors: every variant (and torch's SDPA,
the dense kernel's peer) is timed in the same run, the speed-ups are against fp32 of the same
repetitions, the JSON says where it ran."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("socllm")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_attention.py"


def test_bench_attention_quick(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--synthetic", "--quiet", "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    meta = d["meta"]
    assert meta["threads"] == 2 and meta["isa"] in meta["supported_isas"]
    assert meta["shape"] == {"n_heads": 9, "n_kv_heads": 3, "head_dim": 64}
    assert [row["tokens"] for row in d["rows"]] == [128, 256]
    peers = {"torch-sdpa"} if importlib.util.find_spec("torch") else set()
    for row in d["rows"]:
        v = row["variants"]
        assert (
            set(v)
            == {"fp32", "sparse", "shadow-attn", "shadow-fused", "certified", "block-sparse"}
            | {"npu-int8"}
            | peers
        )
        assert v["fp32"]["speedup_vs_fp32"] == 1.0
        # causal pairs T (T + 1) / 2, 4 flop per pair and head dim, 9 heads of 64
        T = row["tokens"]
        flop = 4 * 9 * 64 * T * (T + 1) / 2
        assert row["fp32_gflops"] == pytest.approx(flop / v["fp32"]["median_ms"] / 1e6)
        assert all(len(x["times_ms"]) == 2 and x["median_ms"] > 0 for x in v.values())
        b = row["shadow_attn_breakdown_1thread"]
        # the engine's 128-row blocks: one GEMM and one row-after-row top-k (topk_rows) each
        assert b["gemm_calls"] == b["topk_calls"] == 9 * -(-row["tokens"] // 128)
