"""A local rank's channels: four pipes and a result file (a memfd)."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("notebook_launch")
MEMFD_NAME = "notebook_launch-tensors"
# How a read of a rank's socket (a rank on another machine) says its end went away without a
# clean close: the rank was killed (SIGKILL by SLURM or the OOM killer) with bytes of ours it
# never read, such as the stop request we sent it, so its kernel answered with a reset; or its
# node went away. For the reader this is the same news as end-of-file.
GONE_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                         errno.ENETUNREACH, errno.ENETRESET, errno.ENOTCONN, errno.EPIPE})


def read_ready(fd: int, size: int) -> bytes | None:
    """What a rank's non-blocking pipe or socket holds now: None when nothing is there yet, b""
    when the rank's end is gone (end-of-file, or a connection that ended without one, see
    ``GONE_ERRNOS``). Every reader of a rank's channels reads through here, so a reset
    connection ends that channel like an EOF instead of raising out of the supervisor."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno not in GONE_ERRNOS:
            raise
        log.debug("fd %d: the rank's end went away (%s); read as end-of-file", fd, exc)
        return b""


def create_memfd() -> int | None:
    """A new memfd for tensor bytes, sealed against shrinking; None where memfds do not exist
    (the tensors then travel inside the pickle stream; see ``shared_tensors``)."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        return None
    try:
        fd = memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:   # e.g. a seccomp profile that forbids it
        log.debug("memfd_create failed (%s): tensors travel inside the pickle stream", exc)
        return None
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    except (OSError, AttributeError) as exc:
        log.debug("could not seal the tensor memfd against shrinking: %s", exc)
    return fd


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
            tensors = create_memfd()   # the rank's result file (None where there is no memfd)
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

    def close_all(self) -> None:
        """Both ends: what the caller of a launcher does once the ranks ended (or never started)."""
        self.close_parent_ends()
        self.close_child_ends()
