"""The backend interface: start one process per rank and hand back handles.

A backend knows only how to start processes. Everything a rank does once it
runs (environment, output capture, reporting) is ``rank.bootstrap`` and
``rank.runner``; watching the ranks is the supervisor's job. So a new way of
starting ranks is one small module.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from .. import shared_tensors
from ..supervise import leftovers

if TYPE_CHECKING:
    from ..plan import LaunchPlan, RankSpec
    from ..rank.runner import Job

log = logging.getLogger("notebook_launch")
# How a process ended: ("exit", code) or ("signal", signum); STUCK when it would not end.
WaitStatus = tuple[str, int]
# A process that outlived SIGKILL by WAIT_LIMIT seconds is stuck in uninterruptible sleep (state D:
# in the kernel, usually a device driver releasing a GPU or TPU). It cannot be reaped until it
# leaves it, so waiting on would hang the cell: wait() gives up and says so instead.
WAIT_LIMIT = 30.0
STUCK: WaitStatus = ("stuck", -1)   # -1: torch's exit code for "unknown"


@dataclass
class RankPipes:
    """The four pipes of one rank: events, stdout and stderr (rank -> notebook), and
    answers (notebook -> rank: what the user typed at a prompt of the rank's, see
    rank/stdin_relay.py). ``parent_ends`` are the notebook's, ``child_ends`` the rank's.

    Every close goes through ``close(fd)``, which closes each fd at most once.
    A second ``os.close`` of a number the kernel has since handed to someone
    else (a zmq socket's eventfd in a Jupyter kernel) closes THEIR fd: libzmq
    then aborts with "Bad file descriptor (src/signaler.cpp)" and the notebook
    kernel dies.

    ``tensors`` is the rank's result file (a memfd, see ``shared_tensors``; None
    where there are none): both sides hold it, the rank writes the bytes of its
    result's tensors there and the parent maps them; it goes with the parent ends."""
    events_r: int
    events_w: int
    stdout_r: int
    stdout_w: int
    stderr_r: int
    stderr_w: int
    answers_r: int      # the rank reads the notebook's answers here
    answers_w: int
    tensors: int | None = None
    closed: set = field(default_factory=set, repr=False, compare=False)

    @classmethod
    def open(cls) -> "RankPipes":
        opened: list[int] = []
        try:   # out of fds midway (EMFILE): close what this call opened, leak nothing
            e = os.pipe()
            opened += e
            o = os.pipe()
            opened += o
            r = os.pipe()
            opened += r
            a = os.pipe()
            opened += a
            tensors = shared_tensors.create_file()   # the rank's result file (None where there is no memfd)
        except OSError:
            for fd in opened:
                os.close(fd)
            raise
        for fd in (e[0], o[0], r[0], a[1]):
            os.set_inheritable(fd, False)
        os.set_blocking(a[1], False)   # an answer never blocks the supervisor
        return cls(e[0], e[1], o[0], o[1], r[0], r[1], a[0], a[1], tensors=tensors)

    def child_ends(self) -> tuple[int, ...]:
        return (self.events_w, self.stdout_w, self.stderr_w, self.answers_r)

    def parent_ends(self) -> tuple[int, ...]:
        return (self.events_r, self.stdout_r, self.stderr_r, self.answers_w)

    def all_fds(self) -> tuple[int, ...]:
        return self.parent_ends() + self.child_ends() + ((self.tensors,) if self.tensors is not None else ())

    def close(self, fd: int) -> None:
        """Close one of this rank's fds, unless it was closed already."""
        if fd in self.closed or fd not in self.all_fds():
            return
        self.closed.add(fd)
        try:
            os.close(fd)
        except OSError:
            log.debug("closing fd %d failed", fd, exc_info=True)

    def close_child_ends(self, keep: tuple[int, ...] = ()) -> None:
        for fd in self.child_ends():
            if fd not in keep:
                self.close(fd)

    def close_parent_ends(self) -> None:
        """The parent's ends and its hold on the result file (after the results were loaded)."""
        for fd in self.parent_ends() + ((self.tensors,) if self.tensors is not None else ()):
            self.close(fd)


class RankProcess:
    """Handle on a started rank. ``sentinel`` is a file descriptor that becomes
    readable when the process exits, so the supervisor can select on it.

    A process that carries several ranks (XLA: xmp.spawn runs one thread per
    device) sets ``local_ranks`` to all of them; the supervisor then watches
    each rank's pipes and ends them all when the process ends."""

    local_rank: int
    local_ranks: tuple[int, ...] = ()     # empty: just (local_rank,)
    pid: int
    sentinel: int | None
    end_note: str | None = None           # how it ended when no exit status says it (a Ray actor's death)
    wait_limit: float = WAIT_LIMIT        # seconds wait() waits for a process that should be ending
    on_this_machine: bool = True          # False: ``pid`` is a process of another machine (a Ray actor)

    def poll(self) -> WaitStatus | None:
        """None while running; else a wait status description: ("exit", code) or ("signal", signum)."""
        raise NotImplementedError

    def wait(self) -> WaitStatus:
        """Block until the process ended (its sentinel may fire before waitpid sees it), at
        most ``wait_limit`` seconds: a process still there then is stuck (see WAIT_LIMIT) and
        ``STUCK`` is returned, its ``end_note`` saying so; it is left behind, unreaped."""
        limit = self.wait_limit
        deadline = time.monotonic() + limit
        pause = 0.005
        while True:
            status = self.poll()
            if status is not None:
                return status
            if time.monotonic() >= deadline:
                self.end_note = stuck_note(self.pid, limit)
                log.debug("rank process %d: %s", self.pid, self.end_note)
                return STUCK
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def ranks(self) -> tuple[int, ...]:
        """The local ranks this process carries: one for fork/spawn, every ordinal of it for XLA."""
        return self.local_ranks or (self.local_rank,)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank and everything it started (its process group)."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                log.debug("rank process %d is gone already", self.pid)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def release(self) -> None:
        """Free the sentinel and any other resource once the process is reaped."""


def stuck_note(pid: int, limit: float) -> str:
    return (f"did not end within {limit:g} s of being killed: process {pid} is stuck in the kernel "
            f"(uninterruptible sleep, usually a GPU/TPU driver) and was left behind; if the device stays "
            f"busy, restart the runtime")


class Backend:
    """Starts the ranks of a plan. Subclasses set ``name`` and implement ``start``."""

    name = "base"

    def start(self, plan: "LaunchPlan", job: "Job", pipes_by_rank: Sequence[RankPipes]) -> list[RankProcess]:
        """Start the processes of ``plan.ranks`` (usually one per rank) running ``rank.runner.run_rank``.

        ``job`` is the ``rank.runner.Job`` (function, args, kwargs); ``pipes_by_rank``
        the ``RankPipes`` of each local rank. Returns a list of RankProcess in
        local-rank order (each covering ``local_ranks`` when it carries several).
        A backend must close the child ends in the parent.
        """
        raise NotImplementedError

    def prepare_parent(self) -> None:
        """Work to do once in the parent before starting ranks (e.g. warm imports)."""


def start_each(plan: "LaunchPlan", pipes_by_rank: Sequence[RankPipes],
               start_one: Callable[["RankSpec", RankPipes], RankProcess]) -> list[RankProcess]:
    """Start one process per rank with ``start_one``, closing each rank's child ends in the
    parent once it runs. If any start fails, the ranks started so far are killed, reaped
    and released before the error propagates: no half-started run survives."""
    sys.stdout.flush()
    sys.stderr.flush()
    processes: list[RankProcess] = []
    try:
        for spec in plan.ranks:
            pipes = pipes_by_rank[spec.local_rank]
            processes.append(start_one(spec, pipes))
            # If the notebook dies before the run is swept, its keeper ends what the rank started.
            leftovers.guard(spec.env.get(leftovers.RUN_MARK, ""), processes[-1].pid)
            # The parent keeps the event pipe's write end until the rank exits: a function that
            # closes every fd (os.closerange) then gets no EOF here, and the rank can reopen the
            # pipe through /proc (protocol.EventWriter) to still send its result or error.
            pipes.close_child_ends(keep=(pipes.events_w,))
    except BaseException:
        for process in processes:
            process.kill()
            process.wait()
            process.release()
        raise
    return processes
