"""A call's supervision turns (``persistent.call.CallSupervisor.step``, issue 45): the per-turn
checks (resource round, prompts, stale pipes, stall check: ``Supervisor.react``) are skipped on
the turn that reads the last RESULTs, and run CHECKS_EVERY apart while the ranks work, so a
long call is still watched. Real forked ranks; a spy records which turns ran the checks."""
import os
import threading
import time

import pytest

from notebook_launch import start_ranks
from notebook_launch.persistent.call import CallSupervisor
from notebook_launch.persistent.quick import QUICK_WINDOW
from notebook_launch.planning.net import free_port
from notebook_launch.supervise.supervisor import Step

pytestmark = pytest.mark.timeout(180)
WAIT = 60


def rank():
    return int(os.environ["RANK"])


@pytest.fixture
def turns(monkeypatch):
    """What each turn did, in order: "turn", then "checks" if it ran them, then its Step."""
    seen: list = []
    step, react = CallSupervisor.step, CallSupervisor.react

    def spied_step(self, wait):
        seen.append("turn")
        result = step(self, wait)
        seen.append(result)
        return result

    def spied_react(self):
        seen.append("checks")
        return react(self)

    monkeypatch.setattr(CallSupervisor, "step", spied_step)
    monkeypatch.setattr(CallSupervisor, "react", spied_react)
    return seen


def rank_after_the_first_window():
    """Longer than a call's first window (``persistent.quick``): the call's supervisor reads it."""
    time.sleep(QUICK_WINDOW * 3)
    return int(os.environ["RANK"])


def test_the_turn_that_reads_the_last_results_runs_no_checks(log_dir, turns):
    with start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port()) as ranks:
        for _ in range(5):
            assert ranks.run(rank_after_the_first_window) == [0, 1]
    ends = [index for index, what in enumerate(turns) if what is Step.FINISHED]
    assert len(ends) == 5
    assert all(turns[index - 1] == "turn" for index in ends), turns


def wait_for_file(path):
    while not os.path.exists(path):
        time.sleep(0.01)
    return int(os.environ["RANK"])


def test_a_call_that_runs_on_is_checked_while_it_runs(log_dir, tmp_path, turns):
    """The ranks wait until the checks have run twice during the call (a thread of the test
    lets them go then; after WAIT seconds it lets them go anyway, and the test fails)."""
    go = str(tmp_path / "go")
    checked = threading.Event()

    def release():
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and turns.count("checks") < 2:
            time.sleep(0.01)
        if turns.count("checks") >= 2:
            checked.set()
        open(go, "w").close()

    with start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port()) as ranks:
        ranks.run(rank)
        turns.clear()
        thread = threading.Thread(target=release)
        thread.start()
        try:
            assert ranks.run(wait_for_file, (go,), timeout=WAIT * 2) == [0, 1]
        finally:
            thread.join()
    assert checked.is_set(), turns
