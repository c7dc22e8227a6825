"""socllm as an lm-eval model (socllm.eval.lmeval): scoring against hand computations from the
engine, generation, the local task configs, and agreement with lm-eval's own `hf` backend."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("socllm")
pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: I001

import socllm
import socllm.eval.lmeval as sl
from socllm.eval.lmeval.backend import SocllmLM, build_plan

# golden tier: checked against an independent reference (tests/python/conftest.py)
pytestmark = pytest.mark.golden


def _req(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=tuple(args), idx=0)


@pytest.fixture(scope="module")
def lm(smollm):
    return SocllmLM(model=smollm, quiet=True, batch_size=4)


@pytest.fixture(scope="module")
def tm():
    return sl.task_manager()


def _hand_ll(m, context: str, continuation: str) -> float:
    """sum log p(continuation | context) from token_logprobs, tokens split as lm-eval does."""
    ctx = m.tokenize(context)
    whole = m.tokenize(context + continuation)
    n = len(whole) - len(ctx)
    return float(np.sum(m.token_logprobs([whole])[0][-n:], dtype=np.float64))


def test_registered_with_lm_eval():
    from lm_eval.api.registry import get_model

    assert get_model("socllm") is SocllmLM


def test_loglikelihood_matches_token_logprobs(lm, smollm):
    reqs = [
        _req("loglikelihood", "The capital of France is", " Paris"),
        _req("loglikelihood", "The capital of France is ", "Paris"),  # space moves to the cont.
        _req("loglikelihood", "Question: 2 + 2 =", " 4, said the teacher."),
    ]
    got = lm.loglikelihood(reqs)
    want = [
        _hand_ll(smollm, "The capital of France is", " Paris"),
        _hand_ll(smollm, "The capital of France is", " Paris"),
        _hand_ll(smollm, "Question: 2 + 2 =", " 4, said the teacher."),
    ]
    for (ll, greedy), w in zip(got, want, strict=True):
        assert isinstance(greedy, bool)
        assert ll == pytest.approx(w, rel=1e-5, abs=1e-4)
    assert got[0][0] == got[1][0]


def test_empty_context_uses_prefix_token(lm, smollm):
    ((ll, _),) = lm.loglikelihood([_req("loglikelihood", "", "Hello world")])
    ids = smollm.tokenize("Hello world")
    assert lm.prefix_token_id == smollm.config["bos_id"]  # hf: BOS if the model has one
    want = float(np.sum(smollm.token_logprobs([[lm.prefix_token_id, *ids]])[0], dtype=np.float64))
    assert ll == pytest.approx(want, rel=1e-5, abs=1e-4)


def test_shared_context_choices(lm, smollm):
    """One-token choices of one question run as one input; each still gets its own score."""
    ctx = "Which is a fruit?\nA. stone\nB. apple\nC. car\nD. chair\nAnswer:"
    reqs = [_req("loglikelihood", ctx, f" {c}") for c in "ABCD"]
    got = lm.loglikelihood(reqs)
    for (ll, _), c in zip(got, "ABCD", strict=True):
        assert ll == pytest.approx(_hand_ll(smollm, ctx, f" {c}"), rel=1e-5, abs=1e-4)
    lp = [g[0] for g in got]
    assert len(set(lp)) == 4
    # exactly the most likely letter is greedy (if it is the argmax over the whole vocabulary)
    logits = smollm.logits(smollm.tokenize(ctx))[-1]
    best = int(np.argmax(logits))
    letters = [smollm.tokenize(ctx + f" {c}")[-1] for c in "ABCD"]
    assert [g[1] for g in got] == [t == best for t in letters]


def test_is_greedy(lm, smollm):
    prompt = smollm.tokenize("The first three letters of the alphabet are A, B and")
    gen = smollm.generate_ids(prompt, 4, stop_at_eos=False)
    ((ll, greedy),) = lm._loglikelihood_tokens([(None, prompt, gen)])
    assert greedy is True
    assert ll == pytest.approx(
        float(np.sum(smollm.token_logprobs([prompt + gen])[0][-4:], dtype=np.float64)), abs=1e-4
    )
    # the last token replaced by the runner-up: no longer greedy, lower log-likelihood
    last_logits = smollm.logits(prompt + gen[:-1])[-1]
    second = int(np.argsort(last_logits)[-2])
    ((ll2, greedy2),) = lm._loglikelihood_tokens([(None, prompt, gen[:-1] + [second])])
    assert greedy2 is False and ll2 < ll
    # same through the string interface when the text round-trips to the same ids
    text, cont = smollm.detokenize(prompt), smollm.detokenize(gen)
    if smollm.tokenize(text + cont) == prompt + gen:
        assert lm.loglikelihood([_req("loglikelihood", text, cont)])[0][1] is True


def test_loglikelihood_rolling_single_window(lm, smollm):
    text = "Once upon a time there was a small socket that dreamed of being a phone chip."
    (got,) = lm.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    ids = [lm.prefix_token_id, *smollm.tokenize(text)]
    want = float(np.sum(smollm.token_logprobs([ids])[0], dtype=np.float64))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-4)


class _ContextOf:
    """The model, but claiming a context of ``n`` tokens (to reach the code path for windows
    of max_length + 1 tokens when max_length is the whole context)."""

    def __init__(self, m, n: int):
        self._m = m
        self.config = {**m.config, "context_length": n}

    def __getattr__(self, name):
        return getattr(self._m, name)


@pytest.mark.parametrize("engine_context", [None, 16])
def test_loglikelihood_rolling_windows(smollm, engine_context):
    """max_length 16: disjoint windows of 16 predicted tokens, each with the 16 preceding
    tokens (the prefix token before the first) as its input."""
    small = SocllmLM(model=smollm, quiet=True, max_length=16, batch_size=3)
    if engine_context:
        small.lm = _ContextOf(smollm, engine_context)
    text = "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2
    (got,) = small.loglikelihood_rolling([_req("loglikelihood_rolling", text)])
    full = [small.prefix_token_id, *smollm.tokenize(text)]
    n, L = len(full) - 1, 16
    want = 0.0
    for s in range(0, n, L):
        e = min(s + L, n)  # predict full[s+1 : e+1]
        seq = full[max(0, e - L) : e + 1]
        want += float(np.sum(smollm.token_logprobs([seq])[0][-(e - s) :], dtype=np.float64))
    assert n > 2 * L
    assert got == pytest.approx(want, rel=1e-5, abs=1e-4)


def test_generate_until_stops_at_stop_string(lm, smollm):
    prompt = "Count with me: 1, 2, 3, 4, 5, 6,"
    full = smollm.tokenizer.decode(smollm.generate_ids(prompt, 12), skip_special_tokens=True)
    stop = ","
    assert stop in full[1:], full
    (got,) = lm.generate_until([_req("generate_until", prompt, {"until": [stop]})])
    assert got == full.split(stop)[0] and got
    # no stop string: max_gen_toks tokens
    (got3,) = lm.generate_until([_req("generate_until", prompt, {"until": [], "max_gen_toks": 3})])
    assert got3 == smollm.tokenizer.decode(smollm.generate_ids(prompt, 3), skip_special_tokens=True)


def test_bad_model_args(smollm):
    with pytest.raises(ValueError, match="unknown plan 'no-such-plan'"):
        SocllmLM(model=smollm, plan="no-such-plan")
    with pytest.raises(ValueError, match="no-such-plan"):  # via lm-eval's model_args string
        SocllmLM.create_from_arg_string("model=smollm2-135m,plan=no-such-plan")
    with pytest.raises(ValueError, match="bogus_option"):
        SocllmLM(model=smollm, plan="fp32", bogus_option=3)
    with pytest.raises(ValueError, match="batch_size"):
        SocllmLM(model=smollm, batch_size=0)
    with pytest.raises(ValueError, match="max_length"):
        SocllmLM(model=smollm, max_length=10**9)
    with pytest.raises((ValueError, OSError)):  # no load_calibration yet, or no such file
        SocllmLM(model=smollm, calib="/nonexistent/calibration.h5")
    with pytest.raises(ValueError, match="unknown task"):
        sl.resolve_task("no_such_task")


def test_attention_plan_scores_through_the_backend(smollm):
    # a sparse-attention plan reaches the engine: the score is the plan's own log-probability
    plan = "fp32:attention=sparse,keep=0.1"
    lm = SocllmLM(model=smollm, plan=plan, quiet=True)
    ctx = " ".join(["The old lighthouse keeper climbed the stairs every evening."] * 6)
    ((ll, _),) = lm.loglikelihood([_req("loglikelihood", ctx, " He lit the lamp.")])
    ids, whole = smollm.tokenize(ctx), smollm.tokenize(ctx + " He lit the lamp.")
    want = smollm.token_logprobs([whole], plan)[0][len(ids) - len(whole) :].sum()
    assert ll == pytest.approx(float(want), rel=1e-5, abs=1e-4)
    assert abs(ll - _hand_ll(smollm, ctx, " He lit the lamp.")) > 1e-3  # not fp32's


def test_plan_options():
    assert build_plan("fp32", {}) == "fp32"
    assert build_plan("smoothquant", {"alpha": "0.5", "group_size": "64", "x": "abc"}) == {
        "name": "smoothquant",
        "alpha": 0.5,
        "group_size": 64,
        "x": "abc",
    }
    assert build_plan({"name": "w4-group"}, {"group_size": 32}) == {
        "name": "w4-group",
        "group_size": 32,
    }


def test_task_configs_and_doc_counts(tm):
    names = sl.task_names(list(sl.TASKS))
    loaded = tm.load(list(names.values()))
    tasks = loaded["tasks"]
    assert "socllm_mmlu" in loaded["groups"]
    counts = {
        name: len(t.test_docs() if t.has_test_docs() else t.validation_docs())
        for name, t in tasks.items()
    }
    mmlu = {k: v for k, v in counts.items() if k.startswith("socllm_mmlu_")}
    assert len(mmlu) == 57
    assert sum(mmlu.values()) == sl.EXPECTED_DOCS["mmlu"] == 14042
    for short, lm_name in names.items():
        if short != "mmlu":
            assert counts[lm_name] == sl.EXPECTED_DOCS[short], short
    assert counts["socllm_arc_easy"] == 570

    arc = tasks["socllm_arc_easy"]
    doc = arc.validation_docs()[0]
    assert (
        arc.doc_to_text(doc) == "Question: Which technology was developed most recently?\nAnswer:"
    )
    assert arc.doc_to_choice(doc)[0] == "cellular telephone" and arc.doc_to_target(doc) == 0
    hs = tasks["socllm_hellaswag"]
    doc = hs.validation_docs()[0]
    assert hs.doc_to_text(doc).startswith("Finance and Business: How to apply for a marriage")
    assert len(hs.doc_to_choice(doc)) == 4 and hs.doc_to_target(doc) == 3
    lam = tasks["socllm_lambada_openai"]
    doc = lam.test_docs()[0]
    assert lam.doc_to_target(doc) == " signs" and lam.doc_to_text(doc).endswith("care about")
    wg = tasks["socllm_winogrande"]
    doc = wg.validation_docs()[0]
    assert wg.doc_to_choice(doc) == [
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    ]
    assert wg.doc_to_text(doc) == 1 and wg.doc_to_target(doc) == "always got the easier cases."
    mm = tasks["socllm_mmlu_abstract_algebra"]
    assert mm.config.description.startswith("The following are multiple choice questions")
    assert mm.doc_to_text(mm.test_docs()[0]) == (
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q."
        "\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:"
    )
    assert mm.doc_to_choice(mm.test_docs()[0]) == ["A", "B", "C", "D"]


def test_evaluate_and_agreement_with_hf(smollm, hf_reference, tm):
    """lm-eval's hf backend on transformers' model for the same GGUF and socllm fp32 pick the
    same answers (limit 3 on ARC-Easy and LAMBADA)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    tok, ref = hf_reference
    hf = HFLM(pretrained=ref, tokenizer=tok, batch_size=4, device="cpu")
    tasks = {"arc_easy": "socllm_arc_easy", "lambada": "socllm_lambada_openai"}
    raw_hf = lm_eval.simple_evaluate(
        model=hf, tasks=list(tasks.values()), limit=3, task_manager=tm, bootstrap_iters=0
    )
    r = sl.evaluate(smollm, tasks=list(tasks), limit=3, quiet=True, log_samples=True)
    assert r["arc_easy"]["n"] == 3 and r["lambada"]["n"] == 3
    assert r["arc_easy"]["acc_norm"] is not None and r["lambada"]["acc_norm"] is None
    assert "perplexity" in r["lambada"] and "lm_eval" in r
    for short, name in tasks.items():
        a, b = sl.predictions(raw_hf, name), r["predictions"][short]
        assert [x["doc_id"] for x in a] == [x["doc_id"] for x in b] == [0, 1, 2]
        assert [x["pred"] for x in a] == [x["pred"] for x in b], short
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x["loglikelihoods"], y["loglikelihoods"], atol=2e-2)
        assert r[short]["acc"] == pytest.approx(raw_hf["results"][name]["acc,none"])


def test_model_instance_reused(smollm):
    assert SocllmLM(model=smollm, quiet=True).lm is smollm
    assert isinstance(smollm, socllm.LanguageModel)


def test_quiet_lm_eval_disables_every_bar_and_info_logs():
    import io
    import logging

    import tqdm.auto
    import tqdm.std

    init = vars(tqdm.std.tqdm)["__init__"]
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with sl.quiet_lm_eval():
            out = io.StringIO()
            for cls in (tqdm.std.tqdm, tqdm.auto.tqdm):
                list(cls(range(3), file=out, disable=False))
                list(cls(range(3), "desc", 3, True, out, None, 0.1, 10.0, None, None, False))
            assert out.getvalue() == ""
            assert not logging.getLogger("lm_eval.evaluator").isEnabledFor(logging.INFO)
            assert logging.getLogger("lm_eval.evaluator").isEnabledFor(logging.WARNING)
        assert vars(tqdm.std.tqdm)["__init__"] is init and logger.level == logging.INFO
        out = io.StringIO()
        list(tqdm.std.tqdm(range(3), file=out))
        assert "3/3" in out.getvalue()  # bars are back
    finally:
        logger.setLevel(level)


def _has_bar(err: str) -> bool:
    return "it/s]" in err or "%|" in err


def test_evaluate_quiet_prints_no_progress_bar_or_lm_eval_info(smollm, capfd):
    """lm-eval's own bar (``Task.build_all_requests``) and INFO logs appear without quiet and
    not with it, even with lm-eval's logging configured at INFO."""
    import logging

    logger = logging.getLogger("lm_eval")
    handler = logging.StreamHandler()  # stderr, as lm_eval.utils.setup_logging adds
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        capfd.readouterr()
        sl.evaluate(smollm, tasks=["piqa"], limit=1, quiet=True, bootstrap_iters=0)
        err = capfd.readouterr().err
        assert not _has_bar(err) and "Building contexts" not in err, err
        sl.evaluate(smollm, tasks=["piqa"], limit=1, bootstrap_iters=0)
        err = capfd.readouterr().err
        assert _has_bar(err) and "Building contexts" in err, err
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_cli_eval_quiet_prints_no_progress_bar(capfd):
    from socllm.cli import main

    capfd.readouterr()
    assert main(["eval", "--task", "piqa", "--limit", "1", "--json", "-", "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert not _has_bar(err), err
    assert err == "", err
    assert '"task": "piqa"' in out
