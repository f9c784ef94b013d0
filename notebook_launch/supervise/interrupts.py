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

from ..notebook.interrupt_gate import Held, gate, on_sigint

__all__ = ["Held", "guarding_run", "hurry", "tearing_down"]

log = logging.getLogger("notebook_launch")


def hurry() -> bool:
    """True once the user pressed Ctrl-C again while the run stops: skip the rest of the grace."""
    return gate.presses > 0


@contextlib.contextmanager
def guarding_run() -> Iterator[None]:
    """For a whole run: the first SIGINT raises KeyboardInterrupt, later ones only count."""
    if threading.current_thread() is not threading.main_thread() or gate.guarding:
        yield   # signals reach the main thread only; or an enclosing guard holds (a call's, see Held)
        return
    # _signal, which signal wraps: the same handlers without an enum conversion of each one it
    # returns (three per run, a call on persistent ranks included; scaffold.signal_handlers)
    previous = _signal.getsignal(_signal.SIGINT)
    gate.stopping, gate.depth, gate.presses = False, 0, 0
    try:   # set inside the try: an interrupt right after the handler is set still restores it
        gate.guarding = True
        _signal.signal(_signal.SIGINT, on_sigint)
        yield
    finally:
        gate.guarding = False
        _signal.signal(_signal.SIGINT, previous if previous is not None else signal.default_int_handler)


@contextlib.contextmanager
def tearing_down() -> Iterator[None]:
    """Interrupts during the block are counted, not raised; one KeyboardInterrupt follows it."""
    gate.depth += 1
    try:
        yield
    finally:
        gate.depth -= 1
        if gate.depth == 0 and gate.presses:
            presses, gate.presses = gate.presses, 0
            if not isinstance(sys.exc_info()[1], BaseException):
                log.debug("%d interrupt(s) while stopping the ranks: raising one now", presses)
                gate.stopping = True
                raise KeyboardInterrupt("notebook_launch: interrupted while stopping the ranks")

