"""notebook_launch: train on every device you have, from a notebook cell, with one call."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from . import cuda_tracking as _cuda_tracking
from . import cuda_tracking  # noqa: F401  (preflight and tests use it)
from .errors import GuardError, LaunchArgumentError, LaunchError
from .launcher import notebook_launcher
from .rank.progress import progress

try:  # record where CUDA gets initialized from now on (preflight quotes it)
    import torch as _torch  # noqa: F401
    _cuda_tracking.install()
except ImportError:
    pass  # without torch there is no CUDA to track


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_launch``: track where CUDA gets initialized; add the ``%%launch`` magic."""
    from .magic import load_ipython_extension as _load
    _load(ipython)


__all__ = ["notebook_launcher", "progress", "LaunchError", "GuardError", "LaunchArgumentError",
           "load_ipython_extension", "__version__"]
