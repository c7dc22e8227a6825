"""Issue 37, items 3 and 5: an option audit of the CLI and the Python API.

Every flag or keyword given where it would change nothing is refused by name (an
InvalidArgumentError naming it, its value and what it applies to), not silently ignored; a
value of the wrong type is a typed socllm error naming the argument, not a pybind11
"incompatible function arguments" dump or a raw Python error. Refusals come before any work:
these tests use shape-only configs, stubs, and the shared SmolLM2 only for argument checks.
"""

from __future__ import annotations

import numpy as np
import pytest
import socllm
from socllm import InvalidArgumentError
from socllm.cli import main as cli_main

CFG = "qwen2-0.5b"
DEV = "snapdragon-8gen3"
SHADOW_ATTN = "w8a8:attention=shadow-attn"


def refused(argv: list[str], capsys, *needles: str) -> str:
    """``socllm argv`` fails with one error line naming every needle."""
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


def sim(plan="shadow-outlier", prompt_len=64, **kw):
    return socllm.simulate(CFG, DEV, plan, prompt_len, **kw)


# -- socllm simulate ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra,needles",
    [
        # a shape-only config runs no engine: no calibration
        (["--calib", "/nonexistent.h5"], ["--calib /nonexistent.h5", "--config"]),
        # an empty plan was the default plan (shadow-outlier)
        (["--plan", ""], ["unknown plan ''"]),
        # shadow-outlier has no GPU work: nothing to synchronize with the NPU
        (["--no-fast-sync"], ["--no-fast-sync", "GPU", "shadow-outlier"]),
        (["--engine", "hetero-tensor", "--processor", "cpu", "--no-fast-sync"], ["--no-fast-sync"]),
        # nothing on the NPU: the build time was charged to an idle NPU
        (["--plan", "fp32", "--runtime-graph-build"], ["--runtime-graph-build", "NPU", "fp32"]),
        (["--processor", "cpu", "--runtime-graph-build"], ["--runtime-graph-build", "NPU"]),
    ],
)
def test_cli_simulate_refuses_what_changes_nothing(extra, needles, capsys):
    refused(
        ["simulate", "--config", CFG, "--prompt-len", "64", "--quiet", *extra], capsys, *needles
    )


def test_cli_no_fast_sync_still_times_conventional_sync(capsys, tmp_path):
    import json

    outs = []
    for extra in ([], ["--no-fast-sync"]):
        out = tmp_path / f"s{len(outs)}.json"
        argv = ["simulate", "--config", CFG, "--engine", "hetero-tensor", "--prompt-len", "64"]
        assert cli_main([*argv, "--quiet", "--json", str(out), *extra]) == 0
        outs.append(json.loads(out.read_text())["total_ms"])
    assert outs[1] > outs[0]  # GPU-NPU edges exist: the flag applies


# -- socllm.simulate and its siblings ------------------------------------------------------------


@pytest.mark.parametrize(
    "plan,kw,needles",
    [
        ("fp32", {"runtime_graph_build": True}, ["runtime_graph_build=True", "NPU", "'fp32'"]),
        ("shadow-outlier", {"processor": "cpu", "runtime_graph_build": True}, ["NPU"]),
        ("shadow-outlier", {"fast_sync": True}, ["fast_sync=True", "GPU-NPU"]),
        ("gpu-only", {"fast_sync": False}, ["fast_sync=False", "gpu-only"]),
        ("fp32", {"shadow_channels": 100.0}, ["shadow_channels=100.0", "shadow-outlier"]),
        ("w8a8", {"head_ratios": [0.5] * 336}, ["head_ratios", "keep"]),
        (SHADOW_ATTN, {"rescore_share": 0.5}, ["rescore_share=0.5", "certified"]),
        ("w8a8", {"head_policy": "sequential"}, ["head_policy='sequential'", "head pipeline"]),
        ("w8a8:attention=sparse", {"max_fused_heads": 1}, ["max_fused_heads=1"]),
        ("w8a8:attention=npu-int8", {"head_buckets": [0] * 336}, ["head_buckets"]),
    ],
)
def test_simulate_refuses_options_that_change_nothing(plan, kw, needles):
    with pytest.raises(InvalidArgumentError) as e:
        sim(plan, **kw)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_simulate_options_still_apply_where_they_do():
    base = sim(SHADOW_ATTN).summary()["total_ms"]
    assert sim(SHADOW_ATTN, head_policy="sequential").summary()["total_ms"] != base
    assert sim(SHADOW_ATTN, max_fused_heads=1).summary()["total_ms"] != base
    cert = SHADOW_ATTN + ",certified=1"
    assert sim(cert, rescore_share=0.0).summary()["total_ms"] != sim(cert).summary()["total_ms"]
    w8 = "w8a8:attention=gpu"  # GPU attention between NPU linears
    assert sim(w8, fast_sync=True).summary()["total_ms"] != sim(w8).summary()["total_ms"]


@pytest.mark.parametrize(
    "kw,needles",
    [
        ({"policy": None}, ["policy must be a str", "NoneType"]),
        ({"processor": None}, ["processor must be a str"]),
        ({"runtime_graph_build": "yes"}, ["runtime_graph_build must be True or False", "'yes'"]),
        ({"shadow_channels": "3"}, ["shadow_channels must be a number", "'3'"]),
        ({"shadow_channels": float("nan")}, ["shadow_channels must be finite"]),
        ({"optimal_max_tasks": "3"}, ["optimal_max_tasks must be an integer", "'3'"]),
        ({"optimal_max_tasks": 0}, ["optimal_max_tasks must be >= 1, got 0"]),
        ({"head_ratios": "abc"}, ["head_ratios must be a sequence of numbers", "'abc'"]),
        ({"head_buckets": [1.5]}, ["head_buckets[0] must be an integer", "1.5"]),
        ({"rescore_share": "0.5"}, ["rescore_share must be a number", "'0.5'"]),
        ({"rescore_share": 2.0}, ["rescore_share must be in [0, 1], got 2.0"]),
        ({"co_runner": None}, ["co_runner must be a str"]),
        ({"fast_sync": "no"}, ["fast_sync must be True or False", "'no'"]),
        ({"phase": "x"}, ["phase must be prefill, decode or session", "'x'"]),
    ],
)
def test_simulate_arguments_are_typed_errors(kw, needles):
    with pytest.raises(InvalidArgumentError) as e:
        sim(**kw)
    msg = str(e.value)
    assert "incompatible function arguments" not in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_device_of_the_wrong_type():
    with pytest.raises(InvalidArgumentError, match="a device is a profile name.*got int 3"):
        socllm.simulate(CFG, 3, "fp32", 64)


def test_simulate_graph_head_policy_of_a_planned_graph():
    tl = sim(SHADOW_ATTN)
    assert tl.graph.meta["head_policy"] == "greedy"
    # the graph's pipelines are planned: another head policy was silently the graph's
    with pytest.raises(InvalidArgumentError, match="head_policy='sequential'.*'greedy'"):
        socllm.simulate_graph(tl.graph, DEV, head_policy="sequential")
    with pytest.raises(InvalidArgumentError, match="head_policy='optimal'.*has none"):
        socllm.simulate_graph(sim("fp32").graph, DEV, head_policy="optimal")


def test_simulate_hetero_options():
    h = socllm.simulate_hetero
    with pytest.raises(InvalidArgumentError, match="solve_for_timing_sync=True.*fast_sync=True"):
        h(CFG, DEV, "hetero-tensor", 64, solve_for_timing_sync=True)
    with pytest.raises(InvalidArgumentError, match="prompt_len must be an integer, got str '5'"):
        h(CFG, DEV, "hetero-tensor", "5")
    with pytest.raises(InvalidArgumentError, match="policy must be a str, got int 3"):
        h(CFG, DEV, "hetero-tensor", 64, policy=3)


def test_simulate_cold_start_options():
    def cold(**kw):
        return socllm.simulate_cold_start(CFG, "snapdragon-8elite", **kw)

    with pytest.raises(InvalidArgumentError, match="unpack_format='kquant'.*'mnn' unpacks nothing"):
        cold(system="mnn", unpack_format="kquant")
    # an unknown format named the profile's missing rate; now it lists the known ones
    with pytest.raises(InvalidArgumentError, match="unknown unpack_format 'nope'.*weightlet"):
        cold(unpack_format="nope")
    with pytest.raises(InvalidArgumentError, match="steal_threshold=2.*position-steal.*in-order"):
        cold(steal_threshold=2, policy="in-order")
    with pytest.raises(InvalidArgumentError, match="steal_threshold=2.*first-ready"):
        cold(system="llama.cpp", steal_threshold=2)
    with pytest.raises(InvalidArgumentError, match="bits must be a number, got str '3'"):
        cold(bits="3")
    assert cold(steal_threshold=0).summary()["ttft_ms"] > 0  # edgeflow steals: it applies


def test_simulate_model_fast_sync_without_gpu_npu_edges(smollm):
    with pytest.raises(InvalidArgumentError, match="simulate_model: fast_sync=False.*'fp32'"):
        socllm.simulate_model(smollm, [1, 2, 3], DEV, "fp32", chunk=None, fast_sync=False)
    with pytest.raises(InvalidArgumentError, match="decode_tokens must be an integer"):
        socllm.simulate_model(smollm, [1, 2, 3], DEV, "fp32", chunk=None, decode_tokens="2")


# -- LanguageModel ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,needles",
    [
        ({"top_k": 5}, ["top_k=5", "sampling (temperature > 0)"]),
        ({"seed": 3}, ["seed=3", "temperature"]),
        ({"top_k": 5, "seed": 3}, ["top_k=5, seed=3"]),
    ],
)
def test_greedy_generation_refuses_sampling_options(smollm, kw, needles):
    with pytest.raises(InvalidArgumentError) as e:
        smollm.generate_ids([1, 2, 3], 2, **kw)
    for n in needles:
        assert n in str(e.value)


def test_model_arguments_are_typed_errors(smollm):
    m, ids = smollm, [1, 2, 3, 4]
    cases = [
        (lambda: m.generate_ids(ids, 2, stop_at_eos="no"), "stop_at_eos must be True or False"),
        (lambda: m.prefill(ids, all_positions="yes"), "all_positions must be True or False"),
        (lambda: m.prefill(ids, return_graph=1), "return_graph must be True or False"),
        (lambda: m.step(m.new_cache(8), ids, all_positions="x"), "all_positions must be True"),
        (lambda: m.task_graph("fp32", "16"), "prompt_len must be an integer, got str '16'"),
        (lambda: m.task_graph("fp32", 16, decode_tokens="2"), "decode_tokens must be an integer"),
        (lambda: m.logits_batch([ids], last_rows="a"), "last_rows must be a sequence of integers"),
        (lambda: m.logits_batch([ids], last_rows=[1.5]), "last_rows[0] must be an integer"),
        (lambda: m.new_cache("3"), "capacity must be an integer, got str '3'"),
        (lambda: m.capture(ids, "1"), "layer must be a sequence of integers, got str '1'"),
        (lambda: m.capture(ids, 1.5), "layer must be a sequence of integers, got float 1.5"),
        (lambda: m.linear_info("fp32", "0", "attn_in"), "layer must be an integer, got str '0'"),
        (lambda: m.linear_inputs(ids, [1.5]), "rows[0] must be an integer, got float 1.5"),
        (lambda: m.shadow_stats("shadow-outlier", reset="x"), "reset must be True or False"),
    ]
    for call, needle in cases:
        with pytest.raises(InvalidArgumentError) as e:
            call()
        assert needle in str(e.value) and "incompatible" not in str(e.value), (needle, e.value)


def test_alpha_of_a_plan_without_input_smoothing(smollm):
    with pytest.raises(InvalidArgumentError, match="linear_info: alpha=0.5 .*'fp32' smooths no"):
        smollm.linear_info("fp32", 0, "attn_in", alpha=0.5)
    x = np.zeros((1, smollm.config["d_model"]), np.float32)
    with pytest.raises(InvalidArgumentError, match="linear_forward: alpha=0.5"):
        smollm.linear_forward("fp32", 0, "attn_in", x, alpha=0.5)


@pytest.mark.parametrize("name", ["", "  ", None, 3])
def test_load_names_a_model(name):
    # "" was the current directory ("a directory without config.json"), None the file 'None'
    with pytest.raises(InvalidArgumentError, match="a model is a built-in name or a path"):
        socllm.load(name, progress=False)


# -- socllm eval, divergence, lm-eval ---------------------------------------------------------


@pytest.mark.parametrize(
    "extra,needles",
    [
        (["--limit", "3"], ["--limit 3", "lm-eval tasks", "--task wikitext2 has none"]),
        (["--reference", "w8a8"], ["--reference w8a8", "--metrics"]),
        (["--windows", "3"], ["--windows 3", "--metrics"]),
        (["--metrics", "kl", "--limit-tokens", "64"], ["--limit-tokens 64", "perplexity"]),
        (["--metrics", "kl", "--stride", "8"], ["--stride 8", "perplexity"]),
        (["--metrics", "kl", "--batch-size", "4"], ["--batch-size 4"]),
        (["--task", "piqa", "--context", "64"], ["--context 64", "--task piqa has none"]),
        (["--task", "piqa", "--stride", "8"], ["--stride 8"]),
        # nothing to do was a silent success with no results
        (["--task", ""], ["names no task"]),
        (["--task", ","], ["names no task"]),
        (["--plan", ""], ["--plan '' names no plan"]),
    ],
)
def test_cli_eval_refuses_flags_of_other_tasks(extra, needles, capsys):
    refused(["eval", "--quiet", *extra], capsys, *needles)


def test_metrics_arguments(smollm):
    from socllm.eval import divergence

    with pytest.raises(InvalidArgumentError, match="policy='in-order'.*no device"):
        divergence.compare_plans(smollm, ["fp32"], context=8, windows=1, policy="in-order")
    with pytest.raises(InvalidArgumentError, match="context must be an integer, got str '8'"):
        divergence.heldout_windows(smollm, "8", 1)
    with pytest.raises(InvalidArgumentError, match="windows must be an integer, got float 1.5"):
        divergence.heldout_windows(smollm, 8, 1.5)


def test_lmeval_limit_per_subject_needs_mmlu_and_a_count(smollm):
    pytest.importorskip("lm_eval")
    from socllm.eval.lmeval import evaluate

    with pytest.raises(InvalidArgumentError, match="limit_per_subject=True.*no MMLU"):
        evaluate(smollm, ["piqa"], limit=2, limit_per_subject=True)
    with pytest.raises(InvalidArgumentError, match="limit_per_subject=True.*limit=None"):
        evaluate(smollm, ["mmlu"], limit_per_subject=True)
    with pytest.raises(InvalidArgumentError, match="no tasks given"):
        evaluate(smollm, [])


# -- socllm calibrate ---------------------------------------------------------------------------


def test_calibration_options_read_only_under_another(smollm, capsys):
    from socllm.calibration import check_options, run_steps

    with pytest.raises(InvalidArgumentError, match="'percentile'=99.0 changes nothing.*'maxmin'"):
        check_options(["outliers"], {"percentile": 99.0, "outlier_threshold": "maxmin"})
    # per tensor, bitwidths samples no rows: the sampling options were ignored
    with pytest.raises(InvalidArgumentError, match="'smoothing_rows'=4 .*'per-tensor'"):
        run_steps(smollm, "bitwidths", progress=False, smoothing_rows=4)
    # where another step of the pipeline reads them, or under global-ttft, they apply
    check_options(["smoothing", "bitwidths"], {"smoothing_rows": 4})
    check_options(["bitwidths"], {"smoothing_rows": 4, "bit_scope": "global-ttft"})
    check_options(["outliers"], {"percentile": 99.0})
    argv = ["calibrate", "--steps", "outliers", "--outlier-threshold", "maxmin"]
    refused([*argv, "--percentile", "99", "--out", "c.h5", "--quiet"], capsys, "--percentile")


# -- socllm convert, run, sweep --------------------------------------------------------------


def test_cli_convert_flags(capsys, tmp_path):
    out = str(tmp_path / "o.h5")
    refused(["convert", "/nonexistent", "-o", out, "--group", "64"], capsys, "--group 64")
    refused(
        [
            "convert",
            "smollm2-135m",
            "-o",
            out,
            "--edgeflow-bits",
            "4",
            "--edgeflow-plan",
            "edgeflow",
        ],
        capsys,
        "--edgeflow-bits 4",
        "--edgeflow-plan edgeflow",
    )
    argv = ["convert", "smollm2-135m", "-o", out, "--edgeflow-bits", "4", "--calib", "c.h5"]
    refused([*argv, "--group", "12"], capsys, "--group must be a positive multiple of 8, got 12")
    assert not list(tmp_path.iterdir())


def test_convert_packed_group_of_an_int8_file(tmp_path, smollm):
    from socllm.io.convert_packed import convert_packed

    class Stub:  # a model whose plan prepares every linear at 8 bits
        path = smollm.path

        class _engine:
            @staticmethod
            def prepared_state(plan):
                return {"layers": [{"attn_in": {"bits": np.full(4, 8, np.uint8)}}]}

    with pytest.raises(InvalidArgumentError, match="--group 64 applies to weightlet storage"):
        convert_packed(Stub, tmp_path / "o.h5", plan="int8-plan", group=64, progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["run", "--calib", "c.h5"], ["--calib c.h5", "--cold"]),
        (["run", "--plan", "no-such-plan"], ["no-such-plan"]),
        (["run", "--plan", "@missing.json"], ["missing.json", "does not exist"]),
        (["run", "--repeats", "2"], ["--repeats 2", "--cold"]),
        (["run", "--prompt-tokens", "16"], ["--prompt-tokens 16"]),
        (["run", "--cold", "--out", "x"], ["--out x", "main job"]),
        (["run", "--cold", "--full"], ["--full", "main job"]),
        (["run", "--cold", "--limit-tokens", "64"], ["--limit-tokens 64"]),
        (["run", "--cold", "--calib", "c.h5"], ["--calib c.h5", "--plan"]),
        (["run", "--full", "--limit-tokens", "64", "--calib-samples", "2"], ["--full"]),
        (["sweep", "--table-only", "--retry-errors"], ["--retry-errors", "--table-only"]),
    ],
)
def test_cli_run_and_sweep_modes(argv, needles, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused([*argv, "--quiet"], capsys, *needles)
    assert not list(tmp_path.iterdir())


def test_sweep_table_only_refuses_run_options(tmp_path):
    from socllm.eval.sweep import DISTRIBUTION_TASK, run_sweep

    with pytest.raises(InvalidArgumentError, match="retry_errors=True.*table_only"):
        run_sweep(["smollm2-135m"], ["fp32"], [DISTRIBUTION_TASK], tmp_path, calibs=["none"],
                  table_only=True, retry_errors=True, progress=False)  # fmt: skip
    assert not list(tmp_path.iterdir())


def test_timeline_with_policy_argument():
    with pytest.raises(InvalidArgumentError, match="with_policy: policy must be a str, got None"):
        sim("fp32").with_policy(None)


@pytest.mark.parametrize(
    "kw,match",
    [
        # the co-runner ran during no step (the window defaults to none)
        ({"co_runner": "mobile-game"}, r"co_runner='mobile-game'.*\(0, 0\) names none"),
        ({"co_runner": "mobile-game", "co_runner_steps": (9, 12)}, "names none of steps 1..4"),
        ({"co_runner_steps": (1, 3)}, r"co_runner_steps=\(1, 3\).*no co_runner"),
        ({"repartition": "oracle"}, "repartition='oracle'.*no co_runner"),
        ({"drift_threshold": 0.2}, "drift_threshold=0.2.*adaptive"),
        ({"co_runner_steps": (1, 2, 3)}, r"co_runner_steps must be \(first, end\)"),
        ({"new_tokens": "3"}, "new_tokens must be an integer, got str '3'"),
    ],
)
def test_simulate_session_options(kw, match):
    from socllm.sim.hetero import simulate_session

    kw = {"new_tokens": 4} | kw
    with pytest.raises(InvalidArgumentError, match=match):
        simulate_session("internlm-1.8b", DEV, prompt_len=64, **kw)


def test_lmeval_model_arguments(smollm):
    pytest.importorskip("lm_eval")
    from socllm.eval.lmeval import SocllmLM

    for kw, match in (
        ({"batch_size": "abc"}, "batch_size must be an integer, got str 'abc'"),
        ({"max_batch_tokens": "x"}, "max_batch_tokens must be an integer, got str 'x'"),
        ({"threads": "two"}, "threads must be an integer, got str 'two'"),
        ({"max_length": "1.5"}, "max_length must be an integer, got str '1.5'"),
    ):
        with pytest.raises(InvalidArgumentError, match=match):
            SocllmLM(model=smollm, **kw)
