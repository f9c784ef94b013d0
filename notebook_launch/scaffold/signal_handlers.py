"""The notebook's signal handlers, saved and put back exactly: what the run scaffold does
around every run, and what connecting to Ray does around ``ray.init`` (which installs its
own SIGTERM handler). Torch elastic's launcher and Ray change them and never restore them;
a kernel must get back exactly what it had."""
from __future__ import annotations

import _signal
import signal
import threading
from typing import Any

SAVED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD")


def save_signal_handlers() -> dict[str, Any]:
    """The current handlers (none off the main thread, where they cannot be changed). Read with
    ``_signal.getsignal``, which ``signal.getsignal`` wraps: the same handler objects (SIG_DFL and
    SIG_IGN as the ints ``signal.signal`` takes back) without an enum conversion per signal, which
    was a tenth of a millisecond of every call on persistent ranks (issue 45)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {name: _signal.getsignal(getattr(signal, name)) for name in SAVED_SIGNALS
            if hasattr(signal, name)}


def restore_signal_handlers(saved: dict[str, Any]) -> None:
    """Put back each handler that changed. One that did not is left alone: setting it again
    would drop what C code set beside it, invisible to Python (SA_NOCLDWAIT on SIGCHLD's
    default: the kernel reaps the notebook's children itself)."""
    for name, handler in saved.items():
        signum = getattr(signal, name)
        if handler is not None and _signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
