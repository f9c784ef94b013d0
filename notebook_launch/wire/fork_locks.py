"""Locks that a forked child gets anew when another thread held them at the fork.

``fork()`` copies only the thread that calls it. A lock another thread held at that moment stays
held in the child, by a thread the child does not have, and the child's first use of it waits
forever. Ours meet forks on both sides: a rank forks DataLoader workers (or launches ranks of its
own) while its other threads (a tqdm monitor, an XLA replica, a progress flush) hold its event
channel's lock or a module's; the notebook forks ranks while another of its threads launches.
Python renews its own locks this way (logging's, threading's); ours all go through this class, so
the rule lives in one place.

A lock the forking thread itself holds is kept: that thread goes on in the child and releases it.
The hook is registered at the first acquire, not at import (importing notebook_launch registers
nothing), and a lock never acquired cannot be held at a fork.
"""
from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

_every_lock: "weakref.WeakSet[ForkRenewedLock]" = weakref.WeakSet()
_hook_registered = False


class ForkRenewedLock:
    """A ``threading.Lock`` for ``with`` blocks, renewed in a child forked while another thread held it."""

    __slots__ = ("_lock", "_owner", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None   # the holder's thread ident, read by the child after a fork
        _every_lock.add(self)

    def __enter__(self) -> "ForkRenewedLock":
        _register_hook_once()
        self._lock.acquire()
        self._owner = threading.get_ident()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def _renew_in_child(self) -> None:
        # Held and not by this (the forking) thread: its holder does not exist here. Held with no
        # owner yet (between acquire and the owner's write) is also another thread's: the forking
        # thread is inside fork(), not inside __enter__.
        if self._lock.locked() and self._owner != threading.get_ident():
            self._lock = threading.Lock()
            self._owner = None


def _register_hook_once() -> None:
    global _hook_registered
    if not _hook_registered:   # two threads racing here register twice: renewing twice is harmless
        _hook_registered = True
        os.register_at_fork(after_in_child=_renew_every_lock)


def _renew_every_lock() -> None:
    for lock in list(_every_lock):
        lock._renew_in_child()


# Held around every fork of a rank (engines.local.fork_thread) and every process we start with
# subprocess (the orphan keeper, spawned ranks, py-spy): a process forked without exec while
# another thread's Popen waits on its error pipe inherits that pipe's write end (close-on-exec
# only closes it at an exec), and the Popen waits until that process ends. A rank lives for the
# whole run, so a launch in one thread and the keeper's start in another waited on each other
# forever (test_concurrent_launches' threads, which then held the keeper's lock for every later
# launch of the process). Popen returns once its child has exec'd: milliseconds.
no_fork_during_exec = ForkRenewedLock()

