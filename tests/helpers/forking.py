"""For tests that fork while another thread holds a lock (the class fork_locks answers)."""
from __future__ import annotations

import threading
import time
from typing import ContextManager


def hold_in_another_thread(lock: ContextManager[object], seconds: float = 60) -> None:
    """Another (daemon) thread takes ``lock`` and keeps it for ``seconds``; returns once it holds it,
    so that a fork made next copies the lock held by a thread the child will not have."""
    held = threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            time.sleep(seconds)

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
