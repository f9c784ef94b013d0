"""notebook_launch: train on every device you have, from a notebook cell, with one call."""
from __future__ import annotations

__version__ = "0.1.0"

from . import cuda_tracking as _cuda_tracking
from . import cuda_tracking  # noqa: F401  (guards and tests use it)
from .errors import GuardError, LaunchArgumentError, LaunchError
from .launcher import notebook_launcher
from .progress import progress

try:  # record where CUDA gets initialized from now on (guards quote it)
    import torch as _torch  # noqa: F401
    _cuda_tracking.install()
except ImportError:
    pass


def load_ipython_extension(ipython) -> None:
    """``%load_ext notebook_launch``: track where CUDA gets initialized; add the ``%%launch`` magic."""
    from .magic import load_ipython_extension as _load
    _load(ipython)


__all__ = ["notebook_launcher", "progress", "LaunchError", "GuardError", "LaunchArgumentError", "__version__"]
