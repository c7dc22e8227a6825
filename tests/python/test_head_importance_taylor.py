"""Step head-importance with importance_method=taylor (issue 38 item 4): the first-order estimate
of shadowAttn's Eq. 1-2 from one backward pass (Michel et al. 2019), on a tiny model. The gate
sits where the exact step ablates (an independent float64 numpy forward pass), its gradient is
the finite difference of the loss, and the step's numbers rank the heads as the exact ablation
of the C++ part does."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import socllm

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_model import TINY, numpy_logprobs, tiny_weights, write_tiny  # noqa: E402

L, H = TINY["n_layers"], TINY["n_heads"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ws = tiny_weights(TINY, np.random.default_rng(0))
    path = write_tiny(tmp_path_factory.mktemp("taylor") / "tiny.h5", weights=ws)
    return socllm.load(path, progress=False), ws


@pytest.fixture(scope="module")
def gated64(tiny):
    """The torch model of the tiny file in float64, gated, and two windows of its corpus."""
    from socllm.calibration import calibration_windows, corpus_tokens
    from socllm.calibration.head_importance import GatedReference, reference_model

    m, _ = tiny
    g = GatedReference(reference_model(m).double(), L, H, TINY["head_dim"])
    yield g, calibration_windows(corpus_tokens(m), 2, 20, 3)
    g.close()


def test_gate_sits_where_the_ablation_does(tiny, gated64):
    """A gate at 0 is the exact step's ablation: the window's NLL with that head's (that layer's)
    attention output zeroed in tiny_model's numpy forward pass."""
    import torch

    _, ws = tiny
    g, wins = gated64
    for zero in [set(), {(0, 1)}, {(1, 3)}, {(1, j) for j in range(H)}]:
        gate = torch.ones(L, H, dtype=torch.float64)
        for i, j in zero:
            gate[i, j] = 0
        with torch.no_grad():
            got = g.window_nll(wins, gate).numpy()
        want = [-numpy_logprobs(TINY, ws, w, zero).mean() for w in wins]
        np.testing.assert_allclose(got, want, rtol=1e-6)  # RMSNorm in float32 (below)


def test_gate_gradient_is_the_finite_difference(gated64):
    """d/dxi of the windows' summed mean NLL (one backward pass) against a five-point central
    difference of the loss (forward passes only), per head and along a whole layer's gates.
    (transformers' RMSNorm runs in float32 even in a float64 model, so the loss carries ~1e-7
    of noise: steps of 1e-2, where the stencil's own error is ~1e-9.)"""
    import torch

    g, wins = gated64
    grad, nll = g.gate_gradient(wins)
    assert grad.shape == (L, H) and nll.shape == (len(wins),)

    def loss(gate) -> float:
        with torch.no_grad():
            return float(g.window_nll(wins, gate).sum())

    def derivative(direction) -> float:
        h = 1e-2
        f = [loss(1 + k * h * direction) for k in (-2, -1, 1, 2)]
        return (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h)

    for i in range(L):
        for j in range(H):
            e = torch.zeros(L, H, dtype=torch.float64)
            e[i, j] = 1
            assert grad[i, j] == pytest.approx(derivative(e), rel=1e-3, abs=1e-4), (i, j)
        e = torch.zeros(L, H, dtype=torch.float64)
        e[i] = 1
        assert grad[i].sum() == pytest.approx(derivative(e), rel=1e-3, abs=1e-4), i
    assert np.abs(grad).max() > 1e-1  # gates that matter


def _spearman(a, b) -> float:
    ra, rb = (np.argsort(np.argsort(np.ravel(x))) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_taylor_step_ranks_like_the_ablation(tiny):
    """The step's taylor numbers (torch) against the exact ablation (the C++ part) on the same
    windows: the same arrays, signed alike, heads ranked alike, the layer's number the sum of
    its heads', and the method in the provenance."""
    from socllm.calibration import calibrate_head_importance

    m, _ = tiny
    opts = dict(importance_samples=4, importance_seqlen=32, seed=1, progress=False)
    exact = calibrate_head_importance(m, importance_method="ablation", **opts)
    taylor = calibrate_head_importance(m, importance_method="taylor", **opts)
    assert exact.provenance["head_importance_method"] == "ablation"
    assert taylor.provenance["head_importance_method"] == "taylor"
    assert taylor.provenance["head_importance_samples"] == 4
    h_exact, h_taylor = (d.stats.array("head_importance") for d in (exact, taylor))
    assert h_taylor.shape == h_exact.shape == (L, H) and h_taylor.dtype == np.float32
    l_taylor = taylor.stats.array("layer_importance")
    np.testing.assert_allclose(l_taylor, h_taylor.sum(1), rtol=1e-5, atol=1e-7)
    assert _spearman(h_exact, h_taylor) > 0.8
    assert np.mean(np.sign(h_exact) == np.sign(h_taylor)) >= 0.75


def test_taylor_without_torch_names_the_extra(tiny, monkeypatch):
    """Without torch the step says what to install, before any work."""
    from socllm.calibration import calibrate_head_importance

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(socllm.UnsupportedError, match=r"pip install -e '\.\[reference\]'"):
        calibrate_head_importance(
            tiny[0], importance_method="taylor", importance_samples=1, progress=False
        )


def test_qwen2_layout_scores_as_the_engine(tmp_path):
    """q/k/v biases (qwen2): the torch model built from the file is the engine's model."""
    import torch
    from socllm.calibration import calibration_windows, corpus_tokens
    from socllm.calibration.head_importance import GatedReference, reference_model

    ws = tiny_weights(TINY, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    for i in range(L):
        for name, heads in (("bq", H), ("bk", TINY["n_kv_heads"]), ("bv", TINY["n_kv_heads"])):
            ws[f"layers/{i}/{name}"] = rng.normal(0, 0.2, heads * TINY["head_dim"]).astype("f4")
    config = {"arch": "qwen2", "qkv_bias": 1}
    m = socllm.load(write_tiny(tmp_path / "q.h5", config=config, weights=ws), progress=False)
    g = GatedReference(reference_model(m), L, H, TINY["head_dim"])
    wins = calibration_windows(corpus_tokens(m), 2, 24, 0)
    with torch.no_grad():
        got = g.window_nll(wins, torch.ones(L, H)).numpy()
    want = [-lp.astype(np.float64).mean() for lp in m.token_logprobs(wins, "fp32")]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_other_architectures_are_refused_by_name():
    from types import SimpleNamespace

    from socllm.calibration.head_importance import reference_model

    m = SimpleNamespace(config={"arch": "gemma3"}, path="g.h5")
    with pytest.raises(socllm.UnsupportedError, match="gemma3.*importance_method=ablation"):
        reference_model(m)


def test_another_torch_model_is_refused(tiny, tmp_path):
    """The torch model must score the first window as the engine does: one of other weights is
    an error before any window's result is used."""
    from socllm.calibration import calibration_windows, corpus_tokens
    from socllm.calibration.head_importance import reference_model, taylor_importance

    m, _ = tiny
    other = write_tiny(tmp_path / "o.h5", weights=tiny_weights(TINY, np.random.default_rng(9)))
    ref = reference_model(socllm.load(other, progress=False))
    wins = calibration_windows(corpus_tokens(m), 2, 16, 0)
    with pytest.raises(socllm.InvalidArgumentError, match="not the same model"):
        taylor_importance(m, wins, ref=ref, progress=False)
    heads, layers = taylor_importance(m, wins, ref=ref, progress=False, check_engine=False)
    assert heads.shape == (L, H) and layers.shape == (L,)
