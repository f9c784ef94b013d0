"""The notebook side of one call on persistent ranks: the supervisor of a launch, except
that a call ends when every rank has reported (the processes live on), a failure
interrupts the other ranks instead of stopping them, and the pipes stay open. Its logs are
the call's section of the pool's (``logs.RunLogs.section``)."""
from __future__ import annotations

import logging
import os
import select
import selectors
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..wire import protocol
from ..wire.protocol import Failure
from ..record.state import DONE, FAILED, STOPPED
from ..supervise import interrupts, outcome
from ..supervise.oom import MemoryWatch
from ..supervise.resource_watch import ResourceWatch
from ..supervise.supervisor import Step, Supervisor
from ..supervise.watch import RankWatch, Watcher, WatchHandler, registrations
from ..channels import commands

if TYPE_CHECKING:
    from .quick import FirstLook
    from ..channels import RankPipes, RankProcess
    from ..record.logs import LogWriter
    from ..record.state import RunState
    from .transport import CallInterrupts

log = logging.getLogger("notebook_launch")
DRAIN_ROUNDS = 64   # reads of what a call printed before its RESULT (64 KiB each)
STARTING_ALLOWANCE = 120.0   # seconds past the grace for ranks still starting (a spawned rank imports torch)
RANKS_KEPT = "The ranks are still running, with their state; the next call runs on them."   # after a failure
CHECKS_EVERY = 0.02   # seconds between a call's per-turn checks while nothing asks for them (CallSupervisor._quiet)


class KeptSelector:
    """One selector over a pool's ranks' pipes and exit sentinels, kept from call to call: each
    call's watcher borrows it instead of making and filling a new one (eight registrations and
    an epoll made and closed were a sixth of a warm call's set-up, issue 45). It is lent only
    for the very ranks and pipes it was filled for (by identity), with none of their fds closed
    since; a watcher that gives it back changed (a pipe reached its end, a rank ended: their
    registrations are gone) closes it, and the next call fills a new one. The pool fills one
    as its ranks start and closes it when they stop (``life.RankLife``)."""

    def __init__(self) -> None:
        self._selector: selectors.BaseSelector | None = None
        self._ranks: tuple[tuple[RankProcess, ...], tuple[RankPipes, ...]] = ((), ())
        self._fds: frozenset[int] = frozenset()   # what it was filled with

    def fill(self, processes: Sequence[RankProcess], pipes: Sequence[RankPipes]) -> None:
        """A selector for ranks that just started (its fd lives as long as they do, so calls
        change no fd of the notebook's)."""
        self.close()
        selector = selectors.DefaultSelector()
        try:
            for fd, data in registrations(processes, pipes):
                if data[1] != "exit":   # a watcher reads them without waiting (it sets none it borrows)
                    os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ, data)
        except BaseException:
            selector.close()
            raise
        self._selector, self._ranks = selector, (tuple(processes), tuple(pipes))
        self._fds = frozenset(fd for fd, _ in registrations(processes, pipes))

    def take(self, processes: Sequence[RankProcess], pipes: Sequence[RankPipes]) -> selectors.BaseSelector | None:
        """The kept selector if it holds exactly ``processes``' and ``pipes``' fds, else None."""
        selector, self._selector = self._selector, None
        if selector is None:
            return None
        if self._whole(selector, processes, pipes):
            return selector
        selector.close()
        return None

    def give_back(self, selector: selectors.BaseSelector, processes: Sequence[RankProcess],
                  pipes: Sequence[RankPipes]) -> None:
        """Keep ``selector`` (taken from here) for the next call if it still holds every fd; else
        close it."""
        self.close()
        if self._whole(selector, processes, pipes):
            self._selector = selector
        else:
            selector.close()

    def _whole(self, selector: selectors.BaseSelector, processes: Sequence[RankProcess],
               pipes: Sequence[RankPipes]) -> bool:
        """Whether ``selector`` is the one filled for these very ranks and pipes, with every fd it
        was filled with still registered and none of them closed since. Counted, not compared as
        sets: a watcher only ever unregisters (two sets built per look were a tenth of a quick
        call's bookkeeping, issue 45)."""
        kept_processes, kept_pipes = self._ranks
        return _same(kept_processes, processes) and _same(kept_pipes, pipes) \
            and len(selector.get_map()) == len(self._fds) \
            and all(p.sentinel is not None for p in processes) \
            and all(self._fds.isdisjoint(p.closed) for p in pipes)

    def close(self) -> None:
        selector, self._selector = self._selector, None
        if selector is not None:
            selector.close()


def _same(kept: Sequence[Any], now: Sequence[Any]) -> bool:
    return len(kept) == len(now) and all(a is b for a, b in zip(kept, now))


class CallWatcher(Watcher):
    """Watches the pool's pipes for one call; closing it leaves them open for the next (and the
    selector kept for it, when the supervisor has a ``KeptSelector``)."""

    def __init__(self, processes: Sequence[RankProcess], pipes_by_rank: Sequence[RankPipes],
                 handler: WatchHandler, selector: selectors.BaseSelector | None = None) -> None:
        # the pool's, through the call's supervisor (a plain Watcher's handler lends none): taken
        # for the call already when the notebook read its first events (quick.first_look)
        self.kept: KeptSelector | None = handler.kept_selector if isinstance(handler, CallSupervisor) else None
        if selector is None and isinstance(handler, CallSupervisor):
            selector = handler.taken_selector
        if selector is None and self.kept is not None:
            selector = self.kept.take(processes, pipes_by_rank)
        super().__init__(processes, pipes_by_rank, handler, selector=selector)
        self.pipes_by_rank = pipes_by_rank

    def close(self) -> None:
        for _ in range(DRAIN_ROUNDS):   # what the ranks printed before they reported
            ready = [key for key, _ in self.selector.select(0) if key.data[1] in ("stdout", "stderr")]
            if not ready:
                break
            self.pump(0)
        for watch in self.watches:
            for what in ("stdout", "stderr"):
                for text in watch.splitters[what].flush():
                    self.handler.on_line(watch.local_rank, what, text)
        if self.kept is not None:
            self.kept.give_back(self.selector, self.processes, self.pipes_by_rank)
        else:
            self.selector.close()


class CallSupervisor(Supervisor):
    """One call: results when every rank reported; on a failure, a timeout, Stop or the
    notebook's interrupt, SIGINT to the ranks still running and ``grace`` seconds for them
    to come back. Ranks that do not (or a second interrupt) get every rank stopped, and
    ``lost`` says why: the pool then starts fresh ranks for the next call."""

    watcher_class = CallWatcher
    done_note = "is done with this call ({how})"   # what a verdict says of a rank back from this call

    def __init__(self, *args: Any, grace: float, slot: CallInterrupts, call_number: int,
                 held: interrupts.Held | None = None, events: dict[int, protocol.EventReader] | None = None,
                 command_fds: list[int] | None = None, idle_ranks: frozenset[int] = frozenset(),
                 memory: MemoryWatch | None = None, kept_selector: KeptSelector | None = None,
                 first_look: FirstLook | None = None, **kwargs: Any) -> None:
        self.memory = memory   # the pool's, kept across calls (resource_watch)
        self.kept_selector = kept_selector   # the pool's, lent to this call's watcher
        # what the notebook read of the call before this supervisor (quick.first_look): its events
        # are this supervisor's first, and the kept selector it took is the watcher's
        self.taken_selector: selectors.BaseSelector | None = None
        if first_look is not None:   # this supervisor's now: its watcher gives it back, or closes it
            self.taken_selector, first_look.selector = first_look.selector, None
        self._first_events = first_look.events if first_look is not None else []
        super().__init__(*args, **kwargs)
        self.idle_ranks = idle_ranks   # global ranks this call does not run on (%%ranks --ranks)
        self.grace = grace
        self.slot = slot
        self.call_number = call_number
        self.lost: str | None = None   # why the ranks are gone (died, not back, stopped)
        self._held = held   # interrupts held since the call's frame went out (pool.Ranks._call)
        self.command_fds = command_fds or []   # by local rank: where result files come back
        self._checked_at = time.monotonic()   # the set-up sampled the resources: the last checks
        for watch in self.watches:   # the between-calls reader may hold the start of a frame
            if events is not None and watch.local_rank in events:
                watch.events = events[watch.local_rank]

    def resource_watch(self, state: RunState, logs: LogWriter) -> ResourceWatch:
        return ResourceWatch(self.watches, state, logs, memory=self.memory)

    def step(self, wait: float) -> Step:
        if self._held is not None:
            # The frame went out (whole) before this call's state, session and supervisor were
            # built, an interrupt held meanwhile: raised now, it interrupts the call like any
            # other (here, inside run(), which stops the ranks for it).
            held, self._held = self._held, None
            held.release("notebook_launch: interrupted as the call started")
        if self._first_events:   # read before this supervisor was built (quick.first_look), in order
            first, self._first_events = self._first_events, []
            for local, kind, payload in first:
                self.on_event(self.watches[local], kind, payload)
            wait = 0.0   # the rest may be there already: read it at once
        self.watcher.pump(wait)
        if not self._quiet():
            return self._checked_turn()
        if all(w.has_result or w.error is not None for w in self.watches):
            self._refresh()   # the last RESULTs: every rank is done with the call (see _quiet)
            return Step.FINISHED
        if time.monotonic() - self._checked_at < CHECKS_EVERY:
            self._refresh()
            return Step.RUNNING
        return self._checked_turn()

    def _quiet(self) -> bool:
        """Whether this turn has nothing for the per-turn checks to act on but time: no failure,
        no Stop, no "Where are they?", no prompt, no rank ended or marked stalled. Then the
        resource round, the prompts' poll, the stale-pipe sweep and the stall check run at most
        CHECKS_EVERY apart (each acts on seconds: a round SAMPLE_EVERY apart, a stall after
        ``stall_after``, a dead rank's pipes after DRAIN_AFTER_EXIT), and not at all on the turn
        that read the last RESULTs: every rank is done with the call (none can stall or prompt),
        and the rows show the last round already. A warm call is a turn or two of a millisecond:
        the checks on each were a fifth of its main-thread CPU (issue 45)."""
        state = self.state
        return self.first_failure is None and not state.stop_requested and not state.where_requested \
            and self.prompts.asking is None and not self.prompts.waiting \
            and all(w.exit is None for w in self.watches) \
            and all(rs.stalled_since is None for rs in state.ranks)

    def _checked_turn(self) -> Step:
        self._checked_at = time.monotonic()
        return self.react()

    def _refresh(self) -> None:
        """The panel and the ranks' display() outputs brought up to date (what every turn does)."""
        self.display.refresh(self.state)
        if self.rank_displays is not None:
            self.rank_displays.pump()

    def load_results(self) -> list[Any]:
        """Every rank's value (``load_call_results``); one that cannot be loaded fails the call."""
        results, failure = load_call_results(self.watches, self.command_fds, self.call_number, self.global_rank)
        if failure is not None:
            self.fail(failure)
        return results

    def events_by_rank(self) -> dict[int, protocol.EventReader]:
        """The event readers, for the between-calls reader (a frame may have begun)."""
        return {watch.local_rank: watch.events for watch in self.watches}

    def finished(self) -> bool:
        return all(reported(w) for w in self.watches)

    # --- a failure interrupts instead of stopping ---------------------------------------
    def stop(self, reason: str) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.lost is not None:   # a rank died: the group is broken, interrupting helps nothing
            self.stop_all(reason)
            return
        running = [w for w in self.watches if not reported(w)]
        self.slot.request(self.call_number)   # before the signal: a rank may not have started yet
        for watch in running:
            watch.stopped_by_us = signal.SIGINT
            watch.stop_reason = reason
            if not self.slot.serving(watch.local_rank):
                continue   # still starting: no handler of ours yet; it raises as the call starts
            try:
                os.kill(watch.process.pid, signal.SIGINT)
            except ProcessLookupError:
                log.debug("rank %d is gone already", watch.local_rank)
        self.state.stop_requested = False
        deadline = time.monotonic() + self.grace
        try:
            while not all(reported(w) for w in running) and (
                    time.monotonic() < deadline or self.only_reporting(running)
                    or (self.still_starting(running) and time.monotonic() < deadline + STARTING_ALLOWANCE)):
                self.watcher.pump(0.05)
                self.display.refresh(self.state)
                if self.state.stop_requested:
                    raise KeyboardInterrupt("notebook_launch: Stop pressed twice")
                if interrupts.hurry():   # the run's SIGINT guard counted a second Ctrl-C
                    raise KeyboardInterrupt("notebook_launch: interrupted twice")
        except KeyboardInterrupt:
            self.lost = "a second interrupt (or Stop) came while they were being interrupted"
            self.stop_all(outcome.after(reason, "a second interrupt"))
            raise
        not_back = [w for w in running if not reported(w)]
        if not_back and self.lost is None:
            self.lost = outcome.ranks_not_back([self.global_rank(w.local_rank) for w in not_back],
                                                    self.grace, reason)
            self.stop_all(reason)

    def only_reporting(self, running: list[RankWatch]) -> bool:
        """Every rank not back yet is sending its outcome (its code is over): not stuck, so
        the grace does not end it (a second interrupt still does)."""
        return all(self.slot.reporting(w.local_rank, self.call_number) for w in running if not reported(w))

    def still_starting(self, running: list[RankWatch]) -> bool:
        """A rank not back yet has not begun this call's code: it is still starting (a spawned
        rank imports for seconds) or unpickling the call (which may import modules). It is not
        stuck, and takes the interrupt as the call's code starts, so the grace waits for it, up
        to STARTING_ALLOWANCE more seconds (a second interrupt still stops every rank)."""
        return any(not reported(w) and w.exit is None and not self.slot.started(w.local_rank, self.call_number)
                   for w in running)

    def stop_all(self, reason: str) -> None:
        """Stop every rank of the pool (the group is unusable once one rank is gone)."""
        for watch in self.watches:
            if watch.exit is None:
                watch.stopped_by_us = signal.SIGKILL
                watch.stop_reason = reason
                watch.process.kill()
                watch.exit = watch.process.wait()
                self.state.on_exit(watch.local_rank, STOPPED, f"stopped by notebook_launch after {reason}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.watcher.close()
        self.logs.flush()

    # --- what the ranks report ------------------------------------------------------------
    def on_event(self, watch: RankWatch, kind: protocol.EventKind, payload: Any) -> None:
        local = watch.local_rank
        if kind is protocol.EventKind.ERROR and watch.stopped_by_us is not None \
                and payload.get("type") == "KeyboardInterrupt":
            watch.error = payload   # it answered the interrupt: alive, with its state
            self.state.on_exit(local, STOPPED, f"{outcome.after(watch.stop_reason, 'interrupted')} (alive, state kept)")
            return
        super().on_event(watch, kind, payload)
        if kind is protocol.EventKind.RESULT:
            idle = self.global_rank(local) in self.idle_ranks
            self.state.on_exit(local, DONE, "idle: not in this cell's --ranks" if idle else "returned")
        elif kind is protocol.EventKind.ERROR:
            self.state.on_exit(local, FAILED, "raised", error=protocol.headline_of(payload["type"],
                                                                                   payload["message"]))

    def on_process_exit(self, process: RankProcess) -> None:
        if all(w.exit is not None for w in self.watcher.watches_of(process)):
            return   # stopped (and reaped) by stop_all already
        super().on_process_exit(process)
        for watch in self.watcher.watches_of(process):   # interrupted or not: a rank that ends is lost
            if self.lost is None:   # in the words of its end (a SIGKILL as the kernel's records say it)
                said = self.state.ranks[watch.local_rank].exit_description
                self.lost = (f"rank {self.global_rank(watch.local_rank)} died "
                             f"({said or outcome.describe_status(watch.exit or ('exit', -1))})")


def load_call_results(watches: Sequence[RankWatch], command_fds: Sequence[int], call_number: int,
                      global_rank: Callable[[int], int]) -> tuple[list[Any], Failure | None]:
    """Every rank's value, by local rank, and the first value that could not be loaded (None:
    all were); its tensors map the memfd the rank passed on its command socket
    (``commands.send_result_file``) for this call. A call's supervisor and a quick call
    (``quick``) load them alike."""
    with_files = _with_files(watches, command_fds)
    results: list[Any] = []
    first: Failure | None = None
    for watch in watches:
        tensors = None
        if watch.local_rank in with_files:
            tensors = commands.take_result_file(command_fds[watch.local_rank], call_number)
        saved = watch.pipes.tensors   # outcome.load_result reads the launch's result file there
        watch.pipes.tensors = tensors
        try:
            value, failure = outcome.load_result(watch, global_rank(watch.local_rank))
        finally:
            watch.pipes.tensors = saved
            if tensors is not None:
                os.close(tensors)   # the tensors' mappings keep the pages
        first = first or failure
        results.append(value)
    return results, first


def _with_files(watches: Sequence[RankWatch], command_fds: Sequence[int]) -> set[int]:
    """The local ranks that returned and have something on their command socket: a result file
    (passed before the RESULT, so it is there by now), or one of an earlier call. One select for
    them all: most calls pass no file, and looking on each socket in turn was a socket object and
    a recvmsg per rank (issue 45)."""
    fds = {command_fds[w.local_rank]: w.local_rank for w in watches if w.has_result and command_fds}
    return {fds[fd] for fd in select.select(list(fds), [], [], 0)[0]} if fds else set()


def reported(watch: RankWatch) -> bool:
    """A rank is done with the call once it sent its RESULT or ERROR, or ended."""
    return watch.has_result or watch.error is not None or watch.exit is not None


__all__ = ["CallSupervisor"]
