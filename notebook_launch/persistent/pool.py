"""Persistent ranks, the notebook side: ``start_ranks`` forks the ranks once (same plan,
preflight checks, environment and bootstrap as ``notebook_launcher``), and each
``run``/``push``/``pull``/``%%ranks`` cell is one call supervised on the same processes,
with the same display, LaunchError texts and run folder (one folder per pool, one log
section per call).

What a failure leaves: a Python exception or a timeout interrupts the other ranks and
they stay alive with their state; a rank that dies, ranks that do not come back from an
interrupt, or a second interrupt stop every rank, and the next call starts fresh ones
(saying so). ``close()``, ``%ranks stop``, the interpreter's exit and the kernel's death
(PDEATHSIG, as for every forked rank) leave no process behind, and nothing a rank started
outlives it: a rank's process group ends with the rank, between calls too (``idle``), and
what left the group is swept when the pool stops or restarts (``leftovers``).

Between calls, ``idle.IdleReader`` reads the ranks' output (to the logs, and to the notebook
while a cell runs); during a call the call's supervisor does: one reader at a time.
"""
from __future__ import annotations

import functools
import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..backends import get_backend
from .. import protocol
from ..channels import RankPipes, RankProcess, WaitStatus
from ..display import choose_display
from ..errors import LaunchArgumentError, LaunchError, NotebookLaunchError, user_interrupt
from ..target import LaunchTarget
from ..prepare import plan_launch
from ..net import release_claims
from ..notebook_streams import OUT
from ..line_prefix import parse_line_prefix
from ..logs import RunLogs
from ..options import (
    LaunchOptions,
    check_display_ranks_exist,
    validate_args,
    validate_call,
    validate_function,
    validate_lines_per_second,
    validate_text,
    validate_timeout,
)
from ..plan import LaunchPlan
from ..rank.runner import Job
from ..session import Session, launch_line, open_logs, plan_state
from ..state import RUNNING, RunState
from .. import leftovers
from ..diagnose import hang_verdict, stacks as rank_stacks
from ..diagnose.ranks import where_ranks
from ..supervise import outcome
from ..rank import commands, namespace
from .call import CallSupervisor
from .idle import CellWatch, IdleReader
from ..rank.serve import Call, serve_calls

log = logging.getLogger("notebook_launch")
DEFAULT_GRACE = 3.0    # seconds interrupted ranks have to come back
STOP_GRACE = 2.0       # seconds ranks have to end after STOP before SIGKILL
T = TypeVar("T")


def _trimmed(method: Callable[..., T]) -> Callable[..., T]:
    """Our errors show one frame, not the supervisor's internals (as notebook_launcher's)."""
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        __tracebackhide__ = True
        try:
            return method(*args, **kwargs)
        except (NotebookLaunchError, KeyboardInterrupt) as err:
            if isinstance(err, KeyboardInterrupt):
                raise user_interrupt(err) from None   # shows the user's frames only (errors.render)
            raise err.with_traceback(None) from None
    return wrapper


@dataclass(frozen=True)
class CallWatchOptions:
    """How one call is watched: ``stall_after`` (None: not) and ``lines_per_second`` (None: every line)."""
    stall_after: float | None
    lines_per_second: int | None


class _Unsendable(LaunchArgumentError):
    """A call that does not pickle (``run_cell`` then says which names, and sends the rest)."""


def _serialized(method: Callable[..., T]) -> Callable[..., T]:
    """The pool's calls run one at a time (see the Ranks docstring)."""
    @functools.wraps(method)
    def wrapper(self: Ranks, *args: Any, **kwargs: Any) -> T:
        __tracebackhide__ = True
        if self._owner == threading.get_ident():
            raise LaunchArgumentError(
                f"Ranks.{method.__name__}() was called while a call on the same ranks runs in this thread "
                f"(from a callback of that call?); a pool runs one call at a time: call it after that call ends")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                return method(self, *args, **kwargs)
            finally:
                self._owner = None
    return wrapper


class Ranks:
    """Ranks that live across calls. Made by ``start_ranks``; see its docstring.

    Threads: one pool may be used from several threads. Calls (``run``, ``push``, ``pull``,
    ``run_cell``) and ``close`` take the pool's lock, so they run one at a time, in the
    order the lock grants, each whole; a call from another thread waits for the running one
    to end. A call made from inside a running call of the same thread (a callback) raises
    LaunchArgumentError instead of waiting for itself. Only the main thread gets the
    notebook's interrupt (Ctrl-C), so a call from another thread ends by itself, by its
    ``timeout=`` or by the panel's Stop."""

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
        self._run_mark = ""              # NOTEBOOK_LAUNCH_RUN_ID of the current ranks (leftovers.sweep)
        self._lock = threading.Lock()    # one call (or close) at a time; see the class docstring
        self._owner: int | None = None   # the thread holding _lock
        self._reaping = threading.Lock()   # a rank's group is ended before it is reaped, by one thread
        self._idle: IdleReader | None = None
        self._handed_back: dict[int, protocol.EventReader] = {}
        self._cells: CellWatch | None = None
        self._supervisor: CallSupervisor | None = None   # the call running now (stacks() reads its state)
        self._call_watch = CallWatchOptions(options.stall_after, options.lines_per_second)   # the call's
        self._finalizer = weakref.finalize(self, _kill_all, self._processes, self._reaping)
        _pools[:] = [ref for ref in _pools if ref() is not None] + [weakref.ref(self)]

    # --- the public calls ---------------------------------------------------------------
    @_trimmed
    @_serialized
    def run(self, function: Callable[..., Any], args: tuple | list = (), kwargs: dict[str, Any] | None = None,
            *, timeout: float | None = None, stall_after: float | None = None,
            lines_per_second: int | str | None = None) -> list[Any]:
        """Call ``function(*args, **kwargs)`` on every rank; return each rank's result in rank
        order. A notebook function runs in the ranks' namespace (what earlier calls assigned
        with ``global`` is there). Raises LaunchError as notebook_launcher does. ``timeout``,
        ``stall_after``, ``lines_per_second``: for this call (None: start_ranks' values)."""
        validate_function(function)
        validate_args(args, kwargs)
        validate_call(function, args, kwargs)
        name = getattr(function, "__qualname__", None) or type(function).__name__
        return self._call(Call(Job(function, tuple(args), dict(kwargs or {}))), f"run({name})",
                          self._timeout(timeout), watch=self._watch(stall_after, lines_per_second))

    @_trimmed
    @_serialized
    def push(self, **values: Any) -> None:
        """Set names in every rank's namespace (they are the ranks' from then on)."""
        bad = [name for name in values if not name.isidentifier()]
        if bad:
            raise LaunchArgumentError(f"push takes variable names, e.g. push(model=model); not names: "
                                      f"{', '.join(map(repr, bad))}")
        if values:
            self._call(Call(Job(namespace.push, (values,))), f"push {', '.join(values)}", self._timeout(None),
                       quiet=True)

    @_trimmed
    @_serialized
    def pull(self, *names: str, timeout: float | None = None) -> list[Any]:
        """Each rank's value of ``name`` (one name), or a dict of the names (several), in rank order."""
        bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
        if not names or bad:
            raise LaunchArgumentError(f"pull takes one or more variable names as strings, e.g. "
                                      f"pull('val_loss'); got {', '.join(map(repr, bad or names)) or 'none'}")
        return self._call(Call(Job(namespace.pull, (names,))), f"pull {', '.join(names)}",
                          self._timeout(timeout), quiet=True)

    @_trimmed
    @_serialized
    def run_cell(self, source: str, filename: str, values: dict[str, Any] | None = None, *,
                 timeout: float | None = None, ranks: Iterable[int] | None = None,
                 stall_after: float | None = None, lines_per_second: int | str | None = None) -> list[Any]:
        """Run cell source on every rank in the ranks' namespace (what ``%%ranks`` does), with
        ``values``: the notebook's values of the names the cell uses; return each rank's value of
        the cell's last line (None if it is no expression), in rank order. ``ranks``: the global
        ranks that run it; the others run nothing for this call and return
        ``namespace.NotRun`` (so the cell must not call a collective that needs them).
        A value that cannot be sent (it does not pickle) is named here before anything runs;
        the ranks then use their own value of that name (e.g. their copy from the start), and
        where they have none the cell raises a NameError that says why, before any of its code runs.
        ``timeout``, ``stall_after``, ``lines_per_second``: as for ``run``."""
        if not isinstance(source, str):
            raise LaunchArgumentError(f"run_cell(source=...) must be the cell's code as a str; got "
                                      f"{type(source).__name__}")
        validate_text("run_cell(filename=...)", filename, "the name tracebacks show for the cell, a str")
        if values is not None and (not isinstance(values, dict)
                                   or not all(isinstance(n, str) and n.isidentifier() for n in values)):
            raise LaunchArgumentError(f"run_cell(values=...) must be a dict of variable names to values, or "
                                      f"None; got {values!r:.120}")
        values = dict(values or {})
        timeout = self._timeout(timeout)
        watch = self._watch(stall_after, lines_per_second)
        subset = self._rank_subset(ranks)
        idle = sorted(set(range(self.num_processes)) - subset) if subset is not None else []
        if subset is not None and idle:
            wait = "run nothing and wait" if len(idle) > 1 else "runs nothing and waits"
            print(f"notebook_launch: %%ranks: this cell runs on rank{'s' * (len(subset) > 1)} "
                  f"{', '.join(map(str, sorted(subset)))} only; rank{'s' * (len(idle) > 1)} "
                  f"{', '.join(map(str, idle))} {wait}, "
                  f"with {'their' if len(idle) > 1 else 'its'} state (the cell must not call a collective "
                  f"that needs {'them' if len(idle) > 1 else 'it'})", file=OUT, flush=True)
        try:
            return self._call(Call(Job(namespace.run_cell, (source, filename, values, None, subset)),
                                   hidden_frames=1), "%%ranks cell", timeout, idle=frozenset(idle), watch=watch)
        except _Unsendable:
            pass
        unsent = namespace.unpicklable(values)
        print("notebook_launch: %%ranks: not sent to the ranks: "
              + "; ".join(f"{name} ({why})" for name, why in unsent.items())
              + ". The ranks use their own value of these names; where they have none, the cell stops "
              "with a NameError before it runs. Create such values in the ranks (in a %%ranks cell).",
              file=OUT, flush=True)
        sendable = {name: value for name, value in values.items() if name not in unsent}
        return self._call(Call(Job(namespace.run_cell, (source, filename, sendable, unsent, subset)),
                               hidden_frames=1), "%%ranks cell", timeout, idle=frozenset(idle), watch=watch)

    def _rank_subset(self, ranks: Iterable[int] | None) -> frozenset[int] | None:
        """``ranks`` checked against the pool's world size (an error naming the bad ones)."""
        if ranks is None:
            return None
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            ranks = [ranks]
        world = self.plan.world_size if self.plan is not None else self.num_processes
        try:
            chosen = list(ranks)
        except TypeError:
            chosen = [ranks]   # type: ignore[list-item]
        bad = [r for r in chosen if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world]
        if bad or not chosen:
            raise LaunchArgumentError(
                f"ranks={ranks!r}: give one or more global ranks between 0 and {world - 1} "
                f"(these ranks are {world}), e.g. ranks=[0] or %%ranks --ranks 0,2"
                + (f"; not ranks here: {', '.join(map(repr, bad))}" if bad else ""))
        return frozenset(chosen)

    def stacks(self) -> rank_stacks.WhereReport:
        """Where every rank is now: a one-line verdict (who waits in which collective, who never
        came), then each rank's threads, cells named. Works while a call runs (from another
        thread: it takes no lock and stops nothing) and between calls (the ranks then wait for
        the next call; their other threads show). Also written whole to each rank's log.
        ``print(ranks.stacks())`` or ``%ranks stacks``."""
        if self.closed:
            raise LaunchArgumentError("these ranks were closed: there is no rank to ask")
        plan, processes, supervisor = self.plan, list(self._processes), self._supervisor
        if plan is None or not processes:
            raise LaunchArgumentError(f"no ranks are running now ({self._lost or 'not started'}); the next call "
                                      f"starts them")
        calling = self._lock.locked()
        state = supervisor.state if supervisor is not None else None
        asked: list[tuple[int, RankProcess | None]] = []
        notes: dict[int, str] = {}
        for spec, process in zip(plan.ranks, processes):
            rs = state.ranks[spec.local_rank] if state is not None else None
            if _exited(process):
                notes[spec.global_rank] = "ended (the next call restarts the ranks)"
            elif rs is not None and rs.status != RUNNING:
                notes[spec.global_rank] = f"is done with this call ({rs.exit_description or rs.status})"
            asked.append((spec.local_rank, None if spec.global_rank in notes else process))
        global_rank = {spec.local_rank: spec.global_rank for spec in plan.ranks}.__getitem__
        label = outcome.cell_labeller()
        found = where_ranks(asked, global_rank, label, native=calling)   # an idle rank: native frames in our recvmsg
        for where, spec in zip(found, plan.ranks):
            where.note = notes.get(where.rank, where.note)
            if state is not None:
                where.stalled_for = state.stalled_for(spec.local_rank)
        if calling:
            for where in found:   # back in the loop before the call's supervisor read its report
                if _waits_for_a_call(where):
                    where.note = "is done with this call (its report is on its way)"
            verdict, detail = rank_stacks.where_they_are(found, label)
            verdict = verdict or "no rank could say where it is: " + hang_verdict.notes_text(found)
        else:
            waiting = [where for where in found if _waits_for_a_call(where)]
            verdict = "no call is running: " + (
                "every rank waits for the next one" if len(waiting) == len(found) else
                hang_verdict.notes_text([where for where in found if where not in waiting])
                + "; the others wait for the next call")
            detail = hang_verdict.detail(found, label)
        report = rank_stacks.WhereReport(verdict, detail)
        if self.logs is not None:
            for local_rank, where in enumerate(found):
                self.logs.write_block(local_rank, "notebook_launch: where this rank is (ranks.stacks()): "
                                      + verdict + "\n"
                                      + hang_verdict.detail([where], label, frames_per_thread=1000, whole=True))
        return report

    @_serialized
    def close(self) -> None:
        """Stop the ranks (STOP, then SIGKILL after a grace) and close the run folder; idempotent.
        Waits for a call another thread runs on these ranks to end first."""
        if self.closed:
            return
        self.closed = True
        self._stop_processes(graceful=True)
        if self._cells is not None:
            self._cells.close()
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
    def backend_name(self) -> str:
        return f"{self.plan.start_method if self.plan else 'fork'}, persistent"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    @property
    def log_dir(self) -> str | None:
        return str(self.logs.path) if self.logs is not None else None

    @property
    def alive(self) -> bool:
        return not self.closed and self._lost is None and not any(_exited(p) for p in self._processes)

    def __repr__(self) -> str:
        if self.closed:
            return "<Ranks: closed>"
        how = "alive" if self.alive else f"to be restarted ({self._lost})"
        return f"<Ranks: {len(self._processes)} ranks {how}, {self.calls} calls, logs {self.log_dir}>"

    # --- starting, calling, stopping ----------------------------------------------------
    def _timeout(self, timeout: float | None) -> float | None:
        return self.options.timeout if timeout is None else validate_timeout(timeout)

    def _watch(self, stall_after: float | None, lines_per_second: int | str | None) -> CallWatchOptions:
        """A call's stall_after and lines_per_second: its own, checked, else the pool's."""
        return CallWatchOptions(
            self.options.stall_after if stall_after is None else validate_timeout(stall_after, "stall_after"),
            self.options.lines_per_second if lines_per_second is None
            else validate_lines_per_second(lines_per_second))

    def _start(self) -> None:
        target, plan, run_id = plan_launch(self.options)
        try:
            self._start_planned(target, plan, run_id)
        except BaseException:
            release_claims(run_id)   # the port plan_launch claimed: no rank holds it
            raise

    def _start_planned(self, target: LaunchTarget, plan: LaunchPlan, run_id: str) -> None:
        if plan.start_method not in ("fork", "spawn"):
            raise LaunchArgumentError(
                f"persistent ranks are forked or spawned, but this machine launches with "
                f"{plan.start_method!r}; use notebook_launcher here")
        check_display_ranks_exist(self.options.display_ranks, plan.world_size)
        spawned = plan.start_method == "spawn"
        backend = get_backend(plan.start_method)
        backend.prepare_parent()
        if self.logs is None:
            self.run_id = run_id
            self.logs = open_logs(plan, run_id, self.options)
        pipes = [RankPipes.open() for _ in plan.ranks]
        command_pipes = [commands.CommandPipe.open() for _ in plan.ranks]
        slot = commands.InterruptSlot(len(plan.ranks))
        try:
            job = Job(serve_calls, (plan, command_pipes, slot), {"spawned": spawned})
            if spawned:   # a fresh interpreter inherits only what it is passed
                assert slot.fd is not None
                processes = backend.start(plan, job, pipes,  # type: ignore[call-arg]
                                          extra_fds=[(c.read_fd, slot.fd) for c in command_pipes])
            else:
                processes = backend.start(plan, job, pipes)
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
        self._run_mark = run_id
        self._lost = None
        if self._cells is None:
            self._cells = CellWatch()
        self._start_idle({})
        if self.restarts == 0:
            display = choose_display(self.options.ui, line_prefix=self.options.line_prefix).name
            print(launch_line(plan, self.backend_name, self.logs, display=display, platform=target.where.platform),
                  file=OUT, flush=True)

    def _start_idle(self, events: dict[int, protocol.EventReader]) -> None:
        """Hand the ranks' pipes to the between-calls reader (started with the ranks)."""
        if self._idle is not None:
            self._idle.resume(events)
            return
        assert self.plan is not None and self.logs is not None
        prefix = parse_line_prefix(self.options.line_prefix)
        specs = self.plan.ranks
        reaping = self._reaping

        def end_group(process: RankProcess) -> None:
            with reaping:
                if not process.reaped:
                    leftovers.end_rank_group(process.pid)

        self._idle = IdleReader(
            self._processes, self._pipes, self.logs,
            tag=lambda local: prefix.render(rank=specs[local].global_rank, local_rank=local),
            events={local: events.get(local) or protocol.EventReader() for local in range(len(self._pipes))},
            on_exit=end_group,
            show=lambda: self.options.ui != "none" and self._cells is not None and self._cells.running)

    def _pause_idle(self) -> dict[int, protocol.EventReader]:
        """Take the ranks' pipes back from the between-calls reader (its readers of event frames)."""
        return self._idle.pause() if self._idle is not None else {}

    def _stop_idle(self) -> None:
        """End the between-calls reader (the ranks are going)."""
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.stop()

    def _ensure_running(self) -> dict[int, protocol.EventReader]:
        """Ranks ready for a call (fresh ones if they are gone); returns the event readers
        the between-calls reader hands over: from here on this thread reads the ranks' pipes."""
        if self.closed:
            raise LaunchArgumentError("these ranks were closed; start new ones with start_ranks() "
                                      "(or %ranks start)")
        events = self._pause_idle()
        for process in self._processes:
            if _exited(process) and self._lost is None:
                status = _end_and_reap(process, self._reaping)
                self._lost = f"local rank {process.local_rank} ended between calls ({outcome.describe_status(status)})"
        if self._lost is not None:
            lost = self._lost
            self._stop_processes(graceful=False)
            self.restarts += 1
            assert self.logs is not None
            self.logs.write_to_all(f"----- ranks restarted: {lost} -----")
            print(f"notebook_launch: the ranks were restarted because {lost}; their state (models, "
                  f"variables, process group) is lost: this call runs on fresh ranks.", file=OUT, flush=True)
            self._start()
            events = self._pause_idle()
        return events

    def _call(self, call: Call, title: str, timeout: float | None, quiet: bool = False,
              idle: frozenset[int] = frozenset(), watch: CallWatchOptions | None = None) -> list[Any]:
        self._call_watch = watch or self._watch(None, None)   # _supervise reads it
        """One call on every rank. ``quiet`` (push, pull): no panel, only an error if one comes;
        ``idle``: the global ranks whose part of the call runs nothing (the panel says so)."""
        if self.closed:
            self._ensure_running()   # raises: closed
        call.number = self.calls + 1
        try:
            frame = commands.encode(commands.Command.CALL, call)
        except Exception as exc:
            raise _Unsendable(
                f"{title} cannot be sent to the ranks: {type(exc).__name__}: {exc}. The function, its "
                f"arguments and the notebook globals it names must pickle with cloudpickle.") from None
        try:
            events = self._ensure_running()
            try:
                return self._supervise(call, frame, title, timeout, quiet, events, idle)
            finally:
                if self._processes and self._lost is None and not self.closed:
                    self._start_idle(self._handed_back)
                self._handed_back = {}
        finally:
            frame.close()   # the ranks have their own reference to its memfd

    def _send(self, frame: commands.Frame) -> None:
        """The call's frame to every rank, whole (the caller defers interrupts meanwhile)."""
        for pipe in self._commands:
            try:
                commands.send(pipe.write_fd, frame)
            except BrokenPipeError:   # that rank is gone: the supervisor sees its exit
                log.debug("rank command pipe %d is broken", pipe.write_fd)

    def _describe_ranks(self, state: RunState) -> None:
        """Where each rank runs, in a call's run state: here, nothing to add (Ray ranks name their node)."""

    def _supervise(self, call: Call, frame: commands.Frame, title: str, timeout: float | None, quiet: bool,
                   events: dict[int, Any], idle: frozenset[int] = frozenset()) -> list[Any]:
        watch = self._call_watch
        assert self.plan is not None and self.logs is not None and self._slot is not None
        self.calls += 1
        state = plan_state(self.plan, f"{self.run_id}-call{self.calls}", self.backend_name, self.logs.path,
                           processes=self._processes, state_type=RunState)   # pool.RunState: tests replace it
        self._describe_ranks(state)
        with Session.for_call(self.logs, f"call {self.calls}: {title}", state, self.options, quiet=quiet,
                              lines_per_second=watch.lines_per_second) as session:
            supervisor = CallSupervisor(self._processes, self._pipes, state, session.display, session.logs,
                                        timeout=timeout, poll_interval=self.options.poll_interval,
                                        grace=self.grace, slot=self._slot, call_number=self.calls,
                                        rank_displays=session.rank_displays, send=lambda: self._send(frame),
                                        events=events, command_fds=[c.write_fd for c in self._commands],
                                        idle_ranks=idle, stall_after=None if quiet else watch.stall_after)
            self._supervisor = supervisor
            try:
                results = supervisor.run()
            except LaunchError as error:
                session.fail(error)
                raise outcome.with_note(error, self._after_failure(supervisor.lost)) from None
            except KeyboardInterrupt as interrupt:
                if supervisor.lost is None:
                    raise   # every rank came back with its state
                # the cell must say the ranks (and their state) are gone, not only "KeyboardInterrupt"
                said = str(interrupt.args[0]) if interrupt.args else "notebook_launch: interrupted"
                raise KeyboardInterrupt(f"{said}\n{outcome.ranks_lost_note(supervisor.lost)}") from None
            finally:
                self._supervisor = None
                self._handed_back = supervisor.events_by_rank()
                if supervisor.lost is not None:
                    self._lost = supervisor.lost
                    self._stop_processes(graceful=False)
            session.finish(f"{len(results)} ranks returned in {state.elapsed:.2f} s")
            return results

    def _after_failure(self, lost: str | None) -> str:
        if lost is None:
            return "The ranks are still running, with their state; the next call runs on them."
        return outcome.ranks_lost_note(lost)

    def _stop_processes(self, graceful: bool) -> None:
        """End every rank process and what they started, and close the pool's fds (each once).
        The between-calls reader reads until the ranks are gone, so the logs get their last lines."""
        if not graceful:
            self._stop_idle()
        stop_processes(self._processes, self._pipes, self._commands, graceful, self._reaping,
                       before_kill=self._stop_idle, run_mark=self._run_mark)
        release_claims(self._run_mark)   # the ranks' port, claimed by plan_launch, is free for other launches
        self._processes[:] = []
        self._pipes, self._commands = [], []
        if self._slot is not None:
            self._slot.close()
            self._slot = None


_pools: list[weakref.ReferenceType[Ranks]] = []   # every pool of this process, oldest first


def newest_open_pool() -> Ranks | None:
    """The pool made last that is not closed, however it was started (``start_ranks()`` or
    ``%ranks start``): what ``%ranks`` works on when ``%ranks start`` made none."""
    for ref in reversed(_pools):
        pool = ref()
        if pool is not None and not pool.closed:
            return pool
    return None


def _waits_for_a_call(where: hang_verdict.RankWhereabouts) -> bool:
    """A rank between calls: its main thread waits in ``serve_calls`` for the next command. Its
    main thread (our code only) leaves the detail, which keeps the rank's other threads."""
    if where.note == "waits for the next call" and all(t.ident != where.main_thread for t in where.threads):
        return True   # a Ray rank said so itself (ray.where.decode_answer)
    frames = where.main_frames()
    if not frames or not frames[0].filename.endswith(COMMANDS_FILE):
        return False
    where.threads = [thread for thread in where.threads if thread.frames is not frames]
    where.note = "waits for the next call"
    return True


COMMANDS_FILE = os.path.join("notebook_launch", "rank", "commands.py")   # where serve_calls waits


def stop_processes(processes: list[RankProcess], pipes: list[RankPipes], command_pipes: list[commands.CommandPipe],
                   graceful: bool, reaping: threading.Lock, before_kill: Callable[[], object] = lambda: None,
                   run_mark: str = "") -> None:
    """Ask each rank to end between calls (STOP, then end of file on its command pipe), give
    ``graceful`` ranks STOP_GRACE seconds, SIGKILL the rest with their process groups, sweep
    what left a group (``run_mark``: the ranks' NOTEBOOK_LAUNCH_RUN_ID), and close the pool's fds."""
    if graceful:
        try:
            frame = commands.encode(commands.Command.STOP, None)
            for pipe in command_pipes:
                try:
                    commands.send(pipe.write_fd, frame)
                except OSError:
                    log.debug("STOP not delivered to fd %d", pipe.write_fd)
            frame.close()
        except Exception:
            log.debug("STOP could not be encoded", exc_info=True)
    for pipe in command_pipes:
        pipe.close_write_end()   # end of file: a rank between calls ends its loop
    deadline = time.monotonic() + (STOP_GRACE if graceful else 0.0)
    for process in processes:   # exited, not reaped: its group is ended first (_kill_all)
        left = deadline - time.monotonic()
        if left > 0 and not _exited(process) and process.sentinel is not None:
            select.select([process.sentinel], [], [], left)
    before_kill()
    _kill_all(processes, reaping)
    if run_mark and processes:
        leftovers.sweep(run_mark)   # what a rank started that left its process group
    for rank_pipes in pipes:
        rank_pipes.close_parent_ends()
        rank_pipes.close_child_ends()


def _kill_all(processes: list[RankProcess], reaping: threading.Lock) -> None:
    """SIGKILL what is left of ``processes`` and their process groups, and reap them (also the
    pool's finalizer)."""
    for process in processes:
        _end_and_reap(process, reaping)
        process.release()


def _exited(process: RankProcess) -> bool:
    """Whether the rank ended, without reaping it (its pid stays its group's id until then)."""
    if process.reaped or process.sentinel is None:
        return process.poll() is not None
    return bool(select.select([process.sentinel], [], [], 0)[0])


def _end_and_reap(process: RankProcess, reaping: threading.Lock) -> WaitStatus:
    """SIGKILL the rank and its process group (what it started: a subprocess, DataLoader
    workers), then reap it: alive or a zombie, its pid is still its group's id."""
    with reaping:
        if not process.reaped:
            process.kill()   # killpg, then the pid itself
        return process.wait()

