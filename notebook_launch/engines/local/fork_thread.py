"""Fork from a thread that never ran an OpenMP parallel region.

GNU OpenMP (libgomp, used by torch's CPU build) keeps its worker pool in the
thread that first ran a parallel region. A child forked from that thread
inherits the pool's bookkeeping but not its threads, and deadlocks in its first
parallel region. CPython makes the forking thread the child's main thread, so
forking from a helper thread that only ever forks gives the child a thread with
no pool: its first parallel region starts a new pool with the full thread count.

The helper lives as long as the process: a rank's PR_SET_PDEATHSIG fires when
the *thread* that forked it ends, so a short-lived forking thread would kill
its ranks right away. Every fork of a rank (one-shot or persistent) should go
through ``fork_from_clean_thread``.
"""
from __future__ import annotations

import gc
import logging
import os
import queue
import signal
import threading
from collections.abc import Callable, Sequence
from typing import NoReturn

from ...wire.fork_locks import ForkRenewedLock, no_fork_during_exec

log = logging.getLogger("notebook_launch")

ChildBody = Callable[[], NoReturn]


class _Request:
    """Children to fork one after the other, in one turn of the helper: each pid, and with
    ``pidfds`` each pid's pidfd opened at once (before the next fork), or the error that stopped it."""

    def __init__(self, children: Sequence[ChildBody], pidfds: bool) -> None:
        self.children = children
        self.want_pidfds = pidfds
        self.done = threading.Event()
        self.pids: list[int] = []
        self.pidfds: list[int] = []
        self.error: OSError | None = None


class _ForkThread:
    """One daemon thread per process that forks on request and does nothing else."""

    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        self.requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="notebook_launch-fork", daemon=True)
        self.thread.start()

    def usable(self) -> bool:
        return self.owner_pid == os.getpid() and self.thread.is_alive()

    def _serve(self) -> None:
        while True:
            request = self.requests.get()
            try:
                for child in request.children:
                    self._fork_one(request, child)
            except OSError as exc:   # handed to the requesting thread, which ends what was forked and raises
                request.error = exc
            request.done.set()

    @staticmethod
    def _fork_one(request: _Request, child: ChildBody) -> None:
        with no_fork_during_exec:   # never while our Popen waits on its error pipe (fork_locks)
            pid = os.fork()
        if pid == 0:
            try:
                # What the child inherited is never collected in it: the notebook's garbage may
                # hold C++ objects (torch elastic's TCPStore) whose destructors join threads that
                # did not survive the fork (std::system_error, the rank aborted at its next full
                # collection). Freezing also keeps the inherited pages shared.
                gc.freeze()
                # This thread is the child's main thread now; give it the usual name.
                threading.current_thread().name = "MainThread"
                child()
            finally:
                os._exit(1)
        request.pids.append(pid)
        if request.want_pidfds:   # at once: the pid is pinned before anything can reap the child
            request.pidfds.append(os.pidfd_open(pid))


_fork_thread: _ForkThread | None = None
_start_lock = ForkRenewedLock()   # a rank that launches ranks of its own takes it too


def fork_from_clean_thread(child: ChildBody) -> int:
    """Fork from the process's fork helper thread; the child runs ``child()`` (which must
    never return) as its main thread. Returns the child's pid in the parent.

    An interrupt while waiting still leaves a consistent state: the request is always
    waited for, and a child forked meanwhile is killed and reaped before the interrupt
    propagates, so no process is left unaccounted for."""
    return _forked(_Request((child,), pidfds=False)).pids[0]


def fork_all_from_clean_thread(children: Sequence[ChildBody]) -> list[tuple[int, int]]:
    """Fork each of ``children`` from the helper thread, one after the other in one turn of it,
    and return (pid, pidfd) of each, in order (the pidfd opened right after its fork). As
    ``fork_from_clean_thread``, but the helper and the calling thread meet once, not once per
    child: a warm 4-rank launch waited about 2 ms per rank for the calling thread to be woken
    and to hand over the next fork, while the ranks forked so far held the cores (issue 45).
    If a fork fails, or an interrupt comes while waiting, every child forked is killed and
    reaped (its pidfd closed) before the error propagates."""
    request = _forked(_Request(tuple(children), pidfds=True))
    return list(zip(request.pids, request.pidfds))


def _forked(request: _Request) -> _Request:
    """Hand ``request`` to the helper (started if this process has none yet) and wait for it."""
    global _fork_thread
    with _start_lock:
        if _fork_thread is None or not _fork_thread.usable():
            _fork_thread = _ForkThread()
        helper = _fork_thread
    helper.requests.put(request)
    try:
        request.done.wait()
    except BaseException:
        _wait_despite_interrupts(request)
        _end_forked(request)
        raise
    if request.error is not None:
        _end_forked(request)
        raise request.error
    return request


def _end_forked(request: _Request) -> None:
    """Kill and reap every child ``request`` forked, and close the pidfds it opened."""
    for pid in request.pids:
        _kill_and_reap(pid)
    for pidfd in request.pidfds:
        os.close(pidfd)


def _wait_despite_interrupts(request: _Request) -> None:
    while not request.done.is_set():
        try:
            request.done.wait()
        except BaseException:   # why: a second interrupt: keep waiting, a fork takes milliseconds
            log.debug("interrupt while waiting for the fork helper; waiting on", exc_info=True)


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        log.debug("child %d was already gone", pid, exc_info=True)
