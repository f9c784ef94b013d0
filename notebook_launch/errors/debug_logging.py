"""``NOTEBOOK_LAUNCH_DEBUG=1``: every fallback the package takes is logged (debug level) to
stderr. A module of its own, depending on nothing of ours, because both sides turn it on:
the notebook when its hooks are installed (``hooks``), and a spawned rank at its start
(``rank.spawn_entry``: a fresh interpreter inherits the variable, not the handler; a forked
rank inherits the handler)."""
from __future__ import annotations

import logging
import os

DEBUG_VARIABLE = "NOTEBOOK_LAUNCH_DEBUG"


def debug_logging_from_environment() -> None:
    """Add a stderr handler at debug level to the ``notebook_launch`` logger when the variable says so."""
    if os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("1", "true", "yes", "on"):
        return
    logger = logging.getLogger("notebook_launch")
    logger.setLevel(logging.DEBUG)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("notebook_launch[%(process)d] %(levelname)s %(message)s"))
        logger.addHandler(handler)
