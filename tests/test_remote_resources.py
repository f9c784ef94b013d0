"""A rank on another machine reports its own resources (issue 34 item 1): the notebook cannot read a
Ray actor's or a SLURM rank's /proc, so such a rank samples itself (``rank/reports/resources.py``) and sends
RESOURCES events the notebook takes into the same rows, final picture and logs as its own samples.

The sampler reads this test's own process here (what it reads in a rank: its own); its GPU through
a FAKE NVML (no GPU can exist on these machines). The real engines: tests/raycluster
(test_ray_resources.py) and tests/slurmcluster. Every wait is for a condition."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

from helpers.fake_nvml import FakeDevice, FakeNvml
from helpers.panel_helpers import KeepStateDisplay

from notebook_launch import notebook_launcher
from notebook_launch.wire import protocol
from notebook_launch.display import format as fmt
from notebook_launch.record.logs import RunLogs
from notebook_launch.rank.reports import resources as rank_resources
from notebook_launch.rank.reports.resources import THREAD_NAME, SelfSampler, report_own
from notebook_launch.record.resources import GpuUsage, RankUsage, usage_from_record, usage_record
from notebook_launch.record.state import DONE, RankState, RunState
from notebook_launch.supervise.resources import ResourceSampler
from notebook_launch.supervise.resource_watch import ResourceWatch

MiB = 1 << 20
ALLOCATED = 200 * MiB
ROOT = pathlib.Path(__file__).resolve().parents[1]
WAIT = 120.0   # the longest any condition is waited for; the test then fails


def touched(size: int) -> bytearray:
    """``size`` bytes, every page written, so they are resident."""
    block = bytearray(size)
    block[::4096] = b"\1" * len(range(0, size, 4096))
    return block


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT:g} s for {what}"
        time.sleep(0.02)


# --- the rank side: a process samples itself -----------------------------------------------------

SAMPLES_ITSELF = f"""
import dataclasses, json, time
from notebook_launch.rank.reports.resources import SelfSampler
sampler = SelfSampler()
first = sampler.sample()
block = bytearray({ALLOCATED})
block[::4096] = b"\\1" * len(range(0, {ALLOCATED}, 4096))   # every page written: resident
spent = time.process_time()
while time.process_time() - spent <= 0.05:   # some CPU of its own, between the two samples
    pass
held = sampler.sample()
del block
freed = sampler.sample()
sampler.close()
print(json.dumps([dataclasses.asdict(usage) for usage in (first, held, freed)]))
"""


def test_a_rank_samples_its_own_memory_cpu_and_peaks():
    # in a fresh process, as a rank is: a pytest worker holds threads earlier tests left (a fork
    # server's, a kernel client's), and a process one of them forks shares every page until it
    # execs or ends: while it lives, those pages are nobody's own (a CI run saw the block grow the
    # worker's RSS by 200 MiB and its USS by only 137)
    done = subprocess.run([sys.executable, "-c", SAMPLES_ITSELF], capture_output=True, text=True,
                          timeout=WAIT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    first, held, freed = (RankUsage(**record) for record in json.loads(done.stdout))
    assert first.rss > 0 and first.uss is not None and first.pss is not None
    assert first.cpu_percent is None and first.gpu is None   # nothing to compare with yet; a CPU rank
    assert held.uss is not None
    assert held.rss >= first.rss + ALLOCATED * 0.9 and held.uss >= first.uss + ALLOCATED * 0.9, (first, held)
    assert (held.cpu_percent or 0) > 0 and (held.cpu_average or 0) > 0
    assert freed.rss < held.rss - ALLOCATED * 0.5   # it gave the block back
    assert freed.peak_rss == held.rss and freed.peak_uss == held.uss      # the peaks stay


def test_a_gpu_rank_reads_its_device_through_nvml_and_a_cpu_rank_never_opens_it(monkeypatch):
    fake = FakeNvml([FakeDevice("GPU-a", 16 << 30, 1 << 30, 5),
                     FakeDevice("GPU-b", 16 << 30, 3 << 30, 87, {os.getpid(): 3 << 29})])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    cpu = SelfSampler("cpu")
    cpu.sample()
    cpu.close()
    assert fake.calls == []
    gpu = SelfSampler("cuda:0")
    usage = gpu.sample()
    assert usage is not None   # its process is on the second device: that one is its device
    assert usage.gpu == GpuUsage(index=1, used=3 << 30, total=16 << 30, utilization=87, process_used=3 << 29)
    gpu.close()
    assert fake.calls.count("nvmlInit") == 1 and fake.calls[-1] == "nvmlShutdown"
    monkeypatch.setitem(sys.modules, "pynvml", None)   # no pynvml: the rest is still sampled
    without = SelfSampler("cuda:0").sample()
    assert without is not None and without.gpu is None and without.rss > 0


def test_the_sampling_keeps_within_its_share_of_a_core(monkeypatch):
    """The wait after a sample grows with what the samples cost: at most BUDGET of a core. (What a
    sample costs is measured in benchmarks/resource_sampling.py, never timed here.)"""
    sampler = SelfSampler()
    assert sampler.wait() == rank_resources.SAMPLE_EVERY
    sampler.sample()
    assert sampler.cpu_spent > 0
    assert sampler.wait() == max(rank_resources.SAMPLE_EVERY, sampler.cpu_spent / rank_resources.BUDGET)
    monkeypatch.setattr(rank_resources, "BUDGET", sampler.cpu_spent / 100)   # a sample is over it
    assert sampler.wait() == pytest.approx(100.0)


def test_a_record_travels_as_plain_data_and_comes_back_the_same():
    usage = RankUsage(rss=5, uss=3, pss=4, cpu_percent=9.5, cpu_average=8.0, peak_rss=6, peak_uss=3,
                      gpu=GpuUsage(0, 1, 2, 3, 4))
    record = usage_record(usage)
    assert all(type(value) in (int, float, dict) for value in record.values())
    assert usage_from_record(record) == usage
    assert usage_from_record({**record, "gpu": None, "later_field": 1}) == RankUsage(5, 3, 4, 9.5, 8.0, 6, 3)


def read_events(fd: int, reader: protocol.EventReader, until, what: str) -> list[tuple[protocol.EventKind, object]]:
    """The events on the pipe's read end ``fd`` until ``until(events)`` holds."""
    events: list[tuple[protocol.EventKind, object]] = []
    os.set_blocking(fd, False)
    deadline = time.monotonic() + WAIT
    while not until(events):
        assert time.monotonic() < deadline, f"waited {WAIT:g} s for {what}: {events}"
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        events += reader.feed(data)
    return events


def test_the_reporter_sends_samples_then_a_last_one_and_stops(monkeypatch):
    monkeypatch.setattr(rank_resources, "SAMPLE_EVERY", 0.05)
    read_fd, write_fd = os.pipe()
    writer = protocol.EventWriter(write_fd)
    protocol.install(writer)
    reader = protocol.EventReader()
    try:
        reporter = report_own(writer, "cpu")
        assert rank_resources.current() is reporter
        events = read_events(read_fd, reader, lambda events: len(events) >= 2, "two samples")
        assert {kind for kind, _ in events} == {protocol.EventKind.RESOURCES}
        usage = usage_from_record(events[-1][1])   # type: ignore[arg-type]
        assert usage.rss > 0 and usage.uss is not None and usage.cpu_percent is not None
        sent = reporter.sent
        reporter.stop()
        assert not reporter.thread.is_alive() and reporter.sent == sent + 1   # the last sample
        assert rank_resources.current() is None
        events += read_events(read_fd, reader, lambda more: len(events) + len(more) >= reporter.sent,
                              "every sample sent")
        assert len(events) == reporter.sent
        # a reporter whose channel is gone (the rank ended, the actor's next call) stops by itself
        again = report_own(writer, "cpu")
        protocol.install(None)
        again.thread.join(WAIT)
        assert not again.thread.is_alive()
        again.stop()
    finally:
        protocol.install(None)
        os.close(read_fd)
        os.close(write_fd)


# --- the notebook side: the samples in the rows, the final picture and the logs ------------------

def test_a_reported_sample_is_shown_and_logged_as_a_sampled_one(tmp_path):
    state = RunState("r", 2, "ray", str(tmp_path), [RankState(0, 0, node="node 1 (10.0.0.2)"), RankState(1, 1)])
    logs = RunLogs("r", [0, 1], [0, 1], log_dir=str(tmp_path))
    sampler = ResourceSampler()
    usage = RankUsage(rss=1200 * MiB, uss=820 * MiB, pss=900 * MiB, cpu_percent=97.0, cpu_average=60.0,
                      peak_rss=1500 * MiB, peak_uss=1000 * MiB)
    try:
        sampler.publish(state, logs)
        assert state.ranks[0].resources is None   # nothing came yet
        sampler.reported(0, usage_record(usage))
        sampler.publish(state, logs)
        assert state.ranks[0].resources == usage and state.ranks[1].resources is None
        assert "cpu 97% · 820.0 MiB own of 1.2 GiB resident" in fmt.rank_line(state.ranks[0])
        sampler.reported(0, {"not": "a record"})   # a sample it cannot read is left out
        sampler.publish(state, logs)
        assert state.ranks[0].resources == usage
        state.ranks[0].status = DONE
        assert "avg cpu 60% · peak 1000.0 MiB own of 1.5 GiB resident" in fmt.summary(state)
        # it ended (no count of the kernel's here): its log's line over its life says its last sample;
        # a rank that never sent one gets none
        sampler.ended_as_sampled(0)
        sampler.ended_as_sampled(1)
        sampler.publish(state, logs)
        sampler.publish(state, logs)   # once
    finally:
        logs.close()
    text = pathlib.Path(tmp_path, "rank0.log").read_text()
    assert text.count("[notebook_launch] resources: cpu 97% of a core; 820.0 MiB own (USS)") == 1, text
    assert text.count("[notebook_launch] resources over its life: cpu 60% of a core on average; "
                      "1000.0 MiB own (USS) at its peak, 1.5 GiB resident at its peak") == 1, text
    assert "resources" not in pathlib.Path(tmp_path, "rank1.log").read_text()


class SeeingDisplay(KeepStateDisplay):
    """A real Display that writes ``sentinel`` once ``seen(state)`` holds, keeping the rows then."""

    def __init__(self, seen, sentinel: str) -> None:
        super().__init__()
        self.seen, self.sentinel = seen, sentinel
        self.rows: list[str] = []

    def refresh(self, state: RunState) -> None:
        if not self.rows and self.seen(state):
            self.rows = [fmt.rank_line(rs) for rs in state.ranks]
            pathlib.Path(self.sentinel).touch()


def report_like_a_remote_rank(sentinel: str) -> bool:
    """What a Ray actor's or a SLURM rank's bootstrap does around the function (``report_own``),
    done here by the function itself; rank 0 holds ALLOCATED bytes until the notebook saw them."""
    writer = protocol.current()
    assert writer is not None
    reporter = report_own(writer, "cpu")
    block = touched(ALLOCATED) if os.environ["RANK"] == "0" else None
    deadline = time.monotonic() + WAIT
    while not os.path.exists(sentinel) and time.monotonic() < deadline:
        time.sleep(0.05)
    del block
    reporter.stop()
    return os.path.exists(sentinel)


def test_a_launch_shows_what_ranks_reported_of_themselves(monkeypatch, tmp_path, log_dir):
    """Real ranks whose /proc the notebook does not read (as for ranks on other machines): their
    rows, final picture and logs show what they sent."""
    monkeypatch.setattr(ResourceWatch, "sampled_pids", lambda self: {})   # the notebook reads no /proc
    sentinel = str(tmp_path / "seen")

    def seen(state: RunState) -> bool:
        owns = [None if rs.resources is None else rs.resources.uss for rs in state.ranks]
        return all(own is not None for own in owns) and (owns[0] or 0) >= ALLOCATED

    display = SeeingDisplay(seen, sentinel)
    results = notebook_launcher(report_like_a_remote_rank, args=(sentinel,), num_processes=2, log_dir=log_dir,
                                ui=display)
    assert results == [True, True], "the notebook never showed rank 0's memory"
    assert " own of " in display.rows[0] and "resident" in display.rows[0], display.rows
    state = display.state
    assert state is not None
    final = state.ranks[0].resources
    assert final is not None and (final.peak_uss or 0) >= ALLOCATED   # the last sample kept the peak
    assert "peak " in fmt.summary(state)
    for rank in (0, 1):
        text = pathlib.Path(log_dir, f"rank{rank}.log").read_text()
        assert "[notebook_launch] resources: " in text and "(USS)" in text, text


def sampler_state() -> tuple[bool, bool]:
    return rank_resources.current() is None, all(t.name != THREAD_NAME for t in threading.enumerate())


def test_local_ranks_never_sample_themselves(log_dir):
    """The notebook reads a local rank's /proc itself: the rank runs no sampler of its own."""
    assert notebook_launcher(sampler_state, num_processes=2, log_dir=log_dir, ui="text") == [(True, True)] * 2


def reports_then_skips_an_all_reduce() -> None:
    """Each rank sends its samples (as a rank on another machine does) while rank 1 skips an
    all_reduce the other waits in: a hang, however often they report."""
    import torch
    import torch.distributed as dist
    writer = protocol.current()
    assert writer is not None
    report_own(writer, "cpu")
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if os.environ["RANK"] == "1":
        time.sleep(600)
    dist.all_reduce(t)


def test_a_ranks_own_samples_are_no_sign_of_progress(monkeypatch, log_dir):
    """A sample is sent whatever the rank does: a hung rank that reports every 0.8 s is still
    called stalled after 2 s (the stall's report stops the run, as the Stop button does)."""
    from helpers.watching import WatchingDisplay, WhereReports

    from notebook_launch import LaunchError
    from notebook_launch.planning.net import free_port
    monkeypatch.setattr(rank_resources, "SAMPLE_EVERY", 0.8)   # the forked ranks inherit it
    monkeypatch.setattr(rank_resources, "BUDGET", 1.0)
    shown = WhereReports()
    reports = shown.texts

    def stop_when_stalled(state: RunState) -> None:   # as a person at the panel presses Stop
        if shown.new(state) is not None:
            state.stop_requested = True

    samples: list[int] = []
    reported = ResourceSampler.reported

    def count_and_take(self, local, record):
        samples.append(local)   # observes only
        reported(self, local, record)

    monkeypatch.setattr(ResourceSampler, "reported", count_and_take)
    with pytest.raises(LaunchError) as info:
        notebook_launcher(reports_then_skips_an_all_reduce, num_processes=2, stall_after=2, log_dir=log_dir,
                          ui=WatchingDisplay(on_refresh=stop_when_stalled), use_port=str(free_port()), timeout=90,
                          start_method="fork")
    assert info.value.kind == "stopped", str(info.value)   # not "timeout": the stall was seen
    assert reports and reports[0].startswith("stalled: no rank showed progress for 2 s; "), reports
    assert samples.count(0) >= 3 and samples.count(1) >= 3, samples   # the samples did come, all along
