"""Inside a rank: never let DDP's Reducer be the last owner of a process group.

torch 2.13 can deadlock in the common ``destroy_process_group(); return`` with a DDP
model alive. Every ``backward()`` stashes a ``contextvars`` context in thread-local state
(torch/autograd/graph.py); each gloo all_reduce Work copies that state, so the gloo worker
thread that frees a finished Work must take the GIL (~ThreadLocalState -> SafePyObject
decref). After ``destroy_process_group()`` only the Reducer owns the group; freeing the DDP
model (at ``return``) frees the Reducer with the GIL held, ~ProcessGroupGloo joins the gloo
worker threads, and one of them is waiting for that GIL: a hang (seen with py-spy; the open
torch issue on blocking destructors run with the GIL held is pytorch/pytorch#56297).

The Python binding of ProcessGroup releases the GIL in its destructor (IntrusivePtrNoGilDestructor,
pytorch/pytorch#56381 and #154976); the Reducer's binding does not.
So each rank keeps a Python reference to the group of every DDP model it builds and lets go
of destroyed ones only later: after the launched function has returned, or before the next
rendezvous (a re-init binds MASTER_PORT, which the old group's store holds). The last owner is
then that Python reference, and ~ProcessGroupGloo runs without the GIL. Groups no DDP model
uses are left alone (freed inside destroy_process_group as usual).
"""
from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("notebook_launch")
_kept: list[Any] = []          # the groups DDP models in this rank were built on
_PATCHED = "_notebook_launch_keeps_groups"


_active = False                # True in a rank: the patches below act there only
_patched_before_forks = False  # made in the notebook (``patch_before_forks``), inherited by forked ranks


def patch_before_forks() -> None:
    """In the notebook, before a launch's forks: make the patches once, inert there (``_active``
    is false outside a rank: DDP builds and ``rendezvous`` runs as torch's own, only through one
    more frame), so a forked rank only turns them on. Made in each rank, setting
    ``DistributedDataParallel.__init__`` updated the type's slots and those of its subclasses,
    about 0.3 ms of every rank's CPU, most of it the notebook's pages that wrote to, copied after
    the fork (issue 45). Only where torch.distributed and DDP are imported already: nothing is
    imported into the notebook for it (a rank then patches at its start, as a spawned one does)."""
    global _patched_before_forks
    if _patched_before_forks:
        return
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    ddp = getattr(sys.modules.get("torch.nn.parallel"), "DistributedDataParallel", None)
    if c10d is not None and isinstance(ddp, type):
        _patched_before_forks = _patch(c10d, ddp)


def keep_groups_used_by_ddp() -> None:
    """In a rank: patch DistributedDataParallel.__init__ (the class a user imported before the launch is
    the same object) and c10d's ``rendezvous`` (looked up at call time by init_process_group),
    or turn on the patches the notebook made before the fork."""
    global _active
    _active = True
    if _patched_before_forks or "torch" not in sys.modules:
        return
    try:
        import torch.distributed.distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel
    except Exception:   # why: a torch built without distributed
        log.debug("torch.distributed is unavailable; no process groups to keep", exc_info=True)
        return
    _patch(c10d, DistributedDataParallel)


def _patch(c10d: Any, ddp: Any) -> bool:
    """Wrap ``ddp.__init__`` to keep each model's group, and ``c10d.rendezvous`` to let the
    destroyed ones go first, both acting only in a rank (``_active``); False where torch has no
    ``rendezvous`` to wrap."""
    rendezvous = getattr(c10d, "rendezvous", None)
    if getattr(ddp, _PATCHED, False) or rendezvous is None:
        return rendezvous is not None
    build = ddp.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        group = getattr(self, "process_group", None) if _active else None
        if group is not None and not any(kept is group for kept in _kept):
            _kept.append(group)

    def rendezvous_after_release(*args: Any, **kwargs: Any) -> Any:
        if _active:
            release_destroyed_groups()   # a re-init binds MASTER_PORT again: free the old store
        return rendezvous(*args, **kwargs)

    __init__.__wrapped__ = build  # type: ignore[attr-defined]
    __init__.__doc__ = build.__doc__
    ddp.__init__ = __init__
    c10d.rendezvous = rendezvous_after_release
    setattr(ddp, _PATCHED, True)
    return True


def release_destroyed_groups() -> None:
    """Drop our references to groups destroy_process_group() has forgotten. Called when no
    Reducer should be left (the launched function returned) or a new group is wanted; a group
    that a still-alive DDP model uses then lives on through it, as in plain torch."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    live = getattr(getattr(c10d, "_world", None), "pg_map", None)
    if live is None:
        return
    _kept[:] = [group for group in _kept if group in live]
