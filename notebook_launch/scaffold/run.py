"""The one scaffold around every run, single-node, elastic and Ray alike: the launcher's
parent-side preparation, then one ``session.Session`` (the run folder and its logs, the run
state, the display, the launch line, signal handlers saved and restored exactly, and the
final status) around the body.

Every run is given one settings object, the launch's ``LaunchOptions``. ``run_plan`` is
a single-node launch on it (``supervise_ranks``: the launcher interface's one start,
supervised); ``elastic.run_elastic`` puts torch elastic's agent inside the same scaffold,
and ``ray.run`` and ``slurm.run`` a cluster's launcher with its restarts (``supervise_attempts``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from . import restarts
from ..engines.base import Launcher, StartFailed, StartWatch, end_started
from ..channels import RankPipes
from ..display.base import Display
from ..display.display_relay import RankDisplays
from ..display.words import counted
from ..errors import LaunchError
from ..record.logs import RunLogs
from ..notebook.notebook_streams import OUT
from ..planning.options import LaunchOptions
from ..wire.plan import LaunchPlan
from ..wire.protocol import Failure
from ..rank.runner import Job
from .session import Session, launch_summary
from ..record.state import RunState
from ..supervise import outcome
from ..supervise.supervisor import Supervisor

__all__ = ["PanelStartWatch", "RunContext", "launch_summary", "run_plan", "run_with_scaffold", "supervise_attempts",
           "supervise_ranks"]

T = TypeVar("T")


@dataclass
class RunContext:
    """What a run's body works with."""
    plan: LaunchPlan
    launcher: Launcher
    logs: RunLogs
    state: RunState
    display: Display
    options: LaunchOptions
    rank_displays: RankDisplays | None = None   # the ranks' display() calls, in a Jupyter kernel


def run_plan(plan: LaunchPlan, job: Job, options: LaunchOptions, *, run_id: str, launcher: Launcher,
             platform: str | None = None) -> list[Any]:
    """Start the plan's ranks with ``launcher`` (the engine's) and supervise them until results or
    one clear error."""
    return run_with_scaffold(plan, lambda ctx: supervise_ranks(ctx, job), options, run_id=run_id,
                             platform=platform, launcher=launcher)


def supervise_ranks(ctx: RunContext, job: Job, launcher: Launcher | None = None) -> list[Any]:
    """One start of the plan's ranks through the launcher interface, supervised to its end:
    open the channels, ``start`` (a start that waits shows on the panel, ``PanelStartWatch``;
    one that fails is the run's LaunchError), the supervisor's loop; whatever happens, every
    channel is closed and the launcher's ``end`` runs. A launch runs it once, Ray once per attempt."""
    launcher = launcher or ctx.launcher
    options = ctx.options
    channels: list[RankPipes] = []
    launcher.watch_start(PanelStartWatch(ctx.state, ctx.display))
    try:
        channels = launcher.open_channels(ctx.plan)
        try:
            processes = launcher.start(ctx.plan, job, channels)
        except StartFailed as failed:
            raise outcome.cluster_error(failed.text, ctx.state, rank=failed.rank, kind=failed.kind) from None
        try:
            supervisor = Supervisor(processes, channels, ctx.state, ctx.display, ctx.logs,
                                    timeout=options.timeout, poll_interval=options.poll_interval,
                                    rank_displays=ctx.rank_displays, stall_after=options.stall_after)
            supervisor.timeout_spent, supervisor.timeout_note = launcher.timeout_spent, launcher.timeout_note
        except BaseException:   # an interrupt (or an error) before the supervisor holds the ranks
            end_started(processes)
            raise
        return supervisor.run()
    finally:
        try:
            for pipes in channels:
                pipes.close_all()
        finally:
            launcher.end()


def supervise_attempts(ctx: RunContext, job: Job,
                       why_not_again: Callable[[LaunchError], str | None] | None = None) -> list[Any]:
    """A cluster's launch (Ray, SLURM): ``supervise_ranks`` once per attempt, every rank started
    again after a failure the restart rule allows (``restarts.run_attempts``), up to
    ``max_restarts`` times. Each restart is said in the cell ("restart N of M", as elastic's agent
    says it) and gives the panel a fresh attempt's rows; the final error says which attempt failed.
    ``why_not_again(error)``: the launcher's reason the failed attempt cannot be followed by
    another (a SLURM job the scheduler ended), added to the error; None lets it restart."""
    plan, max_restarts = ctx.plan, ctx.options.max_restarts

    def attempt(number: int) -> list[Any]:
        if number:
            ctx.state.begin_attempt(number, node_rank=0, num_nodes=1, world_size=plan.world_size, ranks=plan.ranks)
        return supervise_ranks(ctx, job)

    def before_restart(error: LaunchError, number: int) -> None:
        print(outcome.restart_notice(failure_of(error), number, max_restarts, False), file=OUT, flush=True)

    def may_restart(error: LaunchError) -> bool:
        reason = why_not_again(error) if why_not_again is not None else None
        if reason:
            outcome.with_note(error, reason)
        return not reason

    return restarts.run_attempts(
        attempt, max_restarts, before_restart,
        last_error=lambda error, number: outcome.with_attempts(error, number, max_restarts), may_restart=may_restart)


def failure_of(error: LaunchError) -> Failure:
    """The failure record a restart notice names, from the attempt's LaunchError."""
    headline = str(error).splitlines()[0].split(" failed: ", 1)[-1]
    return Failure(None, error.kind, headline, rank=error.rank)


class PanelStartWatch(StartWatch):
    """A start that waits, on the run's panel: what it waits for and where each rank landed in
    the ranks' rows, its news in the cell, the panel kept live on every tick, and Stop honoured
    while it waits."""

    def __init__(self, state: RunState, display: Display) -> None:
        self.state, self.display = state, display

    def waiting_for(self, text: str) -> None:
        for rank_state in self.state.ranks:
            self.state.on_line(rank_state.local_rank, "stdout", text)

    def announce(self, text: str) -> None:
        print(f"notebook_launch: {text}", file=OUT, flush=True)

    def placed(self, rank: int, node_rank: int, address: str) -> None:
        self.state.on_placed(rank, node_rank, address)

    def phase(self, text: str) -> None:
        self.state.on_phase(None, text)
        self.display.refresh(self.state)

    def tick(self) -> None:
        self.display.refresh(self.state)
        if self.state.stop_requested:
            raise KeyboardInterrupt("notebook_launch: run stopped with the Stop button")


def run_with_scaffold(plan: LaunchPlan, body: Callable[[RunContext], T], options: LaunchOptions, *,
                      run_id: str, launcher: Launcher, platform: str | None = None,
                      backend_suffix: str = "", extra_lines: tuple[str, ...] = ()) -> T:
    """Set up the run around ``body`` and tear it down whatever happens (one
    ``session.Session``); ``body`` returns this node's results or raises LaunchError /
    KeyboardInterrupt. ``launcher``: the way its ranks start (its engine's)."""
    launcher.prepare_parent()
    with Session.for_launch(plan, options, run_id=run_id, backend=launcher.name + backend_suffix,
                            platform=platform, extra_lines=extra_lines) as session:
        results = body(RunContext(plan, launcher, session.logs, session.state, session.display, options,
                                  session.rank_displays))
        session.finish(f"{counted(plan.num_processes, 'rank')} finished in {session.state.elapsed:.1f} s")
        return results
