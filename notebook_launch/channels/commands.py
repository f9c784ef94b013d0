"""The format of the persistent ranks' command channel, which both sides use: one Unix socket per
rank, notebook -> rank, carrying length-prefixed frames, and result files back the other way.
Here so that neither side reads the other's module for it; what a frame's pickle holds is each
side's (the notebook encodes it: ``persistent.command_frames``; the rank decodes it:
``rank.serve.receive_command``), as both go through ``shared_tensors``, which channels/ may not
import.

The rank -> notebook direction of a launch is ``protocol`` (events, output pipes); this is the
channel only persistent ranks need: each call is one CALL frame carrying a ``rank.runner.Job``,
and STOP ends the rank's loop.

A frame: ``HEADER`` (the length, 64 bits, as protocol's), then the pickle of (command, payload).
Tensors cross at memory speed, both ways: a frame's big storages' bytes are in a fresh memfd,
and that memfd travels beside the frame on the socket (SCM_RIGHTS), so the rank maps its pages
instead of reading them through a pipe. A result goes back the same way: the rank writes its
tensors into a fresh memfd and passes it to the notebook (``send_result_file``, with
``RESULT_FILE``: the call number it belongs to) just before its RESULT event. A fresh file per
call, because the reader's copy-on-write mappings would see a rewrite of the same file; memfds
have no name, so nothing is left behind however a process ends.
"""
from __future__ import annotations

import array
import enum
import logging
import os
import socket
import struct
from dataclasses import dataclass

HEADER = struct.Struct("!Q")   # a frame's length: 64 bits, as protocol's
RESULT_FILE = struct.Struct("!q")   # the call number a result file belongs to
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
            close_fd(self.read_fd)
            self.read_fd = -1

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            close_fd(self.write_fd)
            self.write_fd = -1


def close_fd(fd: int) -> None:
    """Close a channel's fd; one already gone is no error (the debug log says so)."""
    try:
        os.close(fd)
    except OSError:
        log.debug("closing command fd %d failed", fd, exc_info=True)


@dataclass
class Frame:
    """An encoded command: the bytes (header and pickle), and the memfd holding its tensors'
    bytes (or None)."""
    data: bytes
    tensors: int | None = None

    @classmethod
    def of(cls, pickled: bytes, tensors: int | None = None) -> Frame:
        """The frame of a pickled (command, payload): its header, then the pickle."""
        return cls(HEADER.pack(len(pickled)) + pickled, tensors)

    def body(self) -> memoryview:
        """The pickle, without the header (what a remote rank's CALL message carries)."""
        return memoryview(self.data)[HEADER.size:]

    def close(self) -> None:
        if self.tensors is not None:
            close_fd(self.tensors)
            self.tensors = None


def _socket_of(fd: int) -> socket.socket:
    """A socket object over a command socket's ``fd`` (detach it after use). Its family, type and
    protocol are given, as ``CommandPipe.open`` made it: given none, Python asks the kernel for
    each (two syscalls more per use: each call reads its frame's header through one in every rank,
    and looks for each rank's result file through one in the notebook, issue 45)."""
    return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fd)


def send(fd: int, frame: Frame | bytes) -> None:
    """Write a whole frame (the rank reads it whole; a write may be partial); its memfd goes
    with the first bytes."""
    if isinstance(frame, bytes):
        frame = Frame(frame)
    view = memoryview(frame.data)
    if frame.tensors is not None:
        sock = _socket_of(fd)
        try:
            view = view[sock.sendmsg([view], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                               array.array("i", [frame.tensors]))]):]
        finally:
            sock.detach()
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int) -> tuple[bytes, int | None] | None:
    """Block until the next frame: its pickle and the memfd that came with it (the caller closes
    it), or None at end of file (the notebook is gone)."""
    header, tensors = _read_header(fd)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    data = _read_exactly(fd, size)
    if data is None:
        if tensors is not None:
            close_fd(tensors)
        return None
    return data, tensors


def _read_header(fd: int) -> tuple[bytes | None, int | None]:
    """The frame's header and the memfd that came with it, if any."""
    sock = _socket_of(fd)
    chunks: list[bytes] = []
    tensors: int | None = None
    left = HEADER.size
    try:
        while left:
            data, ancillary, _, _ = sock.recvmsg(left, _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
            for fds in _fds_of(ancillary):
                for extra in fds[1:] if tensors is None else fds:
                    close_fd(extra)
                if tensors is None and fds:
                    tensors = fds[0]
            if not data:
                if tensors is not None:
                    close_fd(tensors)
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
    sock = _socket_of(fd)
    try:
        sock.sendmsg([RESULT_FILE.pack(call_number)],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [tensors]))], socket.MSG_NOSIGNAL)
    finally:
        sock.detach()


def take_result_file(fd: int, call_number: int) -> int | None:
    """(In the notebook) the memfd a rank passed for ``call_number`` (the caller closes it),
    or None; files of earlier calls (one that was interrupted) are closed."""
    sock = _socket_of(fd)
    found: int | None = None
    try:
        while True:
            try:
                data, ancillary, _, _ = sock.recvmsg(RESULT_FILE.size, _FD_SPACE,
                                                     socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                break
            fds = [fd for group in _fds_of(ancillary) for fd in group]
            if not data:
                for extra in fds:
                    close_fd(extra)
                break
            number = RESULT_FILE.unpack(data)[0] if len(data) == RESULT_FILE.size else -1
            for extra in fds:
                if number == call_number and found is None:
                    found = extra
                else:
                    close_fd(extra)
    finally:
        sock.detach()
    return found
