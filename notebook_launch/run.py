"""The one scaffold around every run, single-node and elastic alike: the backend's
parent-side preparation, the run folder and its logs, the run state, the display,
the launch line, signal handlers (saved and restored exactly), and the final status.

``run_plan`` is a single-node launch on it; ``elastic.run_elastic`` puts torch
elastic's agent inside the same scaffold.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from .backends import get_backend
from .backends.base import Backend, RankPipes
from .display import choose_display
from .detect.platform import in_ipython_kernel
from .display.base import Display
from .display.rank_displays import RankDisplays
from .errors import LaunchError
from .logs import RunLogs
from .plan import LaunchPlan
from .rank.runner import Job
from .state import DONE, FAILED, STOPPED, RankState, RunState
from .supervise.outcome import error_summary
from .supervise import interrupts
from .supervise.supervisor import Supervisor

_SAVED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD")
T = TypeVar("T")


@dataclass
class RunContext:
    """What a run's body works with."""
    plan: LaunchPlan
    backend: Backend
    logs: RunLogs
    state: RunState
    display: Display
    rank_displays: RankDisplays | None = None   # the ranks' display() calls, in a Jupyter kernel


def run_plan(plan: LaunchPlan, job: Job, *, run_id: str, log_dir: Any = None, ui: str = "auto",
             timeout: float | None = None, poll_interval: float = 0.1, line_prefix: str | None = None,
             platform: str | None = None, display_ranks: frozenset[int] | None = frozenset({0}),
             stall_after: float | None = None) -> list[Any]:
    """Start the plan's ranks and supervise them until results or one clear error."""
    def body(ctx: RunContext) -> list[Any]:
        pipes: list[RankPipes] = []
        try:
            for _ in plan.ranks:   # one by one: a failure midway still closes those opened
                pipes.append(RankPipes.open())
            processes = ctx.backend.start(plan, job, pipes)
            return Supervisor(processes, pipes, ctx.state, ctx.display, ctx.logs,
                              timeout=timeout, poll_interval=poll_interval, rank_displays=ctx.rank_displays,
                              stall_after=stall_after).run()
        finally:
            for p in pipes:
                p.close_parent_ends()
                p.close_child_ends()

    return run_with_scaffold(plan, body, run_id=run_id, log_dir=log_dir, ui=ui, line_prefix=line_prefix,
                             platform=platform, display_ranks=display_ranks)


def run_with_scaffold(plan: LaunchPlan, body: Callable[[RunContext], T], *, run_id: str, log_dir: Any,
                      ui: str, line_prefix: str | None, platform: str | None = None,
                      backend_suffix: str = "", max_restarts: int = 0, extra_lines: tuple[str, ...] = (),
                      display_ranks: frozenset[int] | None = frozenset({0})) -> T:
    """Set up the run around ``body`` and tear it down whatever happens; ``body``
    returns this node's results or raises LaunchError / KeyboardInterrupt."""
    backend = get_backend(plan.start_method)
    backend.prepare_parent()
    logs = RunLogs(run_id, [r.local_rank for r in plan.ranks], [r.global_rank for r in plan.ranks], log_dir)
    state = RunState(run_id=run_id, world_size=plan.world_size, backend=backend.name + backend_suffix,
                     log_dir=str(logs.path), node_rank=plan.node_rank, num_nodes=plan.num_nodes,
                     max_restarts=max_restarts,
                     ranks=[RankState(rank=r.global_rank, local_rank=r.local_rank, device=r.device)
                            for r in plan.ranks])
    display = choose_display(ui, line_prefix=line_prefix)
    print("\n".join((launch_summary(plan, state.backend, logs.path, platform=platform, display=display.name),
                     *(f"notebook_launch: {note}" for note in logs.notes), *extra_lines)), flush=True)
    rank_displays = RankDisplays(display_ranks, run_id) if in_ipython_kernel() else None
    with presenting(state, display, logs, rank_displays):
        try:
            results = body(RunContext(plan, backend, logs, state, display, rank_displays))
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
    saved = _save_signal_handlers()
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
        _restore_signal_handlers(saved)


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


def _save_signal_handlers() -> dict[str, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {name: signal.getsignal(getattr(signal, name)) for name in _SAVED_SIGNALS
            if hasattr(signal, name)}


def _restore_signal_handlers(saved: dict[str, Any]) -> None:
    for name, handler in saved.items():
        if handler is not None:
            signal.signal(getattr(signal, name), handler)
