"""notebook_launch: train on every device you have, from a notebook cell, with one call."""
from __future__ import annotations

from typing import Any

from .notebook import cuda_tracking  # noqa: F401  (preflight and tests use it)
from .engines import RayCluster, SlurmCluster
from .record.metrics import load_metrics
from .errors import GuardError, LaunchArgumentError, LaunchError, NotebookLaunchError
from .launcher import notebook_launcher
from .persistent import Ranks
from .ranks import start_ranks
from ._version import __version__
from .rank.reports.progress import progress
from .rank.batch.batch_size import find_executable_batch_size

# Importing changes nothing in the process: torch, IPython, logging, at-fork handlers and threads
# are hooked only by hooks.install(), on %load_ext, on the first launch or by install_hooks().


def install_hooks() -> None:
    """Install notebook_launch's hooks now (``notebook_launch.hooks`` lists them and says why):
    call it in the first cell, before anything touches CUDA, so the launch guards can name the
    line that did. ``%load_ext notebook_launch`` does the same; a launch does it otherwise.
    It imports nothing: torch is wrapped if it is imported, else (in IPython) after the cell
    that imports it."""
    from .hooks import install
    install(by="notebook_launch.install_hooks()")


def prestart() -> bool:
    """Start the warm start process now, in the background (returns at once): launches that must not
    fork the notebook (after CUDA was initialized in it, ``start_method="spawn"``, persistent ranks
    started that way) fork their ranks from it, in milliseconds instead of seconds. The first such
    launch starts it otherwise, and waits for its imports; ``%load_ext notebook_launch`` starts it
    where such launches are likely (a GPU or TPU, Python 3.14). False where it is switched off
    (``NOTEBOOK_LAUNCH_START_PROCESS=0``) or cannot run (not Linux)."""
    from .engines.local import start_process
    return start_process.prestart()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext notebook_launch``: track where CUDA gets initialized; add ``%%launch`` and ``%ranks``/``%%ranks``;
    start the warm start process where launches will likely need it (``prestart``)."""
    from .detect.platform import inside_launched_rank
    from .hooks import install
    from .magics.launch import load_ipython_extension as _load
    from .magics.ranks import register as _register_ranks
    install(by="%load_ext notebook_launch", shell=ipython)
    _load(ipython)
    _register_ranks(ipython)
    if not inside_launched_rank():
        from .engines.local import start_process
        if start_process.why_start_early() is not None:
            start_process.prestart()


__all__ = ["notebook_launcher", "RayCluster", "SlurmCluster", "start_ranks", "Ranks", "progress", "load_metrics",
           "find_executable_batch_size", "NotebookLaunchError", "LaunchError", "GuardError", "LaunchArgumentError",
           "load_ipython_extension", "install_hooks", "prestart", "__version__"]
