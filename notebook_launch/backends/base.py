"""The backend interface: start one process per rank and hand back handles.

A backend knows only how to start processes. Everything a rank does once it
runs (environment, output capture, reporting) is ``worker.run_rank``; watching
the ranks is the supervisor's job. So a new way of starting ranks is one
small module.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field


@dataclass
class RankPipes:
    """Parent ends (read) and child ends (write) of one rank's three pipes.

    Every close goes through ``close(fd)``, which closes each fd at most once.
    A second ``os.close`` of a number the kernel has since handed to someone
    else (a zmq socket's eventfd in a Jupyter kernel) closes THEIR fd: libzmq
    then aborts with "Bad file descriptor (src/signaler.cpp)" and the notebook
    kernel dies."""
    events_r: int
    events_w: int
    stdout_r: int
    stdout_w: int
    stderr_r: int
    stderr_w: int
    closed: set = field(default_factory=set, repr=False, compare=False)

    @classmethod
    def open(cls) -> "RankPipes":
        e = os.pipe()
        o = os.pipe()
        r = os.pipe()
        for fd in (e[0], o[0], r[0]):
            os.set_inheritable(fd, False)
        return cls(e[0], e[1], o[0], o[1], r[0], r[1])

    def child_ends(self):
        return (self.events_w, self.stdout_w, self.stderr_w)

    def parent_ends(self):
        return (self.events_r, self.stdout_r, self.stderr_r)

    def close(self, fd: int) -> None:
        """Close one of this rank's pipe fds, unless it was closed already."""
        if fd in self.closed or fd not in self.parent_ends() + self.child_ends():
            return
        self.closed.add(fd)
        try:
            os.close(fd)
        except OSError:
            pass

    def close_child_ends(self) -> None:
        for fd in self.child_ends():
            self.close(fd)

    def close_parent_ends(self) -> None:
        for fd in self.parent_ends():
            self.close(fd)


class RankProcess:
    """Handle on a started rank. ``sentinel`` is a file descriptor that becomes
    readable when the process exits, so the supervisor can select on it.

    A process that carries several ranks (XLA: xmp.spawn runs one thread per
    device) sets ``local_ranks`` to all of them; the supervisor then watches
    each rank's pipes and ends them all when the process ends."""

    local_rank: int
    local_ranks: tuple = ()     # empty: just (local_rank,)
    pid: int
    sentinel: int

    def poll(self):
        """None while running; else a wait status description: ("exit", code) or ("signal", signum)."""
        raise NotImplementedError

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank and everything it started (its process group)."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def release(self) -> None:
        """Free the sentinel and any other resource once the process is reaped."""


class Backend:
    """Starts the ranks of a plan. Subclasses set ``name`` and implement ``start``."""

    name = "base"

    def start(self, plan, job, pipes_by_rank):
        """Start the processes of ``plan.ranks`` (usually one per rank) running ``worker.run_rank``.

        ``job`` is the ``worker.Job`` (function, args, kwargs); ``pipes_by_rank``
        the ``RankPipes`` of each local rank. Returns a list of RankProcess in
        local-rank order (each covering ``local_ranks`` when it carries several).
        A backend must close the child ends in the parent.
        """
        raise NotImplementedError

    def prepare_parent(self) -> None:
        """Work to do once in the parent before starting ranks (e.g. warm imports)."""
