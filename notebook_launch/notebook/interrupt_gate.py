"""The notebook's own SIGINT while notebook_launch holds it: the gate every run's handler reads
(``supervise.interrupts`` installs the handler for a run and tears down under it), and the two ways
of holding an interrupt through a block that must not stop half way (``Held``, ``held_through``).

Why here, below ``supervise``: a launcher holds interrupts too (the warm start process's answer
to a fork request names ranks that only the answer lets the notebook end), and a launcher imports
nothing of the supervisor's side (tests/test_import_graph.py).
"""
from __future__ import annotations

import _signal
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType


class _Gate:
    stopping = False   # the first interrupt was raised: the run is ending
    depth = 0          # nesting of tearing_down() and of a Held
    presses = 0        # interrupts counted instead of raised
    guarding = False   # guarding_run() is in force (a nested one changes nothing)


gate = _Gate()


class Held:
    """Interrupts held from its making until ``release`` (see ``supervise.interrupts``): counted, not raised.
    Only inside ``guarding_run`` on the main thread (elsewhere no interrupt comes: it holds
    nothing and touches no shared count, which another thread's run reads)."""

    def __init__(self) -> None:
        self.released = False   # release() was called (whether or not it held anything)
        self.active = gate.guarding and threading.current_thread() is threading.main_thread()
        if self.active:
            gate.depth += 1

    def pending(self) -> bool:
        """Whether an interrupt came while held (it will be raised at ``release``)."""
        return self.active and gate.presses > 0

    def release(self, said: str) -> None:
        """Stop holding; raise KeyboardInterrupt(``said``) for the ones that came meanwhile,
        unless an enclosing block still holds them or an exception is on its way. Once; later
        calls do nothing."""
        self.released = True
        if not self.active:
            return
        self.active = False
        gate.depth -= 1
        if gate.depth == 0 and gate.presses:
            gate.presses = 0
            if not isinstance(sys.exc_info()[1], BaseException):
                gate.stopping = True
                raise KeyboardInterrupt(said)


@contextlib.contextmanager
def held_through(said: str) -> Iterator[None]:
    """An interrupt during the block is held, and raised (``KeyboardInterrupt(said)``) once the
    block is done, as ``Held`` does, also outside a run (``start_ranks`` starting its ranks):
    there, on the main thread, Python's own SIGINT handler is swapped for a counting one for the
    block. A handler of the user's own is left as it is. For a block that must not stop half way:
    a request whose answer names processes that only the answer lets the caller end."""
    if gate.guarding or threading.current_thread() is not threading.main_thread():
        held = Held()
        try:
            yield
        finally:
            held.release(said)
        return
    if _signal.getsignal(_signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    came: list[int] = []
    _signal.signal(_signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        _signal.signal(_signal.SIGINT, signal.default_int_handler)
    if came:
        raise KeyboardInterrupt(said)


def on_sigint(signum: int, frame: FrameType | None) -> None:
    if gate.stopping or gate.depth > 0:
        gate.presses += 1
        return
    gate.stopping = True
    raise KeyboardInterrupt
