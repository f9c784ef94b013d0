"""Stall detection (issue 20): a run whose live ranks all show no sign of progress for
``stall_after`` seconds is stalled, and each of those ranks is marked in the run state (since
when it was quiet). Nothing is stopped: the user decides.

A sign of progress is something that means the run moves: anything the notebook sees from the
rank (a ``progress()`` step or metric, an output line, a result or any other event), CPU time
spent by the rank or by any process below it (``descendants``: every thread's children and
theirs, DataLoader workers, a subprocess a worker thread started, and what they reaped), and its
stack changing between two looks. A long silent computation (a first epoch that prints nothing)
is therefore never called stalled; a rank waiting in a collective, a lock or ``time.sleep`` does
none of these.

What is not a sign: bytes read or written. A hung rank does I/O without moving: rank 0 waiting
in ``init_process_group`` for a rank that never calls it polls its TCPStore about 200 times a
second (4-5 KB/s of socket traffic), a background logger writes a line every few seconds, and
asking the rank for its stack writes to its memfd. A download or a checkpoint that is real work
burns CPU (copying, hashing, decompressing) or draws a bar (the hub's tqdm), so it still counts.

Why the whole run: a rank that waits in a collective while another rank works (rank 0 saves a
checkpoint, downloads weights, compiles) is waiting, not stuck; the run is stuck only when no
rank moves. Then every quiet rank is marked, and the verdict (``hang_verdict``) says who waits
where and who never came.

Before a run is called stalled its quiet ranks' stacks are sampled twice, ``STACK_GAP``
seconds apart (``StallWatch(stack=)``): a rank whose stack (or collective number) changed in
between moved, and the watch starts over.

What it costs: one read of ``/proc/<pid>/stat`` per process of the rank's tree (and of each
thread's ``children`` list and ``schedstat``) at most once per ``SAMPLE_EVERY`` second, in the notebook; the ranks
do nothing for it. Two stack samples per stall, and none while the run moves.
"""
from __future__ import annotations

import os
from typing import Callable, Hashable, Sequence

from .proc_tasks import descendants, run_delay

DEFAULT_STALL_AFTER = 300.0
"""notebook_launcher's, start_ranks' and the magics' default, in seconds. Why 300:

- a training loop does not trip it: the run must show nothing at all for five minutes, on any
  rank: no output line, no ``progress()`` step, no CPU time (its own or its DataLoader
  workers'), and no change of stack. A step, a long silent epoch, an
  evaluation, a checkpoint written or weights downloaded by one rank while the others wait in a
  barrier are all signs; what is left is waiting on something outside the run (a prompt is
  not counted either);
- it comes well before the process groups' own timeouts end the run (NCCL's watchdog: 10
  minutes; gloo: 30): the panel says where every rank is while they still are there;
- a hang is rarely worth a false alarm: the mark is a claim that something is wrong, and it
  should be true when it shows. For an answer sooner, the panel's "Where are they?" button
  (and ``ranks.stacks()``) asks at once, and ``stall_after=`` takes any number of seconds.
"""
SAMPLE_EVERY = 1.0     # seconds between two reads of a rank's CPU time
BUSY_SHARE = 0.05
"""CPU seconds per wall second (over one SAMPLE_EVERY) above which a rank's tree counts as
working. Why 5% of one core: what a hung rank burns is well below it and what a working one
burns well above. Measured on the 2-core CI machine: rank 0 polling its TCPStore in
``init_process_group`` for a rank that never came, 1.5-2.5%; a rank waiting in a gloo
all_reduce, 0-0.5%; our own flusher and relay threads, a logger thread, a DataLoader worker
waiting on its queue, less. A rank that computes uses a whole core, or its share of a loaded
machine (16 busy processes on 2 cores: 12%). The counters tick every 10 ms, so 5% of a second
is 5 ticks: one tick of rounding cannot cross it."""
STACK_GAP = 2.0        # seconds between the two stack samples that confirm a stall
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

Fingerprint = Hashable   # what a rank's stack sample is compared by (None: it could not be taken)


def _stat_cpu(pid: int) -> float | None:
    """CPU seconds of ``pid`` (all its threads, ended ones included) and of the children it
    reaped (a subprocess that ran between two looks and is gone), or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()   # after "pid (comm) ": the comm may hold spaces
    try:   # utime, stime, cutime, cstime (fields 14 to 17)
        return sum(int(value) for value in fields[11:15]) / _TICKS
    except (IndexError, ValueError):
        return None


def run_delay_seconds(pid: int) -> float:
    """Time ``pid`` and every process below it spent waiting for a CPU while ready to run: on a
    loaded machine what a computing rank wants but does not get (see ``StallWatch.quiet_since``)."""
    return run_delay(pid) + sum(run_delay(child) for child in descendants(pid))


def cpu_seconds(pid: int) -> float | None:
    """CPU time of process ``pid`` and of every process below it (``descendants``), with what
    each reaped, or None when the rank's own is unreadable."""
    own = _stat_cpu(pid)
    if own is None:
        return None
    return own + sum(_stat_cpu(child) or 0.0 for child in descendants(pid))


def _busy(cpu: float, waited: float, wall: float) -> bool:
    """Whether ``cpu`` seconds over ``wall`` are work, ``waited`` of them spent waiting for a CPU
    (BUSY_SHARE of the time it could run; all CPU time counts when it waited the whole while)."""
    return cpu > BUSY_SHARE * max(wall - waited, 0.0)


class StallWatch:
    """Per rank: when it last showed a sign of progress; ``check_all`` says which ranks are stalled
    since when. ``stack(pids)`` (local rank -> pid) samples stacks to confirm a stall (None:
    confirm by CPU time alone)."""

    def __init__(self, stall_after: float, now: float, cpu: Callable[[int], float | None] = cpu_seconds,
                 stack: Callable[[dict[int, int]], dict[int, Fingerprint]] | None = None,
                 waited: Callable[[int], float] = run_delay_seconds) -> None:
        self.stall_after = stall_after
        self.cpu = cpu
        self.waited = waited
        self.stack = stack
        self.last_sign: dict[int, float] = {}
        # local rank -> (when sampled, CPU seconds, seconds waited for a CPU)
        self.last_cpu: dict[int, tuple[float, float, float]] = {}
        self.started = now
        self.samples: tuple[float, dict[int, Fingerprint]] | None = None   # the first stack sample of a candidate stall
        self.stalled = False      # the run is stalled (confirmed), until a rank moves
        self.asked_at = float("-inf")   # when the notebook last asked the ranks where they are (``asked``)

    def asked(self, now: float) -> None:
        """The notebook asked the ranks where they are and has their answers: the CPU time each spent
        answering (its where-thread walking every stack) is ours, not a sign that it moves. Without
        this a stalled run flipped back to running after a stack sample or a "Where are they?" on a
        loaded machine, and was marked stalled again later with younger ages than its report's."""
        self.asked_at = now

    def saw(self, local_rank: int, now: float) -> None:
        """The rank showed a sign (an event, an output line, a prompt it waits on)."""
        self.last_sign[local_rank] = now

    def quiet_since(self, local_rank: int, pid: int | None, now: float) -> float:
        """Since when the rank shows no sign, reading its tree's CPU time (once a SAMPLE_EVERY).

        The share is of the time the rank did not spend waiting for a CPU: on a machine with
        many more runnable processes than cores a computing rank gets a few percent of one
        (26 busy processes on a core: under 4%, below ``BUSY_SHARE``) but waits for the rest,
        and was once called stalled. A rank that sleeps, blocks or polls waits for a CPU only
        briefly after each wake-up, so its share stays what it is on a quiet machine (a 5 ms
        poller beside those 26: 0.4%).

        The first read (the baseline the next one is judged against) waits for the run's first
        ``SAMPLE_EVERY``: a launch that ends sooner (every short one) reads no /proc file for it,
        where the read cost a first launch in a fresh process a quarter of its time (/proc is slow
        on some kernels and sandboxes). What it gives up: CPU time in that first second is not a
        sign, so a rank that computed only then and hung is called stalled at most that second
        early; it started then, which is a sign of its own."""
        sign = self.last_sign.get(local_rank, self.started)
        if pid is None:
            return sign
        sampled = self.last_cpu.get(local_rank)
        if sampled is None and now - self.started < SAMPLE_EVERY:
            return sign   # the run's first second: its first read waits for it (see below)
        if sampled is None or now - sampled[0] >= SAMPLE_EVERY:
            spent = self.cpu(pid)
            if spent is not None:
                waited = self.waited(pid)
                # judged only over a span that holds no answer of ours (``asked``)
                if sampled is not None and sampled[0] > self.asked_at and \
                        _busy(spent - sampled[1], waited - sampled[2], now - sampled[0]):
                    sign = self.last_sign[local_rank] = max(sign, now)
                self.last_cpu[local_rank] = (now, spent, waited)
        return sign

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
                    self.asked(now)
                    return {local: None for local in quiet}
                if now - self.samples[0] < STACK_GAP:
                    return {local: None for local in quiet}
                first, second = self.samples[1], self.stack(pids)
                self.samples = None
                self.asked(now)
                moved = [local for local in pids
                         if first.get(local) is not None and first.get(local) != second.get(local)]
                if moved:   # its stack changed: it works without showing it
                    for local in moved:
                        self.last_sign[local] = now
                    return {local: None for local in quiet}
            self.stalled = True
        return {local: since for local, since in quiet.items()}
