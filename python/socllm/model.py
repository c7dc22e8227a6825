"""The Python face of a loaded model: tokenizer + C++ engine.

Arrays returned are float32 numpy arrays that own their memory (moved out of C++, no copy).
"""

from __future__ import annotations

import copy
import math
import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import h5py
import numpy as np
from tqdm.auto import tqdm

from . import _core
from .errors import ContextOverflowError, FormatError, InvalidArgumentError
from .errors import bool_arg as _bool_arg
from .errors import int_arg as _int_arg
from .errors import ints_arg as _ints_arg
from .errors import not_applicable as _not_applicable
from .errors import real_arg as _real_arg
from .eval.perplexity import sliding_windows
from .io.model_format import CHECKSUM_FORMAT_VERSION, TOKENIZER_JSON_DIGEST, tokenizer_json_digest
from .registry import resolve_model_file
from .tokenizer import load_tokenizer_json

# The C++ engine and KV cache a LanguageModel drives (cpp/engine/engine.h), for direct use.
Engine = _core.Engine
KVCache = _core.KVCache

PlanLike = str | Mapping | _core.Plan


def _token_ids(seq: Sequence[int], fn: str) -> list[int]:
    """Python ints from a sequence of integer token ids; like the C++ core, floats, strings and
    other non-integers are an InvalidArgumentError (``int()`` would silently truncate 1.5 or
    parse "12")."""
    if isinstance(seq, (str, bytes, bytearray)):
        raise InvalidArgumentError(
            f"{fn}: expected a sequence of token ids, got {type(seq).__name__}"
        )
    if isinstance(seq, np.ndarray) and seq.ndim != 1:
        raise InvalidArgumentError(
            f"{fn}: expected a 1-D sequence of token ids, got a {seq.ndim}-D array of shape "
            f"{seq.shape}"
        )
    try:
        iter(seq)
    except TypeError:
        raise InvalidArgumentError(
            f"{fn}: expected a sequence of token ids, got {type(seq).__name__} {seq!r}"
        ) from None
    out = []
    for i in seq:
        try:
            out.append(operator.index(i))
        except TypeError:
            raise InvalidArgumentError(
                f"{fn}: token ids must be integers, got {type(i).__name__} {i!r}"
            ) from None
    return out


def _read_tokenizer_json(path: Path) -> str:
    """The ``tokenizer/json`` text of a model file, checked against its stored SHA-256 (HDF5's
    Fletcher-32 cannot cover a variable-length string), which format 2 requires."""
    with h5py.File(path, "r") as f:
        tok = f.get("tokenizer/json")
        if not isinstance(tok, h5py.Dataset):
            raise FormatError(f"{path} has no tokenizer (tokenizer/json)")
        # One string; its shape is checked before reading (a compressed dataset may claim GBs).
        if tok.shape != () or tok.dtype.kind not in "OSU":
            raise FormatError(
                f"{path}: tokenizer/json must be one string, got {tok.dtype} of shape {tok.shape}"
            )
        text = tok[()]
        stored = tok.attrs.get(TOKENIZER_JSON_DIGEST)
        version = f.attrs.get("format_version")
    # The whole file's attributes (tokenizer ids and flags included), as Model.load checks them.
    _core.verify_h5_attributes(
        str(path),
        required=isinstance(version, (int, np.integer))
        and version >= _core.Model.attribute_checksum_format_version,
    )
    if stored is not None and not isinstance(stored, (str, bytes)):
        raise FormatError(f"{path}: the {TOKENIZER_JSON_DIGEST} of tokenizer/json is not a string")
    if isinstance(stored, bytes):
        stored = stored.decode("ascii", "replace")
    if (
        stored is None
        and isinstance(version, (int, np.integer))
        and (version >= CHECKSUM_FORMAT_VERSION)
    ):
        raise FormatError(
            f"{path}: tokenizer/json has no {TOKENIZER_JSON_DIGEST} checksum (format version "
            f"{version} requires one)"
        )
    try:
        text = text.decode() if isinstance(text, bytes) else text
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: tokenizer/json is not UTF-8 ({e})") from e
    if not isinstance(text, str):
        raise FormatError(f"{path}: tokenizer/json is not a string")
    if stored is not None and stored != tokenizer_json_digest(text):
        raise FormatError(
            f"{path}: tokenizer/json does not match its {TOKENIZER_JSON_DIGEST} checksum "
            "(the file is corrupt)"
        )
    return text


@dataclass
class PerplexityResult:
    """Outcome of a sliding-window perplexity evaluation (protocol in the README)."""

    perplexity: float
    nll_mean: float
    n_scored: int  # tokens whose log-probability entered the mean
    n_tokens: int  # tokens in the (possibly truncated) stream
    n_windows: int
    context: int
    stride: int
    token_nll: np.ndarray = field(repr=False)  # [n_scored] negative log-likelihoods, stream order

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "token_nll"}


def _file_tokenizer(path: Path):
    try:
        return load_tokenizer_json(_read_tokenizer_json(path))
    except FormatError:
        raise
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise FormatError(f"{path}: tokenizer/json is not a valid tokenizer ({e})") from e


def _tokenize(tokenizer, text: str) -> list[int]:
    if not isinstance(text, str):
        raise InvalidArgumentError(f"tokenize expects a str, got {type(text).__name__}")
    try:
        return tokenizer.encode(text).ids
    except TypeError:  # tokenizers' only word for a str it cannot take: not UTF-8 encodable
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidArgumentError(
                f"tokenize: the text has a lone surrogate {text[e.start]!r} at index "
                f"{e.start} (not valid Unicode)"
            ) from None
        raise


class FileTokenizer:
    """A model file's tokenizer without its weights (``tokenize``, ``tokenizer``: what
    ``calibrate.corpus_tokens`` needs), for work that must not load the model, e.g. a cold
    start's prompt."""

    def __init__(self, model_file: str | os.PathLike):
        self.path = Path(model_file)
        self.tokenizer = _file_tokenizer(self.path)

    def tokenize(self, text: str) -> list[int]:
        return _tokenize(self.tokenizer, text)


class LanguageModel:
    """A model loaded into the socllm engine. Create with :func:`socllm.load`."""

    def __init__(
        self,
        model_file: str | os.PathLike,
        *,
        threads: int | None = None,
        calib: str | os.PathLike | None = None,
    ):
        self.path = Path(model_file)
        if threads is not None:
            _core.set_num_threads(threads)
        self._model = _core.Model.load(str(self.path))
        self._engine = _core.Engine(self._model)
        self.config: Mapping = MappingProxyType(dict(self._model.config))
        self.tokenizer = _file_tokenizer(self.path)
        self.calibration_path: Path | None = None
        self.calibration_provenance: dict = {}  # the loaded file's attributes (corpus, seed...)
        if calib is not None:
            self.load_calibration(calib)

    @property
    def rotation(self) -> str:
        """The rotation the weights carry: ``none`` as loaded (:meth:`rotated`)."""
        return self._model.rotation

    @property
    def calibrated_rotations(self) -> list[str]:
        """The rotations whose statistics are loaded (a calibration file serves the plans of the
        rotation it was made on: ``none``, or e.g. ``hadamard,seed=0,down``)."""
        return self._engine.calibrated_rotations()

    def rotated(self, rotation: str) -> LanguageModel:
        """This model with ``rotation`` folded into its weights (a rotation's name, e.g.
        ``hadamard,seed=0,down``; ``Plan(...).rotation`` gives a plan's): the same function in
        fp32. Plans with rotate parts run on such a model by themselves; this is for gathering
        statistics on it (``socllm calibrate --rotate ...``). No calibration is loaded."""
        out = copy.copy(self)
        out._model = self._model.rotated(rotation)
        out._engine = _core.Engine(out._model)
        out.calibration_path, out.calibration_provenance = None, {}
        return out

    # -- calibration ------------------------------------------------------------------------
    def load_calibration(self, path: str | os.PathLike) -> None:
        """Use the activation statistics in ``path`` (``socllm calibrate``) for the plans that
        fix static scales or smoothing factors from calibration."""
        from .calibration.artifact import load_calibration

        cal = load_calibration(path, self)
        self._engine.set_calibration(cal.stats)
        self.calibration_path = Path(path)
        self.calibration_provenance = dict(cal.provenance)

    def set_calibration(self, stats: _core.Calibration | None) -> None:
        """Use these statistics (a ``Calibration``, e.g. from :meth:`observe_activations`) for
        the static plans, or None to drop the loaded calibration."""
        self._engine.set_calibration(stats)
        if stats is None:
            self.calibration_path = None
            self.calibration_provenance = {}

    def observe_activations(self, seqs: Sequence[Sequence[int]], into: _core.Calibration) -> None:
        """Runs each sequence in fp32 and folds every linear input into ``into``
        (``socllm._core.Calibration.empty_for(m._model)`` or a loaded calibration)."""
        self._engine.observe_activations([_token_ids(s, "observe_activations") for s in seqs], into)

    def new_calibration(self) -> _core.Calibration:
        """Empty statistics shaped for this model, to fill with :meth:`observe_activations`."""
        return _core.Calibration.empty_for(self._model)

    @property
    def calibration(self) -> _core.Calibration | None:
        """A copy of the loaded calibration statistics (``Calibration.array(name, site)``,
        ``shadow_configs(...)``, ``outlier_importance()``), or None."""
        return self._engine.calibration()

    def capture(
        self, ids: Sequence[int], layer: int | Sequence[int], what: Sequence[str] = ("q", "k")
    ) -> dict[str, np.ndarray] | list[dict[str, np.ndarray]]:
        """A layer's post-RoPE attention inputs of an fp32 run of ``ids``: ``q``
        ``[n_heads, T, head_dim]``, ``k`` and ``v`` ``[n_kv_heads, T, head_dim]`` (float32), the
        ones named in ``what``. The model stops after that layer's RoPE. A sequence of layers
        gives a list of such dicts from one run."""
        names = (what,) if isinstance(what, str) else tuple(what)
        bad = [w for w in names if w not in ("q", "k", "v")]
        if bad or not names:
            raise InvalidArgumentError(f"capture: what must name q, k and/or v, got {what!r}")
        many = not isinstance(layer, (int, np.integer))
        layers = (
            _ints_arg("capture", "layer", layer) if many else [_int_arg("capture", "layer", layer)]
        )
        got = self._engine.capture(_token_ids(ids, "capture"), layers)
        out = [{w: g[w] for w in names} for g in got]
        return out if many else out[0]

    def attention_constants(self, plan: PlanLike) -> list[dict]:
        """Per layer, what the plan's attention scheme fixes from the loaded calibration: per-head
        keep ratios (seed 000 Eq. 3), bucket scales (§3.3), npu-int8 static scales."""
        return self._engine.attention_constants(plan)

    def prepare(self, plan: PlanLike) -> int:
        """Quantize/pack the plan's linears now (else on first use); returns their bytes."""
        return self._engine.prepare(plan)

    def linear_info(
        self, plan: PlanLike, layer: int, site: str, alpha: float | None = None
    ) -> dict:
        """What one linear of the plan holds when built alone: ``bits`` per row, stored
        ``bits_per_weight`` and ``weight_bytes``, ``act_scale``, ``input_smoothing`` (EdgeFlow's
        S_I^alpha; ``alpha`` overrides the plan's exponent, refused for a plan without input
        smoothing)."""
        layer = _int_arg("linear_info", "layer", layer)
        if alpha is not None:
            alpha = _real_arg("linear_info", "alpha", alpha)
        info = self._engine.linear_info(plan, layer, site, alpha)
        if alpha is not None and not len(info["input_smoothing"]):
            raise self._no_smoothing("linear_info", plan, alpha)
        return info

    def _no_smoothing(self, fn: str, plan: PlanLike, alpha: float) -> InvalidArgumentError:
        name = plan.name if isinstance(plan, _core.Plan) else _core.Plan(plan).name
        return _not_applicable(
            fn,
            f"alpha={alpha!r}",
            "the exponent of a linear's input smoothing S_I^alpha (e.g. plan edgeflow)",
            f"plan {name!r} smooths no input",
        )

    def linear_forward(
        self, plan: PlanLike, layer: int, site: str, x: np.ndarray, alpha: float | None = None
    ) -> np.ndarray:
        """``y [rows, out]`` of one linear of the plan built alone on the site's fp32 input ``x``
        (its input smoothing divided at run time, not folded; ``alpha`` as in
        :meth:`linear_info`)."""
        layer = _int_arg("linear_forward", "layer", layer)
        if alpha is not None:
            alpha = _real_arg("linear_forward", "alpha", alpha)
            if not len(self._engine.linear_info(plan, layer, site, alpha)["input_smoothing"]):
                raise self._no_smoothing("linear_forward", plan, alpha)
        return self._engine.linear_forward(plan, layer, site, x, alpha)

    def linear_inputs(self, ids: Sequence[int], rows: Sequence[int]) -> list[dict]:
        """Per layer ``{site: [len(rows), width]}``: the fp32 inputs of every linear at ``rows``
        of a run of ``ids``."""
        return self._engine.linear_inputs(
            _token_ids(ids, "linear_inputs"), _ints_arg("linear_inputs", "rows", rows)
        )

    def linear_graph(self, plan: PlanLike, layer: int, site: str, rows: int) -> _core.LinearGraph:
        """One linear static graph of the plan built for ``rows`` rows: ``.run(x)`` takes exactly
        ``[rows, in_cols]``; ``.scales`` are the static activation scales it bakes in."""
        layer = _int_arg("linear_graph", "layer", layer)
        return self._engine.linear_graph(plan, layer, site, _int_arg("linear_graph", "rows", rows))

    def shadow_stats(self, plan: PlanLike, *, reset: bool = False) -> list[dict]:
        """Per linear input of a shadow-outlier plan: its profiled configuration (threshold,
        pruned, hot channels, resident float bytes) and what its CPU part did since the last
        reset (syncs, outlier values and channels, hot hits, cold fetches and bytes)."""
        return self._engine.shadow_stats(plan, _bool_arg("shadow_stats", "reset", reset))

    def graph_stats(self) -> dict:
        """Static graphs built by chunked prefill so far (llm.npu's chunk-sharing cache)."""
        return self._engine.graph_stats()

    def graph_events(self) -> list[dict]:
        """Every static graph built so far, in order (kind, layer, rows, chunk index, bytes)."""
        return self._engine.graph_events()

    def clear_graphs(self) -> None:
        self._engine.clear_graphs()

    # -- graphs and timelines -------------------------------------------------------------
    def prefill(
        self,
        ids: Sequence[int],
        plan: PlanLike = "fp32",
        *,
        chunk_len: int | None = None,
        all_positions: bool = False,
        return_graph: bool = False,
        decode_tokens: int = 0,
        return_records: bool = False,
    ):
        """A prefill of ``ids`` from an empty cache: logits of the last position ``[1, V]`` (or
        all ``[T, V]``). ``chunk_len`` (None: the plan's) runs it in chunks on static graphs.
        With ``return_graph`` (only) returns ``(logits, TaskGraph)``: the graph the engine
        executed, with the shadow loads and attention choices it measured (equal to
        :meth:`task_graph` but for those). ``decode_tokens``: that many greedy decoding steps
        after the prompt, under the plan's decode placement, recorded in the same graph (a
        session); ``return_records``: what every op's run did (block.h OpRecord). With either,
        the result is a dict of ``logits``, ``decoded``, ``graph`` and ``records``."""
        from .sim.timeline import _chunk

        ids = _token_ids(ids, "prefill")
        all_positions = _bool_arg("prefill", "all_positions", all_positions)
        return_graph = _bool_arg("prefill", "return_graph", return_graph)
        return_records = _bool_arg("prefill", "return_records", return_records)
        decode_tokens = _int_arg("prefill", "decode_tokens", decode_tokens, 0)
        p = plan if isinstance(plan, _core.Plan) else _core.Plan(plan)
        if chunk_len is not None:
            p = p.with_chunk_len(_chunk(chunk_len, len(ids), "prefill"))
        r = self._engine.prefill(ids, p, all_positions, return_graph, decode_tokens, return_records)
        if isinstance(r, dict) and not decode_tokens and not return_records:
            return r["logits"], r["graph"]
        return r

    def task_graph(
        self,
        plan: PlanLike,
        prompt_len: int,
        chunk_len: int | None = None,
        decode_tokens: int = 0,
    ):
        """The task graph of ``prompt_len`` tokens (and ``decode_tokens`` decoding steps) from
        the config, with this model's calibration: shadow pruning and expected loads, the
        attention's calibrated head ratios (see :func:`socllm.task_graph`)."""
        from .sim.timeline import _chunk

        p = plan if isinstance(plan, _core.Plan) else _core.Plan(plan)
        prompt_len = _int_arg("task_graph", "prompt_len", prompt_len, 1)
        decode_tokens = _int_arg("task_graph", "decode_tokens", decode_tokens, 0)
        chunk = p.chunk_len if chunk_len is None else _chunk(chunk_len, prompt_len, "task_graph")
        return self._engine.task_graph(p, prompt_len, chunk, decode_tokens)

    # -- text <-> ids -------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return _tokenize(self.tokenizer, text)

    def detokenize(self, ids: Sequence[int]) -> str:
        ids = _token_ids(ids, "detokenize")
        bad = [i for i in ids if not 0 <= i < self.config["vocab_size"]]
        if bad:
            raise InvalidArgumentError(
                f"token id {bad[0]} is outside the vocabulary [0, {self.config['vocab_size']})"
            )
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # -- numerics -------------------------------------------------------------------------
    def logits(self, ids: Sequence[int], plan: PlanLike = "fp32") -> np.ndarray:
        """Logits for every position of ``ids``: float32 ``[len(ids), vocab]``."""
        return self._engine.logits([_token_ids(ids, "logits")], plan)[0]

    def logits_batch(
        self,
        seqs: Sequence[Sequence[int]],
        plan: PlanLike = "fp32",
        last_rows: Sequence[int] | None = None,
    ) -> list[np.ndarray]:
        """Several independent sequences in one engine call (linears batched over all rows):
        ``[T_i, V]`` logits each, or with ``last_rows`` only the last ``last_rows[i]`` rows of
        sequence ``i`` (the vocabulary projection runs for those rows only)."""
        rows = None if last_rows is None else _ints_arg("logits_batch", "last_rows", last_rows)
        return self._engine.logits(seqs, plan, rows)

    def token_logprobs(
        self, seqs: Sequence[Sequence[int]], plan: PlanLike = "fp32"
    ) -> list[np.ndarray]:
        """log p(x_t | x_<t) for t = 1..T-1 of each sequence (float32)."""
        return self._engine.token_logprobs(seqs, plan)

    def head_masked_logprobs(self, ids: Sequence[int], layer: int, masks: np.ndarray) -> np.ndarray:
        """[len(masks), len(ids) - 1] log p(x_t | x_<t) in fp32 with layer ``layer``'s per-head
        attention outputs scaled by each row of ``masks`` [n, n_heads] (0: the head ablated,
        shadowAttn's Eq. 1), the layers below it run once: the exact head-importance step's
        kernel."""
        layer = _int_arg("head_masked_logprobs", "layer", layer)
        xs = self._engine.layer_inputs(ids)
        if not 0 <= layer < len(xs):
            raise InvalidArgumentError(
                f"head_masked_logprobs: layer {layer} is not one of the model's {len(xs)}"
            )
        return self._engine.ablation_logprobs(ids, layer, xs[layer], masks)

    def new_cache(self, capacity: int = 0) -> _core.KVCache:
        """An empty KV cache of ``capacity`` positions (0: the model's context length)."""
        return self._engine.new_cache(_int_arg("new_cache", "capacity", capacity))

    def step(
        self,
        cache: _core.KVCache,
        ids: Sequence[int],
        *,
        all_positions: bool = False,
        plan: PlanLike = "fp32",
    ) -> np.ndarray:
        """Append ``ids`` to ``cache``; logits of the last position ``[1, V]`` (or all)."""
        return self._engine.step(
            cache, ids, _bool_arg("step", "all_positions", all_positions), plan
        )

    def generate(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 64,
        plan: PlanLike = "fp32",
        **sampling,
    ) -> str:
        """Continue ``prompt`` and return the new text only; ``sampling`` keywords as in
        :meth:`generate_ids` (greedy unless ``temperature`` > 0)."""
        return self.detokenize(self.generate_ids(prompt, max_new_tokens, plan, **sampling))

    def generate_ids(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 64,
        plan: PlanLike = "fp32",
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int | None = None,
        stop_at_eos: bool = True,
    ) -> list[int]:
        """New token ids after ``prompt`` (text or ids). Greedy when ``temperature`` is 0;
        otherwise sampled from softmax(logits / temperature), restricted to the ``top_k`` most
        likely tokens if given, with a numpy generator seeded by ``seed``. Stops after the EOS
        token unless ``stop_at_eos`` is False. ``top_k`` and ``seed`` shape sampling: with
        ``temperature`` 0 (greedy) they are refused, not ignored."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else _token_ids(prompt, "generate")
        if not ids:
            raise InvalidArgumentError("generate: the prompt is empty")
        max_new_tokens = _int_arg("generate", "max_new_tokens", max_new_tokens, 0)
        temperature = _real_arg("generate", "temperature", temperature)
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise InvalidArgumentError(
                f"generate: temperature must be finite and >= 0, got {temperature}"
            )
        if top_k is not None:
            top_k = _int_arg("generate", "top_k", top_k, 1)
        if seed is not None:
            seed = _int_arg("generate", "seed", seed, 0)
        stop_at_eos = _bool_arg("generate", "stop_at_eos", stop_at_eos)
        if temperature == 0.0:
            given = [f"{k}={v!r}" for k, v in (("top_k", top_k), ("seed", seed)) if v is not None]
            if given:
                raise _not_applicable(
                    "generate",
                    ", ".join(given),
                    "sampling (temperature > 0)",
                    "temperature 0 decodes greedily: give a temperature, or drop them",
                )
        eos = self.config.get("eos_id", -1)
        stop = [eos] if stop_at_eos and eos >= 0 else []
        if max_new_tokens == 0:
            return []
        if temperature == 0.0:
            return list(self._engine.generate_greedy(ids, max_new_tokens, stop, plan))
        ctx = self.config["context_length"]
        if len(ids) + max_new_tokens > ctx:
            raise ContextOverflowError(
                f"generate: prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds "
                f"the model's context length {ctx}"
            )
        rng = np.random.default_rng(seed)
        cache = self.new_cache(len(ids) + max_new_tokens)
        logits = self.step(cache, ids, plan=plan)[0]
        out: list[int] = []
        for i in range(max_new_tokens):
            z = logits.astype(np.float64) / temperature
            if top_k is not None and top_k < z.size:
                kth = np.partition(z, -top_k)[-top_k]
                z = np.where(z >= kth, z, -np.inf)
            p = np.exp(z - z.max())
            tok = int(rng.choice(z.size, p=p / p.sum()))
            out.append(tok)
            if tok in stop or i + 1 == max_new_tokens:
                break
            logits = self.step(cache, [tok], plan=plan)[0]
        return out

    def perplexity_eval(
        self,
        text: str | None = None,
        plan: PlanLike = "fp32",
        *,
        ids: Sequence[int] | None = None,
        context: int = 2048,
        stride: int | None = None,
        limit_tokens: int | None = None,
        batch_size: int = 1,
        progress: bool = False,
    ) -> PerplexityResult:
        """Sliding-window perplexity (Hugging Face's protocol, see README "Perplexity").

        The text is tokenized once. Windows of ``context`` tokens start every ``stride`` tokens
        (default ``stride = context``: non-overlapping); each window scores only the tokens that
        no earlier window scored, and a window's first token is never scored.
        """
        if (text is None) == (ids is None):
            raise InvalidArgumentError("perplexity: give exactly one of text or ids")
        batch_size = _int_arg("perplexity", "batch_size", batch_size, 1)
        context = _int_arg("perplexity", "context", context)
        if stride is not None:
            stride = _int_arg("perplexity", "stride", stride)
        tokens = self.tokenize(text) if text is not None else _token_ids(ids, "perplexity")
        if limit_tokens is not None:
            limit_tokens = _int_arg("perplexity", "limit_tokens", limit_tokens)
            if limit_tokens < 2:
                raise InvalidArgumentError(
                    f"perplexity: limit_tokens must be >= 2, got {limit_tokens}"
                )
            tokens = tokens[:limit_tokens]
        stride = context if stride is None else stride
        if context < 2 or context > self.config["context_length"]:
            raise InvalidArgumentError(
                f"perplexity: context {context} must be in [2, {self.config['context_length']}]"
            )
        if not 1 <= stride <= context:
            raise InvalidArgumentError(
                f"perplexity: stride {stride} must be in [1, context={context}]"
            )
        if len(tokens) < 2:
            raise InvalidArgumentError(f"perplexity: need at least 2 tokens, got {len(tokens)}")

        # (window, number of trailing predictions to keep), in the order of Hugging Face's loop.
        spans = sliding_windows(len(tokens), context, stride)
        windows = [(tokens[b:e], keep) for b, e, keep in spans]
        nll_parts: list[np.ndarray] = []
        bar = tqdm(total=len(windows), desc="perplexity", unit="win", disable=not progress)
        for i in range(0, len(windows), batch_size):
            batch = windows[i : i + batch_size]
            lps = self._engine.token_logprobs([w for w, _ in batch], plan)
            for (_, keep), lp in zip(batch, lps, strict=False):
                nll_parts.append(-lp[-keep:].astype(np.float64))
            bar.update(len(batch))
        bar.close()
        token_nll = np.concatenate(nll_parts)
        nll_mean = float(token_nll.mean())
        return PerplexityResult(
            perplexity=math.exp(nll_mean),
            nll_mean=nll_mean,
            n_scored=int(token_nll.size),
            n_tokens=len(tokens),
            n_windows=len(windows),
            context=context,
            stride=stride,
            token_nll=token_nll,
        )

    def perplexity(
        self,
        text: str,
        plan: PlanLike = "fp32",
        context: int = 2048,
        stride: int | None = None,
        limit_tokens: int | None = None,
        **kw,
    ) -> float:
        """Perplexity of ``text`` (see :meth:`perplexity_eval` for the protocol)."""
        return self.perplexity_eval(
            text, plan, context=context, stride=stride, limit_tokens=limit_tokens, **kw
        ).perplexity

    def __repr__(self) -> str:
        c = self.config
        return (
            f"LanguageModel({c['name'] or c['arch']!r}, layers={c['n_layers']}, "
            f"d_model={c['d_model']}, vocab={c['vocab_size']}, path='{self.path}')"
        )


def load(
    name_or_path: str | os.PathLike = "smollm2-135m",
    *,
    threads: int | None = None,
    calib: str | os.PathLike | None = None,
    progress: bool = True,
) -> LanguageModel:
    """Load a built-in model by name, a GGUF file, a Hugging Face model directory, or a
    socllm ``.h5`` model. Sources other than ``.h5`` are converted once into the cache.
    ``calib``: a calibration file (``socllm calibrate``) for plans with static scales; a file
    made on a rotated model (``socllm calibrate --rotate ...``) serves the plans with that
    rotation (``w8a8:rotate=hadamard``)."""
    return LanguageModel(
        resolve_model_file(name_or_path, progress=progress), threads=threads, calib=calib
    )
