"""The package version, in a module of its own so that submodules can import it without
importing the package (``socllm/__init__.py`` imports them: that would be a cycle)."""

__version__ = "0.1.0"
