"""The one scaffold around every run, single-node, elastic and Ray alike: the launcher's
parent-side preparation, the run folder and its logs, the run state, the display,
the launch line, signal handlers (saved and restored exactly), and the final status.

Every run is given one settings object, the launch's ``LaunchOptions``. ``run_plan`` is
a single-node launch on it (``supervise_ranks``: the launcher interface's one start,
supervised); ``elastic.run_elastic`` puts torch elastic's agent inside the same scaffold,
and ``run_ray`` a Ray launcher with its restarts.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from .backends import get_backend
from .backends.base import Launcher
from .channels import RankPipes
from .display import choose_display
from .detect.platform import in_ipython_kernel
from .display.base import Display
from .display.display_relay import RankDisplays
from .errors import LaunchError
from .logs import RunLogs
from .options import LaunchOptions
from .plan import LaunchPlan
from .signal_handlers import restore_signal_handlers, save_signal_handlers
from .rank.runner import Job
from .state import DONE, FAILED, STOPPED, RankState, RunState
from .supervise.outcome import error_summary
from .supervise import interrupts
from .supervise.supervisor import Supervisor

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


def run_plan(plan: LaunchPlan, job: Job, options: LaunchOptions, *, run_id: str,
             platform: str | None = None) -> list[Any]:
    """Start the plan's ranks and supervise them until results or one clear error."""
    return run_with_scaffold(plan, lambda ctx: supervise_ranks(ctx, job), options, run_id=run_id,
                             platform=platform)


def supervise_ranks(ctx: RunContext, job: Job, launcher: Launcher | None = None) -> list[Any]:
    """One start of the plan's ranks through the launcher interface, supervised to its end:
    open the channels, ``start``, the supervisor's loop; whatever happens, every channel is
    closed and the launcher's ``end`` runs. A launch runs it once, Ray once per attempt."""
    launcher = launcher or ctx.launcher
    options = ctx.options
    channels: list[RankPipes] = []
    try:
        channels = launcher.open_channels(ctx.plan)
        processes = launcher.start(ctx.plan, job, channels)
        return Supervisor(processes, channels, ctx.state, ctx.display, ctx.logs,
                          timeout=options.timeout, poll_interval=options.poll_interval,
                          rank_displays=ctx.rank_displays, stall_after=options.stall_after).run()
    finally:
        try:
            for pipes in channels:
                pipes.close_all()
        finally:
            launcher.end()


def run_with_scaffold(plan: LaunchPlan, body: Callable[[RunContext], T], options: LaunchOptions, *,
                      run_id: str, platform: str | None = None, launcher: Launcher | None = None,
                      backend_suffix: str = "", extra_lines: tuple[str, ...] = ()) -> T:
    """Set up the run around ``body`` and tear it down whatever happens; ``body``
    returns this node's results or raises LaunchError / KeyboardInterrupt. ``launcher``:
    the way its ranks start (default: the one for ``plan.start_method``)."""
    launcher = launcher or get_backend(plan.start_method)
    launcher.prepare_parent()
    logs = RunLogs(run_id, [r.local_rank for r in plan.ranks], [r.global_rank for r in plan.ranks],
                   options.log_dir)
    state = RunState(run_id=run_id, world_size=plan.world_size, backend=launcher.name + backend_suffix,
                     log_dir=str(logs.path), node_rank=plan.node_rank, num_nodes=plan.num_nodes,
                     max_restarts=options.max_restarts,
                     ranks=[RankState(rank=r.global_rank, local_rank=r.local_rank, device=r.device)
                            for r in plan.ranks])
    display = choose_display(options.ui, line_prefix=options.line_prefix, lines_per_second=options.lines_per_second)
    print("\n".join((launch_summary(plan, state.backend, logs.path, platform=platform, display=display.name),
                     *(f"notebook_launch: {note}" for note in logs.notes), *extra_lines)), flush=True)
    rank_displays = RankDisplays(options.display_ranks, run_id) if in_ipython_kernel() else None
    with presenting(state, display, logs, rank_displays):
        try:
            results = body(RunContext(plan, launcher, logs, state, display, options, rank_displays))
        except LaunchError as error:
            state.finish(FAILED, error_summary(error))
            raise
        state.finish(DONE, f"{plan.num_processes} ranks finished in {state.elapsed:.1f} s")
        return results


@contextlib.contextmanager
def presenting(state: RunState, display: Display, logs: RunLogs,
               rank_displays: RankDisplays | None = None) -> Iterator[None]:
    """What every run does around its ranks: interrupts reach us as KeyboardInterrupt, the
    display starts and always closes with the final state, the ranks' display() outputs get
    their final content, the logs close, and the notebook gets its signal handlers back
    exactly as they were."""
    saved = save_signal_handlers()
    try:
        with interrupts.guarding_run():   # a second Ctrl-C cannot cut the teardown short
            try:
                display.start(state)
                yield
            finally:
                with interrupts.tearing_down():
                    if state.ended_at is None:
                        state.finish(STOPPED, "interrupted")
                    try:
                        if rank_displays is not None:
                            rank_displays.close()
                        display.close(state)
                    finally:
                        logs.close()
    finally:
        restore_signal_handlers(saved)


def launch_summary(plan: LaunchPlan, backend_name: str, log_path: str | Path, platform: str | None = None,
                   display: str | None = None) -> str:
    """One line that says what the launcher chose and why it matters: where, on what, how."""
    what = {"cpu": "CPU", "cuda": "CUDA GPU", "xla": "XLA"}[plan.device_kind]
    nodes = f" on node {plan.node_rank} of {plan.num_nodes}" if plan.num_nodes > 1 else ""
    where = f" on {platform}" if platform else ""
    shown = f", display {display}" if display else ""
    port = f", port {plan.master_port}" if plan.master_port else ""   # 0: chosen on rank 0's node (Ray)
    line = (f"notebook_launch: {plan.num_processes} rank{'s' if plan.num_processes != 1 else ''}{where} "
            f"({what}, {plan.dist_backend}, {backend_name}){nodes}{port}{shown}; "
            f"logs: {log_path}")
    for note in plan.notes:
        line += f"\nnotebook_launch: {note}"
    return line
