"""The messages between the notebook and its warm start process (``engines.local.start_process`` on the
notebook's side, ``engines.local.start_server`` on the start process's): one pickled dict per message, framed
by its length, over a Unix stream socket, with file descriptors riding on the message's first bytes
(SCM_RIGHTS). A stream, not datagrams: a request carries the notebook's whole environment, which
can outgrow a datagram socket's buffer.

Both ends are processes of one user on one machine, started by the notebook: what is pickled here
is only ever read by the other of the two.
"""
from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct("!I")
MAX_FDS = 253             # SCM_RIGHTS' own limit: a launch's ranks' fds ride on one message (7 each at most)
MAX_MESSAGE = 64 << 20    # bytes; a message past it is a broken peer, not a request


# One record per rank that ended, on the start process's reports pipe: pid, 0 (exit code) or 1
# (signal), the code or signal, peak resident memory in bytes, CPU seconds. Under PIPE_BUF, so each
# write arrives whole.
REPORT = struct.Struct("!iBiqd")
LOST_KIND = 2   # in place of 0 or 1: it ended, but how is unknown


class WireClosed(EOFError):
    """The other end closed the socket (its process ended) or sent something that is not a message."""


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send ``message`` with ``fds`` (which stay open here: the receiver gets duplicates)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = HEADER.pack(len(body)) + body
    try:
        sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
        if sent < len(data):
            sock.sendall(data[sent:])
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise WireClosed(f"the start process closed its socket ({exc})") from exc


def receive(sock: socket.socket, timeout: float | None = None) -> tuple[dict[str, Any], list[int]]:
    """One message and the fds that came with it (new fds of this process: the caller closes them).
    Raises WireClosed when the peer is gone, TimeoutError when nothing came within ``timeout`` s."""
    deadline = None if timeout is None else time.monotonic() + timeout
    fds: list[int] = []
    buffer = b""
    try:
        while len(buffer) < HEADER.size or len(buffer) < HEADER.size + HEADER.unpack_from(buffer)[0]:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([sock], [], [], left)[0]:
                    raise TimeoutError("no message from the start process in time")
            want = 1 << 16
            chunk, new_fds, _, _ = socket.recv_fds(sock, want, MAX_FDS)
            fds.extend(new_fds)
            if not chunk:
                raise WireClosed("the start process closed its socket")
            buffer += chunk
            if len(buffer) >= HEADER.size and HEADER.unpack_from(buffer)[0] > MAX_MESSAGE:
                raise WireClosed("a message past the size limit")
        size = HEADER.unpack_from(buffer)[0]
        message = pickle.loads(buffer[HEADER.size:HEADER.size + size])
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    if not isinstance(message, dict):
        for fd in fds:
            os.close(fd)
        raise WireClosed("a message that is not a dict")
    return message, fds
