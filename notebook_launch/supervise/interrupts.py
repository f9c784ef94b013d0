"""Teardown finishes whatever the user presses.

Ctrl-C (or the kernel's interrupt button) pressed again while we stop the ranks used
to raise KeyboardInterrupt inside the teardown itself: a rank kept running, zombies and
pipe fds stayed, and the panel still said "running". For the whole run the scaffold
installs ``guarding_run()``: the first interrupt raises KeyboardInterrupt (that stops
the run); any later one, and any during a ``tearing_down()`` block, is only counted.
A counted press also cuts the SIGTERM grace short (``hurry()``): the ranks get SIGKILL
at once. When the teardown is over, one KeyboardInterrupt is raised for the counted
presses, unless one is already on its way.

A call on persistent ranks sends its frame before its bookkeeping (run state, session,
supervisor) is built, so the ranks run while the notebook builds it (issue 45). From just
before that send until its supervisor's first turn an interrupt is held (``Held``): counted,
never raised, so no frame goes out half written and no half-built session is left; the
supervisor then raises it, and it interrupts the call like any other.
"""
from __future__ import annotations

import _signal
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger("notebook_launch")


class _Gate:
    stopping = False   # the first interrupt was raised: the run is ending
    depth = 0          # nesting of tearing_down() and of a Held
    presses = 0        # interrupts counted instead of raised
    guarding = False   # guarding_run() is in force (a nested one changes nothing)


_gate = _Gate()


def hurry() -> bool:
    """True once the user pressed Ctrl-C again while the run stops: skip the rest of the grace."""
    return _gate.presses > 0


@contextlib.contextmanager
def guarding_run() -> Iterator[None]:
    """For a whole run: the first SIGINT raises KeyboardInterrupt, later ones only count."""
    if threading.current_thread() is not threading.main_thread() or _gate.guarding:
        yield   # signals reach the main thread only; or an enclosing guard holds (a call's, see Held)
        return
    # _signal, which signal wraps: the same handlers without an enum conversion of each one it
    # returns (three per run, a call on persistent ranks included; scaffold.signal_handlers)
    previous = _signal.getsignal(_signal.SIGINT)
    _gate.stopping, _gate.depth, _gate.presses = False, 0, 0
    try:   # set inside the try: an interrupt right after the handler is set still restores it
        _gate.guarding = True
        _signal.signal(_signal.SIGINT, _on_sigint)
        yield
    finally:
        _gate.guarding = False
        _signal.signal(_signal.SIGINT, previous if previous is not None else signal.default_int_handler)


@contextlib.contextmanager
def tearing_down() -> Iterator[None]:
    """Interrupts during the block are counted, not raised; one KeyboardInterrupt follows it."""
    _gate.depth += 1
    try:
        yield
    finally:
        _gate.depth -= 1
        if _gate.depth == 0 and _gate.presses:
            presses, _gate.presses = _gate.presses, 0
            if not isinstance(sys.exc_info()[1], BaseException):
                log.debug("%d interrupt(s) while stopping the ranks: raising one now", presses)
                _gate.stopping = True
                raise KeyboardInterrupt("notebook_launch: interrupted while stopping the ranks")


class Held:
    """Interrupts held from its making until ``release`` (see the module): counted, not raised.
    Only inside ``guarding_run`` on the main thread (elsewhere no interrupt comes: it holds
    nothing and touches no shared count, which another thread's run reads)."""

    def __init__(self) -> None:
        self.released = False   # release() was called (whether or not it held anything)
        self.active = _gate.guarding and threading.current_thread() is threading.main_thread()
        if self.active:
            _gate.depth += 1

    def pending(self) -> bool:
        """Whether an interrupt came while held (it will be raised at ``release``)."""
        return self.active and _gate.presses > 0

    def release(self, said: str) -> None:
        """Stop holding; raise KeyboardInterrupt(``said``) for the ones that came meanwhile,
        unless an enclosing block still holds them or an exception is on its way. Once; later
        calls do nothing."""
        self.released = True
        if not self.active:
            return
        self.active = False
        _gate.depth -= 1
        if _gate.depth == 0 and _gate.presses:
            _gate.presses = 0
            if not isinstance(sys.exc_info()[1], BaseException):
                _gate.stopping = True
                raise KeyboardInterrupt(said)


@contextlib.contextmanager
def held_through(said: str) -> Iterator[None]:
    """An interrupt during the block is held, and raised (``KeyboardInterrupt(said)``) once the
    block is done, as ``Held`` does, also outside a run (``start_ranks`` starting its ranks):
    there, on the main thread, Python's own SIGINT handler is swapped for a counting one for the
    block. A handler of the user's own is left as it is. For a block that must not stop half way:
    a request whose answer names processes that only the answer lets the caller end."""
    if _gate.guarding or threading.current_thread() is not threading.main_thread():
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


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _gate.stopping or _gate.depth > 0:
        _gate.presses += 1
        return
    _gate.stopping = True
    raise KeyboardInterrupt
