"""The life of a persistent rank: started like any forked or spawned rank (``rank.fork_entry``
or ``rank.spawn_entry`` -> ``rank.runner.run_rank``, which runs ``serve_calls`` as its
function; a spawned rank unpickles it from the spawn payload), it then takes
calls from its command pipe and runs each through ``runner.call_and_report``: the
same RESULT/ERROR reporting, result encoding and progress flushing as a launch.

Interrupts: the notebook sends SIGINT to interrupt a call. It raises KeyboardInterrupt
only while a call's code runs; between calls (and while a result is being sent, which
a half-written frame would corrupt) it is ignored, so the rank stays alive and in step.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..wire import function_pickles, protocol, shared_tensors
from ..channels import commands
from ..channels.interrupt_slot import InterruptSlot
from . import runner
from . import namespace

if TYPE_CHECKING:
    from ..wire.plan import LaunchPlan

log = logging.getLogger("notebook_launch")


@dataclass
class Call:
    """What one CALL frame carries: the job, and how many frames of ours sit between the
    call wrapper and the user's code (tracebacks start at the user's code)."""
    job: runner.Job
    number: int = 0          # the pool's call count: what an interrupt names
    hidden_frames: int = 0

    def wire(self) -> tuple[Any, tuple, dict, int, int]:
        """What a CALL frame carries: builtins around the function and its arguments, so that
        neither side looks up a class of ours to pickle or unpickle the call (cloudpickle's
        by-reference checks of Call and Job were a tenth of the notebook's encoding, issue 45)."""
        return self.job.function, self.job.args, self.job.kwargs, self.number, self.hidden_frames

    @classmethod
    def from_wire(cls, wire: Any) -> Call:
        """The call a CALL frame carries (``wire``). A function that came as the bytes of its own
        pickle (``command_frames.encode``) is the one unpickled from the same bytes last time,
        where nothing a call does can have changed it (``function_pickles.LoadedFunctions``)."""
        function, args, kwargs, number, hidden_frames = wire
        if isinstance(function, bytes):
            function = function_pickles.loaded.loads(function, _load_function)
        return cls(runner.Job(function, args, kwargs), number, hidden_frames)


def _load_function(data: bytes) -> Any:
    return shared_tensors.loads(data, None)


class Interruptible:
    """SIGINT raises KeyboardInterrupt only while the code of the call it was meant for runs;
    an interrupt that came before the code started raises as it starts."""

    def __init__(self, slot: InterruptSlot, local_rank: int = 0) -> None:
        self.slot = slot
        self.local_rank = local_rank
        self.calling = False
        self.number = 0
        self.raised = -1             # the call an interrupt was raised in: once per call
        self._lock = threading.Lock()
        self._main = threading.get_ident()

    def handler(self, signum: int, frame: types.FrameType | None) -> None:
        if self._claim(blocking=False):
            raise KeyboardInterrupt
        log.debug("an interrupt outside the call it was meant for (or raised already) is ignored")

    def _claim(self, blocking: bool) -> bool:
        """Whether an interrupt raises now; True once per call (the handler and the nudge
        thread both answer one SIGINT)."""
        if not self._lock.acquire(blocking=blocking):
            return False   # the nudge thread is raising it
        try:
            if self.calling and self.slot.requested(self.number) and self.raised != self.number:
                self.raised = self.number
                return True
            return False
        finally:
            self._lock.release()

    def nudge_on_signals(self) -> None:
        """Python 3.13 runs a rank's signal handlers late when the rank was forked from a
        thread other than the notebook's main one (every fork rank is: engines.local.fork_thread):
        the signal marks the eval loop of the parent's old main thread, not this one, so the
        handler waits for the next call that checks signals itself (a sleep, a write), and
        a loop of torch ops or pure Python never sees the interrupt (a child forked from a
        helper thread running ``while True: sum(range(100))`` ignored SIGINT on 3.13.0 and
        3.13.5, not on 3.12). A thread woken through the wakeup fd raises the interrupt in
        this thread instead (PyThreadState_SetAsyncExc), under the handler's rule."""
        if sys.version_info < (3, 13):
            return
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        os.set_blocking(read_fd, True)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def wake() -> None:
            while True:
                data = os.read(read_fd, 512)
                if not data:
                    return
                if signal.SIGINT in data and self._claim(blocking=True):
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._main),
                                                               ctypes.py_object(KeyboardInterrupt))

        threading.Thread(target=wake, name="notebook_launch-interrupts", daemon=True).start()

    def start(self, number: int) -> None:
        self.number = number
        self.calling = True
        self.slot.set_started(self.local_rank, number)
        if self.slot.requested(number):
            raise KeyboardInterrupt

    def stop(self) -> None:
        """The call's code is over: from now on the rank only reports (not interruptible)."""
        with self._lock:
            self.calling = False
            if sys.version_info >= (3, 13):   # an interrupt the nudge thread set and the code outran
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._main), None)
        self.slot.set_reporting(self.local_rank, self.number)


def serve_calls(plan: LaunchPlan, pipes: Sequence[commands.CommandPipe], slot: InterruptSlot,
                spawned: bool = False) -> None:
    """The function a persistent rank runs: one call after the other until STOP (or until
    the notebook goes away: end of file on the command pipe). ``spawned``: this rank is a
    fresh interpreter that was passed only its own command socket and the slot's memfd
    (under the notebook's numbers); the other numbers in ``pipes`` are not its fds."""
    local_rank = int(os.environ["LOCAL_RANK"])
    spec = plan.ranks[local_rank]
    own = pipes[local_rank]
    if spawned:   # passed to us inheritable: what the user's code starts must not hold them
        for fd in (own.read_fd, slot.fd):
            if fd is not None:
                os.set_inheritable(fd, False)
    else:
        for index, pipe in enumerate(pipes):   # keep only this rank's read end
            if index != local_rank:
                pipe.close_read_end()
            pipe.close_write_end()
    writer = protocol.current()
    assert writer is not None, "serve_calls runs inside a rank"
    # Not the rank's result file of a launch: that file only grows until it is closed
    # (shared_tensors), and these ranks answer many calls. Each call's result has its own
    # (``CallWriter``), passed to the notebook on the command socket.
    writer.tensors_fd = None
    interrupts = Interruptible(slot, local_rank)
    signal.signal(signal.SIGINT, interrupts.handler)
    interrupts.nudge_on_signals()
    slot.set_serving(local_rank)   # from now on a SIGINT is ours to judge (see InterruptSlot)
    ns = namespace.current()
    while True:
        try:
            kind, payload = receive_command(own.read_fd)
        except Exception as exc:   # why: the frame was read whole; only this call is lost
            runner.report_error(protocol.error_payload(
                exc, message=f"rank {spec.global_rank} could not unpickle the call "
                f"({type(exc).__name__}: {exc}); define what it needs in the notebook or push it"), writer)
            continue
        if kind is commands.Command.STOP:
            return
        run_one(spec, payload, ns, interrupts, CallWriter(writer, own.read_fd, payload.number),
                forked=not spawned)


def receive_command(fd: int) -> tuple[commands.Command, Any]:
    """Block until the next command on the rank's command socket (``channels.commands``); end of
    file (the notebook is gone) reads as STOP. A payload that cannot be unpickled here raises (the
    caller reports it for that call); its tensors map the memfd's pages (``shared_tensors``)."""
    frame = commands.read_frame(fd)
    if frame is None:
        return commands.Command.STOP, None
    data, tensors = frame
    try:
        kind, payload = shared_tensors.loads(data, tensors)
        command = commands.Command(kind)
        return command, Call.from_wire(payload) if command is commands.Command.CALL else payload
    finally:
        if tensors is not None:
            commands.close_fd(tensors)


class CallWriter:
    """The rank's event writer as one call's report sees it: the result's tensors go to a
    fresh memfd, passed to the notebook on the command socket just before the RESULT."""

    def __init__(self, writer: protocol.EventWriter, command_fd: int, call_number: int) -> None:
        self.writer = writer
        self.command_fd = command_fd
        self.call_number = call_number
        self.tensors: int | None = None

    def result_file(self) -> int | None:
        if self.tensors is None:
            self.tensors = shared_tensors.create_file()
        return self.tensors

    def send(self, kind: protocol.EventKind, payload: Any) -> None:
        try:
            if kind is protocol.EventKind.RESULT and self.tensors is not None \
                    and os.fstat(self.tensors).st_size:
                commands.send_result_file(self.command_fd, self.call_number, self.tensors)
            self.writer.send(kind, payload)
        finally:
            self.close()

    def close(self) -> None:
        if self.tensors is not None:
            os.close(self.tensors)
            self.tensors = None


def run_one(spec: Any, call: Call, ns: namespace.RankNamespace, interrupts: Interruptible,
            writer: CallWriter, forked: bool = True) -> None:
    """One call through the runner's report path, interruptible only inside the user's code.
    ``forked``: the rank's ``__main__`` began as a copy of the notebook's (see run_rank)."""
    job = call.job
    interrupts.number = call.number
    function = ns.adopt(job.function)
    args = tuple(ns.adopt(arg) for arg in job.args)   # e.g. a notebook loss function passed in
    before = ns.snapshot()

    def interruptible(*args: Any, **kwargs: Any) -> Any:
        try:
            interrupts.start(call.number)
            return function(*args, **kwargs)
        finally:
            interrupts.stop()

    try:
        runner.call_and_report(spec, runner.Job(interruptible, args, job.kwargs), writer,  # type: ignore[arg-type]
                               own_frames=2 + call.hidden_frames, forked_from_notebook=forked)
    finally:
        writer.close()
        ns.own_changes(before)
