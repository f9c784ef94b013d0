"""The handle on a started rank process, as the supervisor watches and ends it."""
from __future__ import annotations

import abc
import errno
import fcntl
import logging
import os
import signal
import struct
import time
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:   # for the annotation only: channels imports nothing of ours
    from ..diagnose.hang_verdict import RankWhereabouts

log = logging.getLogger("notebook_launch")
# How a process ended: ("exit", code) or ("signal", signum); STUCK when it would not end.
WaitStatus = tuple[str, int]
# A process that outlived SIGKILL by WAIT_LIMIT seconds is stuck in uninterruptible sleep (state D:
# in the kernel, usually a device driver releasing a GPU or TPU). It cannot be reaped until it
# leaves it, so waiting on would hang the cell: wait() gives up and says so instead.
WAIT_LIMIT = 30.0
STUCK: WaitStatus = ("stuck", -1)   # -1: torch's exit code for "unknown"
# It ended, but someone else took its exit status and this kernel cannot tell it afterwards
# (see ended_status): the notebook ignores SIGCHLD or reaps every child, on Linux before 6.15.
LOST: WaitStatus = ("lost", -1)


class RankProcess(abc.ABC):
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
    end_usage: "EndUsage | None" = None   # what the kernel counted of it, once reaped (``reap``)

    @abc.abstractmethod
    def poll(self) -> WaitStatus | None:
        """None while running; else a wait status description: ("exit", code) or ("signal", signum)."""

    @property
    def reaped(self) -> bool:
        """Whether poll() has already seen the end (the pid may belong to someone else now)."""
        return False

    def where(self, global_rank: Callable[[int], int]) -> dict[int, "RankWhereabouts"] | None:
        """Where this process's ranks are, by local rank, when the process answers for them itself:
        one that carries several ranks (XLA's launcher: each replica's own record and thread) or
        one of another machine (a Ray actor, over its connections); a rank it has no answer for is
        left out. ``global_rank`` maps a local rank to its global one. None, the default: a rank of
        its own process on this machine, which ``diagnose.ranks`` asks by its pid, with every other
        such rank at once."""
        return None

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

    def release(self) -> None:  # noqa: B027  (a hook: a process with nothing to free has nothing here)
        """Free the sentinel and any other resource once the process is reaped."""


class PidfdRank(RankProcess):
    """A rank watched through a pidfd this handle owns (``sentinel``): a forked rank, or one the warm
    start process forked. ``release`` closes it once, then calls ``released`` for what else to free."""

    _status: WaitStatus | None = None

    @property
    def reaped(self) -> bool:
        return self._status is not None

    def release(self) -> None:
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None
            self.released()

    def released(self) -> None:  # noqa: B027  (a hook: most ranks have nothing more to free)
        """Once, after the pidfd was closed."""


def stuck_note(pid: int, limit: float) -> str:
    return (f"did not end within {limit:g} s of being killed: process {pid} is stuck in the kernel "
            f"(uninterruptible sleep, usually a GPU/TPU driver) and was left behind; if the device stays "
            f"busy, restart the runtime")


class EndUsage(NamedTuple):
    """What the kernel counted of a reaped child over its whole life (``wait4``'s rusage): its peak
    resident memory and the CPU time it used. A rank that ended before the notebook's first
    sample of it (a run of a fraction of a second) still shows them in its row."""
    peak_rss: int         # bytes
    cpu_seconds: float    # user and system time


def ended_status(pid: int, pidfd: int | None) -> WaitStatus | None:
    """How our child ``pid`` ended, reaping it; None while it runs (``reap`` with its usage)."""
    ended = reap(pid, pidfd)
    return None if ended is None else ended[0]


def reap(pid: int, pidfd: int | None) -> tuple[WaitStatus, EndUsage | None] | None:
    """How our child ``pid`` ended and what the kernel counted of it (``EndUsage``; None where
    someone else reaped it), reaping it; None while it runs.

    The notebook may have taken the status before us, whatever it did to SIGCHLD: ignored
    (SIG_IGN or SA_NOCLDWAIT: the kernel reaps every child itself, so waitpid only ever
    says ECHILD), a handler that reaps every child (``waitpid(-1)``: a library's child
    watcher, a "no zombies" recipe). Then the status comes from the pidfd we opened right
    after the fork, which keeps it after the reap (``PIDFD_GET_INFO``, Linux 6.15), and is
    LOST on older kernels. A blocked SIGCHLD or a handler that does not reap takes nothing.

    Why not give SIGCHLD back its default for a launch instead: only the main thread may set
    a Python handler (a launch can run in any thread), persistent ranks live across cells
    in which the notebook's own disposition must hold, a C library's handler is invisible
    to Python, and the notebook's other children would change behaviour under it. Why not
    have the rank report its own exit code: a signal's death cannot be reported by the dead,
    nor an exit from C; and a waiter process between the notebook and each rank would double
    every fork. Where the status is LOST, a result or an exception that arrived still says
    how the rank ended (supervise.outcome)."""
    try:
        reaped, status, rusage = os.wait4(pid, os.WNOHANG)
    except ChildProcessError:
        taken = _exit_status_kept(pidfd) if pidfd is not None else None
        log.debug("rank process %d was reaped by someone else (SIGCHLD ignored or a reaping handler): %s",
                  pid, taken or "its exit status is lost on this kernel")
        return taken or LOST, None
    if reaped == 0:
        return None
    # ru_maxrss is in KiB on Linux
    return decode_wait_status(status), EndUsage(rusage.ru_maxrss * 1024, rusage.ru_utime + rusage.ru_stime)


def decode_wait_status(status: int) -> WaitStatus:
    if os.WIFSIGNALED(status):
        return ("signal", os.WTERMSIG(status))
    return ("exit", os.waitstatus_to_exitcode(status))


# struct pidfd_info (include/uapi/linux/pidfd.h), its first version: the mask, then the exit
# status (a wait status, as waitpid gives it) at byte 60. PIDFD_GET_INFO is _IOWR(0xFF, 11, it).
_PIDFD_INFO_SIZE = 64
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11


KEPT_WAIT = 2.0   # seconds at most for the kernel to keep a reaped child's status on its pidfd


def _exit_status_kept(pidfd: int) -> WaitStatus | None:
    """exit_status_from_pidfd, waiting out the moment between a child leaving its parent's
    children (waitpid: ECHILD) and the kernel keeping its status on the pidfd: microseconds on a
    quiet machine, but the exiting process can be preempted in between, and on a loaded one (CI,
    four test workers on two cores) 127 ms of tries once ran out and the status was called lost.
    ESRCH in that moment is the same wait; only a kernel without PIDFD_GET_INFO (ENOTTY, EINVAL)
    answers at once."""
    deadline = time.monotonic() + KEPT_WAIT
    pause = 0.0005
    while True:
        try:
            status = _pidfd_exit_info(pidfd)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                return None
            status = None
        if status is not None or time.monotonic() >= deadline:
            return status
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def exit_status_from_pidfd(pidfd: int) -> WaitStatus | None:
    """The wait status the kernel kept on ``pidfd`` for a process that ended and was reaped by
    anyone (Linux 6.15 and later); None where the kernel keeps none or it has not ended."""
    try:
        return _pidfd_exit_info(pidfd)
    except OSError:
        return None


def _pidfd_exit_info(pidfd: int) -> WaitStatus | None:
    info = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("=Q", info, 0, _PIDFD_INFO_EXIT)
    fcntl.ioctl(pidfd, _PIDFD_GET_INFO, info, True)
    mask, = struct.unpack_from("=Q", info, 0)
    if not mask & _PIDFD_INFO_EXIT:
        return None
    status, = struct.unpack_from("=i", info, 60)
    return decode_wait_status(status)
