"""Persistent ranks between calls: their output keeps flowing, and a rank that dies takes
what it started with it.

During a call the call's supervisor (``call.CallSupervisor``) is the one reader of the
ranks' pipes, on the notebook's main thread. Between calls nobody would read them: a
background thread in a rank that prints (or reports progress) fills its 64 KiB pipe and
blocks until the next call, and what it prints after the last call never reaches the log.
So between calls one thread of ours, ``IdleReader``, is that reader: the same selector
over every rank's output and event pipes and every process's exit, lines to the rank's
log (and to the notebook while a cell runs there), and a rank that exits has its process
group ended at once (while it is an unreaped zombie its pid is still its group's id; see
``leftovers``). Exactly one reader at a time: the pool stops this thread before
a call's supervisor starts and starts it again after the call; partial event frames are
handed over both ways, so no frame is ever read by halves.
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..wire import protocol
from ..errors.best_effort import best_effort
from ..channels.pipes import read_ready
from ..errors.ipython_shell import running_shell
from ..wire.line_splitter import LineSplitter
from ..notebook.notebook_streams import notebook_stream

if TYPE_CHECKING:
    from ..channels import RankPipes, RankProcess
    from ..record.logs import RunLogs

log = logging.getLogger("notebook_launch")
READ_SIZE = 1 << 16
STREAMS = ("stdout", "stderr")


class CellWatch:
    """Whether a notebook cell runs now (IPython's pre/post_run_cell events); outside
    IPython there are no cells and output always goes to our stdout."""

    def __init__(self) -> None:
        self.running = True
        self._shell: Any = None
        shell = running_shell()
        if shell is not None and hasattr(shell, "events"):
            self._shell = shell
            self.running = False   # this runs inside a cell, but the hooks say so from the next one
            shell.events.register("pre_run_cell", self._pre)
            shell.events.register("post_run_cell", self._post)

    def _pre(self, *args: Any) -> None:
        self.running = True

    def _post(self, *args: Any) -> None:
        self.running = False

    def close(self) -> None:
        if self._shell is not None:
            for name, callback in (("pre_run_cell", self._pre), ("post_run_cell", self._post)):
                try:
                    self._shell.events.unregister(name, callback)
                except ValueError:
                    pass
            self._shell = None


class IdleReader:
    """The ranks' one reader between calls: a daemon thread for the life of the ranks;
    ``pause`` hands the pipes to a call, ``resume`` takes them back, ``stop`` ends it.

    Why two epolls: the ranks' fds are in an inner epoll, and the thread waits on an outer one
    that holds the inner's fd (ready when any rank fd is) and a wake pipe. ``pause`` takes the
    inner out of the outer and ``resume`` puts it back (one epoll_ctl each, legal while the thread
    waits), so during a call the thread sleeps on: the rank's RESULT that wakes the call's
    supervisor does not also wake this thread, and no GIL handoff to it is on a call's path (with
    one epoll the thread woke at every call, once for the result and once at the resume)."""

    def __init__(self, processes: Sequence[RankProcess], pipes: Sequence[RankPipes], logs: RunLogs,
                 tag: Callable[[int], str], events: dict[int, protocol.EventReader],
                 on_exit: Callable[[RankProcess], None], show: Callable[[], bool]) -> None:
        self.processes = list(processes)
        self.pipes = list(pipes)
        self.logs = logs
        self.tag = tag              # local rank -> "[rank N] "
        self.events = events        # local rank -> the reader of its event frames (handed on)
        self.on_exit = on_exit      # ends the exited rank's group (under the pool's lock)
        self.show = show            # whether lines go to the notebook now
        self.splitters = {(local, what): LineSplitter() for local in range(len(self.pipes)) for what in STREAMS}
        self._wake_r, self._wake_w = os.pipe()
        self._keys: dict[int, tuple[int, str]] = {}   # fd in the inner epoll -> (local rank or index, what)
        self._inner = select.epoll()
        self._outer = select.epoll()
        for local, rank_pipes in enumerate(self.pipes):
            for fd, what in ((rank_pipes.events_r, "events"), (rank_pipes.stdout_r, "stdout"),
                             (rank_pipes.stderr_r, "stderr")):
                if fd not in rank_pipes.closed:
                    os.set_blocking(fd, False)
                    self._watch(fd, local, what)
        for index, process in enumerate(self.processes):
            if process.sentinel is not None:
                self._watch(process.sentinel, index, "exit")
        self._outer.register(self._wake_r, select.EPOLLIN)
        self._outer.register(self._inner.fileno(), select.EPOLLIN)
        self._closing = False
        self._paused = False                  # set by pause; the thread reads it under _batch
        self._batch = threading.Lock()        # held by the thread while it handles what one wait returned
        self._thread = threading.Thread(target=self._loop, name="notebook_launch-ranks-between-calls",
                                        daemon=True)
        self._thread.start()

    def _watch(self, fd: int, local: int, what: str) -> None:
        self._inner.register(fd, select.EPOLLIN)
        self._keys[fd] = (local, what)

    def _unwatch(self, fd: int) -> None:
        if self._keys.pop(fd, None) is not None:
            with contextlib.suppress(OSError):   # closed already: the kernel dropped it
                self._inner.unregister(fd)

    def pause(self) -> dict[int, protocol.EventReader]:
        """Stop reading until ``resume`` and return the event readers, which may hold the start
        of a frame. Cheap: the thread is not woken; a batch it is handling is finished first,
        and from then on it reads nothing (it checks under the same lock)."""
        with self._batch:
            if not self._paused:
                self._paused = True
                self._outer.unregister(self._inner.fileno())
        for (local, what), splitter in self.splitters.items():   # a line cut by the call's start
            for text in splitter.flush():
                self._line(local, what, text)
        self.logs.flush()
        return self.events

    def resume(self, events: dict[int, protocol.EventReader]) -> None:
        """Read again after a call; ``events``: the call's readers (a frame may have begun)."""
        for local, reader in events.items():
            self.events[local] = reader
        for fd, (local, what) in list(self._keys.items()):   # what the call closed (a rank's EOF)
            if what in ("events", *STREAMS) and fd in self.pipes[local].closed:
                self._unwatch(fd)
        with self._batch:
            if self._paused:
                self._paused = False
                self._outer.register(self._inner.fileno(), select.EPOLLIN)

    def stop(self) -> dict[int, protocol.EventReader]:
        """End the thread, read what the pipes hold (the ranks' last lines), free its fds."""
        events = self.pause()
        self._closing = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        with best_effort("the ranks' last output was not read"):
            self._drain()
        for (local, what), splitter in self.splitters.items():
            for text in splitter.flush():
                self._line(local, what, text)
        self.logs.flush()
        self._inner.close()
        self._outer.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        return events

    # --- the thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closing:
            self._outer.poll()
            with self._batch:
                if self._closing:
                    return
                if not self._paused:   # paused: the inner is out of the outer; the next wait sleeps
                    # a logging problem: say so, and keep the pipes flowing
                    with best_effort("the between-calls reader of the ranks failed on a batch"):
                        self._handle(self._inner.poll(0))

    def _handle(self, ready: list[tuple[int, int]]) -> None:
        for fd, _ in ready:
            key = self._keys.get(fd)
            if key is None:
                continue   # unregistered meanwhile (an end of file earlier in this batch)
            local, what = key
            if what == "exit":
                self._unwatch(fd)
                self.on_exit(self.processes[local])
            else:
                self._read(fd, local, what)
        self.logs.flush()

    def _drain(self) -> None:
        """Read what is already in the pipes, without waiting for more."""
        for fd, (local, what) in list(self._keys.items()):
            if what in ("events", *STREAMS):
                while self._read(fd, local, what):
                    pass

    def _read(self, fd: int, local: int, what: str) -> bool:
        data = read_ready(fd, READ_SIZE)
        if data is None:
            return False
        if not data:   # the rank closed it or ended: stop watching it (the pool closes it)
            self._unwatch(fd)
            return False
        if what == "events":
            for kind, payload in self.events[local].feed(data):
                self._event(local, kind, payload)
        else:
            for text in self.splitters[(local, what)].feed(data):
                self._line(local, what, text)
        return True

    def _line(self, local: int, what: str, text: str) -> None:
        self.logs.write_line(local, what, text)
        if self.show():
            out = notebook_stream(what)
            with best_effort("a rank's line between calls was not shown"):
                out.write(f"{self.tag(local)}{text}\n")
                out.flush()

    def _event(self, local: int, kind: protocol.EventKind, payload: Any) -> None:
        if kind is protocol.EventKind.PROGRESS and isinstance(payload, dict):
            self.logs.write_metrics(local, payload.get("series"))
        else:   # a display() or a prompt outside any call has no cell to go to
            log.debug("rank %d: %s event between calls dropped", local, kind.value)
