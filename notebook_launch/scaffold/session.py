"""One session: what every supervised stretch of ranks has around it, a launch (``run``)
and each call on persistent ranks (``persistent.pool``) alike: the logs it writes to, the
run state, the display and the ranks' display() outputs, the notebook's signal handlers
saved and put back exactly, interrupts guarded while it ends, and its finish.

    session = Session.for_launch(plan, options, run_id=run_id, backend="fork")   # prints the launch line
    with session:
        results = supervise(session.state, session.display, session.logs, ...)
        session.finish(f"{counted(len(results), 'rank')} finished")

Inside the ``with``: the first interrupt raises KeyboardInterrupt, a second one cannot cut
the teardown short. Leaving it, whatever happens: a LaunchError finishes the state FAILED
(its first line), anything else that ends it unfinished STOPPED ("interrupted"); the
display closes once with that final state, the ranks' display() outputs get their final
content, the logs close (a call's section: flushed) and the signal handlers are the
notebook's again.

The pieces a pool needs for its start, which has no session of its own (its calls do):
``open_logs`` and ``launch_line``.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Iterator, Sequence, TypeVar

from ..detect.platform import in_ipython_kernel
from ..display import choose_display
from ..display.display_relay import RankDisplays
from ..errors import LaunchError
from ..record.logs import LogSection, LogWriter, RunLogs
from ..notebook.notebook_streams import OUT
from .signal_handlers import restore_signal_handlers, save_signal_handlers
from ..record.state import DONE, FAILED, RUNNING, STARTING, STOPPED, RankState, RunState
from ..supervise import interrupts
from ..supervise.outcome import error_summary, stop_cause

if TYPE_CHECKING:
    from ..channels import RankProcess
    from ..display.base import Display
    from ..planning.options import LaunchOptions
    from ..wire.plan import LaunchPlan

__all__ = ["Session", "launch_line", "launch_summary", "open_logs", "plan_state"]

W = TypeVar("W", bound=LogWriter)


class Session(Generic[W]):
    """A run state shown on a display and written to logs, from ``with`` to its end (see the
    module). ``logs``: a launch's ``RunLogs``, or a call's ``LogSection``. ``display_ranks``:
    the global ranks whose display() calls the cell re-publishes (None: every rank), in a
    Jupyter kernel only. Used once: one launch, or one call."""

    def __init__(self, state: RunState, logs: W, display: Display,
                 display_ranks: frozenset[int] | None = None) -> None:
        self.state = state
        self.logs = logs
        self.display = display
        self.rank_displays = RankDisplays(display_ranks, state.run_id) if in_ipython_kernel() else None
        self._presenting: contextlib.AbstractContextManager[None] | None = None
        self._ended_by: BaseException | None = None   # what ended the session unfinished, for its summary

    @classmethod
    def for_launch(cls, plan: LaunchPlan, options: LaunchOptions, *, run_id: str, backend: str,
                   platform: str | None = None, extra_lines: Sequence[str] = ()) -> Session[RunLogs]:
        """A launch's session: its run folder and state, the display ``options`` ask for (or
        the caller's own, ``ui=`` a ``Display``), and the launch line printed (what was chosen,
        where the logs are)."""
        logs = open_logs(plan, run_id, options)
        try:
            state = plan_state(plan, run_id, backend, logs.path, max_restarts=options.max_restarts)
            display = choose_display(options.ui, line_prefix=options.line_prefix,
                                     lines_per_second=options.lines_per_second, cell_output=options.cell_output)
            print(launch_line(plan, backend, logs, display=display.name, platform=platform,
                              extra_lines=extra_lines), file=OUT, flush=True)
            return Session(state, logs, display, options.display_ranks)
        except BaseException:
            logs.close()   # no session owns them yet
            raise

    @classmethod
    def for_call(cls, logs: RunLogs, title: str, state: RunState, options: LaunchOptions, *,
                 quiet: bool = False, lines_per_second: int | None = None) -> Session[LogSection]:
        """One call on persistent ranks: its section of the pool's logs (under ``title``) and a
        display of its own (``quiet``: none, only an error if one comes)."""
        display = choose_display("none" if quiet else options.ui, line_prefix=options.line_prefix,
                                 lines_per_second=lines_per_second, call=True, cell_output=options.cell_output)
        return Session(state, logs.section(title), display, options.display_ranks)

    # --- the finish -------------------------------------------------------------------------
    def finish(self, summary: str) -> None:
        """The ranks did what was asked: DONE, with ``summary`` as the display's last line."""
        if self.state.ended_at is None:
            self.state.finish(DONE, summary)

    def fail(self, error: LaunchError) -> None:
        """FAILED, with the error's first line (once: the first failure is the one shown); a run
        the user stopped (Stop or an interrupt on a stalled run: ``kind`` "stopped") is STOPPED,
        as any interrupted run is, its first line saying where the ranks were."""
        if self.state.ended_at is None:
            self.state.finish(STOPPED if error.kind == "stopped" else FAILED, error_summary(error))

    # --- the with block ---------------------------------------------------------------------
    def __enter__(self) -> Session[W]:
        if self._presenting is not None:
            raise RuntimeError("a Session is used once: one launch, or one call")
        self._presenting = self._presented()
        self._presenting.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> bool | None:
        assert self._presenting is not None, "__exit__ without __enter__"
        return self._presenting.__exit__(kind, error, traceback)

    @contextlib.contextmanager
    def _presented(self) -> Iterator[None]:
        """The display starts and always closes with the final state; teardown runs with
        interrupts counted, not raised (``supervise.interrupts``); the handlers come back."""
        saved = save_signal_handlers()
        try:
            with interrupts.guarding_run():   # a second Ctrl-C cannot cut the teardown short
                try:
                    self.display.start(self.state)
                    yield
                except LaunchError as error:
                    self.fail(error)
                    raise
                except BaseException as error:   # an interrupt, or the notebook's own exception
                    self._ended_by = error
                    raise
                finally:
                    with interrupts.tearing_down():
                        self._end()
        finally:
            restore_signal_handlers(saved)

    def _end(self) -> None:
        if self.state.ended_at is None:   # "stopped after TimeoutError raised in the notebook", not "interrupted"
            cause = self._ended_by
            self.state.finish(STOPPED, "interrupted" if cause is None or isinstance(cause, KeyboardInterrupt)
                              else f"stopped after {stop_cause(cause)}")
        try:
            if self.rank_displays is not None:
                self.rank_displays.close()
            self.display.close(self.state)
        finally:
            self.logs.close()


def open_logs(plan: LaunchPlan, run_id: str, options: LaunchOptions) -> RunLogs:
    """The run folder of ``plan``'s ranks: a file per rank (``options.log_dir``, else a new
    folder in the default root)."""
    return RunLogs(run_id, [r.local_rank for r in plan.ranks], [r.global_rank for r in plan.ranks],
                   options.log_dir)


def plan_state(plan: LaunchPlan, run_id: str, backend: str, log_dir: str | Path, *, max_restarts: int = 0,
               processes: Sequence[RankProcess] | None = None) -> RunState:
    """The run state of ``plan``'s ranks; ``processes``: ranks already running (a call on
    persistent ranks), whose pids the rows show from the start."""
    pids: Sequence[int | None] = [p.pid for p in processes] if processes is not None else [None] * len(plan.ranks)
    return RunState(run_id=run_id, world_size=plan.world_size, backend=backend, log_dir=str(log_dir),
                    node_rank=plan.node_rank, num_nodes=plan.num_nodes, max_restarts=max_restarts,
                    ranks=[RankState(rank=r.global_rank, local_rank=r.local_rank, device=r.device, pid=pid,
                                     status=STARTING if processes is None else RUNNING)
                           for r, pid in zip(plan.ranks, pids)])


def launch_line(plan: LaunchPlan, backend: str, logs: RunLogs, *, display: str | None = None,
                platform: str | None = None, extra_lines: Sequence[str] = ()) -> str:
    """What a launch (or a pool's start) prints first: ``launch_summary``, then where the logs
    went if not where expected (``logs.notes``), then the caller's own lines."""
    return "\n".join((launch_summary(plan, backend, logs.path, platform=platform, display=display),
                      *(f"notebook_launch: {note}" for note in logs.notes), *extra_lines))


def launch_summary(plan: LaunchPlan, backend_name: str, log_path: str | Path, platform: str | None = None,
                   display: str | None = None) -> str:
    """One line that says what the launcher chose and why it matters: where, on what, how; after
    the plan's notes, which explain a choice it shows (a busy default port replaced)."""
    what = {"cpu": "CPU", "cuda": "CUDA GPU", "xla": "XLA", "tpu": "TPU (TorchTPU)"}[plan.device_kind]
    nodes = f" on node {plan.node_rank} of {plan.num_nodes}" if plan.num_nodes > 1 else ""
    where = f" on {platform}" if platform else ""
    shown = f", display {display}" if display else ""
    port = f", port {plan.master_port}" if plan.master_port else ""   # 0: chosen on rank 0's node (Ray)
    line = (f"notebook_launch: {plan.num_processes} rank{'s' if plan.num_processes != 1 else ''}{where} "
            f"({what}, {plan.dist_backend}, {backend_name}){nodes}{port}{shown}; "
            f"logs: {log_path}")
    # the plan's notes first: they say why the line reads as it does ("port 29500 is held by pid 4242
    # (...); using port 29501 instead")
    return "".join(f"notebook_launch: {note}\n" for note in plan.notes) + line
