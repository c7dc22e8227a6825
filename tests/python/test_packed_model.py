"""Model files with prequantized linears (`socllm convert --edgeflow-bits`, seed 004 §4.2):
loading one gives exactly the logits of its plan on the original model, and a damaged file is
a FormatError naming the tensor, never wrong weights."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import socllm
from socllm.calibration import corpus_tokens, held_out_tokens, run_steps, save_calibration
from socllm.io.convert_packed import convert_packed

SMALL = {"samples": 4, "seqlen": 128, "seed": 7, "smoothing_windows": 2, "smoothing_rows": 32}
INT8_PLAN = "edgeflow:bits=8,allocation=uniform"


@pytest.fixture(scope="module")
def calibrated(smollm, tmp_path_factory):
    data = run_steps(smollm, "act-scales,smoothing", progress=False, **SMALL)
    path = save_calibration(tmp_path_factory.mktemp("cal") / "ef.h5", data, smollm)
    smollm.load_calibration(path)
    yield path
    smollm.set_calibration(None)


@pytest.fixture(scope="module")
def packed(smollm, calibrated, tmp_path_factory):
    d = tmp_path_factory.mktemp("packed")
    return {
        "edgeflow": convert_packed(smollm, d / "ef5.h5", plan="edgeflow", progress=False),
        INT8_PLAN: convert_packed(smollm, d / "int8.h5", plan=INT8_PLAN, progress=False),
    }


@pytest.fixture(scope="module")
def tokens(smollm):
    return held_out_tokens(corpus_tokens(smollm))[:96]


@pytest.mark.parametrize("plan", ["edgeflow", INT8_PLAN])
def test_loaded_file_gives_the_plans_logits_exactly(smollm, packed, tokens, plan):
    ref = smollm.logits(tokens, plan)
    m = socllm.load(packed[plan], progress=False)
    np.testing.assert_array_equal(m.logits(tokens, plan), ref)
    # generation runs on it too, with the same tokens
    assert m.generate_ids(tokens[:32], 8, plan=plan) == smollm.generate_ids(
        tokens[:32], 8, plan=plan
    )
    with pytest.raises(socllm.InvalidArgumentError, match="prequantized for plan"):
        m.logits(tokens, "fp32")
    with pytest.raises(socllm.InvalidArgumentError, match="prequantized for plan"):
        m.logits(tokens, "edgeflow:bits=6")


def test_file_layout(packed):
    with h5py.File(packed["edgeflow"]) as f:
        assert f.attrs["format_version"] == socllm.io.Model.format_version == 4
        pk = f["packed_linears"]
        assert pk.attrs["storage"] == "weightlet" and pk.attrs["group"] == 128
        t = pk["layers/0/wq"]
        rows, cols = t.attrs["rows"], t.attrs["cols"]
        bits = socllm.ops.WeightletTensor(rows, cols, 128, t["bits"][()], t["data"][()]).bits
        assert abs(bits.mean() - 5.0) < 0.01
        assert "wq" not in f["weights/layers/0"]  # no fp32 linears
    with h5py.File(packed[INT8_PLAN]) as f:
        assert f["packed_linears"].attrs["storage"] == "int8"
        assert f["packed_linears/layers/0/w_down/codes"].dtype == np.int8
    sizes = {k: os.path.getsize(v) for k, v in packed.items()}
    assert sizes["edgeflow"] < sizes[INT8_PLAN]


def _damaged(src, tmp_path, dataset: str, damage) -> str:
    """A copy of ``src`` whose ``dataset`` is rewritten through h5py (which recomputes its
    Fletcher-32, so only socllm's own checks can see the damage)."""
    dst = tmp_path / (dataset.replace("/", "_") + ".h5")
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        v = f[dataset][()]
        damage(v)
        f[dataset][...] = v
    return dst


def test_damaged_files_are_format_errors_naming_the_tensor(packed, tmp_path):
    src = packed["edgeflow"]
    # Truncated: HDF5 cannot read the file.
    cut = tmp_path / "cut.h5"
    shutil.copy(src, cut)
    with open(cut, "r+b") as f:
        f.truncate(os.path.getsize(src) // 2)
    with pytest.raises(socllm.FormatError):
        socllm.load(cut, progress=False)

    def flip(v):
        v[1000] ^= 0x10

    def other_width(v):
        v[0] ^= 0x01  # row 0 of the tensor: another bit-width

    def nan(v):
        v[4] = np.nan

    for dataset, damage, match in [
        ("packed_linears/layers/3/w_up/data", flip, "'layers/3/w_up'.*checksum"),
        ("packed_linears/layers/5/wk/bits", other_width, "'layers/5/wk'.*metadata implies"),
        ("packed_linears/layers/2/wo/scales", nan, "layers/2/wo/scales"),
    ]:
        with pytest.raises(socllm.FormatError, match=match):
            socllm.load(_damaged(src, tmp_path, dataset, damage), progress=False)


def test_changed_activation_scale_is_a_format_error(smollm, packed, tokens, tmp_path):
    """Issue 37: a per-layer activation scale is an attribute, which HDF5's Fletcher-32 does not
    cover; one changed bit used to load and change the logits."""
    src = packed["edgeflow"]
    dst = tmp_path / "scale.h5"
    shutil.copy(src, dst)
    layer = "packed_linears/layers/9"
    with h5py.File(dst, "r+") as f:
        v = np.float64(f[layer].attrs["act_scale_mlp_act"])
        f[layer].attrs["act_scale_mlp_act"] = (v.view(np.uint64) ^ np.uint64(1 << 40)).view(
            np.float64
        )
    with pytest.raises(socllm.FormatError, match=f"'/{layer}' in '{dst}'.*CRC-32"):
        socllm.load(dst, progress=False)


def test_interrupted_convert_leaves_no_file(smollm, calibrated, tmp_path, monkeypatch):
    import socllm.io.convert_packed as cp

    calls = {"n": 0}
    real = cp.packed_crc

    class Stop(Exception):
        pass

    def failing(*a):
        calls["n"] += 1
        if calls["n"] == 50:  # half way through the tensors
            raise Stop
        return real(*a)

    monkeypatch.setattr(cp, "packed_crc", failing)
    out = tmp_path / "out.h5"
    with pytest.raises(Stop):
        cp.convert_packed(smollm, out, plan="edgeflow", progress=False)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_convert_and_bad_budgets(calibrated, tmp_path):
    out = tmp_path / "cli.h5"
    cmd = [sys.executable, "-m", "socllm", "convert", "smollm2-135m", "--calib", str(calibrated)]
    r = subprocess.run(
        [*cmd, "--edgeflow-bits", "4.5", "-o", str(out), "--quiet"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        assert '"bits": 4.5' in f["packed_linears"].attrs["plan"]
    r = subprocess.run(
        [*cmd, "--edgeflow-bits", "9", "-o", str(tmp_path / "x.h5")], capture_output=True, text=True
    )
    assert r.returncode != 0 and "--edgeflow-bits" in r.stderr
    assert not (tmp_path / "x.h5").exists()
