"""The notebook's signal handlers, saved and put back exactly: what the run scaffold does
around every run, and what connecting to Ray does around ``ray.init`` (which installs its
own SIGTERM handler). Torch elastic's launcher and Ray change them and never restore them;
a kernel must get back exactly what it had."""
from __future__ import annotations

import signal
import threading
from typing import Any

SAVED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD")


def save_signal_handlers() -> dict[str, Any]:
    """The current handlers (none off the main thread, where they cannot be changed)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {name: signal.getsignal(getattr(signal, name)) for name in SAVED_SIGNALS
            if hasattr(signal, name)}


def restore_signal_handlers(saved: dict[str, Any]) -> None:
    for name, handler in saved.items():
        if handler is not None:
            signal.signal(getattr(signal, name), handler)
