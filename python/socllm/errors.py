"""socllm's exception classes. They are defined by the C++ core, so an error raised in C++
and one raised in Python are the same class:

- ``SocllmError``: base of all.
- ``InvalidArgumentError`` (also ``ValueError``): a bad value; ``ShapeError`` and
  ``ContextOverflowError`` derive from it.
- ``MissingFileError`` (also ``FileNotFoundError``), ``FormatError`` (also ``ValueError``):
  missing, malformed or truncated files.
- ``UnsupportedError`` (also ``NotImplementedError``): valid input socllm does not implement.
"""

from ._core import (  # noqa: F401
    ContextOverflowError,
    FormatError,
    InvalidArgumentError,
    MissingFileError,
    ShapeError,
    SocllmError,
    UnsupportedError,
)
