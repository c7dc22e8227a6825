"""socllm's exception classes. They are defined by the C++ core, so an error raised in C++
and one raised in Python are the same class:

- ``SocllmError``: base of all.
- ``InvalidArgumentError`` (also ``ValueError``): a bad value; ``ShapeError`` and
  ``ContextOverflowError`` derive from it.
- ``MissingFileError`` (also ``FileNotFoundError``), ``FormatError`` (also ``ValueError``):
  missing, malformed or truncated files.
- ``UnsupportedError`` (also ``NotImplementedError``): valid input socllm does not implement.

:func:`int_arg`, :func:`real_arg`, :func:`bool_arg`, :func:`str_arg`, :func:`ints_arg` and
:func:`reals_arg` check a Python API's arguments into these errors; :func:`not_applicable` is the
refusal of an option that would change nothing where it is given (issue 37).
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


def bool_arg(fn: str, name: str, value) -> bool:
    """``value`` as a bool: True or False (numpy's included), not a truthy string or number."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidArgumentError(
        f"{fn}: {name} must be True or False, got {type(value).__name__} {value!r}"
    )


def str_arg(fn: str, name: str, value) -> str:
    """``value`` as a str (not None, bytes or a number)."""
    if isinstance(value, str):
        return value
    raise InvalidArgumentError(f"{fn}: {name} must be a str, got {type(value).__name__} {value!r}")


def ints_arg(fn: str, name: str, values, minimum: int | None = None) -> list[int]:
    """A sequence of ints (each as :func:`int_arg`), not a str or a scalar."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidArgumentError(
            f"{fn}: {name} must be a sequence of integers, got {type(values).__name__} {values!r}"
        )
    return [int_arg(fn, f"{name}[{i}]", v, minimum) for i, v in enumerate(values)]


def reals_arg(fn: str, name: str, values) -> list[float]:
    """A sequence of real numbers (each as :func:`real_arg`), not a str or a scalar."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidArgumentError(
            f"{fn}: {name} must be a sequence of numbers, got {type(values).__name__} {values!r}"
        )
    return [real_arg(fn, f"{name}[{i}]", v) for i, v in enumerate(values)]


def not_applicable(fn: str, option: str, applies_to: str, here: str) -> InvalidArgumentError:
    """The refusal of an option that would change nothing where it is given (issue 37: no
    option is ignored): ``option`` as given (``"name=value"`` or a CLI flag), what it applies
    to, and why that is not the case ``here``."""
    return InvalidArgumentError(f"{fn}: {option} applies to {applies_to}; {here}")
