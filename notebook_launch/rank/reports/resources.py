"""A rank the notebook cannot read samples itself: its CPU, memory and GPU, sent as RESOURCES
events (issue 34 item 1: remote ranks report their own).

Who: a rank on another machine, whose pid means nothing to the notebook's /proc: a Ray actor
(``engines.ray.actor``) and a SLURM rank (``engines.slurm.task``) call ``report_own`` in their bootstrap.
Never a local rank: the notebook reads its ``/proc/<pid>`` itself at no cost to the rank
(``supervise.resources``). An elastic node's ranks are local to that node's own agent, which
reads them the same way.

How: one daemon thread (``THREAD_NAME``) takes a sample once every ``SAMPLE_EVERY`` seconds,
with the readers the notebook uses (``proc_usage``: statm, stat and smaps_rollup of its own
process; ``gpu_usage``: NVML on a GPU rank, only if ``pynvml`` imports), and sends it. Nothing
per training step. What the rank owns (smaps_rollup) is the costly read, a walk of its page
tables (some 5 ms for a rank that imported torch): the wait after a sample grows with what the
samples cost, so the sampling stays under ``BUDGET`` of one core however big the rank is
(``benchmarks/resource_sampling.py`` measures it). A last sample when the rank ends
(``Reporter.stop``), so the final picture has its peak. The notebook takes the events into the
same ``RankUsage`` its own sampler makes (``ResourceSampler.reported``): every display shows
them alike.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from ...wire import protocol
from ...record.proc_usage import cpu_times, own_memory, resident
from ...record.resources import GpuUsage, RankUsage, usage_record

if TYPE_CHECKING:
    from ...record.gpu_usage import GpuWatch

SAMPLE_EVERY = 2.0      # seconds between two samples, at the least
BUDGET = 0.005          # the share of one core the sampling may take (the whole goal: under 1%)
STOP_WAIT = 5.0         # seconds ``stop`` waits for the thread (it may be sending)
THREAD_NAME = "notebook_launch-resources"
log = logging.getLogger("notebook_launch")


class SelfSampler:
    """This process's usage, one ``sample`` at a time, with its peaks and its CPU between samples."""

    def __init__(self, device: str = "cpu", pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.device = device
        self.last: RankUsage | None = None
        self.samples = 0
        self.cpu_spent = 0.0    # CPU seconds the samples took, in the sampling thread
        self._first: tuple[float, float] | None = None    # (CPU seconds, when) at the first sample
        self._before: tuple[float, float] | None = None   # the same at the previous sample
        self._gpu: "GpuWatch | None" = None
        self._gpu_tried = False

    def sample(self, now: float | None = None) -> RankUsage | None:
        """Read the process now; None once it cannot be read (it is ending)."""
        started = time.thread_time()
        try:
            return self._read(time.monotonic() if now is None else now)
        finally:
            self.cpu_spent += time.thread_time() - started

    def _read(self, now: float) -> RankUsage | None:
        rss = resident(self.pid)
        if rss is None:
            return None
        own = own_memory(self.pid)
        uss, pss = own if own is not None else (None, None)
        percent = average = None
        times = cpu_times(self.pid)
        if times is not None:
            used, age = times
            # the average over the rank's life: from the first sample (a Ray actor's process may
            # be older than its rank); the first sample has only the process's own to go by
            first = self._first = self._first or (used, now)
            average = (100.0 * (used - first[0]) / (now - first[1]) if now > first[1]
                       else 100.0 * used / age if age > 0 else None)
            if self._before is not None and now > self._before[1]:
                percent = max(0.0, 100.0 * (used - self._before[0]) / (now - self._before[1]))
            self._before = (used, now)
        previous = self.last
        peak_uss = uss if previous is None or previous.peak_uss is None else \
            previous.peak_uss if uss is None else max(uss, previous.peak_uss)
        self.last = RankUsage(rss=rss, uss=uss, pss=pss, cpu_percent=percent, cpu_average=average,
                              peak_rss=rss if previous is None else max(rss, previous.peak_rss),
                              peak_uss=peak_uss, gpu=self._gpu_usage())
        self.samples += 1
        return self.last

    def _gpu_usage(self) -> GpuUsage | None:
        """The rank's device through NVML, opened the first time (never for a CPU rank)."""
        if not self.device.startswith("cuda"):
            return None
        if not self._gpu_tried:
            self._gpu_tried = True
            from ...record.gpu_usage import GpuWatch
            self._gpu = GpuWatch.open()
        return None if self._gpu is None else self._gpu.usage(self.device, self.pid)

    def wait(self) -> float:
        """Seconds until the next sample: SAMPLE_EVERY, or more where the samples cost more
        than BUDGET of a core at that pace."""
        each = self.cpu_spent / self.samples if self.samples else 0.0
        return max(SAMPLE_EVERY, each / BUDGET)

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None


class Reporter:
    """The thread that sends this rank's samples on its event channel (see the module)."""

    def __init__(self, writer: protocol.EventWriter, sampler: SelfSampler) -> None:
        self.writer = writer
        self.sampler = sampler
        self.sent = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set() and self.send_one():
            self.stopped.wait(self.sampler.wait())

    def send_one(self) -> bool:
        """Sample and send; False once there is nowhere to send (the channel was replaced or closed)."""
        if protocol.current() is not self.writer:
            return False
        try:
            usage = self.sampler.sample()
        except Exception:   # why: an extra: the rank goes on without it
            log.debug("this rank's resources could not be read", exc_info=True)
            return True
        if usage is None:
            return True
        try:
            self.writer.send(protocol.EventKind.RESOURCES, usage_record(usage))
        except Exception:   # why: the notebook went away
            log.debug("this rank's resources cannot be sent any more; its sampler stops", exc_info=True)
            return False
        self.sent += 1
        return True

    def stop(self, final: bool = True) -> None:
        """End the thread; ``final``: send one last sample first (the rank's peak, its average)."""
        self.stopped.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(STOP_WAIT)
        if final and not self.thread.is_alive():
            self.send_one()
        self.sampler.close()
        global _current
        if _current is self:
            _current = None


_current: Reporter | None = None


def report_own(writer: protocol.EventWriter, device: str) -> Reporter:
    """Start sampling this process and sending it on ``writer`` (a rank on another machine's
    bootstrap calls this; ``device``: the rank's, "cuda:0" for NVML); ``Reporter.stop`` ends it."""
    global _current
    reporter = _current = Reporter(writer, SelfSampler(device))
    reporter.thread.start()
    return reporter


def current() -> Reporter | None:
    """This process's reporter, None where the notebook samples the rank itself (a local rank)."""
    return _current
