"""socllm as an lm-eval (lm-evaluation-harness 0.4.13) model, registered as ``socllm`` when
this module is imported (``import socllm.eval.lmeval``; lm-eval's own ``lm_eval`` command does not
import it, so use :func:`socllm.eval.lmeval.evaluate` or ``lm_eval.simple_evaluate(model="socllm",
...)`` from Python).

Model arguments (``--model_args model=smollm2-135m,plan=fp32,batch_size=8``):

* ``model``: a built-in name, a .gguf / Hugging Face folder / socllm .h5 path (anything
  :func:`socllm.load` takes), or an already loaded :class:`socllm.LanguageModel`.
* ``plan``: plan name (default ``fp32``) or a dict; ``calib``: calibration file for plans that
  need one (``LanguageModel.load_calibration``).
* ``batch_size`` (default 8; ``auto`` means 8), ``max_batch_tokens`` (default 4096: tokens per
  engine call, bounds the [tokens, vocab] logits kept in memory), ``max_length`` (default the
  model's context length), ``threads``, ``quiet`` (no progress bars).
* ``device`` and ``max_batch_size`` (which lm-eval passes to every model) are accepted and
  ignored (socllm runs on the CPU).
* Any other key (``alpha``, ``threshold``, ``group_size``, ...) is a plan option or part:
  ``plan = {"name": plan, **options}``; numbers given as strings become int/float. Issue 39's
  parts go the same way: ``plan=w8a8,rotate=hadamard,rotate_down=hadamard,rounding=gptq,
  calib=rot.h5`` with a calibration made by ``socllm calibrate --rotate hadamard --rotate-down
  hadamard --steps act-scales,gptq``; ``residual_scale=auto`` for Gemma 3's fp16 float ops.

Requests are scored as lm-eval's own ``hf`` backend (``lm_eval/models/huggingface.py``) scores
them, so the two agree on the same model:

* tokenization: this class is a ``TemplateLM``, so lm-eval's ``_encode_pair`` runs unchanged
  (trailing context whitespace moved to the continuation; context + continuation encoded whole
  and split at the context's length); special tokens are added exactly as the model's tokenizer
  adds them by default (none for SmolLM2), and not when the text already starts with the prefix
  token, as in ``HFLM.tok_encode``;
* empty contexts and rolling windows are conditioned on ``prefix_token_id`` = the BOS token if
  the model has one, else EOS: that is HFLM's rule (not "always EOT"); for SmolLM2, whose
  tokenizer has a BOS token but does not add it, the prefix is ``<|im_start|>`` (id 1), while
  ``eot_token_id`` is EOS (``<|im_end|>``, id 2);
* inputs longer than ``max_length + 1`` tokens lose tokens on the left;
* a request's result is (sum of the continuation's log-probabilities, whether every
  continuation token is the argmax of its row), from log-softmax of the engine's fp32 logits
  (computed in float64 here, float32 in hf);
* requests that share context + continuation[:-1] (all one-token-answer choices of one
  question, e.g. MMLU's " A"/" B"/" C"/" D") run once, as hf's ``logits_cache`` does, and
  the vocabulary projection runs only for the rows that predict continuation tokens;
  unique inputs run longest first in batches of ``batch_size`` sequences and at most
  ``max_batch_tokens`` tokens (one long input may exceed it alone);
* ``loglikelihood_rolling``: lm-eval's ``get_rolling_token_windows`` + ``make_disjoint_window``
  with ``max_length`` and the prefix token, the windows' sums added (scored with
  ``token_logprobs``: is_greedy is not needed there, and this keeps memory small; a window of
  max_length + 1 tokens that exceeds the engine's context runs its input for logits instead);
* ``generate_until``: context left-truncated to ``max_length - max_gen_toks`` tokens, greedy
  decoding on a KV cache (sampling if ``do_sample`` and ``temperature`` > 0), stopping at EOS,
  at any ``until`` string or after ``max_gen_toks`` (default 256) tokens; the text is decoded
  without special tokens and cut at the first stop string (lm-eval's
  ``postprocess_generated_text``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from tqdm.auto import tqdm

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_BATCH_TOKENS = 4096
DEFAULT_MAX_GEN_TOKS = 256
# Keys that are not plan options (the last two are passed by lm-eval to every model).
RESERVED_ARGS = frozenset(
    {
        "model",
        "plan",
        "calib",
        "batch_size",
        "threads",
        "max_length",
        "max_batch_tokens",
        "quiet",
        "device",
        "max_batch_size",
    }
)


def _number(v: Any) -> Any:
    """'3' -> 3, '0.5' -> 0.5, 'true'/'false' -> bool; anything else unchanged."""
    if not isinstance(v, str):
        return v
    s = v.strip()
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return v


def _count(name: str, v: Any, minimum: int | None = 1) -> int:
    """A model argument that counts (an int, or a string of one, as lm-eval's model_args give
    it), else an InvalidArgumentError naming it (not int()'s "invalid literal")."""
    from ...errors import InvalidArgumentError, int_arg

    n = _number(v)
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidArgumentError(
            f"socllm: {name} must be an integer, got {type(v).__name__} {v!r}"
        )
    return int_arg("socllm", name, n, minimum)


def _bool(v: Any) -> bool:
    return bool(_number(v)) if isinstance(v, str) else bool(v)


def build_plan(plan: str | Mapping | None, options: Mapping[str, Any]) -> str | dict:
    """The plan the engine gets: a name when there are no options, else a dict."""
    if plan is None:
        plan = "fp32"
    opts = {k: _number(v) for k, v in options.items()}
    if isinstance(plan, Mapping):
        return {**{k: _number(v) for k, v in plan.items()}, **opts}
    if not isinstance(plan, str):
        raise ValueError(f"socllm: plan must be a name or a dict, got {type(plan).__name__}")
    return {"name": plan, **opts} if opts else plan


def _score_rows(rows: np.ndarray, cont: Sequence[int], block: int = 256) -> tuple[float, bool]:
    """(sum of log-softmax(rows)[t, cont[t]], every cont[t] is its row's argmax); float64
    log-softmax, ``block`` rows at a time to bound the temporary memory."""
    total, greedy = 0.0, True
    tgt = np.asarray(cont)
    for b in range(0, len(tgt), block):
        x = rows[b : b + block].astype(np.float64)
        t = tgt[b : b + block]
        m = x.max(axis=1)
        lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
        total += float((x[np.arange(len(t)), t] - lse).sum())
        greedy = greedy and bool((x.argmax(axis=1) == t).all())
    return total, greedy


@register_model("socllm")
class SocllmLM(TemplateLM):
    """lm-eval model backed by a :class:`socllm.LanguageModel` (see the module docstring)."""

    backend = "causal"

    def __init__(
        self,
        model: Any = "smollm2-135m",
        plan: str | Mapping | None = "fp32",
        calib: str | None = None,
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        max_length: int | str | None = None,
        threads: int | str | None = None,
        quiet: bool | str = False,
        max_batch_tokens: int | str = DEFAULT_MAX_BATCH_TOKENS,
        device: str | None = None,
        max_batch_size: int | None = None,
        **plan_options: Any,
    ) -> None:
        super().__init__()
        # (the modules, not the package: `socllm` reaches socllm.frontier, which validates
        # through this backend, and the import graph must not close that cycle)
        from ... import _core
        from ...errors import SocllmError
        from ...model import LanguageModel, load

        self.quiet = _bool(quiet)
        self._batch_size = self._parse_batch_size(batch_size)
        self.max_batch_tokens = _count("max_batch_tokens", max_batch_tokens)
        if device not in (None, "cpu") and not self.quiet:
            lm_utils.eval_logger.warning(f"socllm runs on the CPU; device={device!r} is ignored")
        if threads is not None:
            _core.set_num_threads(_count("threads", threads))

        # cheap checks first: a bad plan or calib fails before the model is loaded
        self.plan = build_plan(plan, plan_options)
        try:
            _core.Plan(self.plan)  # unknown plan names and fields are reported here
        except SocllmError as e:
            raise ValueError(f"socllm: invalid plan {self.plan!r}: {e}") from e
        self.calib = str(calib) if calib else None
        model_cls = type(model) if isinstance(model, LanguageModel) else LanguageModel
        if self.calib and not hasattr(model_cls, "load_calibration"):
            raise ValueError(
                f"socllm: calib={self.calib!r} given, but this socllm has no "
                "LanguageModel.load_calibration (calibrated plans are not available yet)"
            )

        if isinstance(model, LanguageModel):
            self.lm = model
            self.model_name = str(model.path)
        elif isinstance(model, str) and model:
            self.model_name = model
            self.lm = load(model, progress=not self.quiet)
        else:
            raise ValueError(
                f"socllm: model must be a model name/path or a socllm.LanguageModel, got {model!r}"
            )
        if self.calib:
            self.lm.load_calibration(self.calib)

        cfg = self.lm.config
        self._eos = int(cfg["eos_id"])
        self._bos = int(cfg.get("bos_id", -1))
        if self._eos < 0 and self._bos < 0:
            raise ValueError("socllm: the model has neither an EOS nor a BOS token")
        ctx = int(cfg["context_length"])
        self._max_length = _count("max_length", max_length, None) if max_length else ctx
        if not 2 <= self._max_length <= ctx:
            raise ValueError(
                f"socllm: max_length must be in [2, {ctx}] (the model's context), got {max_length}"
            )
        self._prefix_text = self.lm.tokenizer.decode(
            [self.prefix_token_id], skip_special_tokens=False
        )
        try:  # a two-token forward: plans that need calibration data fail here, not mid-run
            self.lm.token_logprobs([[self.prefix_token_id, self.eot_token_id]], self.plan)
        except Exception as e:
            raise ValueError(
                f"socllm: plan {self.plan!r} cannot run on {self.model_name}: {e}"
            ) from e

    @staticmethod
    def _parse_batch_size(bs: Any) -> int:
        if bs is None or (isinstance(bs, str) and bs.startswith("auto")):
            return DEFAULT_BATCH_SIZE
        return _count("batch_size", bs)

    # -- what lm-eval asks of a model ------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self._eos if self._eos >= 0 else self._bos

    @property
    def prefix_token_id(self) -> int:
        return self._bos if self._bos >= 0 else self._eos

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return DEFAULT_MAX_GEN_TOKS

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def tokenizer_name(self) -> str:
        return self.model_name.replace("/", "__")

    def get_model_info(self) -> dict:
        return {
            "model_name": self.model_name,
            "model_file": str(self.lm.path),
            "plan": self.plan,
            "calib": self.calib,
            "max_length": self.max_length,
        }

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        tok = self.lm.tokenizer
        if add_special_tokens is None:  # HFLM: no special tokens if it starts with the prefix
            prefix = self._prefix_text
            add_special_tokens = not (prefix and string.startswith(prefix))
        ids = tok.encode(string, add_special_tokens=add_special_tokens).ids
        left = kwargs.get("left_truncate_len")
        return ids[-left:] if left else ids

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.lm.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    # -- scoring ----------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        # TemplateLM.loglikelihood: lm-eval's _encode_pair, then _loglikelihood_tokens
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or self.quiet)

    def _batches(self, seqs: list[tuple[int, ...]]):
        """Consecutive runs of ``seqs`` (already sorted) with at most ``batch_size`` sequences
        and ``max_batch_tokens`` tokens (a longer single sequence forms its own batch)."""
        batch: list[tuple[int, ...]] = []
        tokens = 0
        for s in seqs:
            if batch and (len(batch) >= self.batch_size or tokens + len(s) > self.max_batch_tokens):
                yield batch
                batch, tokens = [], 0
            batch.append(s)
            tokens += len(s)
        if batch:
            yield batch

    def _loglikelihood_tokens(
        self,
        requests: Sequence[tuple[Any, Sequence[int], Sequence[int]]],
        disable_tqdm: bool = False,
        need_greedy: bool = True,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each (request key, context ids, continuation ids)."""
        n_max = self.max_length
        groups: dict[tuple[int, ...], list[int]] = {}
        conts: list[list[int]] = []
        for i, (_, ctx, cont) in enumerate(requests):
            ctx, cont = list(ctx), list(cont)
            if not ctx or not cont:
                raise ValueError("socllm: a request needs a non-empty context and continuation")
            if len(cont) > n_max:
                raise ValueError(
                    f"socllm: continuation of {len(cont)} tokens exceeds max_length {n_max}"
                )
            full = (ctx + cont)[-(n_max + 1) :]
            # greedy: one input per (context + continuation[:-1]); else the whole sequence
            key = tuple(full[:-1]) if need_greedy else tuple(full)
            groups.setdefault(key, []).append(i)
            conts.append(cont)

        order = sorted(groups, key=lambda s: (-len(s), s))
        res: list[tuple[float, bool] | None] = [None] * len(requests)
        pbar = tqdm(
            total=len(requests),
            disable=disable_tqdm or self.quiet,
            desc="socllm loglikelihood",
        )
        ctx_len = int(self.lm.config["context_length"])
        for batch in self._batches(order):
            # outs[j]: logits rows of batch[j] (greedy) or its token log-probabilities
            if need_greedy:  # only the rows that predict a continuation token
                tails = [max(len(conts[i]) for i in groups[key]) for key in batch]
                outs = self.lm.logits_batch([list(s) for s in batch], self.plan, tails)
            else:
                # whole sequences; one of max_length + 1 > context tokens cannot run whole:
                # its input (all but the last token) runs for logits instead
                fits = [s for s in batch if len(s) <= ctx_len]
                lps = iter(
                    self.lm.token_logprobs([list(s) for s in fits], self.plan) if fits else []
                )
                outs = [
                    next(lps) if len(s) <= ctx_len else self.lm.logits(list(s[:-1]), self.plan)
                    for s in batch
                ]
            for key, out in zip(batch, outs, strict=True):
                for i in groups[key]:
                    cont = conts[i]
                    n = len(cont)
                    if out.ndim == 2:  # logits: the last n rows predict the continuation
                        answer = _score_rows(out[-n:], cont)
                    else:
                        answer = (float(np.asarray(out[-n:], dtype=np.float64).sum()), False)
                    if not need_greedy:
                        answer = (answer[0], False)
                    res[i] = answer
                    req_key = requests[i][0]
                    if req_key is not None:
                        self.cache_hook.add_partial("loglikelihood", req_key, answer)
                pbar.update(len(groups[key]))
            del outs
        pbar.close()
        return res  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows: list[tuple[None, list[int], list[int]]] = []
        counts: list[int] = []
        for (string,) in (req.args for req in requests):
            ws = [
                lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            windows.extend((None, ctx, cont) for ctx, cont in ws)
            counts.append(len(ws))
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm, need_greedy=False)
        out: list[float] = []
        pos = 0
        for req, n in zip(requests, counts, strict=True):
            total = float(sum(s for s, _ in scores[pos : pos + n]))
            pos += n
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return out

    # -- generation ---------------------------------------------------------------------------
    def _generate_one(self, context: str, gen_kwargs: dict, eos: str) -> str:
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)  # a deep copy
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_gen = int(kwargs.pop("max_gen_toks"))
        if max_gen >= self.max_length:
            raise ValueError(
                f"socllm: max_gen_toks {max_gen} must be less than max_length {self.max_length}"
            )
        temperature = float(kwargs.get("temperature", 0.0) or 0.0)
        sample = bool(kwargs.get("do_sample")) and temperature > 0
        rng = np.random.default_rng(kwargs.get("seed", 1234)) if sample else None
        top_k = kwargs.get("top_k")

        ids = self.tok_encode(context)[-(self.max_length - max_gen) :]
        if not ids:
            ids = [self.prefix_token_id]
        if max_gen <= 0:
            return ""
        cache = self.lm.new_cache(len(ids) + max_gen)
        logits = self.lm.step(cache, ids, plan=self.plan)[0]
        out: list[int] = []
        stops = [s for s in until if s]
        for _ in range(max_gen):
            if sample:
                z = logits.astype(np.float64) / temperature
                if top_k and int(top_k) < z.size:
                    kth = np.partition(z, -int(top_k))[-int(top_k)]
                    z = np.where(z >= kth, z, -np.inf)
                p = np.exp(z - z.max())
                tok = int(rng.choice(z.size, p=p / p.sum()))
            else:
                tok = int(np.argmax(logits))
            out.append(tok)
            if tok == self.eot_token_id:
                break
            if stops:
                text = self.tok_decode(out, skip_special_tokens=False)
                if any(s in text for s in stops):
                    break
            if len(out) == max_gen:
                break
            logits = self.lm.step(cache, [tok], plan=self.plan)[0]
        text = self.tok_decode(out, skip_special_tokens=True)
        return postprocess_generated_text(generation=text, stop=until, think_end_token=None)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        args = [req.args for req in requests]
        # longest prompt first, like hf's Collator (time estimates are over-estimates)
        order = sorted(range(len(args)), key=lambda i: -len(self.tok_encode(args[i][0])))
        res: list[str | None] = [None] * len(args)
        pbar = tqdm(total=len(args), disable=disable_tqdm or self.quiet, desc="socllm generate")
        for i in order:
            context, gen_kwargs = args[i]
            if not isinstance(gen_kwargs, dict):
                raise ValueError(f"socllm: generation kwargs must be a dict, got {gen_kwargs!r}")
            res[i] = self._generate_one(context, gen_kwargs, eos)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), res[i])
            pbar.update(1)
        pbar.close()
        return res  # type: ignore[return-value]
