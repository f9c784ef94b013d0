"""Real synchronisation for tests that need one process to be somewhere before another acts:
poll a condition with a generous deadline instead of sleeping a guessed time, which a loaded
machine outlasts. The deadlines only keep a broken test from hanging: the conditions are what
the tests wait for, and they hold within milliseconds on an idle machine."""
from __future__ import annotations

import os
import select
import time
from typing import Callable

from notebook_launch.rank.reports.whereabouts import RECORD_NAME
from notebook_launch.diagnose.stacks import rank_files, read_record

GENEROUS = 60.0   # seconds: far beyond any wait these conditions need, short of the tests' timeouts
POLL = 0.01


def wait_for(condition: Callable[[], bool], timeout: float = GENEROUS) -> bool:
    """Whether ``condition()`` became true before ``timeout`` seconds passed (polled)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


def inside_collective(pid: int, op: str) -> bool:
    """Whether the rank ``pid`` is inside the torch.distributed collective ``op`` now, as its own
    whereabouts record says (``rank.reports.whereabouts``: set as the wrapper calls into torch)."""
    files = rank_files(pid)
    record = read_record(files[RECORD_NAME]) if RECORD_NAME in files else None
    if record is None:
        return False
    record_pid, _, _, collective, inside = record
    return record_pid == pid and inside and collective is not None and collective.op == op


def wait_until_inside(pid: int, op: str, timeout: float = GENEROUS) -> None:
    """Return once the rank ``pid`` is inside ``op`` (run by another rank, which then acts);
    TimeoutError if it never gets there."""
    if not wait_for(lambda: inside_collective(pid, op), timeout):
        raise TimeoutError(f"the rank with pid {pid} was not inside {op} within {timeout:g} s")


def ended(pid: int) -> bool:
    """Whether the process ``pid`` has ended: gone, or a zombie its parent has not reaped yet, as
    its pidfd says (what the pool watches). Not /proc's "Z": a process's main thread shows it
    while the process's other threads (gloo's) are still exiting."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)
