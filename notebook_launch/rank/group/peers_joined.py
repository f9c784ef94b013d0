"""A rank does not leave a gloo group before every peer has finished joining it.

``init_process_group`` with gloo connects every pair of ranks (gloo's ``connectFullMesh``), and a
rank's call returns once its own connections are up, while a peer may still be reading the last
of its handshakes. A rank that ends then (a function that only joins the group and returns; a
``destroy_process_group()`` right after init) closes its sockets under that peer, whose init
fails with "Gloo connectFullMesh failed ... Connection reset by peer" (or "closed by peer"). On a
busy machine plain torch 2.13 does it in about 2 launches of 30 (4 forked ranks, init and
return); never when each rank stays 3 s. torch's own ``TORCH_DIST_INIT_BARRIER=1`` made it worse
(10 in 30): its barrier ends with rank 0, the store's host, leaving while others still read.
``new_group`` connects its members the same way, with the same race.

So each rank counts itself in on a group's store once the group is made (``Joining``), and before
it ends (``before_exit``, after the launched function returned) or destroys a group, it waits
until every member has joined, ``WAIT_LIMIT`` seconds at most. Normally every peer joined long
before: no wait, and no store request at the end. Gloo groups only: NCCL connects lazily, and
XLA's replicas share one process. Installed by every launched rank (a ``runner.rank_hooks``
entry).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from types import ModuleType
from typing import Any

from ...errors.best_effort import best_effort

log = logging.getLogger("notebook_launch")
WAIT_LIMIT = 10.0   # seconds a rank waits for its peers to join before it ends anyway
KEY = "notebook_launch/joined"
ALL_IN = "notebook_launch/all-joined"
HEARD = "notebook_launch/heard"
ALL_HEARD = "notebook_launch/all-heard"
THREAD_NAME = "notebook_launch-peers-joined"
POLL_FIRST = 0.001   # seconds between the first two looks at the store, doubling up to POLL_MOST
POLL_MOST = 0.05
_PATCHED = "_notebook_launch_waits_for_peers"
_made: Counter[str] = Counter()          # groups made in this process, by name: each has keys of its own
_joinings: dict[str, "Joining"] = {}     # the last group of each name this process joined


def install(spec: Any = None) -> None:
    """Wrap torch.distributed now if it is imported, else right after the rank imports it."""
    from ..after_import import after_import
    after_import("torch.distributed", wrap)


def wrap(dist: ModuleType) -> None:
    """Count in where c10d makes a group the default one (``_update_default_pg``, looked up at call
    time: every way of calling ``init_process_group`` reaches it, even a reference taken before
    the launch) and after ``new_group``; wait in ``destroy_process_group`` before it shuts a group
    down. A ``destroy_process_group`` taken before the launch still waits, later, where c10d
    forgets the default group (``_update_default_pg(None)``)."""
    c10d = getattr(dist, "distributed_c10d", None)
    update, destroy = getattr(c10d, "_update_default_pg", None), getattr(dist, "destroy_process_group", None)
    new_group = getattr(dist, "new_group", None)
    if update is None or destroy is None or new_group is None or getattr(update, _PATCHED, False):
        return

    def _update_default_pg(pg: Any) -> Any:
        if pg is None:
            wait_for_peers()
        value = update(pg)
        if pg is not None:
            with best_effort("this rank could not count itself in on its group's store"):
                count_in(dist, pg)
        return value

    def made_group(*args: Any, **kwargs: Any) -> Any:
        group = new_group(*args, **kwargs)
        with best_effort("this rank could not count itself in on its new group's store"):
            count_in(dist, group)
        return group

    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        world = getattr(getattr(c10d, "GroupMember", None), "WORLD", None)
        wait_for_peers(None if group is None or group is world else group)
        return destroy(group, *args, **kwargs)

    ours = {"destroy_process_group": destroy_process_group, "new_group": made_group}
    wrappers: list[tuple[Any, str, Any, Any]] = [
        (c10d, "_update_default_pg", _update_default_pg, update),
        (dist, "destroy_process_group", destroy_process_group, destroy), (dist, "new_group", made_group, new_group)]
    wrappers += [(c10d, name, ours[name], original)   # the same function, under its own name there
                 for name, original in (("destroy_process_group", destroy), ("new_group", new_group))
                 if getattr(c10d, name, None) is original]
    # Set by the attribute's name, not the function's: what sits there may be another's wrapper
    for module, attribute, wrapper, original in wrappers:
        wrapper.__wrapped__ = original
        wrapper.__doc__ = original.__doc__
        wrapper.__name__ = original.__name__
        setattr(wrapper, _PATCHED, True)
        setattr(module, attribute, wrapper)


def count_in(dist: ModuleType, group: Any) -> None:
    """Count this rank in on the store of ``group``, a gloo group it just joined."""
    c10d = dist.distributed_c10d
    if group is None or group is c10d.GroupMember.NON_GROUP_MEMBER or "gloo" not in str(dist.get_backend(group)):
        return
    name = str(group.group_name)
    _made[name] += 1
    _joinings[name] = Joining(c10d._get_process_group_store(group), _made[name], group.rank(), group.size())


class Joining:
    """One gloo group as this rank sees it: who has joined, and who has heard that all did.

    The last member in says so (``ALL_IN``); every other member hears it, and each member but the
    group's rank 0 says it heard (``HEARD``). Rank 0 (of the default group: the store's host in an
    ``env://`` or ``tcp://`` rendezvous) ends only once every other rank heard: a rank that asked
    as it ends could find the host gone (and torch prints a C++ trace for that). All of it happens
    on a thread of the rank's own, right after the group was made, while every peer is still
    there; the thread then lets go of the store (a kept reference would keep rank 0's old store
    serving, with the old group's addresses, after ``destroy_process_group``). So a rank that
    ends asks nothing of the store."""

    def __init__(self, store: Any, made: int, rank: int, size: int) -> None:
        self.store: Any = store
        self.rank, self.size = rank, size
        self.keys = {word: f"{word}/{made}" for word in (KEY, ALL_IN, HEARD, ALL_HEARD)}
        self.done = threading.Event()   # this rank may leave: all joined, and (rank 0) all heard so
        last = store.add(self.keys[KEY], 1) == size
        if last:
            store.set(self.keys[ALL_IN], "1")
        if size == 1:
            self.store = None
            self.done.set()
        else:
            threading.Thread(target=self._listen, args=(last,), daemon=True, name=THREAD_NAME).start()

    def _listen(self, last: bool) -> None:
        deadline = time.monotonic() + WAIT_LIMIT
        try:
            if not last:
                self._wait_for(ALL_IN, deadline)
            if self.rank != 0:
                if self.store.add(self.keys[HEARD], 1) == self.size - 1:
                    self.store.set(self.keys[ALL_HEARD], "1")
            else:
                self._wait_for(ALL_HEARD, deadline)
        except Exception:   # why: a peer that never joins, or the host gone: the rank leaves as it would have
            log.debug("this rank did not hear that every peer joined its group", exc_info=True)
        finally:
            self.store = None
            self.done.set()

    def _wait_for(self, word: str, deadline: float) -> None:
        """Poll, never ``store.wait``: a store client serves one request at a time and holds its
        lock through a wait, so a waiting thread would hold back the rank's own store requests (the
        next ``new_group``'s), and a peer's that need them: a stall until the wait gives up."""
        pause = POLL_FIRST
        while not self.store.check([self.keys[word]]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {word} within {WAIT_LIMIT:g} s")
            time.sleep(pause)
            pause = min(2 * pause, POLL_MOST)


def wait_for_peers(group: Any = None, limit: float | None = None) -> bool:
    """Wait until every member has joined ``group`` (None: every group this rank joined); True
    once they have (or there is no such gloo group), False after ``limit`` seconds (``WAIT_LIMIT``)."""
    deadline = time.monotonic() + (WAIT_LIMIT if limit is None else limit)
    if group is None:
        joinings = list(_joinings.values())
    else:
        joining = _joinings.get(str(getattr(group, "group_name", "")))
        joinings = [] if joining is None else [joining]
    return all([joining.done.wait(max(0.0, deadline - time.monotonic())) for joining in joinings])


def before_exit() -> None:
    """Called once the launched function returned, in a rank that is about to end."""
    wait_for_peers()
