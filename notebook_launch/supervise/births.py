"""Whether a process may have been born below the ranks since the last look, told from the pids
the kernel handed out since, so the OOM watch walks the ranks' trees only when one may have grown.

Why not walk every round (as it did): the walk lists the rank's threads in /proc and reads each
thread's ``children``, which leaves each thread's entry in the kernel's cache of /proc (the rank's
where-thread's too). When the rank exits, that thread's exit drops its entry while the
notebook, reaping the rank, drops the whole ``/proc/<pid>`` tree and waits for the other CPU to
finish: one reap in six took 2-8 ms of the notebook's CPU in a warm 4-rank launch on 2 busy cores,
about 3 ms a launch, the first round (right after the forks) being enough (issue 45).

What is kept: a process below a rank needs a pid handed out after the rank's, and its parent is
the rank or a process below it. So each look reads ``/proc/<pid>/stat`` of the pids handed out
since the last look (the kernel's pid counter, as ``leftovers.sweep`` does; threads take pids too,
and their files name their process's parent), and says yes at the first whose parent is one of
``parents``, and wherever it cannot tell (no /proc, too many pids since, the counter gone round).
"""
from __future__ import annotations

from ..process.leftovers import birth_mark

MAX_LOOKS = 256   # pids read at most in one look; more born since: a walk, as before
FIRST_PID = 300   # where the kernel's counter starts again after pid_max (RESERVED_PIDS)


class Births:
    """The pids handed out since the last ``below`` (first: since ``since``, a ``birth_mark``
    taken before the ranks started; None: the first look says yes)."""

    def __init__(self, since: tuple[int, int] | None = None) -> None:
        self.since = since

    def below(self, parents: set[int]) -> bool:
        """Whether a process born since the last look may have one of ``parents`` for its parent:
        True at the first such pid read, and wherever it cannot be told. Moves the mark."""
        since, now = self.since, birth_mark()
        self.since = now
        if since is None or now is None:
            return True
        pids = _handed_out(since, now)
        if pids is None:
            return True
        return any(_parent(pid) in parents for pid in pids)


def _handed_out(since: tuple[int, int], now: tuple[int, int]) -> list[int] | None:
    """The pids the counter can have handed out from ``since`` to ``now`` (each ``(last pid,
    forks since boot)``), in order; None where there are too many to read or it cannot tell."""
    (first, forks_then), (last, forks_now) = since, now
    if forks_now - forks_then > MAX_LOOKS:
        return None
    if last >= first:
        spans = [range(first + 1, last + 1)]
    else:   # gone round past pid_max
        pid_max = _pid_max()
        if pid_max is None:
            return None
        spans = [range(first + 1, pid_max), range(FIRST_PID, last + 1)]
    if sum(len(span) for span in spans) > 4 * MAX_LOOKS:   # pids in use skipped: a few, not thousands
        return None
    return [pid for span in spans for pid in span]


def _pid_max() -> int | None:
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _parent(pid: int) -> int | None:
    """The parent of ``pid``'s process (for a thread's id, its process's), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None
