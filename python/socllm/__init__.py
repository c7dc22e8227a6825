"""socllm: run real LLMs as a phone SoC would, with measured accuracy and simulated timing.

>>> import socllm
>>> m = socllm.load("smollm2-135m")
>>> m.generate("The capital of France is", max_new_tokens=8)
>>> socllm.simulate("qwen1.5-1.8b", "snapdragon-8gen3", "shadow-outlier", 1024).summary()
"""

import os as _os

from . import blas_core as _blas_core  # the standard library only: no core yet

# Issue 37 (graceful under load): by default libgomp's threads (the core's and OpenBLAS's, an
# OpenMP build) spin 300000 times (about 8 ms on Zen 4) before they sleep; beside other busy
# processes on few cores that starves the threads being waited for (a decode step took 0.2-2 s
# instead of 25 ms). Unless the user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT), they sleep after
# 1000 spins (about 25 us: enough to bridge the gaps between one decode step's parallel regions;
# with no spin at all decoding alone is 20% slower), and at once when libgomp's own threads
# outnumber the CPUs (PASSIVE). scripts/bench_load.py measures it. libgomp reads these when it
# is loaded, hence before the `_core` import; processes started from here inherit them.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _os.environ["GOMP_SPINCOUNT"] = "1000"
    try:  # a libgomp loaded earlier (torch ships a libgomp.so.1, which the core then shares)
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as _maps:
            if any("libgomp" in line for line in _maps):
                import warnings as _warnings

                _warnings.warn(
                    "libgomp was loaded before socllm (by torch or another OpenMP library), "
                    "so its threads spin while they wait and can starve other processes on a "
                    "busy machine (issue 37); set OMP_WAIT_POLICY=PASSIVE and GOMP_SPINCOUNT=1000 "
                    "in the environment before Python starts, or import socllm first",
                    RuntimeWarning,
                    stacklevel=2,
                )
    except OSError:  # no /proc/self/maps: not Linux, nothing to check
        pass

# OpenBLAS's kernels from the CPU's own flags (issue 38), before the library loads
_os.environ.update(_blas_core.choice())

from . import _core  # after the wait policy and the kernel choice: loads libgomp, OpenBLAS
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

_blas_core.warn_if_fallback(blas_info()["corename"])

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


def frontier(model, device="snapdragon-8gen3", **options) -> dict:
    """The plan frontier of a loaded ``model`` on ``device``: which composed plan to ship for a
    budget, accuracy and simulated time together (``socllm frontier``; see
    :func:`socllm.plan_frontier.run.frontier` for the options and the report)."""
    from .plan_frontier.run import frontier as _frontier

    return _frontier(model, device, **options)


# Subpackages (ops, quant, sim, io, calibration, eval) are attributes, not star-exports:
# `from socllm import *` must not shadow the builtin eval or the stdlib io.
__all__ = [
    "load",
    "frontier",
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
