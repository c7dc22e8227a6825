"""The component energy model and `socllm fidelity` (issue 40): energy recomputed from the
spans by hand, the fit recovering planted parameters, range residuals by hand, the folds, and
the committed fidelity table reproduced from the code (the cheap variant of the test tier)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import socllm
from socllm import fidelity
from socllm.devices import load_profile
from socllm.fidelity import fit as ffit
from socllm.fidelity.model import PAPERS, SocModel
from socllm.fidelity.targets import Target, all_targets

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "results" / "fidelity.json"
RESULTS = ROOT / "docs" / "RESULTS.md"


def _component_profile(static_w=0.7, dram_pj=50.0) -> dict:
    p = copy.deepcopy(load_profile("snapdragon-8gen3"))
    power = p["cost_model"]["power"]
    power["static_w"] = {"value": static_w, "unit": "W", "source": "test"}
    power["dram_pj_per_byte"] = {"value": dram_pj, "unit": "pJ/byte", "source": "test"}
    return p


def test_component_energy_is_recomputed_from_the_spans():
    """energy = static x makespan + sum of busy x active power + DRAM bytes x pJ/byte, each part
    recomputed here from the timeline's spans and ops (not read back from the simulator)."""
    prof = _component_profile()
    tl = socllm.simulate("qwen1.5-1.8b", prof, "shadow-outlier", 128, chunk=64)
    s = tl.summary()
    spans = tl.spans_us
    power = prof["cost_model"]["power"]
    makespan_us = float(spans[:, 1].max())
    active_mj = 0.0
    dram_bytes = 0.0
    for t in tl.tasks:
        busy = spans[t["id"], 1] - spans[t["id"], 0]
        active_mj += busy * power[f"{t['processor']}_w"]["value"] * 1e-3
        dram_bytes += sum(o.get("weight_bytes", 0) + o.get("activation_bytes", 0) for o in t["ops"])
    static_mj = makespan_us * 0.7 * 1e-3
    dram_mj = dram_bytes * 50.0 * 1e-9
    assert s["static_energy_mj"] == pytest.approx(static_mj, rel=1e-9)
    assert s["dram_energy_mj"] == pytest.approx(dram_mj, rel=1e-9)
    assert s["energy_mj"] == pytest.approx(active_mj + static_mj + dram_mj, rel=1e-9)
    assert dram_mj > 0 and static_mj > 0


def test_two_processors_together_pay_one_static_floor():
    """The issue's point: two processors running at once cost the floor once plus both active
    powers, not two whole-phone powers. Doubling the floor adds exactly floor x makespan."""
    a = socllm.simulate("qwen1.5-1.8b", _component_profile(0.5), "shadow-outlier", 128, chunk=64)
    b = socllm.simulate("qwen1.5-1.8b", _component_profile(1.0), "shadow-outlier", 128, chunk=64)
    sa, sb = a.summary(), b.summary()
    assert {"npu", "cpu"} <= set(sa["busy_ms"])  # both ran
    assert sb["energy_mj"] - sa["energy_mj"] == pytest.approx(0.5 * sa["total_ms"], rel=1e-9)


def test_whole_system_profiles_keep_their_energy():
    """A profile without /cost_model/power/static_w keeps the whole-system reading: busy x
    power, nothing static, nothing for DRAM."""
    prof = load_profile("snapdragon-8gen3")
    tl = socllm.simulate("qwen1.5-1.8b", prof, "shadow-outlier", 128, chunk=64)
    s = tl.summary()
    spans = tl.spans_us
    power = prof["cost_model"]["power"]
    expect = sum(
        (spans[t["id"], 1] - spans[t["id"], 0]) * power[f"{t['processor']}_w"]["value"] * 1e-3
        for t in tl.tasks
    )
    assert s["static_energy_mj"] == 0 and s["dram_energy_mj"] == 0
    assert s["energy_mj"] == pytest.approx(expect, rel=1e-9)


def test_negative_static_power_is_refused_with_its_value():
    with pytest.raises(socllm.InvalidArgumentError, match=r"static_w = -0\.5"):
        socllm.simulate("qwen1.5-1.8b", _component_profile(-0.5), "shadow-outlier", 64)


def _target(value, lo=None, hi=None):
    return Target("t", "llmnpu", value, "x", "", lambda m: value, lo, hi)


def test_range_residuals_by_hand():
    t = _target(28.285, 18.17, 38.4)
    assert ffit.log_residual(t, 20.0) == 0.0  # inside the range
    assert ffit.log_residual(t, 9.085) == pytest.approx(math.log(0.5))  # half the lower end
    assert ffit.relative_error(t, 76.8) == pytest.approx(1.0)  # twice the upper end
    assert ffit.relative_error(_target(2.0), 3.0) == pytest.approx(0.5)
    assert ffit.log_residual(_target(2.0), -1.0) == math.log(1e-6)  # a failed prediction


def test_the_fit_recovers_planted_parameters():
    """Targets made at planted values of two parameters (llama.cpp's speed and llm.npu's NPU
    time): the fit, started at the neutral values, finds the planted values."""
    planted = {"cpu_time_scale": 1.7, "npu_int8_time_scale": 1.3}
    base = [t for t in all_targets() if t.id.startswith(("001 §1: llama.cpp", "001 §3.4"))]
    m = SocModel(planted)
    made = [
        Target(t.id, t.paper, t.predict(m), t.unit, t.conditions, t.predict) for t in base
    ]  # the paper's values replaced by the planted model's answers
    ev = ffit.Evaluator(made)
    assert [set(d) for d in ev.deps] == [{"cpu_time_scale"}, {"npu_int8_time_scale"}]
    got = ev.fit(list(range(len(made))))
    assert set(got["free"]) == {"cpu_time_scale", "npu_int8_time_scale"}
    for name, v in planted.items():
        assert got["values"][name] == pytest.approx(v, rel=0.02), name
    assert got["values"]["static_w_8gen3"] == 1.0  # not free: left at its start


def _made(id_: str, value: float, predict) -> Target:
    return Target(id_, "llmnpu", value, "x", "test", predict)


def test_a_dependency_that_appears_away_from_the_start_is_fitted():
    """A target that moves with the top-k cost only once llama.cpp is over 1.5x slower (a part
    that leaves the critical path, say): invisible at the start, found again at the first fit's
    vector, then fitted; the planted values come back."""

    def gated(m):
        v = m.values
        return 3.0 if v["cpu_time_scale"] <= 1.5 else 1.5 * v["topk_ns_per_score"]

    made = [
        _made("001 a", 17.0, lambda m: 10.0 * m.values["cpu_time_scale"]),
        _made("001 b", 4.5, gated),  # planted: cpu 1.7, top-k 3 ns
    ]
    ev = ffit.Evaluator(made)
    assert ev.deps == [("cpu_time_scale",), ()]
    got = ev.fit([0, 1])
    assert got["free"] == ["cpu_time_scale", "topk_ns_per_score"]
    assert ev.deps[1] == ("topk_ns_per_score",)
    assert got["values"]["cpu_time_scale"] == pytest.approx(1.7, rel=0.02)
    assert got["values"]["topk_ns_per_score"] == pytest.approx(3.0, rel=0.02)


def test_fitted_values_stay_inside_their_bounds():
    """A target beyond a parameter's reach: the fit stops at the bound, exactly on it."""
    upper = next(p.upper for p in fidelity.PARAMETERS if p.name == "cpu_time_scale")
    made = [_made("001 far", 10.0 * 3 * upper, lambda m: 10.0 * m.values["cpu_time_scale"])]
    got = ffit.Evaluator(made).fit([0])
    assert got["values"]["cpu_time_scale"] <= upper
    assert got["values"]["cpu_time_scale"] == pytest.approx(upper, rel=1e-3)


def test_folds_partition_the_targets_and_mix_the_papers():
    targets = all_targets()
    idx = [i for i, t in enumerate(targets) if t.modelled]
    fs = ffit.folds(targets, idx, 5, seed=3)
    assert sorted(i for f in fs for i in f) == idx
    for f in fs:
        assert {targets[i].paper for i in f} == set(PAPERS)
    assert ffit.folds(targets, idx, 5, seed=3) == fs


def test_every_target_names_its_seed_and_modelled_ones_predict():
    targets = all_targets()
    assert len(targets) >= 60
    assert {t.paper for t in targets} == set(PAPERS)
    for t in targets:
        assert t.id[:3] in ("000", "001", "002", "004"), t.id
        assert t.modelled or t.why_not_modelled, t.id
    ids = [t.id for t in targets]
    assert len(ids) == len(set(ids))


def test_the_committed_table_is_reproduced():
    """The fidelity section of RESULTS is the committed report rendered again, and the quick
    targets' predictions at its fitted parameters are what the report says (the cheap variant:
    simulations of milliseconds, no fit)."""
    report = json.loads(REPORT.read_text())
    text = RESULTS.read_text()
    block = text.split(fidelity.BEGIN, 1)[1].split(fidelity.END, 1)[0]
    command = block.split("`", 2)[1]
    assert block.strip() == fidelity.markdown(report, command).strip()
    values = {p["name"]: p["fitted"] for p in report["parameters"]}
    m = SocModel(values)
    rows = {r["id"]: r for r in report["targets"]}
    checked = 0
    for t in fidelity.quick_targets():
        assert t.predict(m) == pytest.approx(rows[t.id]["predicted"], rel=1e-6), t.id
        checked += 1
    assert checked >= 10
    assert report["n_parameters"] < report["n_modelled"] / 2


def test_cli_refuses_a_results_file_without_markers(tmp_path, capsys):
    from socllm.cli import main

    f = tmp_path / "R.md"
    f.write_text("# results\n")
    assert main(["fidelity", "--quick", "--folds", "0", "--results", str(f), "--quiet"]) == 2
    assert "fidelity: begin" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fidelity", "--folds", "1"])


def test_energy_under_other_powers_equals_a_new_simulation():
    """Power parameters change no duration, so the fidelity model reuses a timeline simulated
    under other powers and recomputes its energy: equal to simulating again."""
    from socllm.fidelity.targets import _hetero

    a = SocModel({})
    _hetero(a, "llama-3-8b", "hetero-tensor", 256)  # simulated under a's powers
    b = SocModel({"static_w_8gen3": 1.7, "npu_active_w": 0.9, "gpu_active_w": 2.2})
    again = socllm.simulate_hetero(
        "llama-3-8b", b.profile("snapdragon-8gen3"), "hetero-tensor", 256
    )
    reused = _hetero(b, "llama-3-8b", "hetero-tensor", 256)
    assert b.energy_mj("snapdragon-8gen3", reused) == pytest.approx(
        again.summary()["energy_mj"], rel=1e-12
    )


def test_every_held_out_pattern_names_targets():
    """The main fit's held-out rows are named by id patterns: each must match (a pattern that
    matches nothing would silently put rows back into the fit)."""
    targets = all_targets()
    for pattern in fidelity.MAIN_HELD_OUT:
        assert any(pattern in t.id for t in targets), pattern
    held = [t for t in targets if t.modelled and fidelity.held_out(t)]
    assert {t.paper for t in held} == set(PAPERS)
    assert 0.3 < len(held) / sum(t.modelled for t in targets) < 0.7


def test_cold_start_energy_and_setup_by_hand():
    """EdgeFlow's cold start under the fidelity model: the simulator's energy under the
    model's powers, plus the NPU systems' setup: its seconds on the TTFT and one CPU core above
    the floor for its duration (recomputed here from a fresh simulation)."""
    from socllm.fidelity.model import ELITE
    from socllm.fidelity.targets import _cold

    m = SocModel({"static_w_8elite": 0.8, "cpu_active_w": 4.0, "npu_setup_s": 1.5})
    prof = m.profile(ELITE)
    fresh = socllm.simulate_cold_start(
        "qwen1.5-1.8b", prof, "edgeflow", bits=5, prompt_len=128
    ).summary()
    got = _cold(m, "qwen1.5-1.8b", "edgeflow", 5, 128)
    setup_ms = 1500.0
    assert got["ttft_ms"] == pytest.approx(fresh["ttft_ms"] + setup_ms, rel=1e-12)
    core_w = 4.0 / prof["processors"]["cpu_all"]["count"]["value"]
    assert got["energy_mj"] == pytest.approx(
        fresh["energy_mj"] + setup_ms * (0.8 + core_w), rel=1e-12
    )


def test_simulate_on_the_fitted_device(capsys):
    """`socllm simulate --device-params fitted` times on the committed vector: llm.npu's
    headline row comes out as the fidelity report predicted it; a phone the SoC model does not
    cover is refused by name."""
    from socllm.cli import main

    row = next(
        r for r in json.loads(REPORT.read_text())["targets"] if r["id"].startswith("001 abstract")
    )
    argv = ["simulate", "--config", "qwen1.5-1.8b", "--prompt-len", "1024", "--json", "-"]
    assert main([*argv, "--device-params", "fitted", "--quiet"]) == 0
    fitted = json.loads(capsys.readouterr().out)["prefill_tokens_per_s"]
    assert fitted == pytest.approx(row["predicted"], rel=1e-6)
    assert main([*argv, "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["prefill_tokens_per_s"] != pytest.approx(fitted)
    assert main([*argv, "--device", "snapdragon-8gen1", "--device-params", "fitted"]) == 2
    assert "snapdragon-8gen1" in capsys.readouterr().err


def test_a_parameter_file_of_another_model_is_refused(tmp_path):
    """SocModel.fitted reads only a vector of exactly this model's parameters, inside their
    bounds: an unknown or missing name, or a value out of bounds, is a FormatError naming it."""
    params = json.loads((ROOT / "python/socllm/fidelity/fitted_parameters.json").read_text())
    good = tmp_path / "good.json"
    good.write_text(json.dumps(params))
    assert SocModel.fitted(good).values == SocModel.fitted().values
    for name, edit in (
        ("extra", lambda p: p["parameters"].update(gpu_boost={"value": 2.0})),
        ("missing", lambda p: p["parameters"].pop("cpu_time_scale")),
        ("bounds", lambda p: p["parameters"]["cpu_time_scale"].update(value=99.0)),
    ):
        bad = copy.deepcopy(params)
        edit(bad)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(socllm.FormatError, match="gpu_boost|cpu_time_scale"):
            SocModel.fitted(path)


def test_npu_compute_roof_is_its_own_parameter():
    """npu_int8_time_scale scales the NPU INT8 overheads and weight streams, not the compute roof,
    which npu_int8_compute_gops sets; a chunk-sized matmul then follows the roof by hand."""
    base = load_profile("snapdragon-8gen3")["cost_model"]["npu"]
    npu = SocModel({"npu_int8_time_scale": 2.0, "npu_int8_compute_gops": 1500.0}).profile(
        "snapdragon-8gen3"
    )["cost_model"]["npu"]
    assert npu["int8_overhead_us"]["value"] == pytest.approx(2 * base["int8_overhead_us"]["value"])
    assert npu["int8_weight_gbps"]["value"] == pytest.approx(base["int8_weight_gbps"]["value"] / 2)
    assert npu["int8_compute_gops"]["value"] == 1500.0
    # a 256 x 2048 x 5504 INT8 matmul (Qwen1.5-1.8B's FFN, one chunk): compute-bound at 1.5 TOPS
    cost = socllm.sim.CostModel(
        socllm.sim.DeviceProfile.from_json(
            {"name": "t", "cost_model": {"npu": npu}}, "snapdragon-8gen3"
        )
    )
    op = {"op": "matmul", "dtype": "int8", "m": 256, "k": 2048, "n": 5504}
    tile = [int(npu[f"tile_{d}"]["value"]) for d in "mkn"]  # whole tiles (seed 002 §3.2)
    m, k, n = (-(-x // t) * t for x, t in zip((256, 2048, 5504), tile, strict=True))
    compute_us = 2 * m * k * n / (1500.0 * 1e3)
    stream_us = 2048 * 5504 / (npu["int8_weight_gbps"]["value"] * 1e3)
    assert compute_us > stream_us
    assert cost.latency_us(op, "npu") == pytest.approx(
        npu["int8_overhead_us"]["value"] + compute_us, rel=1e-9
    )
