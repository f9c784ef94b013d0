"""The exceptions a user can see. Every message says what happened and what to do."""
from __future__ import annotations

from typing import Any


class LaunchError(RuntimeError):
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
    """

    def __init__(self, message: str, *, rank: int | None = None, kind: str = "exception",
                 exc_type: str | None = None, exc_message: str | None = None,
                 remote_traceback: str | None = None, log_dir: str | None = None,
                 results: list[Any] | None = None, node_rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.kind = kind
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.remote_traceback = remote_traceback
        self.log_dir = log_dir
        self.results = results
        self.node_rank = node_rank


class GuardError(RuntimeError):
    """Raised before any process starts, when launching now would fail or misbehave."""


class LaunchArgumentError(ValueError):
    """An argument of notebook_launcher is invalid; the message names it and the valid values."""


from .render import install as _install_rendering  # noqa: E402  (IPython shows cells, not our frames)
_install_rendering(LaunchError, GuardError, LaunchArgumentError)
