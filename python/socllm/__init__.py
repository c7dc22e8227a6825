"""socllm: run real LLMs as a phone SoC would, with measured accuracy and simulated timing.

>>> import socllm
>>> m = socllm.load("smollm2-135m")
>>> m.generate("The capital of France is", max_new_tokens=8)
>>> socllm.simulate("qwen1.5-1.8b", "snapdragon-8gen3", "shadow-outlier", 1024).summary()
"""

from . import _core
from . import calibration as calibration
from . import eval as eval  # noqa: A004 (socllm.eval, not the builtin)
from . import io as io
from . import ops as ops
from . import quant as quant
from . import sim as sim
from ._core import (
    Plan,
    blas_info,
    decoder_block,
    log_level,
    max_num_threads,
    num_threads,
    set_log_level,
    set_num_threads,
)
from ._version import __version__ as __version__
from .devices import DEVICE_DIR as _DEVICE_DIR
from .errors import (
    ContextOverflowError,
    FormatError,
    InvalidArgumentError,
    MissingFileError,
    ShapeError,
    SocllmError,
    UnsupportedError,
)
from .model import LanguageModel, PerplexityResult, load
from .registry import BUILTIN_MODELS, DEFAULT_MODEL
from .sim import (
    TaskGraph,
    Timeline,
    hetero_engines,
    policies,
    simulate,
    simulate_cold_start,
    simulate_graph,
    simulate_hetero,
    simulate_model,
    task_graph,
)

# Plans name devices; the C++ core reads the named profiles from the package's devices/ folder.
_core.sim.set_device_dir(str(_DEVICE_DIR))


def build_info() -> dict:
    """The compiled core this socllm runs: ``module`` (the extension's file), ``blas`` (its
    OpenBLAS and the kernels it chose for this CPU), ``isa`` (the INT8 kernels' path) and
    ``version``."""
    return {
        "module": _core.__file__,
        "blas": _core.blas_info(),
        "isa": _core.ops.isa(),
        "version": __version__,
    }


# Subpackages (ops, quant, sim, io, calibration, eval) are attributes, not star-exports:
# `from socllm import *` must not shadow the builtin eval or the stdlib io.
__all__ = [
    "load",
    "LanguageModel",
    "PerplexityResult",
    "simulate",
    "hetero_engines",
    "simulate_cold_start",
    "simulate_hetero",
    "simulate_graph",
    "simulate_model",
    "Timeline",
    "TaskGraph",
    "task_graph",
    "policies",
    "Plan",
    "decoder_block",
    "build_info",
    "blas_info",
    "max_num_threads",
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "set_num_threads",
    "num_threads",
    "set_log_level",
    "log_level",
    "SocllmError",
    "InvalidArgumentError",
    "ShapeError",
    "ContextOverflowError",
    "MissingFileError",
    "FormatError",
    "UnsupportedError",
]
