"""socllm's exception classes. They are defined by the C++ core, so an error raised in C++
and one raised in Python are the same class:

- ``SocllmError``: base of all.
- ``InvalidArgumentError`` (also ``ValueError``): a bad value; ``ShapeError`` and
  ``ContextOverflowError`` derive from it.
- ``MissingFileError`` (also ``FileNotFoundError``), ``FormatError`` (also ``ValueError``):
  missing, malformed or truncated files.
- ``UnsupportedError`` (also ``NotImplementedError``): valid input socllm does not implement.

:func:`int_arg` / :func:`real_arg` check a Python API's numeric arguments into these errors.
"""

import operator

import numpy as np

from ._core import (  # noqa: F401
    ContextOverflowError,
    FormatError,
    InvalidArgumentError,
    MissingFileError,
    ShapeError,
    SocllmError,
    UnsupportedError,
)

INT64_MAX = 2**63 - 1


def int_arg(fn: str, name: str, value, minimum: int | None = None) -> int:
    """``value`` as a Python int (operator.index: 1.5, "12" and True are refused, not truncated,
    parsed or counted), at least ``minimum`` and at most INT64_MAX; else an InvalidArgumentError
    naming it."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{fn}: {name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(
            f"{fn}: {name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None
    if minimum is not None and v < minimum:
        raise InvalidArgumentError(f"{fn}: {name} must be >= {minimum}, got {v}")
    if v > INT64_MAX:  # the core's counts are int64
        raise InvalidArgumentError(f"{fn}: {name} must be <= {INT64_MAX}, got {v}")
    return v


def real_arg(fn: str, name: str, value) -> float:
    """``value`` as a finite float: a real number (numpy's included), not a string or a bool."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float, np.number)):
        raise InvalidArgumentError(
            f"{fn}: {name} must be a number, got {type(value).__name__} {value!r}"
        )
    return float(value)
