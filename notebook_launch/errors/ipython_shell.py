"""The running IPython shell, found without importing IPython: the one way the package asks.

``IPython.get_ipython()`` returns a shell only where one runs, and a shell runs only where
IPython was imported, so a process without ``IPython`` in ``sys.modules`` has none. Importing
IPython to find that out costs a plain Python process ~130 ms and 100 modules (traitlets,
pygments, ...) on its first launch, for nothing. Imports nothing of ours (anything may use it).
"""
from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("notebook_launch")


def running_shell() -> Any:
    """The running IPython shell (a Jupyter kernel's or a terminal's), or None: never imports IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:   # why: a half-imported or stubbed IPython
        log.debug("IPython is imported but get_ipython() failed", exc_info=True)
        return None


def running_kernel() -> Any:
    """The Jupyter kernel of the running shell, or None (a script, a terminal IPython)."""
    return getattr(running_shell(), "kernel", None)
