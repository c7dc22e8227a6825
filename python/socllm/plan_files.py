"""Plans as files: a plan's full JSON (``Plan.to_json()``) written atomically, and read back
wherever a command takes ``--plan``: ``@PATH`` or a path ending in ``.json`` names a file
(``socllm frontier`` writes its recommended plans so; ``socllm eval``, ``simulate`` and ``run``
read them). Any other value is plan text for the core (``name:key=value,...`` or inline JSON).
A file's top-level keys starting with '_' are notes for people (why the plan was chosen) and
are dropped before the core parses the plan.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import _core
from .errors import FormatError, InvalidArgumentError, MissingFileError
from .io.files import atomic_write_text


def plan_file_path(spec: str) -> Path | None:
    """The file ``spec`` names (``@PATH`` or ``*.json``), or None for plan text."""
    if spec.startswith("@"):
        return Path(spec[1:])
    if not spec.lstrip().startswith("{") and spec.endswith(".json"):
        return Path(spec)
    return None


def read_plan(spec: str) -> str:
    """``spec`` as plan text the core parses: a plan file's JSON, else ``spec`` itself. The
    plan is checked here, so a bad file fails naming the file."""
    if spec.startswith("@") and not spec[1:].strip():
        raise InvalidArgumentError(f"plan file {spec!r}: no path after '@'")
    path = plan_file_path(spec)
    if path is None:
        return spec
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"plan file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FormatError(f"plan file {str(path)!r}: {e}") from None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise FormatError(f"plan file {str(path)!r} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise FormatError(
            f"plan file {str(path)!r} holds a {type(value).__name__}, not a plan (a JSON object)"
        )
    value = {k: v for k, v in value.items() if not k.startswith("_")}
    try:
        _core.Plan(value)
    except _core.SocllmError as e:
        raise type(e)(f"plan file {str(path)!r}: {e}") from None
    return json.dumps(value, sort_keys=True)


def write_plan(path: str | os.PathLike, plan, about: str = "") -> Path:
    """``plan`` (text, dict or Plan) as its full JSON in ``path``, atomically; ``about`` (why
    this plan, e.g. the budget it was chosen for) goes under the key ``_about``, which
    :func:`read_plan` drops."""
    p = plan if isinstance(plan, _core.Plan) else _core.Plan(plan)
    value = p.to_json()
    if about:
        value = {"_about": about, **value}
    atomic_write_text(path, json.dumps(value, indent=1, sort_keys=False) + "\n")
    return Path(path)
