"""Hugging Face `tokenizers` objects for socllm models.

A GGUF file carries no `tokenizer.json`, only llama.cpp's vocabulary metadata. We rebuild the
tokenizer from it the way transformers does when it loads the same file
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, transformers
`integrations/gguf/gguf_tokenizer_mapping.py` + `models/gpt2/tokenization_gpt2.py`), so that our
token ids equal the reference's exactly, without importing transformers at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE

from socllm.errors import UnsupportedError

__all__ = ["bytes_to_unicode", "load_tokenizer_json", "tokenizer_from_gguf_vocab"]

# GGUF token types (llama.cpp `enum llama_token_type` / gguf-py `TokenType`).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# Split regexes transformers puts in front of a byte-level BPE, keyed by `tokenizer.ggml.pre`
# (transformers `GGUF_PRE_TOKENIZER_SPLITS`). Any other `pre` keeps GPT-2's own regex.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# transformers models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX: digits one at a time.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# transformers models/qwen3_5/tokenization_qwen3_5.py PRETOKENIZE_REGEX.
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(
        [
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
        ],
        _LLAMA3_SPLIT,
    ),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"], _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], _GPT4O_SPLIT),
}

# Architectures whose sentencepiece (`llama`) vocabulary transformers builds as GemmaTokenizer
# (gguf_tokenizer_mapping.py GGUF_SENTENCEPIECE_BUILDERS), and that class's named special tokens.
GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")
_GEMMA_MASK = "<mask>"
# GPT2Tokenizer's default unk/bos/eos; transformers marks it special whenever the vocabulary has it.
_GPT2_DEFAULT_SPECIAL = "<|endoftext|>"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py, also in transformers)."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=False))


def tokenizer_from_gguf_vocab(
    tokens: Sequence[str],
    merges: Sequence[str],
    token_type: Sequence[int],
    model: str,
    pre: str,
    bos_id: int,
    eos_id: int,
    add_bos: bool,
    *,
    unk_id: int = -1,
    pad_id: int = -1,
    arch: str = "",
) -> Tokenizer:
    """The tokenizer transformers builds for a GGUF vocabulary: byte-level BPE for
    `tokenizer.ggml.model` `gpt2`, or Gemma's sentencepiece BPE for model `llama` of a Gemma
    architecture (`arch`).

    Mirrors transformers' `byte_level_tokenizer` / `gemma_tokenizer` + `add_gguf_special_tokens` +
    `set_split_regex` and the special tokens its tokenizer class registers. Ids < 0 mean
    "absent". Raises UnsupportedError for any other tokenizer model.
    """
    if model == "llama" and arch in GEMMA_ARCHS:
        return _gemma_tokenizer(tokens, token_type, bos_id, eos_id, add_bos, unk_id, pad_id)
    if model != "gpt2":
        raise UnsupportedError(
            f"[tokenizer_from_gguf_vocab] GGUF tokenizer model {model!r} of architecture "
            f"{arch!r} is not supported (byte-level BPE 'gpt2', or 'llama' for "
            f"{', '.join(GEMMA_ARCHS)})"
        )
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())

    # Tokens stored outside the byte alphabet (e.g. with a raw space) are respelled byte-wise, as
    # transformers does; later duplicates win, as in its dict comprehension.
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(tokens)
    }
    bpe = BPE(
        vocab=vocab,
        merges=[tuple(m.split(" ")) for m in merges],
        dropout=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
    )
    tok = Tokenizer(bpe)
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()

    # Control tokens whole and special; a "control" token spelled outside the byte alphabet is a
    # llama.cpp mislabel that transformers skips. The named special tokens (GGUF bos/eos/unk/pad,
    # plus GPT2Tokenizer's default) are special even when the file types them as normal;
    # transformers would also append the default to the vocabulary when it is missing, producing
    # an id the model has no embedding for; we don't.
    named_extra = [_GPT2_DEFAULT_SPECIAL] if _GPT2_DEFAULT_SPECIAL in vocab else []
    _add_special_tokens(
        tok,
        tokens,
        token_type,
        vocab,
        (bos_id, eos_id, unk_id, pad_id),
        named_extra,
        add_bos,
        control_ok=lambda t: set(t) <= alphabet,
    )
    return tok


def _add_special_tokens(
    tok: Tokenizer,
    tokens: Sequence[str],
    token_type: Sequence[int],
    vocab: dict[str, int],
    named_ids: Sequence[int],
    named_extra: Sequence[str],
    add_bos: bool,
    control_ok=lambda t: True,
) -> None:
    """transformers' `add_gguf_special_tokens` and what TokenizersBackend registers: control
    tokens whole and special (those `control_ok` accepts), user-defined tokens whole but not
    special, the named special tokens (ids `named_ids`, plus `named_extra`) special where the
    vocabulary has them, and a BOS post-processor when the file asks for one
    (TokenizersBackend.update_post_processor)."""
    types = list(token_type or ())
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, ty in zip(tokens, types, strict=False)
        if ty == TOKEN_TYPE_CONTROL and control_ok(t)
    ]
    if control:
        tok.add_special_tokens(control)
    user_defined = [
        AddedToken(t, normalized=False, special=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty == TOKEN_TYPE_USER_DEFINED and t in vocab
    ]
    if user_defined:
        tok.add_tokens(user_defined)

    def token(i: int) -> str | None:
        return tokens[i] if 0 <= i < len(tokens) else None

    named = [token(i) for i in named_ids] + list(named_extra)
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    extra = [  # added with `add_tokens`, as transformers does
        AddedToken(t, normalized=False, special=True)
        for t in dict.fromkeys(named)
        if t is not None and t in vocab and t not in added
    ]
    if extra:
        tok.add_tokens(extra)
    bos_id = named_ids[0]
    bos = token(bos_id)
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="$A:0", pair="$A:0 $B:1", special_tokens=[]
        )


def spm_merges(tokens: Sequence[str], rank: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges implied by a sentencepiece vocabulary that lists none: every split of a token
    into two tokens, best first by `rank` (higher first), then by the longer left and right piece
    (transformers `generate_merges` with vocab scores)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges: list[tuple[str, str, int]] = []
    for merge, score in rank.items():
        local = [
            (merge[:i], merge[i:], score)
            for i in range(1, len(merge))
            if merge[:i] in vocab and merge[i:] in vocab
        ]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _gemma_tokenizer(
    tokens: Sequence[str],
    token_type: Sequence[int],
    bos_id: int,
    eos_id: int,
    add_bos: bool,
    unk_id: int,
    pad_id: int,
) -> Tokenizer:
    """Gemma's sentencepiece BPE (transformers `gemma_tokenizer` and GemmaTokenizer): tokens of
    two or more blanks respelled with "▁", merges from the vocabulary ranked by file order (Gemma's
    scores do not follow its merge order), byte fallback, spaces normalized to "▁"."""
    respelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(respelled)}
    rank = {t: -i for i, t in enumerate(respelled)}
    unk = tokens[unk_id] if 0 <= unk_id < len(tokens) else "<unk>"
    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=spm_merges(respelled, rank),
            fuse_unk=True,
            unk_token=unk,
            dropout=None,
            byte_fallback=True,
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    # GemmaTokenizer's named specials add "<mask>" to the GGUF's bos/eos/unk/pad.
    _add_special_tokens(
        tok, tokens, token_type, vocab, (bos_id, eos_id, unk_id, pad_id), [_GEMMA_MASK], add_bos
    )
    return tok


def load_tokenizer_json(s: str) -> Tokenizer:
    """Tokenizer from the `tokenizer/json` text stored in a socllm model file."""
    return Tokenizer.from_str(s)
