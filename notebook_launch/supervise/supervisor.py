"""Watch the ranks: fold their events and output into the run state, stop
everything on the first failure, a timeout, a Stop click or an interrupt.

Runs on the parent's main thread, so KeyboardInterrupt lands here and the
display is only ever touched from one thread. How fds are read is
``watch.py``; what an end means and every error text is ``outcome.py``; how
ranks are stopped and what is left ended is ``teardown.py``. The loop tells its
collaborators what it saw and when: ``hang_watch.HangWatch`` (stalls, where
the ranks are) and ``resource_watch.ResourceWatch`` (each rank's resources).
"""
from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any, Sequence

from ..wire import protocol
from ..errors import LaunchError
from ..wire.protocol import Failure
from ..process import leftovers
from ..record.slow_rank import only_waiting
from ..record.state import RunState
from ..diagnose.hang_verdict import RankWhereabouts
from . import interrupts, outcome, teardown
from .hang_watch import HangWatch
from .resource_watch import ResourceWatch
from .stdin_relay import StdinRelay, reply_on
from .watch import RankWatch, Watcher

if TYPE_CHECKING:
    from ..channels import RankPipes, RankProcess
    from ..display.base import Display
    from ..display.display_relay import RankDisplays
    from ..record.logs import LogWriter

DRAIN_AFTER_EXIT = 1.0  # how long to wait for a dead rank's pipes to reach EOF (grandchildren may hold them)


class Step(enum.Enum):
    """Where the run stands after one ``Supervisor.step``."""
    RUNNING = "running"
    FINISHED = "finished"   # every rank ended and its pipes are drained
    FAILED = "failed"       # a failure was recorded; the other ranks are stopped


class Supervisor:
    """Drives one set of ranks to an end: ``run()`` for a plain launch, ``step()``
    for the elastic agent, which owns the loop there. Persistent ranks
    (``persistent.call``) supervise one call at a time with a subclass."""

    watcher_class = Watcher
    done_note = "is done ({how})"   # what a verdict says of a live rank done with the run ({how}: "returned")

    def __init__(self, processes: Sequence["RankProcess"], pipes_by_rank: Sequence["RankPipes"],
                 state: RunState, display: "Display", logs: "LogWriter", *,
                 timeout: float | None = None, poll_interval: float = 0.1,
                 rank_displays: "RankDisplays | None" = None, stall_after: float | None = None) -> None:
        self.state = state
        self.rank_displays = rank_displays   # re-publishes the ranks' display() calls (in a kernel)
        self.display = display
        self.logs = logs
        self.timeout = timeout
        # seconds of the timeout its start used already (a SLURM job's wait in the queue), and the
        # words its error says that with (``Launcher.timeout_spent``)
        self.timeout_spent = 0.0
        self.timeout_note = ""
        self.poll_interval = poll_interval
        self.processes = list(processes)
        self.watcher = self.watcher_class(self.processes, pipes_by_rank, self)
        self.watches = self.watcher.watches
        self.resources = self.resource_watch(state, logs)   # each rank's CPU, memory, GPU; OOM deaths
        self.resources.sample()
        self.first_failure: Failure | None = None
        self._stopped = False
        self._closed = False
        self.prompts = StdinRelay(lambda local: f"rank {self.global_rank(local)}",
                                  on_terminal_prompt=lambda showing: display.prompting(self.state, showing))
        # stall detection and where the ranks are (diagnose/), into the state and the logs
        self.hangs = HangWatch(self.watches, state, logs, stall_after=stall_after, global_rank=self.global_rank,
                               waits_for_answer=self.prompts.waits_for_answer, done_note=self.done_note,
                               ask=self.whereabouts)

    def resource_watch(self, state: RunState, logs: "LogWriter") -> ResourceWatch:
        """This run's resource watch (a call on persistent ranks reuses its pool's sampler)."""
        return ResourceWatch(self.watches, state, logs)

    # --- the loop ----------------------------------------------------------
    def run(self) -> list[Any]:
        """Return the results by local rank, or raise LaunchError / KeyboardInterrupt."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout - self.timeout_spent
        try:
            while True:
                wait = self.poll_interval
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                if self.step(wait) is not Step.RUNNING:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    self.time_out()
                    break
        except KeyboardInterrupt as interrupt:
            if self._stopped or interrupt.args:   # the Stop button's, which says where the ranks were
                self.stop(outcome.INTERRUPT)
                raise
            with interrupts.tearing_down():   # a run interrupted by hand is often a hung one: say where
                stalled, verdict, detail = self.hangs.at_stop("when the run was interrupted")
            self.stop(outcome.INTERRUPT)
            if verdict is None:
                raise
            if not stalled:
                raise KeyboardInterrupt(f"notebook_launch: interrupted; where the ranks were: {verdict}") from None
            # the user ended a hang: a LaunchError that says where the ranks were, as a timeout's does
            self.fail(outcome.stopped_stall_failure(outcome.INTERRUPT, verdict, detail))
        except BaseException as exc:   # the notebook's own exception (an alarm handler's, a SystemExit)
            self.stop(outcome.stop_cause(exc))
            raise
        finally:
            self.close()
        results = self.load_results()
        if self.first_failure is None:
            return results
        raise self.launch_error(self.first_failure, results)

    def step(self, wait: float) -> Step:
        """Watch the ranks for up to ``wait`` seconds and react. Returns FAILED once the
        other ranks are stopped; raises KeyboardInterrupt after a Stop click."""
        self.watcher.pump(wait)
        return self.react()

    def react(self) -> Step:
        """The rest of a turn, once the watcher handed on what it read: resources, prompts, stale
        pipes, stalls, the panel's buttons and refresh, a failure, the end."""
        self.resources.sample()
        self.prompts.poll()
        self.watcher.close_stale(DRAIN_AFTER_EXIT)
        self.hangs.check()
        if self.state.where_requested:   # the panel's "Where are they?" button: answer, stop nothing
            self.hangs.report("asked with the Where are they? button")
        self.display.refresh(self.state)
        if self.rank_displays is not None:
            self.rank_displays.pump()
        if self.first_failure is not None:
            self.stop(self.failure_reason())
            return Step.FAILED
        if self.state.stop_requested:
            stalled, verdict, detail = self.hangs.at_stop("when Stop was pressed")
            self.stop("the Stop button was pressed")
            if stalled and verdict is not None:   # the user ended a hang: a LaunchError that says where they were
                self.fail(outcome.stopped_stall_failure("the Stop button", verdict, detail))
                return Step.FAILED
            raise KeyboardInterrupt("notebook_launch: run stopped with the Stop button"
                                    + (f"; where the ranks were: {verdict}" if verdict else ""))
        return Step.FINISHED if self.finished() else Step.RUNNING

    def finished(self) -> bool:
        """Whether the run has ended: every rank exited and its pipes are drained."""
        return all(w.finished for w in self.watches)

    def stop(self, reason: str) -> None:
        """Stop every live rank (SIGTERM, grace, SIGKILL), once; ``reason`` ends "after ..."."""
        if not self._stopped:
            self._stopped = True
            with interrupts.tearing_down():   # a second Ctrl-C hurries the teardown, never aborts it
                self.prompts.close(f"the run is stopping after {reason}")
                teardown.stop_ranks(self.watches, self.watcher, self.state, reason)

    def time_out(self) -> None:
        """Record the timeout as the failure and stop the ranks."""
        assert self.timeout is not None
        running = [self.global_rank(w.local_rank) for w in self.watches if w.exit is None]
        if self.first_failure is None:
            verdict, detail = self.hangs.where_they_are("at the timeout")
            if verdict is None:   # say why not, so that a blind timeout can be looked into
                detail = self.hangs.nobody_could_say()
            self.first_failure = outcome.timeout_failure(self.timeout, running, verdict, detail, self.timeout_note)
        self.stop("the timeout")

    def whereabouts(self, native: bool = True) -> list[RankWhereabouts]:
        """Where every rank of this run is (``HangWatch.local_whereabouts``); elastic's attempt adds
        the other nodes' ranks."""
        return self.hangs.local_whereabouts(native)

    def close(self) -> None:
        """Release pipes, sentinels and processes, once; kills what is still alive."""
        if self._closed:
            return
        self._closed = True
        self.resources.close()
        with interrupts.tearing_down():
            self.prompts.close("the run ended")
            self.watcher.close()
            teardown.end_what_is_left(self.watches, self.processes, self.state.run_id)
            self.logs.flush()

    # --- what the watcher reports (WatchHandler) ------------------------------
    def on_event(self, watch: RankWatch, kind: protocol.EventKind, payload: Any) -> None:
        local = watch.local_rank
        # a sample of its resources (sent whatever the rank does) and a wait in a collective are no progress
        quiet = kind is protocol.EventKind.RESOURCES or (kind is protocol.EventKind.PROGRESS and only_waiting(payload))
        if not quiet:
            self.hangs.saw(local)
        if kind is protocol.EventKind.RESOURCES:   # a rank on another machine sampled itself (rank.reports.resources)
            self.resources.reported(local, payload)
        elif kind is protocol.EventKind.PROGRESS:
            self.state.on_progress(local, payload)
            self.logs.write_metrics(self.state.ranks[local].rank, payload.get("series"))
        elif kind is protocol.EventKind.READY:
            self.state.on_ready(local, payload)
        elif kind is protocol.EventKind.RESULT:
            watch.returned(payload)
        elif kind is protocol.EventKind.ERROR:
            watch.error = payload
            if watch.stopped_by_us is not None:   # what our SIGTERM made it raise: it was stopped
                watch.error_after_stop = True
                return
            self.fail(self.resources.name_failure(Failure.from_payload(local, payload), watch, payload))
        elif kind is protocol.EventKind.DISPLAY and self.rank_displays is not None:
            self.display.before_output(self.state)
            self.rank_displays.on_event(self.global_rank(local), payload)
        elif kind is protocol.EventKind.INPUT_REQUEST:
            self.watcher.drain_streams(watch)   # what the rank printed (pdb's listing) shows first
            self.display.refresh(self.state)
            pipes = watch.pipes
            self.prompts.request(local, payload, reply_on(pipes.answers_w, lambda: pipes.answers_w not in pipes.closed))

    def on_line(self, local_rank: int, stream: str, text: str) -> None:
        self.hangs.saw(local_rank)
        self.state.on_line(local_rank, stream, text)
        self.logs.write_line(local_rank, stream, text)
        self.display.line(self.state, local_rank, stream, text)

    def on_process_exit(self, process: "RankProcess") -> None:
        watches = self.watcher.watches_of(process)
        if any(w.exit is None for w in watches) and process.on_this_machine:
            # Not reaped yet: the rank's pid, and so its group id, cannot have been reused
            # (a Ray actor's pid is its own node's, never a group to end here).
            leftovers.end_rank_group(process.pid)
        shared = len(process.ranks()) > 1
        for watch in watches:
            watch.pipes.close(watch.pipes.events_w)   # kept open while it ran (engines.base.start_each)
            self.prompts.forget(watch.local_rank)
            self.watcher.drain_events(watch)   # an ERROR sent just before exiting decides how it ended
            if watch.exit is not None:   # the teardown reaped and described it already
                continue
            status = process.poll()
            if status is None:  # sentinel fired before waitpid can see it: wait for it
                status = process.wait()
            watch.exit = status
            watch.exited_at = time.monotonic()
            end = outcome.classify_exit(watch, status, shared)
            end = self.resources.name_kill(end, watch)   # a SIGKILL: the OOM killer's, or not? (supervise.oom)
            self.resources.ended(watch, shared)   # the kernel's count of its life: its peak memory
            self.state.on_exit(watch.local_rank, end.status, end.description, error=end.error)
            if end.failure is not None:
                self.fail(end.failure)

    # --- failures and results --------------------------------------------------
    def fail(self, failure: Failure) -> None:
        """Record ``failure`` unless an earlier one was recorded (the first one is the cause)."""
        if self.first_failure is None:
            self.first_failure = failure

    def failure_reason(self) -> str:
        failure = self.first_failure
        assert failure is not None
        if failure.local_rank is None:
            return failure.kind
        return f"rank {self.global_rank(failure.local_rank)} failed"

    def global_rank(self, local_rank: int) -> int:
        return self.state.ranks[local_rank].rank

    def load_results(self) -> list[Any]:
        """Every rank's value (None where there is none); a value that cannot be unpickled fails the run."""
        results = []
        for watch in self.watches:
            value, failure = outcome.load_result(watch, self.global_rank(watch.local_rank))
            if failure is not None:
                self.fail(failure)
            results.append(value)
        return results

    def launch_error(self, failure: Failure, results: list[Any]) -> LaunchError:
        """The LaunchError for ``failure``; its traceback also goes to the rank's log."""
        return failure_error(failure, results, self.state, self.logs, self.watches)


def failure_error(failure: Failure, results: list[Any], state: RunState, logs: "LogWriter",
                  watches: Sequence[RankWatch]) -> LaunchError:
    """The LaunchError for ``failure`` of a supervised run (or of a quick call on persistent
    ranks, ``persistent.quick``); its traceback also goes to the rank's log, whole (the
    error's is capped)."""
    if failure.traceback and failure.local_rank is not None:
        logs.write_block(failure.local_rank, failure.traceback)
    return outcome.launch_error(failure, results, state, facts=outcome.failure_facts(watches, state, failure))
