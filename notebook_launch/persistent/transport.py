"""How a pool of persistent ranks reaches its ranks: one small interface, ``RankTransport``,
so that ``pool.Ranks`` is the user-facing API only and each place ranks live is one class.

A transport starts the ranks idle (they wait for calls in a serving loop), sends each call's
frame whole to every rank, carries an interrupt request (``CallInterrupts``), says where each
rank runs, names what ended between calls, and stops the ranks. The pool does the rest the same
way for every transport: one call at a time, each supervised by ``call.CallSupervisor`` over the
transport's ``processes`` and ``pipes``, the between-calls reader (``idle``), restarts, logs.

Implementations: ``engines.local.persistent.LocalTransport`` (forked or spawned on this machine: a Unix
socket with memfds per rank and an ``InterruptSlot`` in shared memory) and, for ranks of other machines,
``engines.remote.persistent.RemoteTransport`` (calls and interrupts as messages on each rank's events
connection) with ``engines.ray.persistent.RayTransport`` (Ray actors) and
``engines.slurm.persistent.SlurmTransport`` (srun steps of one held SLURM job): they start through their
engine's launcher with a serving job, take calls on their connection and stop when their launcher ends
them; nothing here assumes processes of this machine.
"""
from __future__ import annotations

import abc
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..errors import LaunchError

if TYPE_CHECKING:
    from ..channels import RankPipes, RankProcess
    from ..record.logs import RunLogs
    from ..wire.plan import LaunchPlan
    from ..channels import commands
    from ..record.state import RunState

STOP_GRACE = 2.0       # seconds ranks have to end after STOP before they are killed
LogsFor = Callable[["LaunchPlan", str], "RunLogs"]   # (plan, run id) -> the pool's logs, opened once


class CallInterrupts(Protocol):
    """The notebook's half of interrupting a call (``call.CallSupervisor.stop``): a request the
    ranks read, and what the notebook can know of each rank. ``channels.interrupt_slot.InterruptSlot``
    (shared memory, local ranks) and ``engines.remote.persistent.MessageSlot`` (a message; nothing shared)
    are two."""

    def request(self, call_number: int) -> None:
        """Ask every rank to interrupt call ``call_number`` (before any signal)."""

    def serving(self, local_rank: int) -> bool:
        """Whether the notebook should SIGINT this rank's pid itself (it runs our handler here)."""

    def reporting(self, local_rank: int, call_number: int) -> bool:
        """Whether the rank's code for the call is over and it is sending its outcome."""

    def started(self, local_rank: int, call_number: int) -> bool:
        """Whether the rank began the call's code (not still starting or unpickling)."""

    def close(self) -> None:
        """Let go of what the slot holds."""


class LostBetweenCalls:
    """What a transport says of ranks that ended between calls: ``why`` (the pool's note; the
    next call restarts the ranks) and, where the next call must fail first, its ``error``."""

    def __init__(self, why: str, error: LaunchError | None = None) -> None:
        self.why, self.error = why, error


class RankTransport(abc.ABC):
    """The ranks of one pool, where they live (see the module). ``processes`` is the same list
    object for the pool's life (its finalizer holds it); ``pipes`` each rank's streams, events
    and answers, read by the call's supervisor and between calls by ``idle.IdleReader``."""

    def __init__(self) -> None:
        self.backend_name = "persistent"   # what the launch line and the panel call these ranks
        self.processes: list[RankProcess] = []
        self.pipes: list[RankPipes] = []
        self.interrupts: CallInterrupts | None = None
        self.result_fds: list[int] = []   # by local rank: where a call's result files come back, if any

    @abc.abstractmethod
    def start(self, logs_for: LogsFor) -> LaunchPlan:
        """Start the ranks idle, serving calls; returns their plan. ``logs_for`` opens the
        pool's logs (once; a restart gets the same). Leaves nothing started when it raises."""

    @abc.abstractmethod
    def launch_line(self, plan: LaunchPlan, logs: RunLogs, display: str) -> str:
        """What the pool's first start prints (``session.launch_line`` and where the ranks run)."""

    @abc.abstractmethod
    def send(self, frame: commands.Frame) -> None:
        """A call's frame whole to every rank (a rank that is gone is skipped: the supervisor
        sees its end)."""

    def describe(self, state: RunState) -> None:  # noqa: B027  (nothing to add for ranks of this machine)
        """Where each rank runs, in a call's run state (a cluster's ranks name their node)."""

    @abc.abstractmethod
    def tag(self, plan: LaunchPlan, template: str | None) -> Callable[[int], str]:
        """Local rank -> the prefix of its lines between calls (``template``: the line prefix)."""

    def idle_begins(self) -> None:  # noqa: B027  (a rank of another machine: its end is its engine's to say)
        """The ranks go idle (started, or a call is over): note what naming a death between calls
        needs from the ranks alive now (their memory cgroups, the kernel's OOM counts)."""

    def on_exit(self, process: RankProcess) -> None:  # noqa: B027  (a rank of another machine: nothing here)
        """A rank ended between calls (the between-calls reader saw it): end what it started."""

    @abc.abstractmethod
    def lost_between_calls(self, gone: list[RankProcess], logs: RunLogs, num_processes: int) -> LostBetweenCalls:
        """Ranks found ended when a call comes: why (and whether that call fails first)."""

    @abc.abstractmethod
    def stop(self, graceful: bool, before_kill: Callable[[], object]) -> None:
        """End every rank (``graceful``: STOP, and STOP_GRACE seconds to return) and what they
        started, call ``before_kill`` once they had their grace (the between-calls reader reads
        their last lines until then), and close the channels: afterwards ``processes`` is empty."""

    @abc.abstractmethod
    def abandon(self) -> None:
        """The pool was forgotten without ``close()`` (its finalizer): nothing of it stays. It
        must not need the pool (the finalizer holds only the transport)."""


def exited(process: RankProcess) -> bool:
    """Whether the rank ended, without reaping it (its pid stays its group's id until then)."""
    if process.reaped or process.sentinel is None:
        return process.poll() is not None
    return bool(select.select([process.sentinel], [], [], 0)[0])


def ended(processes: list[RankProcess]) -> list[RankProcess]:
    """Those of ``processes`` that ended (as ``exited``), their sentinels asked in one select:
    asked before and after every call on persistent ranks (issue 45: one syscall, not one a rank)."""
    sentinels = [p.sentinel for p in processes if not p.reaped and p.sentinel is not None]
    ready = set(select.select(sentinels, [], [], 0)[0]) if sentinels else set()
    return [p for p in processes
            if (p.sentinel in ready if not p.reaped and p.sentinel is not None else p.poll() is not None)]


def wait_for_ends(processes: list[RankProcess], seconds: float) -> None:
    """Wait up to ``seconds`` in all for ``processes`` to end (those with a sentinel)."""
    deadline = time.monotonic() + seconds
    for process in processes:
        left = deadline - time.monotonic()
        if left > 0 and not exited(process) and process.sentinel is not None:
            select.select([process.sentinel], [], [], left)
