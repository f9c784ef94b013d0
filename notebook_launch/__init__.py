"""notebook_launch: train on every device you have, from a notebook cell, with one call."""
from __future__ import annotations

import logging
import os
from typing import Any

from . import cuda_tracking as _cuda_tracking
from . import cuda_tracking  # noqa: F401  (preflight and tests use it)
from .cluster import RayCluster
from .curves import load_metrics
from .errors import GuardError, LaunchArgumentError, LaunchError
from .launcher import notebook_launcher
from .persistent import Ranks, start_ranks
from .rank.progress import progress

__version__ = "0.1.0"


def _debug_logging_from_environment() -> None:
    """NOTEBOOK_LAUNCH_DEBUG=1: every fallback the package takes is logged (debug level) to
    stderr, in the notebook and in every rank (ranks inherit the variable)."""
    if os.environ.get("NOTEBOOK_LAUNCH_DEBUG", "").strip().lower() not in ("1", "true", "yes", "on"):
        return
    logger = logging.getLogger("notebook_launch")
    logger.setLevel(logging.DEBUG)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("notebook_launch[%(process)d] %(levelname)s %(message)s"))
        logger.addHandler(handler)


_debug_logging_from_environment()


try:  # record where CUDA gets initialized from now on (preflight quotes it)
    import torch as _torch  # noqa: F401
    _cuda_tracking.install()
except ImportError:
    pass  # without torch there is no CUDA to track


def _warm_between_cells_in_a_kernel() -> None:
    """In a Jupyter kernel, import torch._dynamo between cells (backends.warm_imports)."""
    from .detect.platform import in_ipython_kernel, inside_launched_rank
    if inside_launched_rank() or not in_ipython_kernel():
        return
    from .backends.warm_imports import warm_between_cells
    from IPython import get_ipython
    warm_between_cells(get_ipython())


_warm_between_cells_in_a_kernel()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_launch``: track where CUDA gets initialized; add ``%%launch`` and ``%ranks``/``%%ranks``."""
    from .magic import load_ipython_extension as _load
    from .persistent.magic import register as _register_ranks
    _load(ipython)
    _register_ranks(ipython)


__all__ = ["notebook_launcher", "RayCluster", "start_ranks", "Ranks", "progress", "load_metrics", "LaunchError",
           "GuardError", "LaunchArgumentError",
           "load_ipython_extension", "__version__"]
