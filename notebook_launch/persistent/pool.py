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

``Ranks`` is the API and runs each call; where the ranks live and how a call reaches them is
its transport's (``transport.RankTransport``: ``engines.local.persistent`` on this
machine, ``engines.ray.persistent`` on Ray, ``engines.slurm.persistent`` on SLURM),
and their life around the calls (start, the between-calls reader, restarts, stop) ``life``'s; where
the ranks are when asked (``stacks()``), in a call or waiting for the next, ``whereabouts``'s.
"""
from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..wire import protocol
from ..display.words import counted
from ..errors import LaunchArgumentError, LaunchError, NotebookLaunchError, user_interrupt
from ..record.logs import LogSection, RunLogs
from ..record.state import RunState
from ..planning.options import (
    LaunchOptions,
    validate_args,
    validate_call,
    validate_function,
    validate_lines_per_second,
    validate_timeout,
)
from ..wire.plan import LaunchPlan
from ..rank.runner import Job
from ..scaffold.session import Session, plan_state
from ..diagnose import stacks as rank_stacks
from ..supervise import interrupts, outcome
from ..channels import commands
from ..rank import namespace
from . import command_frames
from . import quick
from .call import RANKS_KEPT, CallSupervisor
from .cells import checked_cell, rank_subset, say_unsent, say_who_runs
from .life import RankLife
from .transport import RankTransport, exited
from .whereabouts import where_report
from ..rank.serve import Call

log = logging.getLogger("notebook_launch")
DEFAULT_GRACE = 3.0    # seconds interrupted ranks have to come back
T = TypeVar("T")


def trimmed(method: Callable[..., T]) -> Callable[..., T]:
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
    """Ranks that live across calls. Made by ``start_ranks``; see its docstring. Where the
    ranks live and how a call reaches them is the ``transport``'s (``transport.RankTransport``).

    Threads: one pool may be used from several threads. Calls (``run``, ``push``, ``pull``,
    ``run_cell``) and ``close`` take the pool's lock, so they run one at a time, in the
    order the lock grants, each whole; a call from another thread waits for the running one
    to end. A call made from inside a running call of the same thread (a callback) raises
    LaunchArgumentError instead of waiting for itself. Only the main thread gets the
    notebook's interrupt (Ctrl-C), so a call from another thread ends by itself, by its
    ``timeout=`` or by the panel's Stop."""

    def __init__(self, options: LaunchOptions, grace: float, transport: RankTransport) -> None:
        self.options = options
        self.grace = grace
        self.transport = transport
        self.calls = 0
        self.closed = False
        self._life = RankLife(options, transport)   # started, read between calls, restarted, stopped
        self._lock = threading.Lock()    # one call (or close) at a time; see the class docstring
        self._owner: int | None = None   # the thread holding _lock
        self._handed_back: dict[int, protocol.EventReader] = {}
        self._supervisor: CallSupervisor | None = None   # the call running now (stacks() reads its state)
        self._finalizer = weakref.finalize(self, transport.abandon)   # holds the transport, not the pool
        _pools[:] = [ref for ref in _pools if ref() is not None] + [weakref.ref(self)]

    # --- the public calls ---------------------------------------------------------------
    @trimmed
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

    @trimmed
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

    @trimmed
    @_serialized
    def pull(self, *names: str, timeout: float | None = None) -> list[Any]:
        """Each rank's value of ``name`` (one name), or a dict of the names (several), in rank order."""
        bad = [n for n in names if not isinstance(n, str) or not n.isidentifier()]
        if not names or bad:
            raise LaunchArgumentError(f"pull takes one or more variable names as strings, e.g. "
                                      f"pull('val_loss'); got {', '.join(map(repr, bad or names)) or 'none'}")
        return self._call(Call(Job(namespace.pull, (names,))), f"pull {', '.join(names)}",
                          self._timeout(timeout), quiet=True)

    @trimmed
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
        values = checked_cell(source, filename, values)
        timeout = self._timeout(timeout)
        watch = self._watch(stall_after, lines_per_second)
        world = self.plan.world_size if self.plan is not None else self.num_processes
        subset = rank_subset(ranks, world)
        idle = sorted(set(range(self.num_processes)) - subset) if subset is not None else []
        if subset is not None and idle:
            say_who_runs(subset, idle)
        try:
            return self._call(Call(Job(namespace.run_cell, (source, filename, values, None, subset)),
                                   hidden_frames=1), "%%ranks cell", timeout, idle=frozenset(idle), watch=watch)
        except _Unsendable:
            pass
        unsent = namespace.unpicklable(values)
        say_unsent(unsent)
        sendable = {name: value for name, value in values.items() if name not in unsent}
        return self._call(Call(Job(namespace.run_cell, (source, filename, sendable, unsent, subset)),
                               hidden_frames=1), "%%ranks cell", timeout, idle=frozenset(idle), watch=watch)

    def stacks(self) -> rank_stacks.WhereReport:
        """Where every rank is now: a one-line verdict (who waits in which collective, who never
        came), then each rank's threads, cells named. Works while a call runs (from another
        thread: it takes no lock and stops nothing) and between calls (the ranks then wait for
        the next call; their other threads show). Also written whole to each rank's log.
        ``print(ranks.stacks())`` or ``%ranks stacks``."""
        if self.closed:
            raise LaunchArgumentError("these ranks were closed: there is no rank to ask")
        plan, processes, supervisor = self.plan, list(self.transport.processes), self._supervisor
        if plan is None or not processes:
            raise LaunchArgumentError(f"no ranks are running now ({self._life.lost or 'not started'}); the next call "
                                      f"starts them")
        return where_report(plan, processes, supervisor.state if supervisor is not None else None,
                            calling=self._lock.locked(), logs=self.logs)

    @_serialized
    def close(self) -> None:
        """Stop the ranks (STOP, then SIGKILL after a grace) and close the run folder; idempotent.
        Waits for a call another thread runs on these ranks to end first."""
        if self.closed:
            return
        self.closed = True
        self._life.close()

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def plan(self) -> LaunchPlan | None:
        """The ranks' plan (None before the first start)."""
        return self._life.plan

    @property
    def logs(self) -> RunLogs | None:
        """The logs of the pool's run folder (one per pool, across restarts)."""
        return self._life.logs

    @property
    def restarts(self) -> int:
        """How many times fresh ranks replaced lost ones."""
        return self._life.restarts

    @property
    def num_processes(self) -> int:
        return self.options.num_processes or (self.plan.num_processes if self.plan else 0)

    @property
    def backend_name(self) -> str:
        return self.transport.backend_name

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.transport.processes]

    @property
    def log_dir(self) -> str | None:
        return str(self.logs.path) if self.logs is not None else None

    @property
    def alive(self) -> bool:
        return not self.closed and self._life.lost is None and not any(exited(p) for p in self.transport.processes)

    def __repr__(self) -> str:
        if self.closed:
            return "<Ranks: closed>"
        how = "alive" if self.alive else f"to be restarted ({self._life.lost})"
        return (f"<Ranks: {counted(len(self.transport.processes), 'rank')} {how}, {counted(self.calls, 'call')}, "
                f"logs {self.log_dir}>")

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
        """Start the ranks (``start_ranks``: once, before the pool is handed out); a start stopped
        part way ends what it started (``RankLife.first_start``)."""
        self._life.first_start(abandon=self._finalizer)

    def _call(self, call: Call, title: str, timeout: float | None, quiet: bool = False,
              idle: frozenset[int] = frozenset(), watch: CallWatchOptions | None = None) -> list[Any]:
        """One call on every rank. ``quiet`` (push, pull): no panel, only an error if one comes;
        ``idle``: the global ranks whose part of the call runs nothing (the panel says so);
        ``watch``: the call's stall_after and lines_per_second (None: the pool's)."""
        if self.closed:
            raise LaunchArgumentError("these ranks were closed; start new ones with start_ranks() "
                                      "(or %ranks start)")
        call.number = self.calls + 1
        try:
            frame = command_frames.encode(commands.Command.CALL, call)
        except Exception as exc:
            raise _Unsendable(
                f"{title} cannot be sent to the ranks: {type(exc).__name__}: {exc}. The function, its "
                f"arguments and the notebook globals it names must pickle with cloudpickle.") from None
        try:
            events = self._life.ensure_running(self.num_processes)
            self._handed_back = events   # back to the between-calls reader if no supervisor takes them
            try:
                with interrupts.guarding_run():   # the call's session's too (a nested guard changes nothing)
                    return self._send_and_supervise(call, frame, title, timeout, quiet, events, idle,
                                                    watch or self._watch(None, None))
            finally:
                if self.transport.processes and self._life.lost is None and not self.closed:
                    self._life.start_idle(self._handed_back)
                self._handed_back = {}
        finally:
            frame.close()   # the ranks have their own reference to its memfd

    def _send_and_supervise(self, call: Call, frame: commands.Frame, title: str, timeout: float | None,
                            quiet: bool, events: dict[int, Any], idle: frozenset[int],
                            watch: CallWatchOptions) -> list[Any]:
        """The frame goes to the ranks first, then the call's run state, session and supervisor
        are built while they run it (issue 45: the notebook's bookkeeping no longer delays the
        ranks). From before the send until the supervisor's first turn an interrupt is held
        (``interrupts.Held``): the frame goes out whole, and the interrupt then interrupts the
        call like any other; one that came during the send is asked of the ranks at once, so a
        rank that had not begun the call raises as it starts, without running its code. If the
        set-up fails once the frame is out, no supervisor reads the call's outcome: the ranks
        are stopped (the next call starts fresh ones, saying why)."""
        transport = self.transport
        assert transport.interrupts is not None
        held = interrupts.Held()
        look = quick.FirstLook()
        try:
            self.calls += 1
            transport.send(frame)
            if held.pending():
                transport.interrupts.request(call.number)
            return _supervised(self, call, title, timeout, quiet, events, idle, watch, held, look)
        except BaseException as exc:
            if not held.released:   # no supervisor took the call over: its outcome would be the next call's
                self._life.lost = (f"setting up call {call.number} failed after it was sent to them "
                                   f"({type(exc).__name__}: {exc})")
                self._life.stop(graceful=False)
            raise
        finally:
            if look.selector is not None:   # no supervisor's watcher took it: the pool keeps it
                self._life.selector.give_back(look.selector, transport.processes, transport.pipes)
            held.release("notebook_launch: interrupted as the call started")   # no-op once released


def _supervised(pool: Ranks, call: Call, title: str, timeout: float | None, quiet: bool, events: dict[int, Any],
                idle: frozenset[int], watch: CallWatchOptions, held: interrupts.Held,
                look: quick.FirstLook) -> list[Any]:
    """The call's run state and session, built while the ranks run the call
    (``Ranks._send_and_supervise`` sent it), then its end: a call over at once with nothing but
    results is finished without a supervisor (``quick``: ``look`` is what the notebook read of
    it, and the pool's kept selector it took); any other is supervised to the end, its
    supervisor's first turn taking what was read. Results, or LaunchError / KeyboardInterrupt
    saying whether the ranks kept their state."""
    transport = pool.transport
    assert transport.interrupts is not None
    state = _call_state(pool, call)
    with _call_session(pool, call, title, state, quiet, watch) as session:
        quick.first_look(look, pool._life.selector, transport.processes, transport.pipes, events, timeout, held)
        if look.complete:
            return quick.finish(state, session, look, held, quick.QuickCall(
                transport.processes, transport.pipes, transport.result_fds, call.number, idle,
                pool._life.memory_watch()))
        supervisor = CallSupervisor(transport.processes, transport.pipes, state, session.display, session.logs,
                                    timeout=timeout, poll_interval=pool.options.poll_interval,
                                    grace=pool.grace, slot=transport.interrupts, call_number=call.number,
                                    rank_displays=session.rank_displays, held=held,
                                    events=events, command_fds=transport.result_fds,
                                    idle_ranks=idle, stall_after=None if quiet else watch.stall_after,
                                    memory=pool._life.memory_watch(), kept_selector=pool._life.selector,
                                    first_look=look)
        pool._supervisor = supervisor
        try:
            results = supervisor.run()
        except LaunchError as error:
            session.fail(error)
            raise outcome.with_note(error, _after_failure(supervisor.lost)) from None
        except KeyboardInterrupt as interrupt:
            if supervisor.lost is None:
                raise   # every rank came back with its state
            # the cell must say the ranks (and their state) are gone, not only "KeyboardInterrupt"
            said = str(interrupt.args[0]) if interrupt.args else "notebook_launch: interrupted"
            raise KeyboardInterrupt(f"{said}\n{outcome.ranks_lost_note(supervisor.lost)}") from None
        finally:
            pool._supervisor = None
            pool._handed_back = supervisor.events_by_rank()
            if supervisor.lost is not None:
                pool._life.lost = supervisor.lost
                pool._life.stop(graceful=False)
        session.finish(f"{counted(len(results), 'rank')} returned in {state.elapsed:.2f} s")
        return results


def _call_state(pool: Ranks, call: Call) -> RunState:
    """A call's run state: the pool's ranks, each RUNNING, where its transport says they are."""
    assert pool.plan is not None and pool.logs is not None
    state = plan_state(pool.plan, f"{pool._life.run_id}-call{call.number}", pool.backend_name, pool.logs.path,
                       processes=pool.transport.processes)
    pool.transport.describe(state)
    return state


def _call_session(pool: Ranks, call: Call, title: str, state: RunState, quiet: bool,
                  watch: CallWatchOptions) -> Session[LogSection]:
    """A call's session: its section of the pool's logs, titled with the call's number, and its
    display (``quiet``: none, only an error if one comes) showing ``watch``'s lines a second."""
    assert pool.logs is not None
    return Session.for_call(pool.logs, f"call {call.number}: {title}", state, pool.options, quiet=quiet,
                            lines_per_second=watch.lines_per_second)


def _after_failure(lost: str | None) -> str:
    if lost is None:
        return RANKS_KEPT
    return outcome.ranks_lost_note(lost)


_pools: list[weakref.ReferenceType[Ranks]] = []   # every pool of this process, oldest first


def newest_open_pool() -> Ranks | None:
    """The pool made last that is not closed, however it was started (``start_ranks()`` or
    ``%ranks start``): what ``%ranks`` works on when ``%ranks start`` made none."""
    for ref in reversed(_pools):
        pool = ref()
        if pool is not None and not pool.closed:
            return pool
    return None
