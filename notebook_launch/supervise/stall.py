"""Stall detection (issue 20): a rank that stays alive but shows no sign of progress for
``stall_after`` seconds is marked stalled in the run state. Nothing is stopped: the user decides.

A sign of progress is anything the notebook sees (a ``progress()`` step, an output line, an
event) or CPU time the rank's process spends: a long silent computation (a first epoch that
prints nothing) burns CPU and is never called stalled; a rank waiting in a collective, a lock or
``time.sleep`` burns none. CPU time is read from ``/proc/<pid>/stat`` at most once a second.
"""
from __future__ import annotations

import os
from typing import Callable

DEFAULT_STALL_AFTER = 300.0   # seconds; notebook_launcher's and start_ranks' default (why: see the README)
SAMPLE_EVERY = 1.0     # seconds between two reads of a rank's CPU time
BUSY_SHARE = 0.05      # CPU seconds per wall second above which the rank counts as working
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` (all its threads), or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()   # after "pid (comm) ": the comm may hold spaces
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS   # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return None


class StallWatch:
    """Per rank: when it last showed a sign of progress; ``check`` says who is stalled since when."""

    def __init__(self, stall_after: float, now: float, cpu: Callable[[int], float | None] = cpu_seconds) -> None:
        self.stall_after = stall_after
        self.cpu = cpu
        self.last_sign: dict[int, float] = {}
        self.last_cpu: dict[int, tuple[float, float]] = {}   # local rank -> (when sampled, CPU seconds)
        self.started = now

    def saw(self, local_rank: int, now: float) -> None:
        """The rank showed a sign (an event or an output line)."""
        self.last_sign[local_rank] = now

    def check(self, local_rank: int, pid: int | None, now: float) -> float | None:
        """The time since which the rank is stalled, or None when it is not."""
        sign = self.last_sign.get(local_rank, self.started)
        if pid is not None:
            sampled = self.last_cpu.get(local_rank)
            if sampled is None or now - sampled[0] >= SAMPLE_EVERY:
                spent = self.cpu(pid)
                if spent is not None:
                    if sampled is not None and spent - sampled[1] > BUSY_SHARE * (now - sampled[0]):
                        sign = self.last_sign[local_rank] = max(sign, now)   # working: CPU time grew
                    self.last_cpu[local_rank] = (now, spent)
        return sign if now - sign >= self.stall_after else None
