"""Forking ranks from a warm process, and reaping them: the one loop both warm forkers use, the
notebook's start process (``engines.local.start_server``) and each SLURM node's agent (``engines.slurm.node_agent``).

Both import once what the ranks need, then fork a child per rank and report each child's end to
whoever supervises the ranks (the notebook cannot wait for a process it did not fork). What they
share is here: the fork (the child closes what is not its own and never returns into the loop),
the pidfd taken at once (before the loop could reap the child and its pid be reused), and the
reap with what the kernel counted of the child's life (``wait4``: its peak memory and CPU time).
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, NamedTuple

from ..channels.process import WaitStatus, decode_wait_status


class Ended(NamedTuple):
    """How a child ended and what the kernel counted of its life."""
    status: WaitStatus | None   # None: someone else reaped it (not expected: SIGCHLD is the forker's)
    peak_rss: int               # bytes
    cpu_seconds: float          # user and system time


def fork_child(run: Callable[[], object], close: Iterable[int] = ()) -> tuple[int, int]:
    """Fork a child that closes ``close`` and runs ``run`` (which should not return: if it does,
    or raises, the child exits with code 1, never going back into the caller's loop); returns its
    pid and a pidfd for it. OSError (EAGAIN: too many processes) comes from the fork itself."""
    pid = os.fork()
    if pid == 0:
        try:
            for fd in close:
                os.close(fd)
            run()
        finally:
            os._exit(1)
    return pid, os.pidfd_open(pid)


def reap(pid: int) -> Ended:
    """Wait for our child ``pid`` (its pidfd said it ended) and say how it ended."""
    try:
        _, status, usage = os.wait4(pid, 0)
    except ChildProcessError:
        return Ended(None, 0, 0.0)
    return Ended(decode_wait_status(status), usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)
