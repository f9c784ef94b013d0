"""The one way the package swallows an error on purpose: ``with best_effort(why):`` around
something whose failure must not stop what it serves (an extra the panel shows, a cleanup a
process exit will do anyway, a library's optional hook). The reason is the debug message, so
``NOTEBOOK_LAUNCH_DEBUG=1`` shows every fallback taken, with its traceback.

Every other broad handler (``except Exception``, ``except BaseException``, a bare ``except``)
re-raises or says on its ``except`` line why swallowing is right there (``# why: ...``):
``tests/test_broad_handlers.py`` holds the package to that. It imports nothing of ours, so
both sides (rank/ too) may use it."""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

log = logging.getLogger("notebook_launch")


@contextlib.contextmanager
def best_effort(why: str, *args: object) -> Iterator[None]:
    """Run the block; an ``Exception`` it raises ends the block and is logged at debug level
    as ``why % args`` (what failed, and what goes on without it), with its traceback.
    KeyboardInterrupt and SystemExit pass."""
    try:
        yield
    except Exception:   # why: the caller chose to go on without the block; its reason is logged
        log.debug(why, *args, exc_info=True)
