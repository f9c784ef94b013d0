"""What persistent ranks on other machines share, whatever started them (Ray's actors:
``engines.ray.persistent``; SLURM's srun steps: ``engines.slurm.persistent``): no memfd, Unix socket or shared memory
reaches such a rank, so everything the notebook says to it travels on the rank's events
connection as ``channels.remote_commands`` messages, which the rank's one serving loop reads
(``engines.remote.serve.serve_ray_calls``, on an actor and on a SLURM node alike).

``RemoteTransport`` is the part of ``transport.RankTransport`` that is the same for every such
cluster: the start through the engine's launcher and its rollback (``start_through``), a call's
frame as one CALL message (``call_message``, ``write_whole``), an interrupt as a message
(``MessageSlot``), STOP and a grace before the launcher's ``end`` ends the ranks, and the
LaunchError of ranks lost between calls (``lost_between_calls_error``). What differs is how the
engine's launcher is made, where each rank runs and what it says of ranks lost between calls.
"""
from __future__ import annotations

import abc
import functools
import logging
import mmap
import os
import select
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..base import Launcher, StartFailed
from ...errors.best_effort import best_effort
from ...errors import LaunchError
from ...record.line_prefix import parse_line_prefix
from ...wire.protocol import FailureKind
from ...scaffold.session import launch_line
from ...supervise import outcome
from ...channels.commands import Frame
from ...channels.remote_commands import Kind, encode_message
from ...persistent.transport import STOP_GRACE, LostBetweenCalls, RankTransport, exited, wait_for_ends

if TYPE_CHECKING:
    from ...record.logs import RunLogs
    from ...wire.plan import LaunchPlan
    from ...rank.runner import Job
    from ...record.state import RunState

log = logging.getLogger("notebook_launch")
SEND_TICK = 1.0   # seconds between checks while a rank's connection does not take more bytes


class MessageSlot:
    """The notebook's half of ``channels.interrupt_slot.InterruptSlot`` for ranks on other machines (a
    ``transport.CallInterrupts``): an interrupt request goes to every rank as a message naming
    the call (the rank's own slot records it and the rank signals itself). The notebook does not
    signal such a rank's pid (it is a process of another machine), so every rank reads as not
    serving to ``CallSupervisor.stop``: the request is the signal. Whether a rank is reporting or
    has started the call is not shared across machines: the grace is the whole allowance."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send   # bytes -> every rank

    def request(self, call_number: int) -> None:
        self._send(encode_message(Kind.INTERRUPT, call_number))

    def serving(self, local_rank: int) -> bool:
        return False

    def reporting(self, local_rank: int, call_number: int) -> bool:
        return False

    def started(self, local_rank: int, call_number: int) -> bool:
        return True

    def close(self) -> None:
        pass


class RemoteTransport(RankTransport):
    """Ranks on other machines, reached over their events connections (see the module). A
    subclass's ``start`` makes the engine's launcher and starts the ranks through it
    (``start_through``); the launcher's ``end`` ends them."""

    def __init__(self) -> None:
        super().__init__()
        self.launchers: list[Launcher] = []   # the current ranks' launcher (a list: the finalizer's view)

    def start_through(self, launcher: Launcher, plan: LaunchPlan, job: Job, state: RunState) -> None:
        """Start the ranks as every start path does (``engines.base``): the launcher's channels,
        then its ``start``. A start that fails leaves nothing (the launcher's ``end``) and is the
        pool's LaunchError (``state``: the run state a failed start names)."""
        self.launchers[:] = [launcher]
        channels = launcher.open_channels(plan)
        try:
            processes = launcher.start(plan, job, channels)
        except BaseException as exc:
            for pipes in channels:
                pipes.close_parent_ends()
            self.end_ranks()
            if isinstance(exc, StartFailed):
                raise outcome.cluster_error(exc.text, state, rank=exc.rank, kind=exc.kind) from None
            raise
        self.pipes = list(channels)
        self.interrupts = MessageSlot(self.send_all)
        self.processes[:] = processes

    def send(self, frame: Frame) -> None:
        """The call's frame to every rank, as one CALL message with its tensors' bytes."""
        with call_message(frame) as parts:
            self.send_all(*parts)

    def send_all(self, *parts: Any) -> None:
        """``parts`` whole to every rank's events connection (a rank that is gone is skipped:
        the supervisor sees its end)."""
        for process, pipes in zip(self.processes, self.pipes):
            if pipes.events_r in pipes.closed:
                continue
            try:
                write_whole(pipes.events_r, parts, gone=functools.partial(exited, process))
            except OSError:
                log.debug("rank %d's connection is closed; not sent", process.local_rank, exc_info=True)

    def stop(self, graceful: bool, before_kill: Callable[[], object]) -> None:
        """STOP (``graceful``: up to STOP_GRACE seconds for the ranks' loops to return), then
        the cluster ends the ranks (``end_ranks``) and the channels close."""
        if graceful and self.processes:
            self.send_all(encode_message(Kind.STOP))
            wait_for_ends(self.processes, STOP_GRACE)
        before_kill()
        self.end_ranks()
        for process in self.processes:
            process.release()
        for pipes in self.pipes:
            pipes.close_parent_ends()
        self.processes[:] = []
        self.pipes = []
        self.interrupts = None

    def abandon(self) -> None:
        """Nothing of forgotten ranks stays on the cluster (the pool's finalizer)."""
        for process in self.processes:
            if not process.reaped:
                process.kill()
            process.wait()
            process.release()
        with best_effort(f"ending the {self.backend_name} ranks failed"):
            self.end_ranks()

    @property
    @abc.abstractmethod
    def nodes(self) -> list[str]:
        """Where each rank runs, by global rank: "node N (its name or address)"."""

    @abc.abstractmethod
    def place(self, rank: int) -> tuple[int, int]:
        """Global ``rank`` -> (its local rank on its node, its node's rank)."""

    @abc.abstractmethod
    def where_lines(self, plan: LaunchPlan, where: str) -> tuple[str, ...]:
        """The launch line's words on the cluster, given ``where`` ("rank 0 on node 0 (...), ...")."""

    def launch_line(self, plan: LaunchPlan, logs: RunLogs, display: str) -> str:
        where = ", ".join(f"rank {r} on {n}" for r, n in enumerate(self.nodes))
        return launch_line(plan, self.backend_name, logs, display=display, extra_lines=self.where_lines(plan, where))

    def tag(self, plan: LaunchPlan, template: str | None) -> Callable[[int], str]:
        """As the cluster's launch's lines, with each rank's node (a rank that ends has no process
        group here to end: its process is on another machine)."""
        prefix, place = parse_line_prefix(template), self.place

        def render(rank: int) -> str:
            local_rank, node_rank = place(rank)
            return prefix.render(rank=rank, local_rank=local_rank, node_rank=node_rank)
        return render

    def describe(self, state: RunState) -> None:
        """Each rank's node, in a call's run state (the panel's rows, the errors' first lines)."""
        for rank, (rs, node) in enumerate(zip(state.ranks, self.nodes)):
            rs.node, rs.node_rank = node, self.place(rank)[1]

    def end_ranks(self) -> None:
        """The launcher's end: the cluster ends every rank and what holds them (Ray's gang, SLURM's
        job), and says when they are gone."""
        for launcher in self.launchers:
            launcher.end()
        self.launchers[:] = []


def lost_between_calls_error(lost: list[int], where: list[str], reason: str, logs: RunLogs,
                             num_processes: int, node_rank: int) -> LostBetweenCalls:
    """Global ranks ``lost`` (on ``where``: their nodes, as the panel names them) ended between
    calls because of ``reason``: the next call is a LaunchError naming them, before fresh ranks
    start with the call after it."""
    rank_words = f"rank{'s' * (len(lost) > 1)} {', '.join(map(str, lost))}"
    were = "were" if len(lost) > 1 else "was"
    why = f"{rank_words} on {' and '.join(where)} {were} lost between calls"
    message = (f"notebook_launch: {rank_words} ({' and '.join(where)}) {were} lost between calls: {reason}. "
               f"This call did not run. " + outcome.ranks_lost_note(why))
    return LostBetweenCalls(why, LaunchError(message, rank=lost[0], kind=FailureKind.SIGNAL, log_dir=str(logs.path),
                                             results=[None] * num_processes, node_rank=node_rank))


@contextmanager
def call_message(frame: Frame) -> Iterator[tuple[Any, ...]]:
    """A CALL message's parts for ``frame`` (as ``command_frames.encode`` made it): the header, the
    pickle and the bytes of its tensor file, mapped (valid inside the ``with``)."""
    mapped: mmap.mmap | None = None
    tensors: memoryview = memoryview(b"")
    if frame.tensors is not None and os.fstat(frame.tensors).st_size:
        mapped = mmap.mmap(frame.tensors, os.fstat(frame.tensors).st_size, prot=mmap.PROT_READ)
        tensors = memoryview(mapped)
    body = frame.body()
    try:
        yield encode_message(Kind.CALL, len(body), len(tensors)), body, tensors
    finally:
        tensors.release()
        body.release()
        if mapped is not None:
            mapped.close()


def write_whole(fd: int, parts: Iterable[Any], gone: Callable[[], bool] = lambda: False) -> None:
    """Write every part whole on a non-blocking socket: wait while it is full, and give up
    (BrokenPipeError) once ``gone()`` says the reader ended."""
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                select.select([], [fd], [], SEND_TICK)
                if gone():
                    raise BrokenPipeError("the rank ended") from None
