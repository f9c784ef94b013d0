"""Each rank's resources, sampled in the notebook: CPU use, resident memory and what of it is the
rank's own (USS/PSS), its GPU through NVML (``gpu_usage``), and the machine's memory.

Why here, and this way: the notebook already holds every local rank's pid, so reading
``/proc/<pid>`` costs the ranks nothing; the rank side sends nothing and does nothing per training
step. The supervisor's loop calls ``sample`` when it wakes anyway (``oom.MemoryWatch``, the one
sampler: its OOM message quotes the resident sizes read here), a round at most once every
``SAMPLE_EVERY`` seconds, with no thread of its own. A round reads a few small /proc files per
rank (about 0.1 ms of CPU each). What of a rank's memory is its own (``smaps_rollup``) costs more:
the kernel walks the process's page tables, some 5 ms for a rank that imported torch and more the
more it maps. So those reads take turns, the stalest rank first, and after each batch the next
one waits long enough for them to stay under ``DETAIL_BUDGET`` of one core however big the ranks
are (a big rank's own memory is then refreshed less often; its resident memory every round).
``benchmarks/resource_sampling.py`` measures the whole sampler's share of a core.

Ranks on other machines (Ray actors, SLURM ranks) are not sampled here: their pids mean nothing
on this machine. They sample themselves (``rank.reports.resources``) and send the figures as RESOURCES
events; ``reported`` takes them into the same ``usage``, so every display shows them alike.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Mapping

from ..record.proc_usage import cpu_times, machine_memory, own_memory, resident
from ..record.resources import (MachineMemory, RankUsage, helper_pids, usage_end_log_text, usage_from_record,
                                usage_log_text)

if TYPE_CHECKING:
    from ..record.logs import LogWriter
    from ..record.state import RunState
    from ..record.gpu_usage import GpuWatch

SAMPLE_EVERY = 1.0     # seconds between two rounds, at the least
DETAIL_BUDGET = 0.005  # the share of one core the smaps_rollup reads may take (the whole goal: under 1%)
LOG_EVERY = 60.0       # seconds between two resource lines in a rank's log
log = logging.getLogger("notebook_launch")


class ResourceSampler:
    """Each rank's usage as last sampled (``usage``: local rank -> RankUsage) and the machine's
    memory (``machine``). A rank that ended keeps its last sample."""

    def __init__(self) -> None:
        self.usage: dict[int, RankUsage] = {}
        self.updated: set[int] = set()   # the local ranks the last round read (the others had ended)
        self.machine: MachineMemory | None = None
        self.next_round = 0.0
        self.next_detail = 0.0        # when the smaps_rollup reads may go on
        self._own: dict[int, tuple[int, int] | None] = {}   # local rank -> (USS, PSS) last read
        self._own_at: dict[int, float] = {}                 # local rank -> when
        self.rounds = 0
        self.cpu_spent = 0.0          # CPU seconds the rounds took, in this thread
        self._pids: dict[int, int] = {}                        # local rank -> the pid sampled
        self._cpu_before: dict[int, tuple[float, float]] = {}   # local rank -> (CPU seconds, when)
        self._born: dict[int, float] = {}   # local rank -> when its process started (monotonic clock)
        self._gpu: "GpuWatch | None" = None
        self._gpu_tried = False
        self._published = 0           # the round the run state last got
        self._logged: dict[int, float] = {}   # local rank -> when its log last got a line
        self._reported: set[int] = set()      # ranks on other machines that sent a sample since the last publish
        self._ending: set[int] = set()        # ranks reaped whose log awaits its line over the rank's life

    def due(self, now: float) -> bool:
        return now >= self.next_round

    def sample(self, pids: Mapping[int, int], devices: Mapping[int, str], now: float | None = None) -> bool:
        """One round, if one is due: each live rank (local rank -> pid) and, for those on a GPU
        (``devices``: local rank -> "cuda:0", ...), NVML. Returns whether it sampled."""
        now = time.monotonic() if now is None else now
        if not self.due(now):
            return False
        spent = time.thread_time()
        gpus = self.gpu_watch(devices)
        self.updated = set()
        for local, pid in pids.items():   # the cheap reads first: a rank about to end is still there
            try:
                self.sample_one(local, pid, now, gpus, devices.get(local, ""))
            except Exception:   # why: an extra: the run goes on without it
                log.debug("could not sample rank %d's resources", local, exc_info=True)
        if self.rounds == 0:   # a supervision's first round (each call on persistent ranks has one): cheap only
            self.next_detail = now + SAMPLE_EVERY
        self.read_own_memory({local: pids[local] for local in self.updated}, now)
        self.machine = machine_memory(helper_pids()) or self.machine
        self.cpu_spent += time.thread_time() - spent
        self.rounds += 1
        self.next_round = now + SAMPLE_EVERY
        return True

    def read_own_memory(self, pids: Mapping[int, int], now: float) -> None:
        """USS and PSS of the stalest ranks, while this batch costs under DETAIL_BUDGET of a
        core's SAMPLE_EVERY (one rank at least, and every rank not read yet: a picture whose rows
        say memory one way needs each rank's own pages once); then a wait that keeps their share
        in budget."""
        if now < self.next_detail or not pids:
            return
        spent = 0.0
        for local in sorted(pids, key=lambda local: self._own_at.get(local, float("-inf"))):
            if spent >= DETAIL_BUDGET * SAMPLE_EVERY and local in self._own_at:
                break
            started = time.thread_time()
            own = self._own[local] = own_memory(pids[local])
            self._own_at[local] = now
            usage = self.usage[local]
            if own is not None:
                uss, pss = own
                peak = uss if usage.peak_uss is None else max(uss, usage.peak_uss)
                self.usage[local] = dataclasses.replace(usage, uss=uss, pss=pss, peak_uss=peak)
            spent += time.thread_time() - started
        self.next_detail = now + spent / DETAIL_BUDGET

    def sample_one(self, local: int, pid: int, now: float, gpus: "GpuWatch | None", device: str) -> None:
        rss = resident(pid)
        if rss is None:   # it ended: keep what it had
            return
        previous = self.usage.get(local) if self._pids.get(local) == pid else None   # a new process starts afresh
        self._pids[local] = pid
        own = self._own.get(local) if previous is not None else None   # a new process: not read yet
        # read in an earlier round (they take turns): never more than it holds now
        uss, pss = (min(own[0], rss), min(own[1], rss)) if own is not None else (None, None)
        times = cpu_times(pid)
        percent = average = None
        if times is not None:
            used, age = times
            average = 100.0 * used / age if age > 0 else None
            self._born[local] = now - age
            before = self._cpu_before.get(local)
            if previous is not None and before is not None and now > before[1]:
                percent = max(0.0, 100.0 * (used - before[0]) / (now - before[1]))
            self._cpu_before[local] = (used, now)
        peak_rss = rss if previous is None else max(rss, previous.peak_rss)
        peak_uss = None if previous is None else previous.peak_uss
        gpu = None if gpus is None or not device.startswith("cuda") else gpus.usage(device, pid)
        self.usage[local] = RankUsage(rss=rss, uss=uss, pss=pss, cpu_percent=percent, cpu_average=average,
                                      peak_rss=peak_rss, peak_uss=peak_uss, gpu=gpu)
        self.updated.add(local)

    def note_births(self, pids: Mapping[int, int], now: float | None = None) -> None:
        """When each rank's process started, read as the run begins: a rank that ends before its
        first sample still gets its life's CPU average (one row of a quick run had none beside
        the other's "avg cpu 56%")."""
        now = time.monotonic() if now is None else now
        for local, pid in pids.items():
            if local in self._born and self._pids.get(local, pid) == pid:
                continue   # known (a call on persistent ranks): no /proc read
            times = cpu_times(pid)
            if times is not None:
                self._born[local] = now - times[1]
                self._pids.setdefault(local, pid)

    def ended(self, local: int, peak_rss: int, cpu_seconds: float | None = None,
              now: float | None = None) -> None:
        """A local rank reaped, with what the kernel counted of its whole life (``channels.EndUsage``):
        its peak resident memory replaces the sampled peak where it is higher (samples come once a
        second; the kernel saw every page), and its CPU time over its whole life gives its average
        (the last sample's was its average up to then: a rank sampled early in a run of a second or
        two read "avg cpu 0%" for work it did after). A rank that ended before its first sample (a
        run of a fraction of a second: it was once missing from the final picture) gets its row from
        it alone: its peak (no CPU average: its start time was never read)."""
        usage = self.usage.get(local)
        if usage is None:
            usage = RankUsage(rss=peak_rss, peak_rss=peak_rss)
        elif peak_rss > usage.peak_rss:
            usage = dataclasses.replace(usage, peak_rss=peak_rss)
        born = self._born.get(local)
        life = (time.monotonic() if now is None else now) - born if born is not None else 0.0
        if cpu_seconds is not None and life > 0:
            usage = dataclasses.replace(usage, cpu_average=100.0 * cpu_seconds / life)
        self.usage[local] = usage
        self._reported.add(local)   # the next publish shows it
        self._ending.add(local)     # and logs its life's line

    def reported(self, local: int, record: Mapping[str, Any]) -> None:
        """A rank on another machine's own sample (a RESOURCES event: ``rank.reports.resources``), taken in
        as a round's: the next ``publish`` shows it and logs it."""
        try:
            self.usage[local] = usage_from_record(record)
        except Exception:   # why: an extra: the run goes on without it
            log.debug("rank %d's resources could not be read from its event", local, exc_info=True)
            return
        self._reported.add(local)

    def ended_as_sampled(self, local: int) -> None:
        """A rank ended whose life the kernel here did not count (a rank on another machine): its log's
        line over its life says its last sample, if one came."""
        if local in self.usage:
            self._ending.add(local)
            self._reported.add(local)

    def publish(self, state: "RunState", logs: "LogWriter", now: float | None = None) -> None:
        """Give the run state the latest round (once per round) and the samples ranks on other
        machines sent since, and each rank's log a line once every LOG_EVERY seconds from when its
        own memory was first read (a call on persistent ranks that ends within SAMPLE_EVERY writes
        none; a rank that samples itself reads it every time), and a rank that ended one line over its
        whole life (its average CPU and peaks: a rank of a run shorter than the first read of its own
        pages got no line at all)."""
        fresh, self._reported = self._reported, set()
        if self.rounds != self._published:
            self._published = self.rounds
            fresh |= self.updated
        if not fresh:
            return
        now = time.monotonic() if now is None else now
        state.on_resources({local: self.usage[local] for local in fresh}, self.machine)
        for local in sorted(fresh):
            if local in self._ending:
                self._ending.discard(local)
                logs.write_block(local, usage_end_log_text(self.usage[local]))
                continue
            own_known = local in self._own_at or self.usage[local].uss is not None
            if own_known and now - self._logged.get(local, -LOG_EVERY) >= LOG_EVERY:
                self._logged[local] = now
                logs.write_block(local, usage_log_text(self.usage[local]))

    def show(self, state: "RunState") -> None:
        """A new run state (the next call on persistent ranks) gets the last round at once."""
        if self.usage:
            state.on_resources(dict(self.usage), self.machine)

    def gpu_watch(self, devices: Mapping[int, str]) -> "GpuWatch | None":
        """NVML, opened the first time a rank has a GPU (never imported otherwise)."""
        if self._gpu is None and not self._gpu_tried and any(d.startswith("cuda") for d in devices.values()):
            self._gpu_tried = True
            from ..record.gpu_usage import GpuWatch
            self._gpu = GpuWatch.open()
        return self._gpu

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
