"""Everything notebook_launch hooks into the notebook's process, in one place, installed
only when asked: on ``%load_ext notebook_launch``, on the first ``notebook_launcher`` /
``start_ranks`` call, or by ``notebook_launch.install_hooks()``. ``import notebook_launch``
alone changes nothing (a library import must leave torch, IPython, logging, at-fork
handlers and threads as they were: tests/test_import_hooks.py checks it).

What ``install()`` hooks, and why:

* **logging**: with ``NOTEBOOK_LAUNCH_DEBUG=1``, a stderr handler at debug level on the
  ``notebook_launch`` logger, so every fallback the package takes is shown (forked ranks
  inherit it; spawned ranks inherit the variable).
* **torch**: ``torch.cuda._lazy_init`` and ``torch._C._cuda_getDeviceCount`` are wrapped
  (``cuda_tracking``) to record the line that first initialized CUDA or first asked the CUDA
  runtime to count devices (what "poisons" fork), and an IPython ``post_run_cell`` callback
  records the cell. The launch guards (preflight) quote that line when they refuse to fork.
  Without the hook the guards still refuse (``torch.cuda.is_initialized()``, the driver and a
  throwaway child say so); they just cannot say where. A cell that touched CUDA before the
  hooks were installed is therefore reported without its line, and the error says to put
  ``%load_ext notebook_launch`` in the first cell.
* **IPython, at-fork, a thread** (Jupyter kernels only, not in a rank): ``pre_run_cell`` and
  ``post_run_cell`` callbacks and an ``os.register_at_fork(before=...)`` handler, so that when
  the notebook defines training code, ``torch._dynamo`` is imported by a background thread
  between cells instead of once per rank after the fork (``engines.local.warm_imports``; opt out
  with ``NOTEBOOK_LAUNCH_PREIMPORT=0``).

One hook is not installed here: ``fork_locks`` registers an ``after_in_child`` at-fork handler
at the first acquire of any of its locks (a launch, a rank's first send), because only a lock
that was taken can be held at a fork; it renews, in a forked child, the locks another thread held.

``install()`` is idempotent; each call also wraps what torch offers by then (torch may be
imported after the first call). It hooks only into what is there: it never imports torch (the
IPython callback wraps torch after the cell that imports it; a fork launch imports torch
before forking only for code that names it, ``engines.local.warm_imports``) nor IPython (a shell
runs only where IPython was imported: ``ipython_shell``).
"""
from __future__ import annotations

import logging
from typing import Any

from .notebook import cuda_tracking, hooks_record
from .notebook.hooks_record import installed_by  # noqa: F401  (re-exported: what installed them)
from .errors.ipython_shell import running_shell
from .errors.debug_logging import DEBUG_VARIABLE, debug_logging_from_environment  # noqa: F401  (re-exported)

log = logging.getLogger("notebook_launch")


def install(by: str = "notebook_launch.install_hooks()", shell: Any = None) -> None:
    """Install every hook listed in the module docstring (idempotent). ``by`` names the
    caller for messages (``notebook.hooks_record``: what installed them first); ``shell`` is the
    IPython shell (default: the running one, if any)."""
    first = hooks_record.note_installed(by)
    if first:
        debug_logging_from_environment()
    cuda_tracking.install()
    if first:
        _warm_between_cells_in_a_kernel(shell)


def _warm_between_cells_in_a_kernel(shell: Any) -> None:
    from .detect.platform import in_ipython_kernel, inside_launched_rank
    if inside_launched_rank():
        return
    if shell is None:
        if not in_ipython_kernel():
            return
        shell = running_shell()
    elif getattr(shell, "kernel", None) is None:
        return   # a terminal IPython: no kernel waiting between cells
    from .engines.local.warm_imports import warm_between_cells
    warm_between_cells(shell)
