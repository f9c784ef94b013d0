"""The launcher interface: every way of starting ranks (fork, spawn, xla, elastic's
attempts, Ray) is one ``Launcher`` with ``start(plan, job, channels) -> processes``, as
Lightning Fabric's ``strategies/launchers`` are.

A launcher knows only how to start processes. Everything a rank does once it runs
(environment, output capture, reporting) is ``rank.bootstrap`` and ``rank.runner``;
watching the ranks is the supervisor's job; restarting a run is ``restarts``. So a new
way of starting ranks is one small module. Its caller always does the same:

    channels = launcher.open_channels(plan)
    try:
        processes = launcher.start(plan, job, channels)
        ... supervise(processes, channels) ...
    finally:
        close every channel; launcher.end()

(``run.supervise_ranks``; elastic's agent does it per attempt, persistent ranks per pool.)

A start that waits (Ray placing its gang, SLURM's queue) draws nothing itself: it tells its
``StartWatch`` what it waits for (and news the cell says once, such as a queued job's id and why
it waits) and where each rank landed, and ticks it on every turn of the wait; the caller's watch
draws the panel and ends the wait on Stop (by raising). A start that fails before any rank ran
raises ``StartFailed``, which the caller, who holds the run, makes the run's ``LaunchError``. So
a launcher reads no run state and imports neither the supervisor nor a display
(tests/test_import_graph.py).
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Callable, Sequence

from ..channels import RankPipes, RankProcess
from ..notebook.notebook_streams import ERR, OUT
from ..process import leftovers
from ..wire.protocol import FailureKind

if TYPE_CHECKING:
    from ..wire.plan import LaunchPlan, RankSpec
    from ..rank.runner import Job

__all__ = ["Launcher", "StartFailed", "StartWatch", "start_all", "start_each"]


class StartWatch:
    """Who sees a start that waits (see the module). This one shows nothing and never stops a
    start: a start nobody watches (persistent ranks starting, before any cell's panel)."""

    def waiting_for(self, text: str) -> None:
        """What every rank waits for now (``"waiting for Ray to place 4 ranks ..."``)."""

    def announce(self, text: str) -> None:
        """News of the start a user may act on, said once in the cell beside the rows' line
        (``"SLURM job 12 pending (Resources); Stop or Ctrl-C cancels it"``, then where it runs)."""

    def placed(self, rank: int, node_rank: int, address: str) -> None:
        """Rank ``rank`` (global) was placed on node ``node_rank``, at ``address``."""

    def phase(self, text: str) -> None:
        """What the start does now for every rank, while it takes seconds ("importing torch")."""

    def tick(self) -> None:
        """Called on every turn of a wait; raises to end the start (KeyboardInterrupt on Stop)."""


class StartFailed(Exception):
    """A start that failed before any rank ran (a cluster that could not place the ranks, an
    actor that could not start, ranks that could not connect back): what happened, with the rank
    it concerns. A launcher has no run to fail: its caller makes this the run's LaunchError
    (``supervise.outcome.cluster_error``), with the run's log folder and results."""

    def __init__(self, text: str, *, rank: int | None = None, kind: str = FailureKind.RENDEZVOUS) -> None:
        super().__init__(text)
        self.text, self.rank, self.kind = text, rank, kind


class Launcher(abc.ABC):
    """Starts the ranks of a plan. Subclasses set ``name`` and implement ``start``."""

    name = "base"
    start_watch = StartWatch()   # who sees a start that waits; the caller sets its own (watch_start)
    # seconds of timeout= the last start used (SLURM's: the job's wait in the queue, then its start),
    # and the words the timeout's error says it with ("(20 s of it pending in SLURM's queue, ...)")
    timeout_spent = 0.0
    timeout_note = ""

    def watch_start(self, watch: StartWatch) -> None:
        """Who sees this launcher's next starts wait (the run's panel, and its Stop button)."""
        self.start_watch = watch

    def prepare_parent(self) -> None:  # noqa: B027  (a hook: most launchers need nothing here)
        """Work to do once in the parent before the run's display starts (e.g. warm imports)."""

    def open_channels(self, plan: "LaunchPlan") -> list[RankPipes]:
        """The channels of this node's ranks, before they start: one ``RankPipes`` per local
        rank (opened one by one: if one fails, those opened so far are closed). A launcher
        whose ranks connect back (Ray) returns an empty list that ``start`` fills."""
        channels: list[RankPipes] = []
        try:
            for _ in plan.ranks:
                channels.append(RankPipes.open())
        except BaseException:
            for pipes in channels:
                pipes.close_all()
            raise
        return channels

    @abc.abstractmethod
    def start(self, plan: "LaunchPlan", job: "Job", channels: list[RankPipes]) -> list[RankProcess]:
        """Start the processes of ``plan.ranks`` (usually one per rank) running ``rank.runner.run_rank``.

        ``job`` is the ``rank.runner.Job`` (function, args, kwargs); ``channels`` the
        ``RankPipes`` of each local rank, from ``open_channels``. Returns a list of RankProcess in
        local-rank order (each covering ``local_ranks`` when it carries several). A launcher
        closes the child ends in the parent, and leaves nothing started when it raises.
        """

    def end(self) -> None:  # noqa: B027  (a hook: only a launcher that makes more than processes)
        """Once the ranks of ``start`` ended and were released: let go of what else it made
        (Ray: the actors and their placement group). Called whatever happened."""



def start_each(plan: "LaunchPlan", pipes_by_rank: Sequence[RankPipes],
               start_one: Callable[["RankSpec", RankPipes], RankProcess]) -> list[RankProcess]:
    """Start one process per rank with ``start_one``, closing each rank's child ends in the
    parent once it runs. If any start fails, the ranks started so far are killed, reaped
    and released before the error propagates: no half-started run survives."""
    def start(processes: list[RankProcess]) -> None:
        for spec in plan.ranks:
            pipes = pipes_by_rank[spec.local_rank]
            processes.append(start_one(spec, pipes))
            # The parent keeps the event pipe's write end until the rank exits: a function that
            # closes every fd (os.closerange) then gets no EOF here, and the rank can reopen the
            # pipe through /proc (protocol.EventWriter) to still send its result or error.
            pipes.close_child_ends(keep=(pipes.events_w,))
    return _start_guarded(plan, pipes_by_rank, start)


def start_all(plan: "LaunchPlan", pipes_by_rank: Sequence[RankPipes],
              start: Callable[[Sequence["RankSpec"]], list[RankProcess]]) -> list[RankProcess]:
    """As ``start_each``, for a launcher that starts every rank in one go (``start(plan.ranks)``,
    which leaves nothing started when it raises; the fork helper's one turn): the child ends are
    closed in the parent once all run."""
    def start_them(processes: list[RankProcess]) -> None:
        processes += start(plan.ranks)
        for spec in plan.ranks:
            pipes = pipes_by_rank[spec.local_rank]
            pipes.close_child_ends(keep=(pipes.events_w,))   # the event pipe's, as start_each says
    return _start_guarded(plan, pipes_by_rank, start_them)


def _start_guarded(plan: "LaunchPlan", pipes_by_rank: Sequence[RankPipes],
                   start: Callable[[list[RankProcess]], None]) -> list[RankProcess]:
    """``start(processes)``, which appends each rank's process as it starts; then the notebook's
    keeper is told of them. Whatever fails, what started is killed, reaped and released."""
    OUT.flush()   # what the notebook printed shows before the ranks' lines
    ERR.flush()
    processes: list[RankProcess] = []
    try:
        start(processes)
        runs: dict[str, list[int]] = {}
        for spec, process in zip(plan.ranks, processes):
            runs.setdefault(spec.env.get(leftovers.RUN_MARK, ""), []).append(process.pid)
        # If the notebook dies before the run is swept, its keeper ends what the ranks started:
        # told once all are forked (a rank dies with the notebook, and in the milliseconds of the
        # forks it has started nothing of its own), one order for all (one wakeup of the keeper)
        for run_id, pids in runs.items():
            leftovers.guard(run_id, *pids)
    except BaseException:
        end_started(processes)
        raise
    return processes


def end_started(processes: Sequence[RankProcess]) -> None:
    """Kill, reap and release ranks that no supervisor holds: a start that failed part way, or a
    run whose supervisor could not be set up (an interrupt then). Nothing a half-started run
    started survives it."""
    for process in processes:
        process.kill()
        process.wait()
        process.release()
