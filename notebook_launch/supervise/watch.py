"""The parent's view of each rank's fds: one selector over every rank's three pipes
and every process's exit sentinel; bytes become events and whole lines.

Every close goes through ``RankPipes.close`` (each fd at most once) and a key
closed earlier in a select batch is never read: its number may already belong to
someone else (in a kernel, a zmq socket).
"""
from __future__ import annotations

import logging
import os
import selectors
import time
from typing import Any, Protocol, Sequence

from ..wire import protocol
from ..channels import RankPipes, RankProcess, WaitStatus, read_ready
from ..wire.line_splitter import LineSplitter

READ_SIZE = 1 << 16
STREAMS = ("stdout", "stderr")
log = logging.getLogger("notebook_launch")


class RankWatch:
    """Parent-side bookkeeping of one rank. Several ranks may share one process
    (XLA runs one thread per device), so the process is not the rank."""

    def __init__(self, process: RankProcess, local_rank: int, pipes: RankPipes) -> None:
        self.process = process
        self.local_rank = local_rank
        self.pipes = pipes         # closes go through it: never the same fd twice
        self.events = protocol.EventReader()
        self.splitters = {stream: LineSplitter() for stream in STREAMS}
        self.open_fds: set[int] = set()
        self.result: bytes | None = None
        self.has_result = False
        self.result_before_stop = False   # it returned before we stopped it (else it did not finish)
        self.error: protocol.ErrorPayload | None = None   # payload of an ERROR event
        self.error_after_stop = False     # it raised only once we had stopped it (a SIGTERM handler)
        self.exit: WaitStatus | None = None
        self.exited_at: float | None = None
        self.stopped_by_us: int | None = None  # signal we sent at teardown
        self.stop_reason = ""      # why we stopped it, e.g. "after rank 1 failed"
        self.events_fd = pipes.events_r

    def returned(self, payload: bytes) -> None:
        """Its RESULT event came (``payload``: the pickled value); a value sent only after we
        stopped it is not a result (it did not finish, ``outcome.load_result``)."""
        self.result = payload
        self.has_result = True
        self.result_before_stop = self.stopped_by_us is None

    @property
    def finished(self) -> bool:
        return self.exit is not None and not self.open_fds


class WatchHandler(Protocol):
    """What the watcher reports to (the supervisor)."""

    def on_event(self, watch: RankWatch, kind: protocol.EventKind, payload: Any) -> None: ...

    def on_line(self, local_rank: int, stream: str, text: str) -> None: ...

    def on_process_exit(self, process: RankProcess) -> None: ...


def registrations(processes: Sequence[RankProcess], pipes_by_rank: Sequence[RankPipes]) -> list[tuple[int, Any]]:
    """What a watcher's selector holds: (fd, data) for each rank's three pipes, ``(local rank,
    "events" | "stdout" | "stderr")``, and each process's exit sentinel, ``(its index, "exit")``."""
    found: list[tuple[int, Any]] = []
    for index, process in enumerate(processes):
        assert process.sentinel is not None, "a started process has its exit sentinel"
        for local in process.ranks():
            pipes = pipes_by_rank[local]
            found += [(pipes.events_r, (local, "events")), (pipes.stdout_r, (local, "stdout")),
                      (pipes.stderr_r, (local, "stderr"))]
        found.append((process.sentinel, (index, "exit")))
    return found


class Watcher:
    """The selector over every rank's pipes and every process's sentinel."""

    def __init__(self, processes: Sequence[RankProcess], pipes_by_rank: Sequence[RankPipes],
                 handler: WatchHandler, selector: selectors.BaseSelector | None = None) -> None:
        """``selector``: one that holds exactly what this watcher would register, its pipes
        non-blocking already (a call on persistent ranks borrows its pool's,
        ``persistent.call.KeptSelector``); None: a new one."""
        self.processes = list(processes)
        self.handler = handler
        self.watches = sorted((RankWatch(p, local, pipes_by_rank[local])
                               for p in self.processes for local in p.ranks()),
                              key=lambda w: w.local_rank)
        made = selector is None
        if selector is None:
            selector = selectors.DefaultSelector()
            for fd, data in registrations(self.processes, pipes_by_rank):
                selector.register(fd, selectors.EVENT_READ, data)
        self.selector = selector
        for watch in self.watches:
            fds = (watch.pipes.events_r, watch.pipes.stdout_r, watch.pipes.stderr_r)
            if made:   # a lent selector's fds were made non-blocking as it was filled (two fcntl each)
                for fd in fds:
                    os.set_blocking(fd, False)
            watch.open_fds.update(fds)

    def watches_of(self, process: RankProcess) -> list[RankWatch]:
        return [w for w in self.watches if w.process is process]

    def pump(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for output, events or exits, and hand them on."""
        for key, _ in self.selector.select(wait):
            if self.selector.get_map().get(key.fd) is not key:
                # Closed earlier in this batch (a drain reached EOF): its number may be
                # reused by now (in a kernel, by a zmq socket), so never read it.
                continue
            index, what = key.data
            if what == "exit":  # ``index`` is the process index here
                self.selector.unregister(key.fd)
                self.handler.on_process_exit(self.processes[index])
                continue
            self.read_once(self.watches[index], key.fd, what)

    def read_once(self, watch: RankWatch, fd: int, what: str) -> bool:
        """One read of ``fd``, handed on as events or whole lines. False when there was nothing
        to read now, or at end-of-file (then the fd is closed)."""
        data = read_ready(fd, READ_SIZE)
        if data is None:
            return False
        if not data:
            self.close_fd(watch, fd, what)
            return False
        if what == "events":
            for kind, payload in watch.events.feed(data):
                self.handler.on_event(watch, kind, payload)
        else:
            for text in watch.splitters[what].feed(data):
                self.handler.on_line(watch.local_rank, what, text)
        return True

    def drain_events(self, watch: RankWatch) -> None:
        """Fold the events a rank wrote before it exited (select may report the exit first)."""
        while watch.events_fd in watch.open_fds and self.read_once(watch, watch.events_fd, "events"):
            pass

    def drain_streams(self, watch: RankWatch) -> None:
        """Hand on every whole line the rank wrote so far (what it printed before a prompt)."""
        for key in list(self.selector.get_map().values()):
            local, what = key.data
            if local == watch.local_rank and what in STREAMS:
                while key.fd in watch.open_fds and self.read_once(watch, key.fd, what):
                    pass

    def close_fd(self, watch: RankWatch, fd: int, what: str) -> None:
        """Stop watching ``fd`` and close it (once); a stream's last partial line is handed on."""
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError):
            log.debug("fd %d was not registered any more", fd)
        watch.pipes.close(fd)
        watch.open_fds.discard(fd)
        if what in STREAMS:
            for text in watch.splitters[what].flush():
                self.handler.on_line(watch.local_rank, what, text)

    def close_rank_fds(self, watch: RankWatch) -> None:
        for key in list(self.selector.get_map().values()):
            local, what = key.data
            if local == watch.local_rank and what != "exit":
                self.close_fd(watch, key.fd, what)

    def close_stale(self, drain_after_exit: float) -> None:
        """Close the pipes of ranks that exited ``drain_after_exit`` seconds ago
        (a grandchild may hold them open forever)."""
        now = time.monotonic()
        for watch in self.watches:
            if watch.exit is not None and watch.open_fds and watch.exited_at is not None \
                    and now - watch.exited_at > drain_after_exit:
                self.close_rank_fds(watch)

    def close(self) -> None:
        """Close every rank fd still open and the selector."""
        for watch in self.watches:
            self.close_rank_fds(watch)
        self.selector.close()
