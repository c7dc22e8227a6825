"""Smoke run of the Python API on the real default model, meant for a sanitized socllm C++ module
(scripts/test_sanitized.sh builds one with ASan/UBSan and runs this under it). Small inputs, so
it takes a few minutes under ASan on 2 cores; every step prints its time.

Covers: every plan (logits, chunked prefill, KV-cache decode), generate (greedy and sampled),
step against logits, perplexity on a few hundred tokens, simulate / task_graph / simulate_model,
calibration (act-scales, outliers, save, load), the GGUF reader (metadata, tensor index,
dequantization of every tensor type in the file), convert of the real GGUF and the HDF5 loader
on its output. (The fuzz corpus and campaigns, tests/python/test_fuzz.py, run after it.)

A sanitizer finding aborts the process (ASAN_OPTIONS=abort_on_error=1, UBSan
halt_on_error=1); a Python error fails with a traceback. ``--expect-module PATH`` checks that the
module imported is that file, not the installed one.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import socllm


def step(name: str):
    """``with step("x"):`` prints the step and its wall time."""

    class _Step:
        def __enter__(self):
            self.t0 = time.perf_counter()
            print(f"[smoke] {name} ...", flush=True)

        def __exit__(self, *exc):
            if exc[0] is None:
                print(f"[smoke] {name}: {time.perf_counter() - self.t0:.1f} s", flush=True)

    return _Step()


def check_module(expect: str | None) -> None:
    got = Path(socllm.build_info()["module"]).resolve()
    print(f"[smoke] socllm's C++ module from {got}", flush=True)
    if expect and got != Path(expect).resolve():
        sys.exit(f"[smoke] expected socllm's C++ module from {expect}, got {got}")


def calibrate(m, tmp: Path):
    from socllm.calibration import (
        calibrate_act_scales,
        calibrate_outliers,
        load_calibration,
        save_calibration,
    )

    cal = calibrate_act_scales(m, samples=2, seqlen=32, progress=False)
    cal = calibrate_outliers(m, cal, progress=False)
    from socllm.calibration import calibrate_smoothing

    calibrate_smoothing(m, cal, smoothing_windows=1, smoothing_rows=8, progress=False)
    path = save_calibration(tmp / "calib.h5", cal, m)
    back = load_calibration(path, m)
    for site in ("attn_in", "attn_out", "mlp_in", "mlp_act"):
        np.testing.assert_array_equal(back.absmax(site), cal.absmax(site))
    m.load_calibration(path)
    assert m.calibration is not None and m.calibration.has_outlier_stats
    m.calibration.shadow_configs(0.85, 0.8)
    return path


def plans(m, ids: list[int]) -> None:
    import socllm

    for name in socllm.Plan.known():
        with step(f"plan {name}"):
            full = m.logits(ids[:24], name)
            assert full.shape == (24, m.config["vocab_size"]) and np.isfinite(full).all(), name
            last = m.prefill(ids[:40], name, chunk_len=16)  # 3 chunks, the last one padded
            assert np.isfinite(last).all(), name
            cache = m.new_cache(32)
            m.step(cache, ids[:8], plan=name)
            for t in ids[8:11]:
                assert np.isfinite(m.step(cache, [t], plan=name)).all(), name
            m.token_logprobs([ids[:12], ids[12:20]], name)
            if name == "shadow-outlier":
                m.shadow_stats(name, reset=True)
    m.graph_stats()
    m.graph_events()
    m.clear_graphs()


def decode(m, ids: list[int]) -> None:
    # step (KV cache decode) agrees with the full forward pass
    full = m.logits(ids[:12])
    cache = m.new_cache(16)
    m.step(cache, ids[:6])
    rows = [m.step(cache, [t])[0] for t in ids[6:12]]
    np.testing.assert_allclose(np.stack(rows), full[6:12], rtol=1e-3, atol=1e-3)
    m.step(m.new_cache(16), ids[:4], all_positions=True)


def gguf_reader(path: Path) -> None:
    f = socllm.io.GgufFile(str(path))
    md = f.metadata
    assert md["general.architecture"] == "llama" and len(md["tokenizer.ggml.tokens"]) > 1000
    seen: set[str] = set()
    for name in f.tensor_names():
        info = f.tensor_info(name)
        # one tensor of each type (and the token embedding, the largest), dequantized in full
        if info["type"] not in seen or name == "token_embd.weight":
            seen.add(info["type"])
            x = f.dequantize(name)
            assert x.shape == info["shape"] and np.isfinite(x).all(), name
            assert len(f.raw(name)) == info["n_bytes"]
    print(f"[smoke] GGUF tensor types dequantized: {sorted(seen)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect-module", help="path the imported C++ module must have")
    args = ap.parse_args()

    check_module(args.expect_module)
    from socllm.calibration import corpus_tokens
    from socllm.io.convert import convert
    from socllm.registry import BUILTIN_MODELS

    socllm.set_log_level("warn")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="socllm-smoke-") as tmp_name:
        tmp = Path(tmp_name)
        with step("load smollm2-135m"):
            m = socllm.load("smollm2-135m", progress=False)
        with step("tokens"):
            ids = corpus_tokens(m)[1000:1400]
        with step("calibration (act-scales, outliers, smoothing, save, load)"):
            calibrate(m, tmp)
        plans(m, ids)
        with step("packed model file (edgeflow): convert, load, same logits; cold start"):
            from socllm.io.convert_packed import convert_packed

            packed = socllm.load(
                convert_packed(m, tmp / "ef.h5", plan="edgeflow", progress=False), progress=False
            )
            np.testing.assert_array_equal(
                packed.logits(ids[:16], "edgeflow"), m.logits(ids[:16], "edgeflow")
            )
            socllm.simulate_cold_start("qwen1.5-1.8b", bits=5, prompt_len=64).summary()
        with step("step (KV cache) against logits"):
            decode(m, ids)
        with step("generate"):
            text = m.generate("The capital of France is", max_new_tokens=6)
            print(f"[smoke]   greedy: {text!r}")
            m.generate_ids(ids[:5], max_new_tokens=4, temperature=0.8, top_k=20, seed=1)
            m.generate_ids(ids[:5], max_new_tokens=3, plan="w8a8", stop_at_eos=False)
        with step("perplexity (300 tokens, windows of 128, stride 64)"):
            r = m.perplexity_eval(ids=ids[:300], context=128, stride=64)
            print(f"[smoke]   ppl {r.perplexity:.2f} over {r.n_scored} tokens")
            assert math.isfinite(r.perplexity)
        with step("simulate, task_graph, simulate_model"):
            socllm.simulate("qwen1.5-1.8b", "snapdragon-8gen3", "shadow-outlier", 1024).summary()
            socllm.simulate("qwen2-0.5b", plan="w8a8", prompt_len=300, chunk=None).summary()
            socllm.simulate("phi-2", plan="w4a16", prompt_len=64, processor="gpu").summary()
            tl = socllm.simulate("qwen2-0.5b", plan="smoothquant", prompt_len=256)
            for policy in socllm.policies():
                if policy["name"] != "optimal":  # branch and bound: small graphs only
                    tl.with_policy(policy["name"]).summary()
            config = {**socllm.configs.load_config("qwen2-0.5b"), "n_layers": 1}
            socllm.simulate(config, plan="w8a8", prompt_len=8, chunk=None, policy="optimal")
            tl.to_perfetto(tmp / "trace.json")
            socllm.task_graph("llama-2-7b", "w8-group", 512, 128).to_json()
            socllm.task_graph(m, "shadow-outlier", 64, 32).to_json()
            socllm.simulate_model(m, ids[:48], plan="shadow-outlier", chunk=16).summary()
        gguf = BUILTIN_MODELS["smollm2-135m"].path()
        with step("GGUF reader on the real file"):
            gguf_reader(gguf)
        with step("convert the real GGUF, load the HDF5 model"):
            h5 = convert(gguf, tmp / "smollm2.h5", progress=False)
            m2 = socllm.load(h5)
            np.testing.assert_array_equal(m2.logits(ids[:8]), m.logits(ids[:8]))
            del m2
    print(f"[smoke] all steps passed in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
