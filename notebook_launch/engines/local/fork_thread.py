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
from collections.abc import Callable
from typing import NoReturn

from ...wire.fork_locks import ForkRenewedLock, no_fork_during_exec

log = logging.getLogger("notebook_launch")

ChildBody = Callable[[], NoReturn]


class _Request:
    def __init__(self, child: ChildBody) -> None:
        self.child = child
        self.done = threading.Event()
        self.pid: int | None = None
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
                with no_fork_during_exec:   # never while our Popen waits on its error pipe (fork_locks)
                    pid = os.fork()
            except OSError as exc:   # handed to the requesting thread, which raises it
                request.error = exc
                request.done.set()
                continue
            if pid == 0:
                try:
                    # What the child inherited is never collected in it: the notebook's garbage may
                    # hold C++ objects (torch elastic's TCPStore) whose destructors join threads that
                    # did not survive the fork (std::system_error, the rank aborted at its next full
                    # collection). Freezing also keeps the inherited pages shared.
                    gc.freeze()
                    # This thread is the child's main thread now; give it the usual name.
                    threading.current_thread().name = "MainThread"
                    request.child()
                finally:
                    os._exit(1)
            request.pid = pid
            request.done.set()


_fork_thread: _ForkThread | None = None
_start_lock = ForkRenewedLock()   # a rank that launches ranks of its own takes it too


def fork_from_clean_thread(child: ChildBody) -> int:
    """Fork from the process's fork helper thread; the child runs ``child()`` (which must
    never return) as its main thread. Returns the child's pid in the parent.

    An interrupt while waiting still leaves a consistent state: the request is always
    waited for, and a child forked meanwhile is killed and reaped before the interrupt
    propagates, so no process is left unaccounted for."""
    global _fork_thread
    with _start_lock:
        if _fork_thread is None or not _fork_thread.usable():
            _fork_thread = _ForkThread()
        helper = _fork_thread
    request = _Request(child)
    helper.requests.put(request)
    try:
        request.done.wait()
    except BaseException:
        _wait_despite_interrupts(request)
        if request.pid is not None:
            _kill_and_reap(request.pid)
        raise
    if request.error is not None:
        raise request.error
    assert request.pid is not None
    return request.pid


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
