"""Watch the ranks: fold their events and output into the run state, stop
everything on the first failure, a timeout, a Stop click or an interrupt, and
classify how each rank ended.

Runs on the parent's main thread, so KeyboardInterrupt lands here and the
display is only ever touched from one thread.
"""
from __future__ import annotations

import os
import selectors
import signal
import time
from dataclasses import dataclass

from . import channel
from .errors import LaunchError
from .output import LineSplitter
from .state import DONE, FAILED, RUNNING, STOPPED  # also what Supervisor.step says

TERM_GRACE = 2.0      # seconds between SIGTERM and SIGKILL at teardown
DRAIN_AFTER_EXIT = 1.0  # how long to wait for a dead rank's pipes to reach EOF (grandchildren may hold them)
READ_SIZE = 1 << 16
LAST_LINES_IN_ERROR = 20  # a crash without a Python traceback shows the rank's last output instead


@dataclass
class Failure:
    local_rank: int
    kind: str               # exception, signal, exit, result, timeout, stopped
    headline: str           # "ValueError: boom", "killed by SIGKILL (possibly out of memory)"
    traceback: str = ""
    exc_type: str | None = None
    exc_message: str | None = None


class _RankWatch:
    """Parent-side bookkeeping of one rank. Several ranks may share one process
    (XLA runs one thread per device), so the process is not the rank."""

    def __init__(self, process, local_rank: int, pipes):
        self.process = process
        self.local_rank = local_rank
        self.pipes = pipes         # closes go through it: never the same fd twice
        self.events = channel.EventReader()
        self.splitters = {"stdout": LineSplitter(), "stderr": LineSplitter()}
        self.open_fds = set()
        self.result = None
        self.has_result = False
        self.error = None          # payload of an ERROR event
        self.exit = None           # ("exit", code) | ("signal", signum)
        self.exited_at = None
        self.stopped_by_us = None  # signal we sent at teardown
        self.stop_reason = ""      # why we stopped it, e.g. "after rank 1 failed"
        self.events_fd = None

    @property
    def finished(self) -> bool:
        return self.exit is not None and not self.open_fds


class Supervisor:
    def __init__(self, plan, processes, pipes_by_rank, state, display, logs, *,
                 timeout=None, poll_interval=0.1):
        self.plan = plan
        self.state = state
        self.display = display
        self.logs = logs
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.processes = list(processes)
        self.watches = sorted((_RankWatch(p, local, pipes_by_rank[local])
                               for p in self.processes for local in local_ranks_of(p)),
                              key=lambda w: w.local_rank)
        self.first_failure: Failure | None = None
        self._stopped = False
        self._closed = False
        self.selector = selectors.DefaultSelector()
        for watch, pipes in zip(self.watches, pipes_by_rank):
            local = watch.local_rank
            for fd, what in ((pipes.events_r, "events"), (pipes.stdout_r, "stdout"),
                             (pipes.stderr_r, "stderr")):
                os.set_blocking(fd, False)
                self.selector.register(fd, selectors.EVENT_READ, (local, what))
                watch.open_fds.add(fd)
            watch.events_fd = pipes.events_r
        for index, process in enumerate(self.processes):
            self.selector.register(process.sentinel, selectors.EVENT_READ, (index, "exit"))

    # --- the loop ----------------------------------------------------------
    def run(self):
        """Return the results by local rank, or raise LaunchError / KeyboardInterrupt."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            while True:
                wait = self.poll_interval
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                if self.step(wait) != RUNNING:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    self.time_out()
                    break
        except BaseException:
            self.stop("an interrupt")
            raise
        finally:
            self.close()
        return self._outcome()

    def step(self, wait: float) -> str:
        """Watch the ranks for up to ``wait`` seconds and react. Returns RUNNING, DONE, or
        FAILED (the other ranks are stopped by then); raises KeyboardInterrupt after a Stop
        click. The elastic agent drives attempts through this too (backends/attempt.py)."""
        self._pump(wait)
        self._close_stale_pipes()
        self.display.refresh(self.state)
        if self.first_failure is not None:
            self.stop(self._failure_reason())
            return FAILED
        if self.state.stop_requested:
            self.stop("the Stop button was pressed")
            raise KeyboardInterrupt("notebook_launch: run stopped with the Stop button")
        return DONE if all(w.finished for w in self.watches) else RUNNING

    def stop(self, reason: str) -> None:
        """Stop every live rank (SIGTERM, grace, SIGKILL), once; ``reason`` ends "after ..."."""
        if not self._stopped:
            self._stopped = True
            self._teardown(reason=reason)

    def time_out(self) -> None:
        """Record the timeout as the failure and stop the ranks."""
        self._on_timeout()

    def close(self) -> None:
        """Release pipes, sentinels and processes, once; kills what is still alive."""
        if not self._closed:
            self._closed = True
            self._close_all()

    def _pump(self, wait: float) -> None:
        for key, _ in self.selector.select(wait):
            if self.selector.get_map().get(key.fd) is not key:
                # Closed earlier in this batch (a drain reached EOF): its number may be
                # reused by now (in a kernel, by a zmq socket), so never read it.
                continue
            local, what = key.data
            if what == "exit":  # ``local`` is the process index here
                self.selector.unregister(key.fd)
                for watch in self._watches_of(self.processes[local]):
                    self._drain_events(watch)   # an ERROR sent just before exiting decides how it ended
                    self._on_exit(watch)
                continue
            watch = self.watches[local]
            try:
                data = os.read(key.fd, READ_SIZE)
            except BlockingIOError:
                continue
            if not data:
                self._close_fd(watch, key.fd, what)
                continue
            if what == "events":
                for kind, payload in watch.events.feed(data):
                    self._on_event(watch, kind, payload)
            else:
                for text in watch.splitters[what].feed(data):
                    self._on_line(local, what, text)

    # --- folding -----------------------------------------------------------
    def _on_event(self, watch, kind, payload) -> None:
        local = watch.local_rank
        if kind == channel.PROGRESS:
            self.state.on_progress(local, payload)
        elif kind == channel.READY:
            self.state.on_ready(local, payload)
        elif kind == channel.RESULT:
            watch.result = payload
            watch.has_result = True
        elif kind == channel.ERROR:
            watch.error = payload
            self._fail(Failure(local, payload.get("kind", "exception"),
                               f"{payload['type']}: {payload['message']}" if payload["message"]
                               else payload["type"],
                               payload.get("traceback", ""), payload["type"], payload["message"]))

    def _on_line(self, local, stream, text) -> None:
        self.state.on_line(local, stream, text)
        self.logs.write_line(local, stream, text)
        self.display.line(self.state, local, stream, text)

    def _drain_events(self, watch) -> None:
        """Fold the events a rank wrote before it exited (select may report the exit first)."""
        fd = getattr(watch, "events_fd", None)
        while fd in watch.open_fds:
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            if not data:
                self._close_fd(watch, fd, "events")
                return
            for kind, payload in watch.events.feed(data):
                self._on_event(watch, kind, payload)

    def _on_exit(self, watch) -> None:
        status = watch.process.poll()
        if status is None:  # sentinel fired before waitpid can see it: wait for it
            status = _blocking_wait(watch.process)
        watch.exit = status
        watch.exited_at = time.monotonic()
        local = watch.local_rank
        shared = len(local_ranks_of(watch.process)) > 1
        if watch.has_result and watch.error is None and (status == ("exit", 0) or shared):
            # a rank that shares its process is done once its result arrived,
            # even if the process was then stopped because a sibling failed
            self.state.on_exit(local, DONE, "finished")
            return
        if watch.stopped_by_us is not None and watch.error is None:
            self.state.on_exit(local, STOPPED, stopped_description(watch, status))
            return
        description = describe_status(status)
        if watch.error is not None:
            self.state.on_exit(local, FAILED, description, error=self._headline(watch))
            return
        if status == ("exit", 0):
            failure = Failure(local, "exit", "exited with code 0 without returning from the function "
                              "(os._exit(0) or a library that ended the process)")
        elif status[0] == "signal":
            failure = Failure(local, "signal", description)
        else:
            failure = Failure(local, "exit", f"{description} without raising a Python exception "
                              "(os._exit, or a crash in C code)")
        self.state.on_exit(local, FAILED, description, error=failure.headline)
        self._fail(failure)

    def _headline(self, watch) -> str:
        payload = watch.error
        return f"{payload['type']}: {payload['message']}" if payload["message"] else payload["type"]

    def _failure_reason(self) -> str:
        failure = self.first_failure
        if failure.local_rank < 0:
            return failure.kind
        return f"rank {self._global(failure.local_rank)} failed"

    def _watches_of(self, process) -> list:
        return [w for w in self.watches if w.process is process]

    def _fail(self, failure: Failure) -> None:
        if self.first_failure is None:
            self.first_failure = failure

    # --- ending ------------------------------------------------------------
    def _on_timeout(self) -> None:
        running = [self._global(w.local_rank) for w in self.watches if w.exit is None]
        self.first_failure = self.first_failure or Failure(
            -1, "timeout", f"timed out after {self.timeout:g} s; ranks still running: "
            + ", ".join(map(str, running)))
        self.stop("the timeout")

    def _teardown(self, reason: str) -> None:
        """SIGTERM every live rank, wait TERM_GRACE, SIGKILL what is left, then drain pipes."""
        live = [w for w in self.watches if w.exit is None]
        for watch in live:
            watch.stopped_by_us = signal.SIGTERM
            watch.stop_reason = reason
        for process in _distinct(w.process for w in live):
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE
        while any(w.exit is None for w in live) and time.monotonic() < deadline:
            self._pump(0.05)
        for watch in live:
            if watch.exit is None:
                watch.stopped_by_us = signal.SIGKILL
        for process in _distinct(w.process for w in live if w.exit is None):
            process.kill()
        for watch in live:
            if watch.exit is None:
                watch.exit = _blocking_wait(watch.process)
                watch.exited_at = time.monotonic()
                self.state.on_exit(watch.local_rank, STOPPED,
                                   stopped_description(watch, watch.exit))
        for process in _distinct(w.process for w in self.watches if w.open_fds):
            process.signal(signal.SIGKILL)  # grandchildren of a killed rank may still hold pipes
        drain_deadline = time.monotonic() + 0.5
        while any(w.open_fds for w in self.watches) and time.monotonic() < drain_deadline:
            self._pump(0.05)

    def _close_stale_pipes(self) -> None:
        now = time.monotonic()
        for watch in self.watches:
            if watch.exit is not None and watch.open_fds and now - watch.exited_at > DRAIN_AFTER_EXIT:
                for key in list(self.selector.get_map().values()):
                    local, what = key.data
                    if local == watch.local_rank and what != "exit":
                        self._close_fd(watch, key.fd, what)

    def _close_fd(self, watch, fd, what) -> None:
        try:
            self.selector.unregister(fd)
        except (KeyError, ValueError):
            pass
        watch.pipes.close(fd)
        watch.open_fds.discard(fd)
        if what in ("stdout", "stderr"):
            for text in watch.splitters[what].flush():
                self._on_line(watch.local_rank, what, text)

    def _close_all(self) -> None:
        for watch in self.watches:
            for key in list(self.selector.get_map().values()):
                local, what = key.data
                if local == watch.local_rank and what != "exit":
                    self._close_fd(watch, key.fd, what)
            if watch.exit is None:
                if watch.process.poll() is None:  # a sibling rank may have reaped it already
                    watch.process.kill()
                watch.exit = _blocking_wait(watch.process)
        for process in self.processes:
            process.release()
        self.selector.close()
        self.logs.flush()

    # --- outcome -----------------------------------------------------------
    def _global(self, local: int) -> int:
        return self.state.ranks[local].rank if local >= 0 else -1

    def _outcome(self):
        results = [self._load_result(w) for w in self.watches]
        if self.first_failure is None:
            return results
        raise self._launch_error(self.first_failure, results)

    def _load_result(self, watch):
        if not watch.has_result:
            return None
        import cloudpickle
        try:
            return cloudpickle.loads(watch.result)
        except Exception as exc:
            rank = self._global(watch.local_rank)
            self._fail(Failure(watch.local_rank, "result",
                               f"the result of rank {rank} could not be unpickled in the notebook "
                               f"({type(exc).__name__}: {exc}); return plain data or tensors"))
            return None

    def _launch_error(self, failure: Failure, results) -> LaunchError:
        node = f"node {self.plan.node_rank}, " if self.plan.num_nodes > 1 else ""
        if failure.kind == "timeout":
            first = f"notebook_launch: {failure.headline}"
            rank = None
        else:
            rank = self._global(failure.local_rank)
            first = f"{node}rank {rank} failed: {failure.headline}"
        lines = [first]
        if failure.traceback:
            lines += ["", f"Traceback from rank {rank}:", failure.traceback.rstrip()]
            self.logs.write_block(failure.local_rank, failure.traceback)
        elif rank is not None and self.state.ranks[failure.local_rank].lines:
            recent = crash_report_lines([text for _, text in self.state.ranks[failure.local_rank].lines])
            lines += ["", f"Last output of rank {rank}:"] + [f"  {text}" for text in recent]
        lines += ["", "Other ranks:" if rank is not None else "Ranks:"]
        for rs in self.state.ranks:
            if rs.rank == rank:
                continue
            fate = rs.exit_description or rs.status
            if rs.status == FAILED and rs.error:
                fate = f"also failed: {rs.error}"
            lines.append(f"  rank {rs.rank}: {fate}")
        lines.append(f"Logs: {self.state.log_dir}")
        self.state.finish(FAILED, first)
        return LaunchError("\n".join(lines), rank=rank, kind=failure.kind, exc_type=failure.exc_type,
                           exc_message=failure.exc_message, remote_traceback=failure.traceback or None,
                           log_dir=self.state.log_dir, results=results)


def crash_report_lines(lines):
    """What to quote from a rank that died without a Python traceback: faulthandler's
    report when there is one (it starts with "Fatal Python error"), else the last lines."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("Fatal Python error"):
            return lines[start:start + 2 * LAST_LINES_IN_ERROR]
    return lines[-LAST_LINES_IN_ERROR:]


def local_ranks_of(process) -> tuple:
    """The local ranks a process carries: one for fork/spawn, every ordinal of it for XLA."""
    return tuple(getattr(process, "local_ranks", None) or (process.local_rank,))


def _distinct(processes) -> list:
    seen = []
    for process in processes:
        if not any(process is p for p in seen):
            seen.append(process)
    return seen


def stopped_description(watch, status) -> str:
    if status == ("exit", 0):
        return f"stopped after {watch.stop_reason} (it exited cleanly when asked)"
    how = "SIGTERM" if status == ("signal", signal.SIGTERM) else describe_status(status)
    if status == ("signal", signal.SIGKILL):
        how = "SIGKILL, it ignored SIGTERM for 2 s"
    return f"stopped by notebook_launch ({how}) after {watch.stop_reason}"


def _blocking_wait(process):
    while True:
        status = process.poll()
        if status is not None:
            return status
        time.sleep(0.005)


SIGNAL_HINTS = {
    signal.SIGKILL: "possibly out of memory (the kernel's OOM killer sends SIGKILL)",
    signal.SIGSEGV: "segmentation fault in native code",
    signal.SIGABRT: "aborted (a C++ assertion or std::terminate)",
    signal.SIGBUS: "bus error (often shared memory /dev/shm too small)",
    signal.SIGTERM: "terminated",
}


def describe_status(status) -> str:
    kind, value = status
    if kind == "signal":
        name = signal.Signals(value).name if value in signal.Signals._value2member_map_ else str(value)
        hint = SIGNAL_HINTS.get(value)
        return f"killed by {name}" + (f", {hint}" if hint else "")
    return f"exit code {value}"
