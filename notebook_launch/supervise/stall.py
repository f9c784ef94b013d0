"""Stall detection (issue 20): a run whose live ranks all show no sign of progress for
``stall_after`` seconds is stalled, and each of those ranks is marked in the run state (since
when it was quiet). Nothing is stopped: the user decides.

A sign of progress is anything the notebook sees (a ``progress()`` step, an output line, an
event) or work the rank does without telling: CPU time spent by its process or by the
processes it started (DataLoader workers), or bytes it read or wrote through system calls (a
download, a checkpoint). A long silent computation (a first epoch that prints nothing) is
therefore never called stalled; a rank waiting in a collective, a lock or ``time.sleep`` does
none of these.

Why the whole run: a rank that waits in a collective while another rank works (rank 0 saves a
checkpoint, downloads weights, compiles) is waiting, not stuck; the run is stuck only when no
rank moves. Then every quiet rank is marked, and the verdict (``hang_verdict``) says who waits
where and who never came.

Before a run is called stalled its quiet ranks' stacks are sampled twice, ``STACK_GAP``
seconds apart (``StallWatch(stack=)``): a rank whose stack (or collective number) changed in
between moved, and the watch starts over.

What it costs: one read of ``/proc/<pid>/stat`` and ``/proc/<pid>/io`` per rank (and of its
children's stat) at most once per ``SAMPLE_EVERY`` second, in the notebook; the ranks do
nothing for it. Two stack samples per stall, and none while the run moves.
"""
from __future__ import annotations

import os
from typing import Callable, Hashable, Sequence

DEFAULT_STALL_AFTER = 300.0
"""notebook_launcher's, start_ranks' and the magics' default, in seconds. Why 300:

- a training loop does not trip it: the run must show nothing at all for five minutes, on any
  rank: no output line, no ``progress()`` step, no CPU time (its own or its DataLoader
  workers'), no byte read or written, and no change of stack. A step, a long silent epoch, an
  evaluation, a checkpoint written or weights downloaded by one rank while the others wait in a
  barrier are all signs; what is left is waiting on something outside the run (a prompt is
  not counted either);
- it comes well before the process groups' own timeouts end the run (NCCL's watchdog: 10
  minutes; gloo: 30): the panel says where every rank is while they still are there;
- a hang is rarely worth a false alarm: the mark is a claim that something is wrong, and it
  should be true when it shows. For an answer sooner, the panel's "Where are they?" button
  (and ``ranks.stacks()``) asks at once, and ``stall_after=`` takes any number of seconds.
"""
SAMPLE_EVERY = 1.0     # seconds between two reads of a rank's CPU time and I/O
BUSY_SHARE = 0.05      # CPU seconds per wall second above which the rank counts as working
STACK_GAP = 2.0        # seconds between the two stack samples that confirm a stall
MAX_CHILDREN = 64      # processes under a rank whose CPU time is counted (DataLoader workers)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

Fingerprint = Hashable   # what a rank's stack sample is compared by (None: it could not be taken)


def _stat_cpu(pid: int) -> float | None:
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


def _children(pid: int) -> list[int]:
    """The processes ``pid``'s main thread started and that still run (DataLoader workers are)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(word) for word in f.read().split()]
    except (OSError, ValueError):
        return []


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` (all its threads) and of the processes under it
    (up to MAX_CHILDREN), or None when the rank's own is unreadable."""
    own = _stat_cpu(pid)
    if own is None:
        return None
    total, pending, seen = own, _children(pid), 0
    while pending and seen < MAX_CHILDREN:
        child = pending.pop()
        seen += 1
        total += _stat_cpu(child) or 0.0
        pending.extend(_children(child))
    return total


def io_bytes(pid: int) -> int | None:
    """Bytes ``pid`` read and wrote through system calls (rchar + wchar), or None when unreadable."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        name, _, value = line.partition(b":")
        if name in (b"rchar", b"wchar"):
            total += int(value)
    return total


class StallWatch:
    """Per rank: when it last showed a sign of progress; ``check_all`` says which ranks are stalled
    since when. ``stack(pids)`` (local rank -> pid) samples stacks to confirm a stall (None:
    confirm by CPU time and I/O alone)."""

    def __init__(self, stall_after: float, now: float, cpu: Callable[[int], float | None] = cpu_seconds,
                 io: Callable[[int], int | None] = io_bytes,
                 stack: Callable[[dict[int, int]], dict[int, Fingerprint]] | None = None) -> None:
        self.stall_after = stall_after
        self.cpu = cpu
        self.io = io
        self.stack = stack
        self.last_sign: dict[int, float] = {}
        self.last_cpu: dict[int, tuple[float, float]] = {}   # local rank -> (when sampled, CPU seconds)
        self.last_io: dict[int, int] = {}
        self.started = now
        self.samples: tuple[float, dict[int, Fingerprint]] | None = None   # the first stack sample of a candidate stall
        self.stalled = False      # the run is stalled (confirmed), until a rank moves

    def saw(self, local_rank: int, now: float) -> None:
        """The rank showed a sign (an event, an output line, a prompt it waits on)."""
        self.last_sign[local_rank] = now

    def quiet_since(self, local_rank: int, pid: int | None, now: float) -> float:
        """Since when the rank shows no sign, reading its CPU time and I/O (once a SAMPLE_EVERY)."""
        sign = self.last_sign.get(local_rank, self.started)
        if pid is None:
            return sign
        sampled = self.last_cpu.get(local_rank)
        if sampled is None or now - sampled[0] >= SAMPLE_EVERY:
            spent, moved = self.cpu(pid), self.io(pid)
            worked = moved is not None and local_rank in self.last_io and moved != self.last_io[local_rank]
            if spent is not None:
                worked = worked or (sampled is not None and spent - sampled[1] > BUSY_SHARE * (now - sampled[0]))
                self.last_cpu[local_rank] = (now, spent)
            if moved is not None:
                self.last_io[local_rank] = moved
            if worked:
                sign = self.last_sign[local_rank] = max(sign, now)
        return sign

    def rebase_io(self, pids: dict[int, int]) -> None:
        """Forget the I/O counters: our own stack dump writes to the rank's memfd (not its work)."""
        for local_rank, pid in pids.items():
            moved = self.io(pid)
            if moved is not None:
                self.last_io[local_rank] = moved

    def check(self, local_rank: int, pid: int | None, now: float) -> float | None:
        """One rank alone: the time since which it is stalled, or None (no stack sampling)."""
        sign = self.quiet_since(local_rank, pid, now)
        return sign if now - sign >= self.stall_after else None

    def check_all(self, live: Sequence[tuple[int, int | None]], now: float) -> dict[int, float | None]:
        """For the live ranks ((local rank, pid)): since when each is stalled (None: it is not).
        Stalled only when every one of them is quiet for ``stall_after`` and, with ``stack``,
        none of their stacks changed across two samples STACK_GAP seconds apart."""
        quiet: dict[int, float] = {local: self.quiet_since(local, pid, now) for local, pid in live}
        if not quiet or any(now - since < self.stall_after for since in quiet.values()):
            self.samples, self.stalled = None, False
            return {local: None for local in quiet}
        if not self.stalled:
            pids = {local: pid for local, pid in live if pid is not None}
            if self.stack is not None and pids:
                if self.samples is None:
                    self.samples = (now, self.stack(pids))
                    self.rebase_io(pids)
                    return {local: None for local in quiet}
                if now - self.samples[0] < STACK_GAP:
                    return {local: None for local in quiet}
                first, second = self.samples[1], self.stack(pids)
                self.rebase_io(pids)
                self.samples = None
                moved = [local for local in pids
                         if first.get(local) is not None and first.get(local) != second.get(local)]
                if moved:   # its stack changed: it works without showing it
                    for local in moved:
                        self.last_sign[local] = now
                    return {local: None for local in quiet}
            self.stalled = True
        return {local: since for local, since in quiet.items()}
