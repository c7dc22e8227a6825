"""socllm as an lm-evaluation-harness (lm-eval 0.4.13) model, with local task configs.

>>> import socllm.eval.lmeval
>>> r = socllm.eval.lmeval.evaluate(
...     "smollm2-135m", tasks=["hellaswag", "mmlu"], plan="fp32", limit=50
... )
>>> r["hellaswag"]            # {"acc": ..., "acc_norm": ..., "n": 50, "task": "socllm_hellaswag"}
>>> r["lm_eval"]              # the raw lm_eval.simple_evaluate result

Importing this package registers the model ``socllm`` with lm-eval, so lm-eval's own API works
as well::

    import lm_eval, socllm.eval.lmeval
    lm_eval.simple_evaluate(model="socllm", model_args="model=smollm2-135m,plan=fp32",
                            tasks=["socllm_piqa"], task_manager=socllm.eval.lmeval.task_manager())

* :mod:`socllm.eval.lmeval.backend`: the model (``SocllmLM``), how requests are tokenized and scored
  (as lm-eval's ``hf`` backend does), model arguments.
* :mod:`socllm.eval.lmeval.task_configs`: the 8 local tasks (hellaswag, winogrande, openbookqa,
  arc_easy, arc_challenge, piqa, mmlu, lambada_openai), their data and the choices made.
* :mod:`socllm.eval.lmeval.runner`: :func:`evaluate`, :func:`summarize`, :func:`predictions`.

Needs the optional dependency ``lm-eval`` (``pip install socllm[eval]``; install
``torch==2.13.0`` first, lm-eval requires torch).
"""

from .backend import SocllmLM, build_plan
from .runner import (
    evaluate,
    predictions,
    quiet_lm_eval,
    simple_evaluate,
    summarize,
    task_names,
)
from .task_configs import EXPECTED_DOCS, TASKS, load_dataset, resolve_task, task_dir, task_manager

__all__ = [
    "SocllmLM",
    "build_plan",
    "evaluate",
    "simple_evaluate",
    "predictions",
    "quiet_lm_eval",
    "summarize",
    "task_names",
    "task_manager",
    "task_dir",
    "load_dataset",
    "resolve_task",
    "TASKS",
    "EXPECTED_DOCS",
]
