"""Persistent ranks, the notebook side: ``start_ranks`` forks the ranks once (same plan,
preflight checks, environment and bootstrap as ``notebook_launcher``), and each
``run``/``push``/``pull``/``%%ranks`` cell is one call supervised on the same processes,
with the same display, LaunchError texts and run folder (one folder per pool, one log
section per call).

What a failure leaves: a Python exception or a timeout interrupts the other ranks and
they stay alive with their state; a rank that dies, ranks that do not come back from an
interrupt, or a second interrupt stop every rank, and the next call starts fresh ones
(saying so). ``close()``, ``%ranks stop``, the interpreter's exit and the kernel's death
(PDEATHSIG, as for every forked rank) leave no process behind.
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..backends import get_backend
from ..backends.base import RankPipes, RankProcess
from ..detect.platform import in_ipython_kernel
from ..display import choose_display
from ..display.rank_displays import RankDisplays
from ..errors import GuardError, LaunchArgumentError, LaunchError
from ..launcher import plan_launch
from ..logs import RunLogs
from ..options import (
    DEFAULT_USE_PORT,
    LaunchOptions,
    check_display_ranks_exist,
    launch_options,
    validate_args,
    validate_function,
    validate_timeout,
)
from ..plan import LaunchPlan
from ..preflight import check_not_inside_rank
from ..rank.runner import Job
from ..run import launch_summary, presenting
from ..state import DONE, FAILED, RUNNING, RankState, RunState
from ..supervise import outcome
from ..supervise.outcome import error_summary
from . import commands, namespace
from .call import CallSupervisor, LogSection
from .serve import Call, serve_calls

log = logging.getLogger("notebook_launch")
DEFAULT_GRACE = 3.0    # seconds interrupted ranks have to come back
STOP_GRACE = 2.0       # seconds ranks have to end after STOP before SIGKILL
BACKEND_NAME = "fork, persistent"
T = TypeVar("T")


def _trimmed(method: Callable[..., T]) -> Callable[..., T]:
    """Our errors show one frame, not the supervisor's internals (as notebook_launcher's)."""
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        __tracebackhide__ = True
        try:
            return method(*args, **kwargs)
        except (LaunchError, GuardError, LaunchArgumentError, KeyboardInterrupt) as err:
            raise err.with_traceback(None) from None
    return wrapper


@_trimmed
def start_ranks(num_processes: int | None = None, mixed_precision: str = "no",
                use_port: int | str = DEFAULT_USE_PORT, master_addr: str = "127.0.0.1", *,
                start_method: str | None = None, timeout: float | None = None,
                log_dir: str | os.PathLike[str] | None = None, ui: str = "auto",
                log_line_prefix_template: str | None = None,
                interrupt_grace: float = DEFAULT_GRACE,
                display_ranks: int | Iterable[int] | str | None = None) -> Ranks:
    """Fork ``num_processes`` ranks now and keep them: each ``run()`` then calls a function
    on the same processes, whose namespace (models, data, an initialized process group)
    lives on between calls. Options mean what they mean for ``notebook_launcher``;
    ``timeout`` is the default for each call; ``interrupt_grace`` the seconds interrupted
    ranks have to come back before every rank is stopped (and restarted on the next call).
    Use ``with start_ranks(2) as ranks:`` or call ``close()``.
    """
    check_not_inside_rank()
    if start_method not in (None, "fork"):
        raise LaunchArgumentError(
            f"start_ranks(start_method={start_method!r}): persistent ranks are forked (Linux), so "
            f"start_method must be 'fork' or None; use notebook_launcher for spawn or xla")
    if isinstance(interrupt_grace, bool) or not isinstance(interrupt_grace, (int, float)) \
            or interrupt_grace <= 0:
        raise LaunchArgumentError(f"interrupt_grace must be a number of seconds > 0; got {interrupt_grace!r}")
    options = launch_options(
        function=serve_calls, args=(), num_processes=num_processes, mixed_precision=mixed_precision,
        use_port=use_port, master_addr=master_addr, node_rank=0, num_nodes=1, rdzv_backend="static",
        rdzv_endpoint="", rdzv_conf=None, rdzv_id="none", max_restarts=0, monitor_interval=0.1,
        log_line_prefix_template=log_line_prefix_template, kwargs=None, start_method=start_method,
        timeout=timeout, log_dir=log_dir, ui=ui, rdzv_timeout=None, display_ranks=display_ranks)
    ranks = Ranks(options, float(interrupt_grace))
    ranks._start()
    return ranks


class Ranks:
    """Ranks that live across calls. Made by ``start_ranks``; see its docstring."""

    def __init__(self, options: LaunchOptions, grace: float) -> None:
        self.options = options
        self.grace = grace
        self.calls = 0
        self.restarts = 0
        self.closed = False
        self.plan: LaunchPlan | None = None
        self.logs: RunLogs | None = None
        self.run_id = ""
        self._processes: list[RankProcess] = []   # the same list object for the pool's life
        self._pipes: list[RankPipes] = []
        self._commands: list[commands.CommandPipe] = []
        self._slot: commands.InterruptSlot | None = None
        self._lost: str | None = None    # why the ranks are gone (the next call restarts them)
        self._finalizer = weakref.finalize(self, _kill_all, self._processes)

    # --- the public calls ---------------------------------------------------------------
    @_trimmed
    def run(self, function: Callable[..., Any], args: tuple | list = (), kwargs: dict[str, Any] | None = None,
            *, timeout: float | None = None) -> list[Any]:
        """Call ``function(*args, **kwargs)`` on every rank; return each rank's result in rank
        order. A notebook function runs in the ranks' namespace (what earlier calls assigned
        with ``global`` is there). Raises LaunchError as notebook_launcher does."""
        validate_function(function)
        validate_args(args, kwargs)
        name = getattr(function, "__qualname__", None) or type(function).__name__
        return self._call(Call(Job(function, tuple(args), dict(kwargs or {}))), f"run({name})",
                          self._timeout(timeout))

    @_trimmed
    def push(self, **values: Any) -> None:
        """Set names in every rank's namespace (they are the ranks' from then on)."""
        if values:
            self._call(Call(Job(namespace.push, (values,))), f"push {', '.join(values)}", self._timeout(None),
                       quiet=True)

    @_trimmed
    def pull(self, *names: str, timeout: float | None = None) -> list[Any]:
        """Each rank's value of ``name`` (one name), or a dict of the names (several), in rank order."""
        bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
        if not names or bad:
            raise LaunchArgumentError(f"pull takes one or more variable names as strings, e.g. "
                                      f"pull('val_loss'); got {', '.join(map(repr, bad or names)) or 'none'}")
        return self._call(Call(Job(namespace.pull, (names,))), f"pull {', '.join(names)}",
                          self._timeout(timeout), quiet=True)

    @_trimmed
    def run_cell(self, source: str, filename: str, values: dict[str, Any] | None = None, *,
                 timeout: float | None = None) -> list[Any]:
        """Run cell source on every rank in the ranks' namespace (what ``%%ranks`` does)."""
        return self._call(Call(Job(namespace.run_cell, (source, filename, dict(values or {}))), hidden_frames=1),
                          "%%ranks cell", self._timeout(timeout))

    def close(self) -> None:
        """Stop the ranks (STOP, then SIGKILL after a grace) and close the run folder; idempotent."""
        if self.closed:
            return
        self.closed = True
        self._stop_processes(graceful=True)
        if self.logs is not None:
            self.logs.close()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def num_processes(self) -> int:
        return self.options.num_processes or (self.plan.num_processes if self.plan else 0)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    @property
    def log_dir(self) -> str | None:
        return str(self.logs.path) if self.logs is not None else None

    @property
    def alive(self) -> bool:
        return not self.closed and self._lost is None and all(p.poll() is None for p in self._processes)

    def __repr__(self) -> str:
        if self.closed:
            return "<Ranks: closed>"
        how = "alive" if self.alive else f"to be restarted ({self._lost})"
        return f"<Ranks: {len(self._processes)} ranks {how}, {self.calls} calls, logs {self.log_dir}>"

    # --- starting, calling, stopping ----------------------------------------------------
    def _timeout(self, timeout: float | None) -> float | None:
        return self.options.timeout if timeout is None else validate_timeout(timeout)

    def _start(self) -> None:
        target, plan, run_id = plan_launch(self.options)
        if plan.start_method != "fork":
            raise LaunchArgumentError(
                f"persistent ranks are forked, but this machine launches with {plan.start_method!r}; "
                f"use notebook_launcher here")
        check_display_ranks_exist(self.options.display_ranks, plan.world_size)
        backend = get_backend("fork")
        backend.prepare_parent()
        if self.logs is None:
            self.run_id = run_id
            self.logs = RunLogs(run_id, [r.local_rank for r in plan.ranks],
                                [r.global_rank for r in plan.ranks], self.options.log_dir)
        pipes = [RankPipes.open() for _ in plan.ranks]
        command_pipes = [commands.CommandPipe.open() for _ in plan.ranks]
        slot = commands.InterruptSlot()
        try:
            processes = backend.start(plan, Job(serve_calls, (plan, command_pipes, slot)), pipes)
        except BaseException:
            for p in pipes:
                p.close_parent_ends()
                p.close_child_ends()
            for c in command_pipes:
                c.close_write_end()
            slot.close()
            raise
        finally:
            for c in command_pipes:
                c.close_read_end()
        self.plan, self._pipes, self._commands, self._slot = plan, pipes, command_pipes, slot
        self._processes[:] = processes
        self._lost = None
        if self.restarts == 0:
            display = choose_display(self.options.ui, line_prefix=self.options.line_prefix).name
            print(launch_summary(plan, BACKEND_NAME, self.logs.path, platform=target.where.platform,
                                 display=display), flush=True)

    def _ensure_running(self) -> None:
        if self.closed:
            raise LaunchArgumentError("these ranks were closed; start new ones with start_ranks() "
                                      "(or %ranks start)")
        for process in self._processes:
            status = process.poll()
            if status is not None and self._lost is None:
                self._lost = f"local rank {process.local_rank} ended between calls ({outcome.describe_status(status)})"
        if self._lost is not None:
            lost = self._lost
            self._stop_processes(graceful=False)
            self.restarts += 1
            assert self.logs is not None
            for local_rank in range(len(self._pipes) or self.options.num_processes or 0):
                self.logs.write_block(local_rank, f"----- ranks restarted: {lost} -----")
            print(f"notebook_launch: the ranks were restarted because {lost}; their state (models, "
                  f"variables, process group) is lost: this call runs on fresh ranks.", flush=True)
            self._start()

    def _call(self, call: Call, title: str, timeout: float | None, quiet: bool = False) -> list[Any]:
        """One call on every rank. ``quiet`` (push, pull): no panel, only an error if one comes."""
        self._ensure_running()
        call.number = self.calls + 1
        try:
            frame = commands.encode(commands.Command.CALL, call)
        except Exception as exc:
            raise LaunchArgumentError(
                f"{title} cannot be sent to the ranks: {type(exc).__name__}: {exc}. The function, its "
                f"arguments and the notebook globals it names must pickle with cloudpickle.") from None
        assert self.plan is not None and self.logs is not None and self._slot is not None
        self.calls += 1
        state = RunState(run_id=f"{self.run_id}-call{self.calls}", world_size=self.plan.world_size,
                         backend=BACKEND_NAME, log_dir=str(self.logs.path),
                         ranks=[RankState(rank=r.global_rank, local_rank=r.local_rank, device=r.device,
                                          pid=p.pid, status=RUNNING)
                                for r, p in zip(self.plan.ranks, self._processes)])
        display = choose_display("none" if quiet else self.options.ui, line_prefix=self.options.line_prefix)
        rank_displays = RankDisplays(self.options.display_ranks, state.run_id) if in_ipython_kernel() else None
        section = LogSection(self.logs, f"call {self.calls}: {title}")
        for pipe in self._commands:
            try:
                commands.send(pipe.write_fd, frame)
            except BrokenPipeError:   # that rank is gone: the supervisor sees its exit
                log.debug("rank command pipe %d is broken", pipe.write_fd)
        with presenting(state, display, section, rank_displays):
            supervisor = CallSupervisor(self._processes, self._pipes, state, display, section,
                                        timeout=timeout, poll_interval=self.options.poll_interval,
                                        grace=self.grace, slot=self._slot, call_number=self.calls,
                                        rank_displays=rank_displays)
            try:
                results = supervisor.run()
            except LaunchError as error:
                state.finish(FAILED, error_summary(error))
                raise outcome.with_note(error, self._after_failure(supervisor.lost)) from None
            finally:
                if supervisor.lost is not None:
                    self._lost = supervisor.lost
                    self._stop_processes(graceful=False)
            state.finish(DONE, f"{len(results)} ranks returned in {state.elapsed:.2f} s")
            return results

    def _after_failure(self, lost: str | None) -> str:
        if lost is None:
            return "The ranks are still running, with their state; the next call runs on them."
        return outcome.ranks_lost_note(lost)

    def _stop_processes(self, graceful: bool) -> None:
        """End every rank process and close the pool's fds (each once)."""
        stop_processes(self._processes, self._pipes, self._commands, graceful)
        self._processes[:] = []
        self._pipes, self._commands = [], []
        if self._slot is not None:
            self._slot.close()
            self._slot = None


def stop_processes(processes: list[RankProcess], pipes: list[RankPipes], command_pipes: list[commands.CommandPipe],
                   graceful: bool) -> None:
    """Ask each rank to end between calls (STOP, then end of file on its command pipe), give
    ``graceful`` ranks STOP_GRACE seconds, SIGKILL the rest, and close the pool's fds."""
    if graceful:
        try:
            frame = commands.encode(commands.Command.STOP, None)
            for pipe in command_pipes:
                try:
                    commands.send(pipe.write_fd, frame)
                except OSError:
                    log.debug("STOP not delivered to fd %d", pipe.write_fd)
        except Exception:
            log.debug("STOP could not be encoded", exc_info=True)
    for pipe in command_pipes:
        pipe.close_write_end()   # end of file: a rank between calls ends its loop
    deadline = time.monotonic() + (STOP_GRACE if graceful else 0.0)
    for process in processes:
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    _kill_all(processes)
    for rank_pipes in pipes:
        rank_pipes.close_parent_ends()
        rank_pipes.close_child_ends()


def _kill_all(processes: list[RankProcess]) -> None:
    """SIGKILL what is left of ``processes`` and reap them (also the pool's finalizer)."""
    for process in processes:
        if process.poll() is None:
            process.signal(signal.SIGKILL)
        process.wait()
        process.release()

