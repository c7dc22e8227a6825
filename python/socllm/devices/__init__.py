"""Device profiles of phone SoCs (JSON; every number with the seed, section and table or figure
it comes from; see README.md here). The simulator reads the ``cost_model`` section, written by
``scripts/fit_cost_model.py --write``."""

from __future__ import annotations

import json
from pathlib import Path

_DIR = Path(__file__).parent
DEVICE_DIR = _DIR


def known() -> list[str]:
    return sorted(p.stem for p in _DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> dict:
    """A profile dict by name (``snapdragon-8gen3``) or from a JSON file path."""
    from ..errors import FormatError, InvalidArgumentError

    path = Path(name_or_path)
    if path.suffix != ".json":
        path = _DIR / f"{name_or_path}.json"
        if not path.exists():
            raise InvalidArgumentError(
                f"unknown device {str(name_or_path)!r} "
                f"(known: {', '.join(known())}, or a .json path)"
            )
    elif not path.exists():
        raise InvalidArgumentError(f"device profile file not found: {path}")
    from ..io.files import read_input_text

    try:
        profile = json.loads(read_input_text(path, "device profile"))
    except json.JSONDecodeError as e:
        raise FormatError(f"device profile {path} is not valid JSON: {e}") from e
    if not isinstance(profile, dict) or "name" not in profile:
        raise FormatError(f"device profile {path} needs a JSON object with a 'name'")
    if path.parent != _DIR:  # a user's file: the core's messages name it
        profile["_file"] = str(path)
    return profile
