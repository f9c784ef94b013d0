"""A process's threads as /proc shows them, the one walk every part of the diagnosis reads:
``children`` and ``descendants`` (what any thread of it started and still runs: stall detection
counts their CPU time, the stack asking asks them, XLA finds its replicas under its launcher, the
OOM watch links a killed child to its rank), ``task_times``
(each thread's CPU time and wake-ups: whether a silent rank's interpreter lock is held) and
``run_delay`` (how long its threads waited for a CPU: a computing rank on a loaded machine).

Why each thread: ``/proc/<pid>/task/<tid>/children`` lists the children of that thread only (a
subprocess a worker thread started is not under the main thread's), and schedstat is per thread.
A process or thread that ended between the listing and the read is skipped: it has nothing to say.
"""
from __future__ import annotations

import os
from typing import Callable, TypeVar

T = TypeVar("T")


def each_task(pid: int, name: str, parse: Callable[[bytes], T]) -> dict[int, T]:
    """Thread id -> ``parse`` of ``/proc/<pid>/task/<tid>/<name>``, for each thread of ``pid`` that
    could be read and parsed ({} when the process is gone)."""
    found: dict[int, T] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}", "rb") as f:
                found[int(tid)] = parse(f.read())
        except (OSError, ValueError):
            continue
    return found


def children(pid: int) -> list[int]:
    """The processes any thread of ``pid`` started that still run, in pid order."""
    lists = each_task(pid, "children", lambda text: [int(word) for word in text.split()])
    return sorted({child for found in lists.values() for child in found})


MAX_DESCENDANTS = 256  # processes one walk of a rank's tree reads at most (DataLoader workers, their children)


def descendants(pid: int, limit: int = MAX_DESCENDANTS) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), at most ``limit`` of them: stall
    detection counts their CPU time, the OOM watch links what they were to their rank."""
    found: list[int] = []
    pending = children(pid)
    seen = {pid}
    while pending and len(found) < limit:
        child = pending.pop(0)
        if child in seen:   # a pid reused while we walked: never loop
            continue
        seen.add(child)
        found.append(child)
        pending.extend(children(child))
    return found


def _schedstat(text: bytes) -> tuple[int, int]:
    ran, _waited, slices = text.split()[:3]
    return int(ran), int(slices)


def task_times(pid: int) -> dict[int, tuple[int, int]]:
    """Thread id -> (ns it ran, times it was put on a CPU), from each thread's schedstat."""
    return each_task(pid, "schedstat", _schedstat)


def run_delay(pid: int) -> float:
    """Seconds the threads of ``pid`` spent ready to run but waiting for a CPU (schedstat's second
    field; the process's own file counts its first thread only); 0 when unreadable."""
    waited = each_task(pid, "schedstat", lambda text: int(text.split()[1]))
    return sum(waited.values()) / 1e9
