"""A rank's pipes over TCP, for ranks that run on other machines (Ray).

The notebook opens one listener on the address that reaches the cluster; each remote
rank connects back four times (events, stdout, stderr, and answers: the notebook's
replies to the rank's input() prompts) and says who it is in a fixed-size hello. The
notebook's ends are then plain socket fds in a ``SocketPipes``, so the supervisor's
selector, line splitting, event frames and EOF-means-gone logic work unchanged. The
events connection also carries the notebook's stop requests back to the rank (a signal
number, 4 bytes).
"""
from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from .pipes import RankPipes

log = logging.getLogger("notebook_launch")
STREAMS = ("events", "stdout", "stderr", "answers")
TOKEN_BYTES = 16
# hello: run token, global rank, stream index
HELLO = struct.Struct(f"!{TOKEN_BYTES}sIB")
SIGNAL_FRAME = struct.Struct("!I")
HELLO_TIMEOUT = 10.0


@dataclass
class SocketPipes(RankPipes):
    """RankPipes whose parent ends are connected sockets; the child ends live on another
    machine, so there is nothing to close here for them."""

    def child_ends(self) -> tuple[int, ...]:
        return ()

    def send_signal(self, signum: int) -> bool:
        """Ask the rank to deliver ``signum`` to itself; False if its channel is closed."""
        if self.events_r in self.closed:
            return False
        try:
            os.write(self.events_r, SIGNAL_FRAME.pack(signum))
            return True
        except OSError:
            log.debug("rank channel closed; signal %d not sent", signum, exc_info=True)
            return False


class StreamListener:
    """The notebook's end: one TCP listener, ``accept_all`` pairs connections with ranks."""

    def __init__(self, host: str, world_size: int) -> None:
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.world_size = world_size
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(max(16, len(STREAMS) * world_size))
        self.sock.setblocking(False)
        self.address = (host, self.sock.getsockname()[1])
        self._fds: dict[tuple[int, int], int] = {}

    def accept_all(self, deadline: float, check: Callable[[], None], tick: float = 0.1) -> list[SocketPipes]:
        """Accept until every rank's four streams arrived; ``check`` runs every ``tick``
        seconds and may raise (a rank died, Stop, interrupt). TimeoutError after ``deadline``."""
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        try:
            while len(self._fds) < len(STREAMS) * self.world_size:
                check()
                if time.monotonic() > deadline:
                    missing = sorted({r for r in range(self.world_size)
                                      for s in range(len(STREAMS)) if (r, s) not in self._fds})
                    raise TimeoutError(f"ranks {missing} did not connect back to the notebook at "
                                       f"{self.address[0]}:{self.address[1]}")
                if selector.select(tick):
                    self._accept_one()
        finally:
            selector.close()
        return [SocketPipes(events_r=self._fds[(r, 0)], events_w=-1, stdout_r=self._fds[(r, 1)], stdout_w=-1,
                            stderr_r=self._fds[(r, 2)], stderr_w=-1, answers_r=-1, answers_w=self._fds[(r, 3)])
                for r in range(self.world_size)]

    def _accept_one(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        conn.settimeout(HELLO_TIMEOUT)
        try:
            hello = _recv_exactly(conn, HELLO.size)
            token, rank, stream = HELLO.unpack(hello)
        except (OSError, struct.error):
            log.debug("a connection to the rank listener sent no hello", exc_info=True)
            conn.close()
            return
        if token != self.token or rank >= self.world_size or stream >= len(STREAMS) or (rank, stream) in self._fds:
            log.debug("rejected a connection to the rank listener (rank %s, stream %s)", rank, stream)
            conn.close()
            return
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._fds[(rank, stream)] = conn.detach()

    def close(self, keep: Sequence[SocketPipes] = ()) -> None:
        """Close the listener, and every accepted fd that was not handed on in ``keep``."""
        handed = {fd for pipes in keep for fd in pipes.parent_ends()}
        for fd in self._fds.values():
            if fd not in handed:
                os.close(fd)
        self._fds.clear()
        self.sock.close()


def connect_streams(host: str, port: int, token: bytes, rank: int, timeout: float = 30.0) -> list[socket.socket]:
    """The rank's end: four connections (events, stdout, stderr, answers) to the notebook."""
    socks = []
    try:
        for index in range(len(STREAMS)):
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(HELLO.pack(token, rank, index))
            sock.settimeout(None)
            socks.append(sock)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise OSError("connection closed before its hello")
        data += chunk
    return data
