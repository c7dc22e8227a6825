"""Local lm-eval task configs: the standard prompts of lm-eval 0.4.13, data from local files only.

The templates live in ``socllm/lmeval/tasks/*.in``; :func:`task_dir` renders them, with the data
folder's path filled in, into ``$SOCLLM_CACHE/lmeval_tasks/<hash>/`` (the hash covers the
templates and the data folder, so edits or another ``SOCLLM_DATA_DIR`` give a new folder) and
:func:`task_manager` returns an ``lm_eval.tasks.TaskManager`` that indexes that folder.

Tasks (lm-eval name -> socllm name; data under :func:`socllm.data.data_dir`):

=================  =========================  ===============================================
lm-eval task       socllm task                data (split, documents)
=================  =========================  ===============================================
hellaswag          socllm_hellaswag           OLMES ``hellaswag/requests.jsonl.gz`` (1000)
winogrande         socllm_winogrande          ``winogrande/validation`` (1267)
openbookqa         socllm_openbookqa          ``openbookqa/validation`` (500) [1]
arc_easy           socllm_arc_easy            ``arc_easy/validation`` (570) [1]
arc_challenge      socllm_arc_challenge       ``arc_challenge/validation`` (299) [1]
piqa               socllm_piqa                ``piqa/validation`` (1838)
mmlu (group)       socllm_mmlu                ``mmlu/<subject>/test`` (57 subjects, 14042)
lambada_openai     socllm_lambada_openai      OLMES ``lambada_openai/requests.jsonl.gz`` (5153)
=================  =========================  ===============================================

[1] lm-eval scores ARC and OpenBookQA on their test splits, which are not stored locally; the
validation split is used with the same prompt, so numbers are not comparable with published
test-split numbers.

Choices made:

* Prompts (``doc_to_text``/``doc_to_choice``/``doc_to_target``, metrics) are copied from lm-eval
  0.4.13's task YAMLs; each template's header names its source.
* HellaSwag: the OLMES file holds, per document, the fields lm-eval's ``process_docs`` builds
  (``query`` = activity label + ": " + context, ``choices``, ``gold``) with the same clean-up, so
  the 0-shot requests are lm-eval's. It is a 1000-document subsample of validation (seed 1234),
  not the full 10042. Its 5-shot OLMES contexts are not used.
* LAMBADA: context = OLMES ``query`` (the passage without its last word), target = " " + the
  word, as lm-eval's ``lambada_openai``.
* MMLU: group ``socllm_mmlu`` -> 4 category groups -> 57 subjects, accuracy weighted by size,
  exactly lm-eval's ``mmlu`` group layout; few-shot examples (if requested) from ``dev``.
* Data are read with ``datasets.Dataset.from_file`` (the Arrow stream files written by
  ``save_to_disk``) or from the jsonl.gz, through the task option ``custom_dataset``: no Hugging
  Face hub, no ``datasets`` cache.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from pathlib import Path

from ...data import data_dir as default_data_dir
from ...errors import MissingFileError
from ...io.files import atomic_dir
from ...registry import cache_dir

TEMPLATE_DIR = Path(__file__).resolve().parent / "tasks"
FORMAT_VERSION = 1  # bump when the rendering (not the templates) changes


class _QuietCustomDatasetWarning(logging.Filter):
    """lm-eval warns about `--metadata` for every task that uses `custom_dataset` (ours all
    do); that advice does not apply to these tasks."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


_task_logger = logging.getLogger("lm_eval.api.task")
if not any(isinstance(f, _QuietCustomDatasetWarning) for f in _task_logger.filters):
    _task_logger.addFilter(_QuietCustomDatasetWarning())

# short name -> lm-eval task (or group) name in the generated folder
TASKS = {
    "hellaswag": "socllm_hellaswag",
    "winogrande": "socllm_winogrande",
    "openbookqa": "socllm_openbookqa",
    "arc_easy": "socllm_arc_easy",
    "arc_challenge": "socllm_arc_challenge",
    "piqa": "socllm_piqa",
    "mmlu": "socllm_mmlu",
    "lambada_openai": "socllm_lambada_openai",
}
ALIASES = {"lambada": "lambada_openai", "arc-easy": "arc_easy", "arc-challenge": "arc_challenge"}

# lm_eval/tasks/mmlu/_generate_configs.py SUBJECTS: subject -> category
MMLU_SUBJECTS = {
    "abstract_algebra": "stem",
    "anatomy": "stem",
    "astronomy": "stem",
    "business_ethics": "other",
    "clinical_knowledge": "other",
    "college_biology": "stem",
    "college_chemistry": "stem",
    "college_computer_science": "stem",
    "college_mathematics": "stem",
    "college_medicine": "other",
    "college_physics": "stem",
    "computer_security": "stem",
    "conceptual_physics": "stem",
    "econometrics": "social_sciences",
    "electrical_engineering": "stem",
    "elementary_mathematics": "stem",
    "formal_logic": "humanities",
    "global_facts": "other",
    "high_school_biology": "stem",
    "high_school_chemistry": "stem",
    "high_school_computer_science": "stem",
    "high_school_european_history": "humanities",
    "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences",
    "high_school_macroeconomics": "social_sciences",
    "high_school_mathematics": "stem",
    "high_school_microeconomics": "social_sciences",
    "high_school_physics": "stem",
    "high_school_psychology": "social_sciences",
    "high_school_statistics": "stem",
    "high_school_us_history": "humanities",
    "high_school_world_history": "humanities",
    "human_aging": "other",
    "human_sexuality": "social_sciences",
    "international_law": "humanities",
    "jurisprudence": "humanities",
    "logical_fallacies": "humanities",
    "machine_learning": "stem",
    "management": "other",
    "marketing": "other",
    "medical_genetics": "other",
    "miscellaneous": "other",
    "moral_disputes": "humanities",
    "moral_scenarios": "humanities",
    "nutrition": "other",
    "philosophy": "humanities",
    "prehistory": "humanities",
    "professional_accounting": "other",
    "professional_law": "humanities",
    "professional_medicine": "other",
    "professional_psychology": "social_sciences",
    "public_relations": "social_sciences",
    "security_studies": "social_sciences",
    "sociology": "social_sciences",
    "us_foreign_policy": "social_sciences",
    "virology": "other",
    "world_religions": "humanities",
}
MMLU_CATEGORIES = ("stem", "other", "social_sciences", "humanities")

# Documents per task in the stored data (what lm-eval evaluates without --limit).
EXPECTED_DOCS = {
    "hellaswag": 1000,
    "winogrande": 1267,
    "openbookqa": 500,
    "arc_easy": 570,
    "arc_challenge": 299,
    "piqa": 1838,
    "mmlu": 14042,
    "lambada_openai": 5153,
}

# The metric each task is reported with in socllm's tables (lm-eval's usual choice: acc_norm
# where choices differ in length and tokenization, acc otherwise; LAMBADA: exact greedy target).
PRIMARY_METRIC = {
    "hellaswag": "acc_norm",
    "winogrande": "acc",
    "openbookqa": "acc_norm",
    "arc_easy": "acc",
    "arc_challenge": "acc_norm",
    "piqa": "acc",
    "mmlu": "acc",
    "lambada": "acc",
}


def resolve_task(name: str) -> str:
    """The lm-eval task/group name for a short name ("hellaswag", "lambada", "mmlu", ...);
    names already starting with ``socllm_`` (e.g. one MMLU subject) pass through."""
    if name.startswith("socllm_"):
        return name
    key = ALIASES.get(name.lower(), name.lower())
    if key not in TASKS:
        raise ValueError(
            f"unknown task {name!r}; socllm's lm-eval tasks are: "
            + ", ".join(sorted(TASKS))
            + " (or any socllm_* task name, e.g. socllm_mmlu_anatomy)"
        )
    return TASKS[key]


# -- rendering -------------------------------------------------------------------------------


def _yaml_str(s: str) -> str:
    """``s`` as the inside of a YAML double-quoted scalar (JSON escapes are valid YAML)."""
    return json.dumps(s)[1:-1]


def _render_all(data: Path) -> dict[str, str]:
    """File name -> text of every generated file."""
    tpl = {p.name: p.read_text(encoding="utf-8") for p in sorted(TEMPLATE_DIR.glob("*.in"))}
    dd = _yaml_str(str(data))
    out: dict[str, str] = {}
    for name, text in tpl.items():
        if name.startswith("_socllm_mmlu_subject") or name.startswith("_socllm_mmlu_category"):
            continue
        out[name[: -len(".in")]] = text.replace("@DATA_DIR@", dd)
    for cat in MMLU_CATEGORIES:
        out[f"socllm_mmlu_{cat}.yaml"] = tpl["_socllm_mmlu_category.yaml.in"].replace(
            "@CATEGORY@", cat
        )
    for subject, cat in MMLU_SUBJECTS.items():
        desc = (
            f"The following are multiple choice questions (with answers) about "
            f"{subject.replace('_', ' ')}.\n\n"
        )
        out[f"socllm_mmlu_{subject}.yaml"] = (
            tpl["_socllm_mmlu_subject.yaml.in"]
            .replace("@DATA_DIR@", dd)
            .replace("@SUBJECT@", subject)
            .replace("@CATEGORY@", cat)
            .replace("@DESCRIPTION@", json.dumps(desc))
        )
    return out


def task_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Render the task templates for ``data_dir`` (default :func:`socllm.data.data_dir`) into
    the cache (once; atomically) and return the folder."""
    data = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir().resolve()
    if not data.is_dir():
        raise MissingFileError(f"datasets folder {data} does not exist")
    files = _render_all(data)
    h = hashlib.sha256(f"v{FORMAT_VERSION}\0{data}".encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    root = cache_dir() / "lmeval_tasks"
    final = root / h.hexdigest()[:16]
    if final.is_dir():
        return final
    with atomic_dir(final) as tmp:  # another process may render the same folder first
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / "README.txt").write_text(
            f"Generated by socllm.eval.lmeval.task_configs from {TEMPLATE_DIR} for data in "
            f"{data}.\n"
        )
    return final


def task_manager(data_dir: str | os.PathLike | None = None, *, include_defaults: bool = False):
    """An ``lm_eval.tasks.TaskManager`` that knows socllm's local tasks (``socllm_*``).

    ``include_defaults=True`` also indexes lm-eval's built-in tasks (slower to build; those
    download their data from the Hugging Face hub, which our machines cannot reach)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(task_dir(data_dir)), include_defaults=include_defaults)


# -- data loading (called by lm-eval through `custom_dataset`) ---------------------------------


def _arrow_split(folder: Path):
    import datasets

    files = sorted(folder.glob("*.arrow"))
    if not files:
        raise MissingFileError(f"no .arrow file in {folder}")
    parts = [datasets.Dataset.from_file(str(f)) for f in files]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _olmes_docs(path: Path, max_doc_id: int = 1_000_000) -> list[dict]:
    """One ``doc`` per ``doc_id`` from an OLMES requests file, in ``doc_id`` order; ids from
    ``max_doc_id`` up are OLMES's unconditional ("Answer:") requests and are skipped."""
    docs: dict[int, dict] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["doc_id"] < max_doc_id:
                docs.setdefault(r["doc_id"], r["doc"])
    return [docs[k] for k in sorted(docs)]


def load_dataset(data_dir: str | None = None, dataset: str | None = None, **_ignored):
    """``datasets.DatasetDict`` of one local data set. ``dataset`` is a key of :data:`TASKS`
    (except ``mmlu``) or ``mmlu/<subject>``. Extra keywords (lm-eval passes the task's
    metadata) are ignored."""
    import datasets

    if not dataset:
        raise ValueError("load_dataset: no dataset given")
    root = Path(data_dir) if data_dir else default_data_dir()
    if dataset in ("hellaswag", "lambada_openai"):
        path = root / dataset / "requests.jsonl.gz"
        if not path.is_file():
            raise MissingFileError(f"{dataset}: {path} not found")
        docs = _olmes_docs(path)
        if dataset == "hellaswag":
            docs = [
                {"ind": d["ind"], "query": d["query"], "choices": d["choices"], "gold": d["gold"]}
                for d in docs
            ]
            split = "validation"
        else:
            docs = [
                {"id": d["id"], "query": d["query"], "answers_text": d["answers_text"]}
                for d in docs
            ]
            split = "test"
        return datasets.DatasetDict({split: datasets.Dataset.from_list(docs)})
    if dataset.startswith("mmlu/"):
        subject = dataset.split("/", 1)[1]
        folder = root / "mmlu" / subject
        if not folder.is_dir():
            raise MissingFileError(f"MMLU subject {subject!r}: {folder} not found")
        return datasets.DatasetDict(
            {s: _arrow_split(folder / s) for s in ("dev", "validation", "test")}
        )
    if dataset in ("arc_easy", "arc_challenge", "piqa", "winogrande", "openbookqa"):
        folder = root / dataset / "validation"
        if not folder.is_dir():
            raise MissingFileError(f"{dataset}: {folder} not found")
        return datasets.DatasetDict({"validation": _arrow_split(folder)})
    raise ValueError(f"load_dataset: unknown local dataset {dataset!r}")


# -- WinoGrande (lm_eval/tasks/winogrande/preprocess_winogrande.py, verbatim logic) -------------


def winogrande_doc_to_text(doc: dict) -> int:
    answer_to_num = {"1": 0, "2": 1}
    return answer_to_num[doc["answer"]]


def winogrande_doc_to_target(doc: dict) -> str:
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def winogrande_doc_to_choice(doc: dict) -> list[str]:
    idx = doc["sentence"].index("_")
    options = [doc["option1"], doc["option2"]]
    return [doc["sentence"][:idx] + opt for opt in options]
