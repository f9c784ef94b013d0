"""The exceptions a user can see. Every message says what happened and what to do.

All derive from ``NotebookLaunchError``, so one ``except NotebookLaunchError`` catches any of
them, and each keeps the builtin base it had (``LaunchError`` and ``GuardError`` are
``RuntimeError``s, ``LaunchArgumentError`` a ``ValueError``) so existing handlers still work.
How they show in IPython (cells, not our frames) is ``errors.render``.

Owns: how a failure is raised, shown and swallowed: the exception types, their rendering in IPython
(``render``, with ``ipython_shell``, the one way to find the running shell), ``best_effort`` and debug
logging. May import: nothing of ours outside this package.
"""
from __future__ import annotations

import builtins
import sys
from typing import Any

from . import render

_adopted = False   # adopt_torch_child_failed_error ran with torch there (whatever it found)

def adopt_torch_child_failed_error() -> None:
    """Make ``LaunchError`` torch elastic's ``ChildFailedError`` too (what Accelerate's launcher
    raises, so code written for it catches it around the launch), once torch is in this process.

    Only then: ``import notebook_launch`` must not import torch (a second of imports, torch's
    at-fork handler, exit hooks and warning filters). Code that names ``ChildFailedError`` has
    imported torch, so the base is added before it can matter: at ``import notebook_launch``
    when torch came first (the usual notebook), else when a ``LaunchError`` is made. With torch
    imported, the errors module is ~6 ms, once. A torch built without torch.distributed keeps
    the plain bases; so does a process that never imports torch."""
    global _adopted
    if _adopted or "torch" not in sys.modules:
        return
    _adopted = True
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except Exception:   # why: a torch without elastic: LaunchError stays a plain NotebookLaunchError
        return
    if not issubclass(LaunchError, ChildFailedError):
        LaunchError.__bases__ = LaunchError.__bases__ + (ChildFailedError,)


class NotebookLaunchError(Exception):
    """The base of every error notebook_launch raises in the notebook: ``LaunchError``,
    ``GuardError`` and ``LaunchArgumentError``.

    In IPython each shows itself through ``_render_traceback_`` (``errors.render``): a launch
    failure as the failing rank's cells, the others as their message alone, without our frames.
    """

    def _render_traceback_(self) -> list[str]:
        return render.render_traceback(self)


class LaunchError(NotebookLaunchError, RuntimeError):
    """A launch failed: a rank raised, died, timed out or could not report its result.

    The first line of the message names the failing rank (and node, for
    multi-node runs), the exception type and message; the failing rank's
    traceback follows, then what happened to the other ranks.

    Attributes: ``rank`` (global rank that failed first, or None), ``kind``
    ("exception", "signal", "exit", "timeout", "result", "stopped", "rendezvous"),
    ``exc_type``, ``exc_message``, ``remote_traceback``, ``log_dir``, and
    ``results`` (the values of the ranks that finished, by local rank; missing
    ones are None), ``node_rank`` (the node of the failing rank in a multi-node
    run, else None).

    Once torch is imported it is also torch elastic's ``ChildFailedError`` (what Accelerate's
    launcher raises; ``adopt_torch_child_failed_error``), so ``except ChildFailedError`` catches
    it: ``name`` is the launched function's name and ``failures`` maps each failed global rank
    to torch's ``ProcessFailure`` (``local_rank``, ``pid``, ``exitcode`` (-signal when killed),
    ``error_file``, ``message``, ``timestamp``, and ``rank``); empty only when no rank ran (a
    rendezvous that never completed).
    """

    def __init__(self, message: str, *, rank: int | None = None, kind: str = "exception",
                 exc_type: str | None = None, exc_message: str | None = None,
                 remote_traceback: str | None = None, log_dir: str | None = None,
                 results: list[Any] | None = None, node_rank: int | None = None,
                 name: str = "notebook_launcher", failures: dict[int, Any] | None = None) -> None:
        adopt_torch_child_failed_error()
        RuntimeError.__init__(self, message)   # our text, not ChildFailedError's torch-format one
        self.name = name
        self.failures = dict(failures or {})
        self.rank = rank
        self.kind = kind
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.remote_traceback = remote_traceback
        self.log_dir = log_dir
        self.results = results
        self.node_rank = node_rank


class GuardError(NotebookLaunchError, RuntimeError):
    """Raised before any process starts, when launching now would fail or misbehave."""


class LaunchArgumentError(NotebookLaunchError, ValueError):
    """An argument of notebook_launcher is invalid; the message names it and the valid values."""


class KeyboardInterrupt(builtins.KeyboardInterrupt):   # the name Jupyter shows the error by
    """The interrupt that ended a launch or a call (Ctrl-C, the kernel's interrupt, the Stop
    button), as it leaves notebook_launch: a ``KeyboardInterrupt`` (``except KeyboardInterrupt``
    catches it), named so, because Jupyter shows an error by its class name. In IPython it shows
    the user's frames only (``render.render_interrupt``): the frames it passed in notebook_launch
    and IPython's own are left out, with a line that counts ours."""

    def _render_traceback_(self) -> list[str]:
        return render.render_interrupt(self)


def user_interrupt(interrupt: builtins.KeyboardInterrupt) -> KeyboardInterrupt:
    """``interrupt`` as the interrupt a user sees (same message), without our frames."""
    if isinstance(interrupt, KeyboardInterrupt):
        return interrupt.with_traceback(None)
    return KeyboardInterrupt(*interrupt.args)


adopt_torch_child_failed_error()   # torch imported first: the base is there from the start
