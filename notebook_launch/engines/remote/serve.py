"""A persistent rank on another machine, the rank side (``engines.remote.persistent`` is the notebook's,
under ``engines.ray.persistent`` and ``engines.slurm.persistent``): a Ray actor's and a SLURM task's alike
(``engines.slurm.task`` runs the same loop). Told here for Ray; a SLURM task differs only in how it started.

The actor runs the same ``RankActor.run`` as a launched Ray rank (streams connected back to
the notebook, the rank's environment, ``runner.run_rank``); its job is ``serve_ray_calls``,
the loop of ``rank.serve`` over a network: no memfd, Unix socket or shared memory
reaches the notebook from another machine, so everything the notebook says to the rank
travels on the rank's events connection (the notebook -> rank direction, which a launch
uses only for signals), as messages (their format: ``channels.remote_commands``):

- CALL: a call's frame as ``persistent.command_frames.encode`` made it, and the bytes of its
  tensor file (the rank puts them in a memfd of its own and maps it, as a local rank does);
- INTERRUPT n: the notebook interrupts call n (what a local pool writes to its shared
  ``InterruptSlot`` and signals with SIGINT): the rank's own slot records it and the rank
  signals itself, under the local rule (it raises only while call n's code runs);
- STOP: the loop returns; end of file (the notebook went away) ends the process;
- a where request (``channels.remote_where``): a launch's 4-byte request frame, told from a message by
  its first byte (0, which no kind is); the rank answers on its answers connection.

One thread (``listen``) reads that connection for the life of the actor's call, so an
interrupt is seen while the main thread runs the user's code; frames of calls go to the
main thread through a queue. Results travel inside the RESULT event (no result file).
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import threading
from dataclasses import dataclass
from typing import Any

from ...wire import protocol, shared_tensors
from ...wire.plan import DeviceKind, RankSpec
from ...channels.commands import Command
from ...channels.interrupt_slot import InterruptSlot
from ...channels.remote_commands import MESSAGE, WHERE_REQUEST_BYTE, Kind
from ...channels.sockets import SIGNAL_FRAME
from ...rank import runner
from ...rank.serve import Call
from ...channels.remote_where import request_number
from ...rank.reports.remote_where import Answerer

log = logging.getLogger("notebook_launch")


@dataclass
class Inbox:
    """What the listening thread hands the serving loop: call frames, in order; None = stop."""
    calls: "queue.Queue[tuple[bytes, bytes] | None]"
    slot: InterruptSlot   # of this rank alone
    stopped: threading.Event
    main_thread: int   # the thread that runs the calls (the actor's task: the worker's main thread)
    between_calls: bool = False   # the serving loop waits for the next call (what a where answer says)


_inbox: Inbox | None = None


def listen(sock: Any, finished: threading.Event, answers: Any = None) -> Inbox:
    """Start reading the notebook's messages on the events connection (the actor's ``run`` calls
    this instead of its signal reader when the job is a persistent rank); where requests are
    answered on ``answers``, the rank's answers connection (None: read and left unanswered)."""
    global _inbox
    inbox = Inbox(queue.Queue(), InterruptSlot(1), threading.Event(), threading.get_ident())
    _inbox = inbox
    answerer = None if answers is None else Answerer(answers, lambda: inbox.between_calls)
    threading.Thread(target=_read_messages, args=(sock, inbox, finished, answerer), daemon=True,
                     name="notebook_launch-ray-commands").start()
    return inbox


def _read_messages(sock: Any, inbox: Inbox, finished: threading.Event, answerer: Answerer | None) -> None:
    while True:
        first = _receive(sock, 1)
        if first == WHERE_REQUEST_BYTE:   # a where request (a 4-byte frame): no message kind is 0
            rest = _receive(sock, SIGNAL_FRAME.size - 1)
            number = None if rest is None else request_number(SIGNAL_FRAME.unpack(first + rest)[0])
            if number is not None and answerer is not None:
                answerer.ask(number)
            continue   # (end of file: the next read says so)
        rest = None if first is None else _receive(sock, MESSAGE.size - 1)
        header = None if first is None or rest is None else first + rest
        if header is None:   # the notebook is gone (or closed the ranks)
            inbox.calls.put(None)
            if not finished.is_set() and not inbox.stopped.is_set():
                os._exit(runner.EXIT_FAILED)   # as a local rank dies with its notebook
            return
        kind, first, second = MESSAGE.unpack(header)
        if kind == Kind.CALL:
            data = _receive(sock, first)
            tensors = _receive(sock, second) if second else b""
            if data is None or tensors is None:
                continue   # end of file: the next read says so
            inbox.calls.put((data, tensors))
        elif kind == Kind.INTERRUPT:
            inbox.slot.request(first)
            if inbox.slot.serving(0) and not finished.is_set():
                # to the main thread itself: a process-wide signal lands on any of Ray's threads,
                # and the main thread, asleep in a system call (time.sleep, a socket read), would
                # run the handler only once that call returned by itself
                signal.pthread_kill(inbox.main_thread, signal.SIGINT)
        elif kind == Kind.STOP:
            inbox.stopped.set()
            inbox.calls.put(None)


def _receive(sock: Any, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        try:
            chunk = sock.recv(min(left, 1 << 22))
        except OSError:
            chunk = b""
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class ResultInEvent:
    """The rank's event writer as one call sees it: the result's tensors stay in the RESULT
    event (there is no file the notebook could map on another machine)."""

    def __init__(self, writer: protocol.EventWriter) -> None:
        self.writer = writer

    def result_file(self) -> None:
        return None

    def send(self, kind: protocol.EventKind, payload: Any) -> None:
        self.writer.send(kind, payload)

    def close(self) -> None:
        pass


def decode(data: bytes, tensors: bytes) -> tuple[str, Any]:
    """A CALL message's frame: (command, payload) as ``serve.receive_command`` reads it locally."""
    fd = shared_tensors.create_file() if tensors else None
    try:
        if fd is not None:
            view = memoryview(tensors)
            while view:
                view = view[os.write(fd, view):]
        elif tensors:
            raise OSError("this node cannot create a memfd for the call's tensors")
        kind, payload = shared_tensors.loads(data, fd)
        return str(kind), Call.from_wire(payload) if kind == Command.CALL.value else payload
    finally:
        if fd is not None:
            os.close(fd)


def serve_ray_calls(device_kind: DeviceKind) -> None:
    """The function a persistent Ray rank runs (``runner.run_rank`` calls it on the actor): one
    call after the other until STOP, each through ``rank.serve.run_one``."""
    from ...rank import namespace
    from ...rank.serve import Interruptible, run_one
    inbox = _inbox
    assert inbox is not None, "serve_ray_calls runs inside RankActor.run with a persistent assignment"
    global_rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    spec = RankSpec(global_rank, local_rank, f"cuda:{local_rank}" if device_kind == "cuda" else "cpu", {})
    writer = protocol.current()
    assert writer is not None, "serve_ray_calls runs inside a rank"
    interrupts = Interruptible(inbox.slot, 0)
    saved = signal.signal(signal.SIGINT, interrupts.handler)
    # A Ray worker's main thread blocks SIGINT (SigBlk 0x2 in /proc): unblocked while we serve,
    # or an interrupt would wait, pending, until the call ended by itself
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    inbox.slot.set_serving(0)
    ns = namespace.current()
    try:
        while True:
            inbox.between_calls = True
            try:
                message = inbox.calls.get()
            finally:
                inbox.between_calls = False
            if message is None:
                return
            try:
                kind, payload = decode(*message)
            except Exception as exc:   # why: the frame was read whole; only this call is lost
                runner.report_error(protocol.error_payload(
                    exc, message=f"rank {global_rank} could not unpickle the call "
                    f"({type(exc).__name__}: {exc}); define what it needs in the notebook or push it"), writer)
                continue
            if kind == Command.STOP.value:
                return
            run_one(spec, payload, ns, interrupts, ResultInEvent(writer), forked=False)  # type: ignore[arg-type]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, saved)
