"""Issue 12 (hardening) through the Python API: every case here crashed, hung, wrapped or gave a
non-socllm error before its fix. File-level cases (outputs, temp files, the conversion cache)
are in test_hardening_files.py; the core's own cases in cpp/tests/test_hardening.cpp."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import h5py
import numpy as np
import pytest
import socllm
from socllm.calibration import CalibrationData, load_calibration, save_calibration
from tiny_model import seal


def test_calibration_arrays_must_be_numeric(smollm):
    # A string or bytes array reached a null pointer in the bindings; None became NaN.
    cal = smollm.new_calibration()
    assert cal.array("act_absmax", "attn_in") is None  # not gathered yet
    shape = (smollm.config["n_layers"], smollm.config["d_model"])
    for bad in (np.full(shape, "a"), np.full(shape, b"a"), np.full(shape, None, dtype=object)):
        with pytest.raises(socllm.InvalidArgumentError, match="numeric array, got dtype"):
            cal.set_array("act_absmax", "attn_in", bad)
    with pytest.raises(socllm.InvalidArgumentError, match="numeric array"):
        cal.set_outlier_thresholds("attn_in", ["x"] * shape[0])
    cal.set_array("act_absmax", "attn_in", np.ones(shape, np.float64))  # numbers convert


def test_linear_graph_refuses_object_arrays(smollm):
    g = smollm.linear_graph("fp32", 0, "attn_in", 4)
    with pytest.raises(socllm.InvalidArgumentError, match="dtype object"):
        g.run(np.full((4, g.in_cols), None, dtype=object))
    assert np.isfinite(g.run(np.ones((4, g.in_cols), np.float64))).all()


@pytest.mark.parametrize(
    "plan, message",
    [
        ({"name": "smoothquant", "alpha": float("nan")}, "finite"),
        ({"name": "smoothquant", "alpha": float("inf")}, "finite"),
        ({"name": "fp32", "chunk_len": 2**70}, "64 bits"),
        ({"name": object()}, "type object"),
        ("smoothquant:alpha=1e400", "out of range"),
        ("w8-group:group_size=99999999999999999999", "out of range"),
    ],
)
def test_plan_values_are_checked(plan, message):
    with pytest.raises(socllm.InvalidArgumentError, match=message):
        socllm.Plan(plan)


def test_values_that_contain_themselves_are_errors_not_crashes():
    # py_to_json recursed without a limit: a cycle or deep nesting overflowed the C stack.
    plan = {"name": "custom"}
    plan["ops"] = plan
    with pytest.raises(socllm.InvalidArgumentError, match="nested deeper"):
        socllm.Plan(plan)
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(socllm.InvalidArgumentError, match="nested deeper"):
        socllm.Plan({"name": "fp32", "x": deep})


def test_plan_dicts_take_numpy_scalars_and_short_decimals():
    p = socllm.Plan({"name": "w8-group", "group_size": np.int64(64), "chunk_len": np.int32(32)})
    assert p.to_json()["group_size"] == 64 and p.chunk_len == 32
    assert socllm.Plan({"name": "smoothquant", "alpha": np.float32(0.5)}).to_json()["alpha"] == 0.5
    assert socllm.Plan("smoothquant:alpha=.5").to_json()["alpha"] == 0.5
    assert socllm.Plan("smoothquant:alpha=+0.5").to_json()["alpha"] == 0.5


def test_thread_count_is_bounded():
    before = socllm.num_threads()
    limit = socllm.max_num_threads()
    assert limit == 4 * os.cpu_count()
    for bad in (0, limit + 1, 64, 2**70, 2.5):
        with pytest.raises(socllm.InvalidArgumentError, match="set_num_threads"):
            socllm.set_num_threads(bad)
    assert socllm.num_threads() == before


def test_generate_counts_and_stop_ids(smollm):
    # 2**63 - 1 new tokens overflowed the capacity computation ("got -9223372036854775804").
    with pytest.raises(socllm.ContextOverflowError, match="9223372036854775807 new tokens"):
        smollm.generate("Hello", max_new_tokens=2**63 - 1)
    # A stop id beyond int32 surfaced as pybind11's TypeError about the signature.
    engine = socllm.model.Engine(socllm.io.Model.load(str(smollm.path)))
    with pytest.raises(socllm.InvalidArgumentError, match="out of range"):
        engine.generate_greedy(smollm.tokenize("Hello"), 2, [10**12])


def test_a_kv_cache_serves_one_call_at_a_time(smollm):
    # Two threads stepping one cache corrupted the heap ("double free or corruption").
    cache = smollm.new_cache(1024)
    errors: list[str] = []
    done = [0]

    def worker():
        for _ in range(12):
            try:
                smollm.step(cache, list(range(1, 9)))
                done[0] += 1
            except socllm.InvalidArgumentError as e:
                errors.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all("in use by another call" in e for e in errors)
    assert cache.length == 8 * done[0]  # every successful call appended its tokens once
    assert done[0] + len(errors) == 24


def test_ctrl_c_stops_a_long_call_quickly(smollm):
    script = textwrap.dedent(
        f"""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from socllm.model import LanguageModel
        m = LanguageModel({str(smollm.path)!r})
        print("ready", flush=True)
        t0 = time.perf_counter()
        try:
            m.logits([1] * 3000)
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # inside the 3000-token forward (several seconds on 2 cores)
        proc.send_signal(signal.SIGINT)
        t0 = time.perf_counter()
        out, _ = proc.communicate(timeout=60)
        waited = time.perf_counter() - t0
    finally:
        proc.kill()
    assert out.strip() == "interrupted"
    assert waited < 3.0, f"took {waited:.1f} s to stop"


def test_a_signal_handlers_own_exception_comes_through(smollm):
    # The interrupt poll ran the handler but raised KeyboardInterrupt whatever it had raised.
    def on_alarm(signum, frame):
        raise TimeoutError("deadline")

    before = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(TimeoutError, match="deadline"):
            smollm.logits([1] * 3000)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_gemm_refuses_k_beyond_the_exact_range():
    k = socllm.ops.max_exact_k()
    a = np.full((1, k["u8s8"] + 1), 255, np.uint8)
    b = np.full((k["u8s8"] + 1, 1), -128, np.int8)
    with pytest.raises(socllm.ShapeError, match="exact int32 range"):
        socllm.ops.gemm_u8s8s32(a, b)
    c = socllm.ops.gemm_u8s8s32(a[:, :-1], b[:-1])  # the worst case at the limit is exact
    assert int(c[0, 0]) == -k["u8s8"] * 255 * 128
    with pytest.raises(socllm.ShapeError, match="exact int32 range"):
        socllm.ops.gemm_s8s8s32(np.ones((1, 70000 * 2), np.int8), np.ones((70000 * 2, 1), np.int8))


@pytest.fixture(scope="module")
def calibration_file(smollm, tmp_path_factory):
    cal = smollm.new_calibration()
    smollm.observe_activations([smollm.tokenize("Hello world, this is a test.")], cal)
    path = tmp_path_factory.mktemp("cal") / "cal.h5"
    save_calibration(path, CalibrationData(cal, {"corpus": "test"}), smollm)
    return path


def _replace_dataset(f, name, data, **kw):
    del f[name]
    f.create_dataset(name, data=data, **kw)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        # a JSON array where the object was: nlohmann's RuntimeError before
        (lambda f: f.attrs.__setitem__("model_config", "[1, 2]"), "must be a JSON object"),
        (lambda f: f.attrs.__setitem__("format_version", "3"), "must be an integer"),
        (lambda f: f.attrs.__setitem__("tokens", np.arange(5)), "must hold one value"),
        # strings where numbers belong: the path that reached Calibration.set_array's null deref
        (
            lambda f: _replace_dataset(f, "act_absmax/attn_in", np.full((30, 576), b"ab")),
            "does not hold numbers",
        ),
        (lambda f: f["act_absmax/attn_in"].__setitem__((0, 0), np.nan), "invalid absmax nan"),
    ],
)
def test_corrupt_calibration_files_are_format_errors(
    smollm, calibration_file, tmp_path, corrupt, message
):

    path = tmp_path / "bad.h5"
    shutil.copy(calibration_file, path)
    with h5py.File(path, "a") as f:
        corrupt(f)
    seal(path)  # a writer's bad value with a consistent attribute checksum: the checks behind it
    with pytest.raises(socllm.SocllmError, match=message):
        load_calibration(path, smollm)
