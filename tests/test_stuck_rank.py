"""A rank that outlives SIGKILL (stuck in a device driver, state D) cannot be reaped: waiting
for it is bounded, and the error says what happened instead of the cell hanging. No driver
can be made to hang here, so the stuck process is a FAKE: a real rank whose handle does not
see its end until the test lets it."""
from __future__ import annotations

import os
import time

import pytest

from notebook_launch import LaunchError, notebook_launcher
from notebook_launch import channels
from notebook_launch.engines.local.fork import ForkedRank
from notebook_launch.supervise import outcome


class FakeStuckInDriverRank(channels.RankProcess):
    """A FAKE rank process that never ends (as one in uninterruptible sleep)."""

    def __init__(self):
        self.local_rank = 0
        self.pid = 424242
        self.sentinel = None
        self.wait_limit = 0.2

    def poll(self):
        return None


def test_wait_gives_up_and_says_why():
    process = FakeStuckInDriverRank()
    assert process.wait() == channels.STUCK
    assert process.end_note is not None
    assert "process 424242 is stuck in the kernel" in process.end_note
    assert "restart the runtime" in process.end_note
    assert "did not end after SIGKILL" in outcome.describe_status(channels.STUCK)
    assert "but it did not end after SIGKILL" in outcome.stopped_description("rank 0 failed", channels.STUCK)


def fail_or_hang():
    if os.environ["RANK"] == "0":
        time.sleep(0.5)
        raise ValueError("rank 0 fails")
    while True:
        time.sleep(0.1)


@pytest.fixture
def rank_1_fakes_stuck_in_a_driver(monkeypatch):
    """Rank 1's handle does not see its end (a FAKE of a process in state D); reaped after the test."""
    seen = {}
    real_poll = ForkedRank.poll

    def poll(self):
        if self.local_rank == 1:
            seen["pid"] = self.pid
            return None
        return real_poll(self)

    monkeypatch.setattr(ForkedRank, "poll", poll)
    monkeypatch.setattr(ForkedRank, "wait_limit", 1.0)
    yield seen
    if "pid" in seen:
        os.waitpid(seen["pid"], 0)   # it did die: the zombie is ours to reap


def test_a_rank_that_outlives_sigkill_does_not_hang_the_launch(rank_1_fakes_stuck_in_a_driver):
    with pytest.raises(LaunchError) as info:
        notebook_launcher(fail_or_hang, num_processes=2, ui="none")
    message = str(info.value)
    assert message.startswith("rank 0 failed: ValueError: rank 0 fails")
    assert "rank 1: stopped by notebook_launch" in message and "did not end after SIGKILL" in message


def test_a_spawned_rank_that_does_not_end_is_waited_for_a_bounded_time():
    """The spawn backend's wait() (the base's, on its own waitpid) is bounded: a process that does not end
    within wait_limit is STUCK with its note (here a real process that simply keeps running)."""
    import subprocess
    import sys

    from notebook_launch.engines.local.spawn import SpawnedRank
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rank = SpawnedRank(0, popen)
    rank.wait_limit = 0.3
    try:
        assert rank.wait() == channels.STUCK
        assert rank.end_note is not None
        assert f"process {popen.pid} is stuck in the kernel" in rank.end_note
    finally:
        popen.kill()
        popen.wait()
        rank.release()
