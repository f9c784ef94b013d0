"""A warm call that is over at once is finished without a supervisor (``persistent.quick``,
issue 45), and leaves what a supervised call leaves: the results, each row DONE with its
resources, the same final display, no fd. Anything else in the first window (a line, an error,
a rank that takes longer, an interrupt) is supervised as before, with what was read handed on.
Real forked ranks; a recording display (``ui=`` a Display of the test's own) keeps each call's
final state, and a spy counts the calls that built a supervisor. A test that needs a call to be
quick widens the first window to WAIT (a busy machine may keep a rank from its core for longer
than the default window); one that needs it supervised makes the ranks take SLOW, longer than
the default window, or print, or fail."""
import os
import signal
import sys
import time
import types

import pytest

from helpers.fd_helpers import fd_links
from helpers.processes import children, running
from notebook_launch import LaunchError, start_ranks
from notebook_launch.display.base import Display
from notebook_launch.persistent import pool as pool_module
from notebook_launch.persistent.call import CallSupervisor
from notebook_launch.persistent import quick
from notebook_launch.planning.net import free_port
from notebook_launch.record.state import DONE

pytestmark = pytest.mark.timeout(180)
WAIT = 60
SLOW = quick.QUICK_WINDOW * 3   # a call this long is never finished in the first window


# --- what the ranks run (importable: they travel by reference) ------------------------------

def rank():
    return int(os.environ["RANK"])


def slow_rank():
    time.sleep(SLOW)
    return int(os.environ["RANK"])


def rank_one_late():
    if os.environ["RANK"] == "1":
        time.sleep(SLOW)
    return int(os.environ["RANK"])


def say_and_return():
    print(f"hello from {os.environ['RANK']}", flush=True)
    return int(os.environ["RANK"])


def raise_on_rank_one():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one says no")
    return 0


def only_the_rank_can_load():
    """A value whose class lives in a module only the rank has: it pickles there by reference
    and cannot be unpickled in the notebook."""
    module = sys.modules.setdefault("only_in_the_rank", types.ModuleType("only_in_the_rank"))
    kind = type("Thing", (), {"__module__": "only_in_the_rank"})
    module.__dict__["Thing"] = kind
    return kind()


counter = 0


def count():
    global counter
    counter += 1
    return counter


# --- the test's eyes --------------------------------------------------------------------------

class RecordingDisplay(Display):
    """Keeps each call's state as the display is closed with it (its final state)."""

    def __init__(self):
        super().__init__()
        self.finals = []

    def close(self, state):
        self.finals.append(state)


@pytest.fixture
def supervised(monkeypatch):
    """How many calls built a supervisor."""
    built = []

    class Counted(CallSupervisor):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pool_module, "CallSupervisor", Counted)
    return built


@pytest.fixture
def wide_window(monkeypatch):
    """Every call that is over with nothing but results is quick, however busy the machine."""
    monkeypatch.setattr(quick, "QUICK_WINDOW", WAIT)


@pytest.fixture
def display():
    return RecordingDisplay()


@pytest.fixture
def ranks(log_dir, display):
    with start_ranks(2, ui=display, log_dir=log_dir, use_port=free_port(), interrupt_grace=30.0) as pool:
        pool.run(rank)   # warm: the first call after the start may meet the ranks' READY
        yield pool
    assert running(children()) == []


def row_facts(state):
    return [(r.rank, r.pid, r.status, r.exit_description, r.resources is not None) for r in state.ranks]


def test_a_quick_call_builds_no_supervisor_and_ends_as_a_supervised_one(ranks, display, supervised, monkeypatch):
    fds = sorted(fd_links())
    window = quick.QUICK_WINDOW
    monkeypatch.setattr(quick, "QUICK_WINDOW", WAIT)
    for _ in range(20):
        assert ranks.run(rank) == [0, 1]
    assert supervised == []
    monkeypatch.setattr(quick, "QUICK_WINDOW", window)
    assert ranks.run(slow_rank, timeout=WAIT) == [0, 1]
    assert supervised == [1]
    quick_end, supervised_end = display.finals[-2], display.finals[-1]
    assert row_facts(quick_end) == row_facts(supervised_end)
    assert [r.status for r in quick_end.ranks] == [DONE, DONE]
    assert [r.exit_description for r in quick_end.ranks] == ["returned", "returned"]
    assert all(r.resources is not None for r in quick_end.ranks)   # the last round's, as a supervisor shows
    assert quick_end.status == supervised_end.status == DONE
    assert quick_end.summary.startswith("2 ranks returned in ")
    assert supervised_end.summary.startswith("2 ranks returned in ")
    assert sorted(fd_links()) == fds   # the kept selector went back each time: no fd made or left


def test_state_on_the_ranks_is_kept_across_quick_calls(ranks, supervised, wide_window):
    assert [ranks.run(count) for _ in range(3)] == [[1, 1], [2, 2], [3, 3]]
    assert supervised == []


def test_a_call_that_prints_is_supervised_and_its_lines_are_kept(ranks, supervised, display, wide_window):
    assert ranks.run(say_and_return) == [0, 1]
    assert supervised == [1]
    lines = {local: [text for _, text in r.lines] for local, r in enumerate(display.finals[-1].ranks)}
    assert lines == {0: ["hello from 0"], 1: ["hello from 1"]}
    with open(os.path.join(ranks.log_dir, "rank1.log")) as log:
        assert "hello from 1" in log.read()


def test_a_result_read_before_the_supervisor_is_handed_to_it(ranks, supervised):
    """Rank 0 returns in the first window, rank 1 after it: rank 0's RESULT, read already, is the
    supervisor's first event."""
    for _ in range(3):
        assert ranks.run(rank_one_late, timeout=WAIT) == [0, 1]
    assert len(supervised) == 3


def test_a_call_that_fails_at_once_is_supervised_and_the_ranks_stay(ranks, supervised, wide_window):
    pids = ranks.pids
    with pytest.raises(LaunchError, match="rank one says no") as info:
        ranks.run(raise_on_rank_one, timeout=WAIT)
    assert "still running, with their state" in str(info.value)
    assert supervised == [1]
    assert ranks.pids == pids and ranks.run(rank) == [0, 1]


def test_a_quick_result_that_cannot_be_loaded_fails_as_a_supervised_one_does(ranks, supervised, display,
                                                                             wide_window):
    pids = ranks.pids
    with pytest.raises(LaunchError) as info:
        ranks.run(only_the_rank_can_load, timeout=WAIT)
    assert supervised == []
    assert info.value.kind == "result" and "could not be unpickled in the notebook" in str(info.value)
    assert "still running, with their state" in str(info.value)
    assert display.finals[-1].status != DONE
    assert ranks.pids == pids and ranks.run(rank) == [0, 1]


@pytest.fixture
def sigint_raises():
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_an_interrupt_as_a_quick_call_ends_keeps_the_ranks(ranks, monkeypatch, sigint_raises, display, wide_window,
                                                            supervised):
    """SIGINT once the first look found every result: held, then raised as the call ends; the
    ranks had returned, so they keep their state and the next call runs on them."""
    assert ranks.run(count) == [1, 1]
    pids, handler, fds = ranks.pids, signal.getsignal(signal.SIGINT), sorted(fd_links())
    real = quick.first_look

    def look_then_interrupt(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass

    monkeypatch.setattr(quick, "first_look", look_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ranks.run(count, timeout=WAIT)
    monkeypatch.setattr(quick, "first_look", real)
    assert supervised == []   # the look found every result: the quick finish raised it
    assert display.finals[-1].status != DONE   # the call's panel says it was interrupted
    assert signal.getsignal(signal.SIGINT) is handler
    assert ranks.pids == pids and ranks.restarts == 0
    assert ranks.run(count) == [3, 3]   # the interrupted call ran on the ranks (it had returned)
    assert sorted(fd_links()) == fds
