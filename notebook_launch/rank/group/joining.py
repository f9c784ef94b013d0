"""Inside a rank: the row says "joining the process group" while ``init_process_group`` runs.

Joining takes as long as the last peer takes to call it (gloo connects every pair of ranks; a
client waits for rank 0's store): seconds on a busy machine, the whole timeout when a peer never
comes. Until now the row said "starting" or nothing for all that time. The rank reports the
phase itself (a PROGRESS event with a ``phase``), since only it knows when it calls in; the
notebook names the peers not joining yet (``group_join``).

Where: c10d's ``rendezvous`` (looked up at call time by ``init_process_group``: a reference the
user took before the launch still passes there) starts the phase, and ``_update_default_pg``
with the new group (the same point ``peers_joined`` counts in at) ends it. A group made from a
``store=`` has no rendezvous: it is not reported (the batch-size finder's groups, for one).
Installed by every launched rank (a ``runner.rank_hooks`` entry).
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from ...wire import protocol
from ...errors.best_effort import best_effort
from ...record.group_join import JOINED, JOINING

_PATCHED = "_notebook_launch_says_joining"
_joining: dict[int, bool] = {}   # pid -> whether it said it joins: a forked process starts from its own


def install(spec: Any = None) -> None:
    from ..after_import import after_import
    after_import("torch.distributed", wrap)


def wrap(dist: ModuleType) -> None:
    c10d = getattr(dist, "distributed_c10d", None)
    rendezvous, update = getattr(c10d, "rendezvous", None), getattr(c10d, "_update_default_pg", None)
    if rendezvous is None or update is None or getattr(rendezvous, _PATCHED, False):
        return

    def says_joining(*args: Any, **kwargs: Any) -> Any:
        report(JOINING)
        return rendezvous(*args, **kwargs)

    def says_joined(pg: Any) -> Any:
        value = update(pg)
        if pg is not None:
            report(JOINED)
        return value

    # Set by the attribute's name, not the function's: what sits there may be another wrapper (the
    # rank's process_groups wraps rendezvous first when torch.distributed was imported before the fork)
    for attribute, wrapper, original in (("rendezvous", says_joining, rendezvous),
                                         ("_update_default_pg", says_joined, update)):
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__doc__, wrapper.__name__ = original.__doc__, original.__name__
        setattr(wrapper, _PATCHED, True)
        setattr(c10d, attribute, wrapper)


def report(phase: str) -> None:
    """Tell the notebook the rank's phase; only a change, only from the rank's own process (a
    process it forked has its channel but no row)."""
    joining, pid = phase == JOINING, os.getpid()
    if joining == _joining.get(pid, False):
        return
    writer = protocol.current()
    if writer is None or getattr(writer, "pid", pid) != pid:
        return
    _joining.clear()   # one process's entry: a parent's, inherited by a fork, says nothing of this one
    _joining[pid] = joining
    with best_effort("the rank could not say it joins the process group"):
        writer.send(protocol.PROGRESS, {"phase": phase})
