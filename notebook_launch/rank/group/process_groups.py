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


def keep_groups_used_by_ddp() -> None:
    """Patch DistributedDataParallel.__init__ (the class a user imported before the launch is
    the same object) and c10d's ``rendezvous`` (looked up at call time by init_process_group)."""
    if "torch" not in sys.modules:
        return
    try:
        import torch.distributed.distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel
    except Exception:   # why: a torch built without distributed
        log.debug("torch.distributed is unavailable; no process groups to keep", exc_info=True)
        return
    rendezvous = getattr(c10d, "rendezvous", None)
    if getattr(DistributedDataParallel, _PATCHED, False) or rendezvous is None:
        return
    build = DistributedDataParallel.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        group = getattr(self, "process_group", None)
        if group is not None and not any(kept is group for kept in _kept):
            _kept.append(group)

    def rendezvous_after_release(*args: Any, **kwargs: Any) -> Any:
        release_destroyed_groups()   # a re-init binds MASTER_PORT again: free the old store
        return rendezvous(*args, **kwargs)

    __init__.__wrapped__ = build  # type: ignore[attr-defined]
    __init__.__doc__ = build.__doc__
    DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign]
    c10d.rendezvous = rendezvous_after_release
    setattr(DistributedDataParallel, _PATCHED, True)


def release_destroyed_groups() -> None:
    """Drop our references to groups destroy_process_group() has forgotten. Called when no
    Reducer should be left (the launched function returned) or a new group is wanted; a group
    that a still-alive DDP model uses then lives on through it, as in plain torch."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    live = getattr(getattr(c10d, "_world", None), "pg_map", None)
    if live is None:
        return
    _kept[:] = [group for group in _kept if group in live]
