"""Notebook <-> rank commands over one Unix socket per rank: length-prefixed frames.

The rank -> notebook direction of a launch is ``protocol`` (events, output pipes); this
is the channel only persistent ranks need: each call is one CALL frame carrying a
``rank.runner.Job``, and STOP ends the rank's loop.

Tensors cross at memory speed, both ways, as a launch's results do (``shared_tensors``):
a frame is pickled with every big storage's bytes in a fresh memfd, and that memfd
travels beside the frame on the socket (SCM_RIGHTS), so the rank maps its pages instead
of reading them through a pipe. A result goes back the same way: the rank writes its
tensors into a fresh memfd and passes it to the notebook (``send_result_file``) just
before its RESULT event. A fresh file per call, because the reader's copy-on-write
mappings would see a rewrite of the same file; memfds have no name, so nothing is left
behind however a process ends.
"""
from __future__ import annotations

import array
import enum
import logging
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

from .. import shared_tensors

_HEADER = struct.Struct("!Q")   # a frame's length: 64 bits, as protocol's
_RESULT_FILE = struct.Struct("!q")   # the call number a result file belongs to
_FD_SPACE = socket.CMSG_SPACE(array.array("i", [0]).itemsize)
log = logging.getLogger("notebook_launch")


class Command(str, enum.Enum):
    CALL = "call"    # payload: a rank.runner.Job (function, args, kwargs), cloudpickled
    STOP = "stop"    # payload: None; the rank's loop returns and the process exits


@dataclass
class CommandPipe:
    """One rank's command socket: the notebook writes frames on ``write_fd`` and the rank
    reads them on ``read_fd``; result files come back the other way. Each end is closed
    once, here, so a number the kernel has since reused is never closed again."""
    read_fd: int     # the rank's end
    write_fd: int    # the notebook's end

    @classmethod
    def open(cls) -> CommandPipe:
        rank_end, notebook_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(rank_end.detach(), notebook_end.detach())

    def close_read_end(self) -> None:
        if self.read_fd >= 0:
            _close(self.read_fd)
            self.read_fd = -1

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            _close(self.write_fd)
            self.write_fd = -1


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        log.debug("closing command fd %d failed", fd, exc_info=True)


@dataclass
class Frame:
    """An encoded command: the bytes, and the memfd holding its tensors' bytes (or None)."""
    data: bytes
    tensors: int | None = None

    def close(self) -> None:
        if self.tensors is not None:
            _close(self.tensors)
            self.tensors = None


def encode(command: Command, payload: Any) -> Frame:
    """One frame; encode once and send the same frame to every rank. Big tensors' bytes go
    to a fresh memfd (one copy, at memory speed), the rest into the bytes."""
    import cloudpickle
    fd = shared_tensors.create_file()
    try:
        data = shared_tensors.dumps((Command(command).value, payload), fd, base=cloudpickle.Pickler)
        if fd is not None and os.fstat(fd).st_size == 0:
            _close(fd)
            fd = None
    except BaseException:
        if fd is not None:
            _close(fd)
        raise
    return Frame(_HEADER.pack(len(data)) + data, fd)


def send(fd: int, frame: Frame | bytes) -> None:
    """Write a whole frame (the rank reads it whole; a write may be partial); its memfd goes
    with the first bytes."""
    if isinstance(frame, bytes):
        frame = Frame(frame)
    view = memoryview(frame.data)
    if frame.tensors is not None:
        sock = socket.socket(fileno=fd)
        try:
            view = view[sock.sendmsg([view], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                               array.array("i", [frame.tensors]))]):]
        finally:
            sock.detach()
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int) -> tuple[Command, Any]:
    """Block until the next frame; end of file (the notebook is gone) reads as STOP.
    A payload that cannot be unpickled here raises (the caller reports it for that call)."""
    header, tensors = _read_header(fd)
    try:
        if header is None:
            return Command.STOP, None
        (size,) = _HEADER.unpack(header)
        data = _read_exactly(fd, size)
        if data is None:
            return Command.STOP, None
        kind, payload = shared_tensors.loads(data, tensors)   # tensors map the memfd's pages
        return Command(kind), payload
    finally:
        if tensors is not None:
            _close(tensors)


def _read_header(fd: int) -> tuple[bytes | None, int | None]:
    """The frame's header and the memfd that came with it, if any."""
    sock = socket.socket(fileno=fd)
    chunks: list[bytes] = []
    tensors: int | None = None
    left = _HEADER.size
    try:
        while left:
            data, ancillary, _, _ = sock.recvmsg(left, _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
            for fds in _fds_of(ancillary):
                for extra in fds[1:] if tensors is None else fds:
                    _close(extra)
                if tensors is None and fds:
                    tensors = fds[0]
            if not data:
                if tensors is not None:
                    _close(tensors)
                return None, None
            chunks.append(data)
            left -= len(data)
    finally:
        sock.detach()
    return b"".join(chunks), tensors


def _fds_of(ancillary: list[tuple[int, int, bytes]]) -> list[list[int]]:
    found = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            found.append(list(fds))
    return found


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_result_file(fd: int, call_number: int, tensors: int) -> None:
    """(In a rank) pass the memfd holding this call's result tensors to the notebook."""
    sock = socket.socket(fileno=fd)
    try:
        sock.sendmsg([_RESULT_FILE.pack(call_number)],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [tensors]))], socket.MSG_NOSIGNAL)
    finally:
        sock.detach()


def take_result_file(fd: int, call_number: int) -> int | None:
    """(In the notebook) the memfd a rank passed for ``call_number`` (the caller closes it),
    or None; files of earlier calls (one that was interrupted) are closed."""
    sock = socket.socket(fileno=fd)
    found: int | None = None
    try:
        while True:
            try:
                data, ancillary, _, _ = sock.recvmsg(_RESULT_FILE.size, _FD_SPACE,
                                                     socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                break
            fds = [fd for group in _fds_of(ancillary) for fd in group]
            if not data:
                for extra in fds:
                    _close(extra)
                break
            number = _RESULT_FILE.unpack(data)[0] if len(data) == _RESULT_FILE.size else -1
            for extra in fds:
                if number == call_number and found is None:
                    found = extra
                else:
                    _close(extra)
    finally:
        sock.detach()
    return found


class InterruptSlot:
    """What the notebook and its ranks must know of each other between a signal and its
    answer, in memory shared with the ranks (made before the fork):

    - which call the notebook interrupted. A SIGINT alone cannot say which call it is for:
      it may land before the rank has started the call (the rank then raises as the call
      starts) or after the rank finished it (the rank then ignores it);
    - per rank, whether it takes interrupts yet (``serving``): a rank still starting
      (bootstrap, imports) has no handler of ours, so a SIGINT would kill it. The notebook
      signals only serving ranks; the others see the request as the call starts;
    - per rank, which call it is reporting (``reporting``): its code has returned or raised
      and it is sending the outcome (a big result takes seconds). That is not stuck code,
      so the interrupt's grace does not run out on it;
    - per rank, which call's code it began (``started``): before that it is starting (a
      spawned rank imports for seconds) or unpickling the call (which may import modules),
      not stuck in a collective, so the grace waits for it too (``CallSupervisor.still_starting``)."""

    def __init__(self, num_ranks: int = 1, fd: int | None = None) -> None:
        import mmap
        self.num_ranks = num_ranks
        size = _SLOT.size * (1 + 3 * num_ranks)   # one word for the request, three per rank
        # A memfd, not anonymous memory: forked children share the mapping, and a spawned
        # rank maps the same file from the fd it was passed (``__reduce__``).
        self.fd = fd
        if self.fd is None:
            self.fd = _anonymous_file()
            os.ftruncate(self.fd, size)
            self._memory = mmap.mmap(self.fd, size)
            self.request(0)
        else:
            self._memory = mmap.mmap(self.fd, size)

    def __reduce__(self) -> tuple[Any, ...]:
        """(For a spawned rank, which was passed ``fd`` under the same number.)"""
        return (InterruptSlot, (self.num_ranks, self.fd))

    def request(self, call_number: int) -> None:
        _SLOT.pack_into(self._memory, 0, call_number)

    def requested(self, call_number: int) -> bool:
        return bool(_SLOT.unpack_from(self._memory, 0)[0] == call_number)

    def set_serving(self, local_rank: int) -> None:
        _SLOT.pack_into(self._memory, self._offset(local_rank, 0), 1)

    def serving(self, local_rank: int) -> bool:
        return bool(_SLOT.unpack_from(self._memory, self._offset(local_rank, 0))[0])

    def set_reporting(self, local_rank: int, call_number: int) -> None:
        _SLOT.pack_into(self._memory, self._offset(local_rank, 1), call_number)

    def reporting(self, local_rank: int, call_number: int) -> bool:
        return bool(_SLOT.unpack_from(self._memory, self._offset(local_rank, 1))[0] == call_number)

    def set_started(self, local_rank: int, call_number: int) -> None:
        _SLOT.pack_into(self._memory, self._offset(local_rank, 2), call_number)

    def started(self, local_rank: int, call_number: int) -> bool:
        """Whether the rank began running this call's code (it took the call's frame whole)."""
        return bool(_SLOT.unpack_from(self._memory, self._offset(local_rank, 2))[0] == call_number)

    def _offset(self, local_rank: int, field: int) -> int:
        if not 0 <= local_rank < self.num_ranks:
            raise IndexError(f"local rank {local_rank} of {self.num_ranks}")
        return _SLOT.size * (1 + 3 * local_rank + field)

    def close(self) -> None:
        self._memory.close()
        if self.fd is not None:
            _close(self.fd)
            self.fd = None


_SLOT = struct.Struct("q")


def _anonymous_file() -> int:
    """A file with no name (nothing to clean up), not inherited by what the notebook starts."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("notebook_launch-interrupt-slot", os.MFD_CLOEXEC)
    import tempfile
    fd, path = tempfile.mkstemp(prefix="notebook_launch-slot-")   # no memfd (macOS): unlinked at once
    os.unlink(path)
    return fd
