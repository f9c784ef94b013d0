"""When a failed attempt runs again: the one rule that elastic's agent (multi-node and
``max_restarts`` on this machine) and the Ray launcher share.

The rule: a run is restarted (while ``max_restarts`` allow) only after a failure of what
the ranks ran -- a rank raised (EXCEPTION), was killed by a signal (SIGNAL: the OOM killer,
a preempted node, a Ray actor's death) or exited on its own (EXIT: NCCL's abort,
``sys.exit``). Those are what another attempt may not meet again, and what torch elastic
restarts a worker group for.

Never restarted, and why:
* TIMEOUT, STOPPED, INTERRUPTED: the user's limit or the user's request (``timeout``, the Stop
  button, Ctrl-C); restarting would defeat it.
* RESULT: every rank finished, but a result cannot be unpickled in the notebook; the next
  attempt would redo the whole run to fail the same way.
* RENDEZVOUS: the nodes (or Ray's placement, or the ranks' connections back) never met; the
  rendezvous already waited ``rdzv_timeout`` for them, and no rank code ran.
* What the launcher says cannot run again (``may_restart``): a SLURM job the scheduler ended (a
  time limit, a node failure, preemption) has no allocation left for the next attempt.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from ..errors import LaunchError
from ..wire.protocol import FailureKind

RESTARTABLE = frozenset({FailureKind.EXCEPTION, FailureKind.SIGNAL, FailureKind.EXIT})
T = TypeVar("T")


def restartable(kind: str | FailureKind | None) -> bool:
    """Whether a failure of this kind may be followed by another attempt (see the module's rule)."""
    try:
        return FailureKind(kind) in RESTARTABLE
    except ValueError:
        return False


def run_attempts(attempt: Callable[[int], T], max_restarts: int,
                 before_restart: Callable[[LaunchError, int], None],
                 last_error: Callable[[LaunchError, int], LaunchError],
                 may_restart: Callable[[LaunchError], bool] | None = None) -> T:
    """Run ``attempt(0)``, and after a restartable LaunchError ``attempt(1)`` ... up to
    ``attempt(max_restarts)``; ``before_restart(error, next_attempt)`` runs between them (the
    notice, the run state's new attempt). ``may_restart(error)``, asked only of a failure the rule
    would restart, may still refuse (it adds its reason to the error). The error that ends the run
    is raised as ``last_error(error, attempt_number)`` makes it (which attempt it was). Elastic's
    agent owns its own loop (torch's ``SimpleElasticAgent``), under the same rule."""
    number = 0
    while True:
        try:
            return attempt(number)
        except LaunchError as error:
            if (number >= max_restarts or not restartable(error.kind)
                    or (may_restart is not None and not may_restart(error))):
                raise last_error(error, number) from None
            number += 1
            before_restart(error, number)
