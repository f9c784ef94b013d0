"""The life of a pool's ranks between its calls: started through the pool's transport, read
between calls (``idle.IdleReader``: one reader at a time, the call's supervisor during a call),
checked before each call and restarted when they are gone, stopped. ``pool.Ranks`` is the API
the notebook uses and runs the calls; this is what happens around them, the same for every
transport (``transport.RankTransport``).

What a lost rank does: a rank that died between calls, ranks that did not come back from an
interrupt, or a second interrupt leave ``lost`` set; the next call stops what is left and runs
on fresh ranks, saying so (or, where the transport says the loss must be reported first, as for
Ray ranks whose node died, that call fails with the transport's LaunchError).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..wire import protocol
from ..errors.best_effort import best_effort
from ..display import choose_display
from ..notebook.notebook_streams import OUT
from ..planning.options import LaunchOptions
from ..scaffold.session import open_logs
from ..supervise.oom import MemoryWatch
from .call import KeptSelector
from .idle import CellWatch, IdleReader
from .transport import RankTransport, ended

if TYPE_CHECKING:
    from ..record.logs import RunLogs
    from ..wire.plan import LaunchPlan


class RankLife:
    """A pool's ranks across calls (see the module): ``plan``, ``logs`` (one run folder per
    pool, kept across restarts), ``restarts`` and ``lost`` (why the ranks are gone: the next
    call restarts them)."""

    def __init__(self, options: LaunchOptions, transport: RankTransport) -> None:
        self.options = options
        self.transport = transport
        self.plan: LaunchPlan | None = None
        self.logs: RunLogs | None = None
        self.run_id = ""
        self.restarts = 0
        self.lost: str | None = None
        self._idle: IdleReader | None = None
        self._cells: CellWatch | None = None
        self.memory: MemoryWatch | None = None   # the ranks' resource sampler, kept across calls
        self.selector = KeptSelector()   # the ranks' fds, registered once for every call's watcher

    def memory_watch(self) -> MemoryWatch:
        """The sampler of these ranks' resources, their calls' one (``call.CallSupervisor``):
        rounds SAMPLE_EVERY apart across calls, each call's rows start from the last round."""
        if self.memory is None:
            assert self.plan is not None
            self.memory = MemoryWatch((spec.local_rank, spec.global_rank) for spec in self.plan.ranks)
        return self.memory

    def start(self) -> None:
        """Start the ranks through the transport, and their between-calls reader; the first
        start prints the launch line."""
        self.plan = self.transport.start(self._logs_for)
        self.lost = None
        self.selector.fill(self.transport.processes, self.transport.pipes)
        if self._cells is None:
            self._cells = CellWatch()
        self.start_idle({})
        if self.restarts == 0:
            assert self.logs is not None
            display = choose_display(self.options.ui, line_prefix=self.options.line_prefix).name
            print(self.transport.launch_line(self.plan, self.logs, display), file=OUT, flush=True)

    def _logs_for(self, plan: LaunchPlan, run_id: str) -> RunLogs:
        """The pool's logs: opened by its first start, kept across restarts."""
        if self.logs is None:
            self.run_id = run_id
            self.logs = open_logs(plan, run_id, self.options)
        return self.logs

    def start_idle(self, events: dict[int, protocol.EventReader]) -> None:
        """Hand the ranks' pipes to the between-calls reader (started with the ranks);
        ``events``: the call's readers of event frames (a frame may have begun)."""
        self.transport.idle_begins()
        if self._idle is not None:
            self._idle.resume(events)
            return
        assert self.plan is not None and self.logs is not None
        transport = self.transport
        self._idle = IdleReader(
            transport.processes, transport.pipes, self.logs,
            tag=transport.tag(self.plan, self.options.line_prefix),
            events={local: events.get(local) or protocol.EventReader() for local in range(len(transport.pipes))},
            on_exit=transport.on_exit,
            show=lambda: self.options.ui != "none" and self._cells is not None and self._cells.running)

    def _pause_idle(self) -> dict[int, protocol.EventReader]:
        """Take the ranks' pipes back from the between-calls reader (its readers of event frames)."""
        return self._idle.pause() if self._idle is not None else {}

    def _stop_idle(self) -> None:
        """End the between-calls reader (the ranks are going)."""
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.stop()

    def ensure_running(self, num_processes: int) -> dict[int, protocol.EventReader]:
        """Ranks ready for a call (fresh ones if they are gone); returns the event readers
        the between-calls reader hands over: from here on the calling thread reads the ranks' pipes."""
        events = self._pause_idle()
        gone = ended(self.transport.processes) if self.lost is None else []
        if gone:
            assert self.logs is not None
            lost = self.transport.lost_between_calls(gone, self.logs, num_processes)
            self.lost = lost.why
            if lost.error is not None:   # this call fails first; the next one starts fresh ranks
                self.stop(graceful=False)
                raise lost.error
        if self.lost is not None:
            why = self.lost
            self.stop(graceful=False)
            self.restarts += 1
            assert self.logs is not None
            self.logs.write_to_all(f"----- ranks restarted: {why} -----")
            print(f"notebook_launch: the ranks were restarted because {why}; their state (models, "
                  f"variables, process group) is lost: this call runs on fresh ranks.", file=OUT, flush=True)
            self.start()
            events = self._pause_idle()
        return events

    def stop(self, graceful: bool) -> None:
        """End every rank process and what they started, and close the pool's fds (each once).
        The between-calls reader reads until the ranks are gone, so the logs get their last lines."""
        if not graceful:
            self._stop_idle()
        self.selector.close()   # before the transport closes the fds it holds
        self.transport.stop(graceful, before_kill=self._stop_idle)
        memory, self.memory = self.memory, None   # fresh ranks get a fresh sampler
        if memory is not None:
            memory.resources.close()

    def first_start(self, abandon: Callable[[], object]) -> None:
        """The pool's start. One stopped part way (an interrupt once ranks run, an error) ends what
        it started before it raises (then ``abandon``, the pool's finalizer, for whatever is left):
        the pool is never handed out, and its finalizer alone would wait for the traceback to go,
        which a notebook keeps (``sys.last_traceback``), the ranks running meanwhile."""
        try:
            self.start()
        except BaseException:
            try:
                with best_effort("ending the ranks of a start that failed part way"):
                    self.end_failed_start()
            finally:
                abandon()
            raise

    def end_failed_start(self) -> None:
        """A start stopped part way: end what it started at once (no grace: nothing of theirs
        ran yet) and close the run folder."""
        try:
            self.stop(graceful=False)
        finally:
            if self._cells is not None:
                self._cells.close()
            if self.logs is not None:
                self.logs.close()

    def close(self) -> None:
        """``Ranks.close()``: STOP the ranks (a grace, then SIGKILL), and close the run folder."""
        self.stop(graceful=True)
        if self._cells is not None:
            self._cells.close()
        if self.logs is not None:
            self.logs.close()
