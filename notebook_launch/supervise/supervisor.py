"""Watch the ranks: fold their events and output into the run state, stop
everything on the first failure, a timeout, a Stop click or an interrupt.

Runs on the parent's main thread, so KeyboardInterrupt lands here and the
display is only ever touched from one thread. How fds are read is
``watch.py``; what an end means and every error text is ``outcome.py``.
"""
from __future__ import annotations

import enum
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Sequence

from .. import protocol
from ..best_effort import best_effort
from ..errors import LaunchError
from ..protocol import Failure
from ..slow_rank import only_waiting
from ..state import RUNNING, STARTING, RunState
from .. import leftovers
from ..diagnose import hang_verdict, stacks
from ..diagnose.ranks import stack_fingerprints, where_ranks
from ..diagnose.stall import StallWatch
from . import interrupts, oom, outcome, teardown
from .stdin_relay import StdinRelay, reply_on
from .watch import RankWatch, Watcher

if TYPE_CHECKING:
    from ..channels import RankPipes, RankProcess
    from ..display.base import Display
    from ..display.display_relay import RankDisplays
    from ..logs import LogWriter

DRAIN_AFTER_EXIT = 1.0  # how long to wait for a dead rank's pipes to reach EOF (grandchildren may hold them)
log = logging.getLogger("notebook_launch")


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

    def __init__(self, processes: Sequence["RankProcess"], pipes_by_rank: Sequence["RankPipes"],
                 state: RunState, display: "Display", logs: "LogWriter", *,
                 timeout: float | None = None, poll_interval: float = 0.1,
                 rank_displays: "RankDisplays | None" = None, stall_after: float | None = None) -> None:
        self.state = state
        self.rank_displays = rank_displays   # re-publishes the ranks' display() calls (in a kernel)
        self.display = display
        self.logs = logs
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.processes = list(processes)
        self.watcher = self.watcher_class(self.processes, pipes_by_rank, self)
        self.watches = self.watcher.watches
        # the OOM counters at the start, each rank's memory as last sampled (an OOM death named)
        self.memory = oom.MemoryWatch((rs.local_rank, rs.rank) for rs in state.ranks)
        self.sample_resources()
        self.first_failure: Failure | None = None
        self.stalls = None if stall_after is None else StallWatch(stall_after, time.monotonic(),
                                                                  stack=stack_fingerprints)
        self.last_found: list[hang_verdict.RankWhereabouts] = []   # the last answer of whereabouts()
        self.where_problem = "they were not asked"   # why the last where_they_are had no verdict
        self._stopped = False
        self._closed = False
        self.prompts = StdinRelay(lambda local: f"rank {self.global_rank(local)}",
                                  on_terminal_prompt=lambda showing: display.prompting(self.state, showing))

    # --- the loop ----------------------------------------------------------
    def run(self) -> list[Any]:
        """Return the results by local rank, or raise LaunchError / KeyboardInterrupt."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
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
                self.stop("an interrupt")
                raise
            stalled = self.stalled()
            with interrupts.tearing_down():   # a run interrupted by hand is often a hung one: say where
                verdict, detail = self.where_they_are("when the run was interrupted", native=False)
            self.stop("an interrupt")
            if verdict is None:
                raise
            if not stalled:
                raise KeyboardInterrupt(f"notebook_launch: interrupted; where the ranks were: {verdict}") from None
            # the user ended a hang: a LaunchError that says where the ranks were, as a timeout's does
            self.fail(outcome.stopped_stall_failure("an interrupt", verdict, detail))
        except BaseException:
            self.stop("an interrupt")
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
        self.sample_resources()
        self.prompts.poll()
        self.watcher.close_stale(DRAIN_AFTER_EXIT)
        self.check_stalls()
        if self.state.where_requested:   # the panel's "Where are they?" button: answer, stop nothing
            self.answer_where()
        self.display.refresh(self.state)
        if self.rank_displays is not None:
            self.rank_displays.pump()
        if self.first_failure is not None:
            self.stop(self.failure_reason())
            return Step.FAILED
        if self.state.stop_requested:
            stalled = self.stalled()
            verdict, detail = self.where_they_are("when Stop was pressed", native=False)   # a stopped run is often hung
            self.stop("the Stop button was pressed")
            if stalled and verdict is not None:   # the user ended a hang: a LaunchError that says where they were
                self.fail(outcome.stopped_stall_failure("the Stop button", verdict, detail))
                return Step.FAILED
            raise KeyboardInterrupt("notebook_launch: run stopped with the Stop button"
                                    + (f"; where the ranks were: {verdict}" if verdict else ""))
        return Step.FINISHED if self.finished() else Step.RUNNING

    def sampled_pids(self) -> dict[int, int]:
        """Local rank -> pid of each live rank whose memory can be read here (its own process, on
        this machine); ranks sharing one process (XLA) are sampled once, as its first rank."""
        pids: dict[int, int] = {}
        for w in self.watches:
            if w.exit is None and w.process.on_this_machine and w.process.pid not in pids.values():
                pids[w.local_rank] = w.process.pid
        return pids

    def sample_resources(self) -> None:
        """Each local rank's CPU, memory and GPU into its row and now and then its log, and the
        machine's memory into the header (``supervise.resources``, a round when one is due); the
        same round's memory is what an OOM death's message quotes (``oom.MemoryWatch``)."""
        devices = {rs.local_rank: rs.device for rs in self.state.ranks}
        self.warn_of_memory(self.memory.sample(self.sampled_pids(), devices=devices))
        # an extra: the run goes on without it
        with best_effort("could not show the ranks' resources"):
            self.memory.resources.publish(self.state, self.logs)

    def warn_of_memory(self, warning: str | None) -> None:
        """Say, before anything dies, that memory is running out (``oom.MemoryWatch.notebook_at_risk``):
        in the cell (stderr) and in every rank's log."""
        if warning is None:
            return
        print(warning, file=sys.stderr, flush=True)
        for local_rank in range(len(self.state.ranks)):
            self.logs.write_block(local_rank, warning)

    def check_stalls(self) -> None:
        """Mark the live ranks stalled when the whole run shows no sign of progress (see ``stall``);
        the moment it becomes stalled, say where every rank is (logs, and the panel through
        ``where_report``). Nothing is stopped."""
        if self.stalls is None:
            return
        now = time.monotonic()
        live = [(w.local_rank, w.process.pid if w.process.on_this_machine else None) for w in self.watches
                if w.exit is None and self.state.ranks[w.local_rank].status == RUNNING]
        for local, _pid in live:
            if self.prompting(local):   # waiting for the user's answer is not a stall
                self.stalls.saw(local, now)
        was_stalled = any(rs.stalled_since is not None for rs in self.state.ranks)
        if any(pid is None for _local, pid in live):   # a rank we cannot watch (on another machine) may
            stalled: dict[int, float | None] = {}        # work silently: no claim that the run is stuck
        else:
            stalled = self.stalls.check_all(live, now)
        for rs in self.state.ranks:
            since = stalled.get(rs.local_rank)
            if since != rs.stalled_since:
                self.state.on_stalled(rs.local_rank, since)
        if not was_stalled and any(since is not None for since in stalled.values()):
            self.report_where(f"stalled: no rank showed progress for {self.stalls.stall_after:g} s", stall=True)

    def stalled(self) -> bool:
        """Whether the run is marked stalled now (``check_stalls``)."""
        return any(rs.stalled_since is not None for rs in self.state.ranks)

    def prompting(self, local_rank: int) -> bool:
        """The rank waits for an answer to its input() (asked or queued)."""
        asking = self.prompts.asking
        return (asking is not None and asking[0] == local_rank) or any(
            item[0] == local_rank for item in self.prompts.waiting)

    def answer_where(self) -> None:
        """Answer the "Where are they?" button: the verdict and every rank's stacks in the run state
        (the panel draws them) and the logs; the run goes on."""
        self.report_where("asked with the Where are they? button")

    def report_where(self, why: str, stall: bool = False) -> None:
        """Collect where every rank is and put the verdict and the (shortened) stacks in the state's
        ``where_report``; the whole stacks go to each rank's log, the verdict to every rank's log."""
        verdict, detail = self.where_they_are(why)
        if verdict is None:
            text = "no rank could say where it is: " + self.where_problem
            for local_rank in range(len(self.state.ranks)):
                self.logs.write_block(local_rank, f"notebook_launch: where the ranks were ({why}): {text}")
        else:
            text = f"{verdict}\n\n{detail}" if detail else verdict
        if stall:
            self.state.on_stall_report(f"{why}; {text}")
        else:
            self.state.on_where_report(text)

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
            verdict, detail = self.where_they_are("at the timeout")
            if verdict is None:   # say why not, so that a blind timeout can be looked into
                detail = f"no rank could say where it is: {self.where_problem}"
            self.first_failure = outcome.timeout_failure(self.timeout, running, verdict, detail)
        self.stop("the timeout")

    def where_they_are(self, why: str = "", native: bool = True) -> tuple[str | None, str]:
        """The one-line verdict on where the ranks are and the detail (every rank's stacks), the
        whole of it also written to each rank's log (``why``: when, for the log's heading);
        (None, "") when no rank could say (ranks that are not ours to ask: no whereabouts record).
        ``native``: add native frames where py-spy is installed (seconds: not on an interrupt)."""
        try:
            found = self.last_found = self.whereabouts(native)
        except Exception as exc:   # why: a diagnosis must never stand in the way of the stop
            log.debug("could not collect the ranks' whereabouts", exc_info=True)
            self.where_problem = f"asking them failed ({type(exc).__name__}: {exc})"
            return None, ""
        label = outcome.cell_labeller()
        verdict, detail = stacks.where_they_are(found, label)
        if verdict is None:
            self.where_problem = hang_verdict.notes_text(found)
            return None, ""
        whole = hang_verdict.detail(found, label, frames_per_thread=1000, whole=True)
        heading = f"notebook_launch: where the ranks were{f' ({why})' if why else ''}: {verdict}\n"
        for watch, where in zip(self.watches, found):   # the verdict, then this rank's whole detail
            self.logs.write_block(watch.local_rank,
                                  heading + hang_verdict.detail([where], label, frames_per_thread=1000, whole=True))
        log.debug("where the ranks were:\n%s", whole)
        return verdict, detail

    def whereabouts(self, native: bool = True) -> list[hang_verdict.RankWhereabouts]:
        """Every rank of this run, asked where it is (``diagnose.ranks``); the ended ones say how they
        ended, and a rank done with the run (a persistent rank that returned from the call) is not asked."""
        asked = [(w.local_rank, w.process if w.exit is None and self.state.ranks[w.local_rank].status
                  in (STARTING, RUNNING) else None) for w in self.watches]
        found = where_ranks(asked, self.global_rank, outcome.cell_labeller(), native=native)
        for watch, where in zip(self.watches, found):
            rs = self.state.ranks[watch.local_rank]
            if watch.exit is not None:
                where.note = f"ended ({rs.exit_description or rs.status})"
            elif rs.status not in (STARTING, RUNNING):
                where.note = self.done_note(rs.exit_description or str(rs.status))
            where.stalled_for = self.state.stalled_for(watch.local_rank)
        return found

    def done_note(self, how: str) -> str:
        """What the verdict says of a live rank that is done with the run (``how``: "returned")."""
        return f"is done ({how})"

    def close(self) -> None:
        """Release pipes, sentinels and processes, once; kills what is still alive."""
        if self._closed:
            return
        self._closed = True
        self.memory.resources.close()
        with interrupts.tearing_down():
            self.prompts.close("the run ended")
            self.watcher.close()
            for process in teardown.distinct(w.process for w in self.watches if w.exit is None):
                if process.on_this_machine:   # a Ray actor's pid is its node's: here it may be anyone's group
                    leftovers.end_rank_group(process.pid)   # alive or not yet reaped: the group id is still its own
            for watch in self.watches:
                if watch.exit is None:
                    if watch.process.poll() is None:  # a sibling rank may have reaped it already
                        watch.process.kill()
                    watch.exit = watch.process.wait()
            for process in self.processes:
                process.release()
            leftovers.sweep(self.state.run_id)   # what left a rank's group (setsid) ends with the run
            self.logs.flush()

    # --- what the watcher reports (WatchHandler) ------------------------------
    def on_event(self, watch: RankWatch, kind: protocol.EventKind, payload: Any) -> None:
        local = watch.local_rank
        # a sample of its resources (sent whatever the rank does) and a wait in a collective are no progress
        quiet = kind is protocol.EventKind.RESOURCES or (kind is protocol.EventKind.PROGRESS and only_waiting(payload))
        if self.stalls is not None and not quiet:
            self.stalls.saw(local, time.monotonic())
        if kind is protocol.EventKind.RESOURCES:   # a rank on another machine sampled itself (rank.resources)
            self.memory.resources.reported(local, payload)
        elif kind is protocol.EventKind.PROGRESS:
            self.state.on_progress(local, payload)
            self.logs.write_metrics(self.state.ranks[local].rank, payload.get("series"))
        elif kind is protocol.EventKind.READY:
            self.state.on_ready(local, payload)
        elif kind is protocol.EventKind.RESULT:
            watch.result = payload
            watch.has_result = True
            watch.result_before_stop = watch.stopped_by_us is None
        elif kind is protocol.EventKind.ERROR:
            watch.error = payload
            if watch.stopped_by_us is not None:   # what our SIGTERM made it raise: it was stopped
                watch.error_after_stop = True
                return
            pid = watch.process.pid if watch.process.on_this_machine else None
            self.fail(self.memory.name_allocation_failure(Failure.from_payload(local, payload), local, pid,
                                                          payload.get("resident")))
        elif kind is protocol.EventKind.DISPLAY and self.rank_displays is not None:
            self.rank_displays.on_event(self.global_rank(local), payload)
        elif kind is protocol.EventKind.INPUT_REQUEST:
            self.watcher.drain_streams(watch)   # what the rank printed (pdb's listing) shows first
            self.display.refresh(self.state)
            pipes = watch.pipes
            self.prompts.request(local, payload, reply_on(pipes.answers_w, lambda: pipes.answers_w not in pipes.closed))

    def on_line(self, local_rank: int, stream: str, text: str) -> None:
        if self.stalls is not None:
            self.stalls.saw(local_rank, time.monotonic())
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
            watch.pipes.close(watch.pipes.events_w)   # kept open while it ran (backends.base.start_each)
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
            if process.on_this_machine:   # a SIGKILL: the OOM killer's, or not? (supervise.oom)
                end = self.memory.name_kill(end, watch.local_rank, process.pid,
                                            {k: v for k, v in self.sampled_pids().items() if v != process.pid})
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
        if failure.traceback and failure.local_rank is not None:
            self.logs.write_block(failure.local_rank, failure.traceback)   # whole; the error is capped
        return outcome.launch_error(failure, results, self.state,
                                    facts=outcome.failure_facts(self.watches, self.state, failure))
