"""A rank does not leave a gloo group before every peer has finished joining it.

``init_process_group`` with gloo connects every pair of ranks (gloo's ``connectFullMesh``), and a
rank's call returns once its own connections are up, while a peer may still be reading the last
of its handshakes. A rank that ends then (a function that only joins the group and returns; a
``destroy_process_group()`` right after init) closes its sockets under that peer, whose init
fails with "Gloo connectFullMesh failed ... Connection reset by peer" (or "closed by peer"). On a
busy machine plain torch 2.13 does it in about 2 launches of 30 (4 forked ranks, init and
return); never when each rank stays 3 s. torch's own ``TORCH_DIST_INIT_BARRIER=1`` made it worse
(10 in 30): its barrier ends with rank 0, the store's host, leaving while others still read.

So each rank counts itself in on the group's store once its ``init_process_group`` returns
(``Joining``), and before it ends (``before_exit``, after the launched function returned) or
destroys the default group, it waits until every peer has joined, ``WAIT_LIMIT`` seconds at most.
Normally every peer joined long before: no wait, and no store request at the end but rank 0's.
Gloo groups only: NCCL connects lazily, and XLA's replicas share one process. Installed by every
launched rank (a ``runner.rank_hooks`` entry).
"""
from __future__ import annotations

import datetime
import logging
import threading
from types import ModuleType
from typing import Any

from ..best_effort import best_effort

log = logging.getLogger("notebook_launch")
WAIT_LIMIT = 10.0   # seconds a rank waits for its peers to join before it ends anyway
KEY = "notebook_launch/joined"
ALL_IN = "notebook_launch/all-joined"
HEARD = "notebook_launch/heard"
ALL_HEARD = "notebook_launch/all-heard"
_PATCHED = "_notebook_launch_waits_for_peers"
_joined = {"inits": 0}   # this process's inits of the default group: each has keys of its own
_joinings: dict[int, "Joining"] = {}   # this process's gloo inits by number
THREAD_NAME = "notebook_launch-peers-joined"


def install(spec: Any = None) -> None:
    """Wrap ``init_process_group`` and ``destroy_process_group`` now if torch.distributed is
    imported, else right after the rank imports it."""
    from .progress_bridge import after_import
    after_import("torch.distributed", wrap)


def wrap(dist: ModuleType) -> None:
    """Count in where c10d makes a group the default one (``_update_default_pg``, looked up at call
    time: every way of calling ``init_process_group`` reaches it, even a reference taken before
    the launch), and wait in ``destroy_process_group`` before it shuts the default group down; a
    reference to it taken before the launch still waits, later, where c10d forgets the group."""
    c10d = getattr(dist, "distributed_c10d", None)
    update, destroy = getattr(c10d, "_update_default_pg", None), getattr(dist, "destroy_process_group", None)
    if update is None or destroy is None or getattr(update, _PATCHED, False):
        return

    def _update_default_pg(pg: Any) -> Any:
        if pg is None:
            wait_for_peers()
        value = update(pg)
        if pg is not None:
            _joined["inits"] += 1
            with best_effort("this rank could not count itself in on its group's store"):
                count_in(dist, _joined["inits"])
        return value

    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        if group is None or group is getattr(getattr(c10d, "GroupMember", None), "WORLD", None):
            wait_for_peers()
        return destroy(group, *args, **kwargs)

    wrappers: list[tuple[Any, Any, Any]] = [(c10d, _update_default_pg, update), (dist, destroy_process_group, destroy)]
    if getattr(c10d, "destroy_process_group", None) is destroy:   # the same function, under its own name
        wrappers.append((c10d, destroy_process_group, destroy))
    for module, wrapper, original in wrappers:
        wrapper.__wrapped__ = original
        wrapper.__doc__ = original.__doc__
        setattr(wrapper, _PATCHED, True)
        setattr(module, original.__name__, wrapper)


def _gloo_store(dist: ModuleType) -> Any:
    """The default group's store, where it is a gloo group; else None."""
    if not dist.is_initialized() or "gloo" not in str(dist.get_backend()):
        return None
    return dist.distributed_c10d._get_default_store()


def count_in(dist: ModuleType, inits: int) -> None:
    """Count this rank in on the store of the group it just joined (its ``inits``-th)."""
    store = _gloo_store(dist)
    if store is not None:
        _joinings[inits] = Joining(store, inits, dist.get_rank(), dist.get_world_size())


class Joining:
    """One default gloo group as this rank sees it: who has joined, and who has heard that all did.

    The last rank in says so (``ALL_IN``); every other rank hears it, and each rank but 0 says it
    heard (``HEARD``). Rank 0, the store's host in an ``env://`` or ``tcp://`` rendezvous, ends
    only once every other rank heard: a rank that asked as it ends could find the host gone (and
    torch prints a C++ trace for that). All of it happens on a thread of the rank's own, right
    after its init, while every peer is still there; the thread then lets go of the store (a kept
    reference would keep rank 0's old store serving, with the old group's addresses, after
    ``destroy_process_group``). So a rank that ends asks nothing of the store."""

    def __init__(self, store: Any, inits: int, rank: int, world: int) -> None:
        self.store: Any = store
        self.rank, self.world = rank, world
        self.keys = {word: f"{word}/{inits}" for word in (KEY, ALL_IN, HEARD, ALL_HEARD)}
        self.done = threading.Event()   # this rank may end: all joined, and (rank 0) all heard so
        last = store.add(self.keys[KEY], 1) == world
        if last:
            store.set(self.keys[ALL_IN], "1")
        if world == 1:
            self.store = None
            self.done.set()
        else:
            threading.Thread(target=self._listen, args=(last,), daemon=True, name=THREAD_NAME).start()

    def _listen(self, last: bool) -> None:
        limit = datetime.timedelta(seconds=WAIT_LIMIT)
        try:
            if not last:
                self.store.wait([self.keys[ALL_IN]], limit)
            if self.rank != 0:
                if self.store.add(self.keys[HEARD], 1) == self.world - 1:
                    self.store.set(self.keys[ALL_HEARD], "1")
            else:
                self.store.wait([self.keys[ALL_HEARD]], limit)
        except Exception:   # why: a peer that never joins, or the host gone: the rank ends as it would have
            log.debug("this rank did not hear that every peer joined its group", exc_info=True)
        finally:
            self.store = None
            self.done.set()

    def wait(self, limit: float) -> bool:
        """True once every rank joined (and, on rank 0, heard it); False after ``limit`` seconds."""
        return self.done.wait(limit)


def wait_for_peers(limit: float | None = None) -> bool:
    """Wait until every rank has joined the default group this rank joined last; True once they
    have (or it joined no gloo group), False after ``limit`` seconds (``WAIT_LIMIT``)."""
    joining = _joinings.get(_joined["inits"])
    return joining is None or joining.wait(WAIT_LIMIT if limit is None else limit)


def before_exit() -> None:
    """Called once the launched function returned, in a rank that is about to end."""
    wait_for_peers()
