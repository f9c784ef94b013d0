"""Persistent ranks that hang (issue 20): ``ranks.stacks()`` says where every rank is, between
calls and during a stuck call run from another thread; a stuck call is marked stalled, its
timeout's LaunchError starts with the verdict, and a stalled call the user stops keeps the ranks
where they can take the interrupt (the grace rules); ``%ranks stacks`` and the magics' options in
a real kernel. Real gloo ranks throughout."""
from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
from helpers.nbutil import cell_text, make_notebook
from helpers.watching import WatchingDisplay, WhereReports

from notebook_launch import LaunchError, start_ranks
from notebook_launch.planning.net import free_port

pytestmark = pytest.mark.timeout(300)
HERE = os.path.basename(__file__)
HANG = 600


def line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    for offset, line in enumerate(lines):
        if text in line:
            return first + offset
    raise AssertionError(f"{text!r} not in {function.__name__}")


def init():
    dist.init_process_group("gloo")


def background_work():
    time.sleep(HANG)


def start_background_work():
    threading.Thread(target=background_work, name="background", daemon=True).start()


def rank_0_reduces_alone():
    """Rank 1 returns at once (it skipped the collective); rank 0 waits in it for ever."""
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(4))
    return dist.get_rank()


def both_sleep():
    time.sleep(HANG)


kept: int   # set by keep(), in the ranks (declared only: a rank has it once keep() ran there)


def keep(value: int) -> None:
    global kept
    kept = value


def kept_plus_one():
    return kept + 1


@contextlib.contextmanager
def started(tmp_path, ui="text"):
    """Two ranks with a process group, stalled after 2 s, shown on ``ui``."""
    with start_ranks(2, ui=ui, log_dir=str(tmp_path / "logs"), use_port=str(free_port()),
                     stall_after=2) as pool:
        pool.run(init)
        yield pool


@pytest.fixture
def ranks(tmp_path):
    with started(tmp_path) as pool:
        yield pool


def stacks_until(ranks, text: str, within: float = 60.0):
    """ranks.stacks() until its verdict holds ``text`` (the call in the other thread gets there)."""
    deadline = time.monotonic() + within
    while True:
        report = ranks.stacks()
        if text in report.verdict or time.monotonic() > deadline:
            return report
        time.sleep(0.2)


def test_stacks_between_calls_say_the_ranks_wait_and_show_their_other_threads(ranks):
    ranks.run(start_background_work)
    report = ranks.stacks()
    assert report.verdict == "no call is running: every rank waits for the next one"
    sleep = line_of(background_work, "time.sleep(HANG)")
    for rank in (0, 1):
        part = report.detail.split(f"rank {rank}:\n")[1].split("\nrank ")[0]
        assert "waits for the next call" in part
        assert f"background_work() at {HERE}:{sleep}" in part and "time.sleep(HANG)" in part
        assert "main thread" not in part   # ours, in the command pipe: left out
    assert str(report).startswith(report.verdict + "\n\nrank 0:")
    assert ranks.run(lambda: 7) == [7, 7]   # asking stopped nothing


def test_stacks_during_a_stuck_call_and_its_timeout_start_with_the_verdict(ranks, tmp_path):
    outcome: dict[str, BaseException] = {}

    def call():
        try:
            ranks.run(rank_0_reduces_alone, timeout=30)
        except BaseException as exc:   # noqa: BLE001  (the test reads it)
            outcome["error"] = exc

    caller = threading.Thread(target=call)
    caller.start()
    line = line_of(rank_0_reduces_alone, "dist.all_reduce(")
    expected = f"rank 0 waits in all_reduce #1 ({HERE}:{line}); rank 1 never reached it: it is done with this call ("
    report = stacks_until(ranks, "waits in all_reduce")
    assert report.verdict.startswith(expected), report   # (returned), or (its report is on its way) if asked
    # just after rank 1 came back and before the call's supervisor read its report
    assert "tensors (4,) float32" in report.detail
    caller.join()
    error = outcome["error"]
    assert isinstance(error, LaunchError) and error.kind == "timeout"
    text = str(error)
    assert text.startswith(f"notebook_launch: timed out after 30 s: rank 0 waits in all_reduce #1 ({HERE}:{line})")
    rank0 = text.split("Where each rank was:\n")[1].split("\nrank 1:")[0]
    assert "stalled for" in rank0 and "waits in all_reduce #1" in rank0   # the call was marked stalled
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert "notebook_launch: where the ranks were (stalled: no rank showed progress for 2 s): rank 0 waits in " \
           "all_reduce #1" in log


def test_a_stalled_call_stopped_by_the_user_says_where_and_keeps_the_ranks(tmp_path):
    """The Stop button (here: pressed as soon as the panel shows the stall report, through a
    display of the test's own passed as ``ui=``) on a stalled call: a LaunchError that starts
    with where the ranks were; ranks asleep in Python take the interrupt, so they stay, with
    their state."""
    reports = []
    shown = WhereReports()

    def stop_when_stalled(state):   # as a person would press Stop on seeing the report
        text = shown.new(state)
        if text is not None:
            reports.append(text)
            state.stop_requested = True

    with started(tmp_path, ui=WatchingDisplay(on_refresh=stop_when_stalled)) as ranks:
        ranks.run(keep, (41,))
        with pytest.raises(LaunchError) as info:
            ranks.run(both_sleep)
        assert ranks.run(kept_plus_one) == [42, 42]   # their state is there
    sleep = line_of(both_sleep, "time.sleep(HANG)")
    verdict = (f"no rank waits in a torch.distributed collective: ranks 0, 1 are in both_sleep() at {HERE}:{sleep} "
               f"(time.sleep(HANG))")
    assert reports[0].startswith(f"stalled: no rank showed progress for 2 s; {verdict}\n\nrank 0:\n  stalled for")
    assert str(info.value).startswith(f"notebook_launch: stopped with the Stop button after the run stalled: {verdict}")
    assert info.value.kind == "stopped"
    assert "The ranks are still running, with their state" in str(info.value)


def test_stall_after_and_lines_per_second_are_checked_per_call(ranks):
    from notebook_launch import LaunchArgumentError
    with pytest.raises(LaunchArgumentError, match="stall_after must be a number of seconds > 0"):
        ranks.run(init, stall_after=0)
    with pytest.raises(LaunchArgumentError, match="lines_per_second must be a whole number >= 1"):
        ranks.run(init, lines_per_second=0)


def test_stacks_and_the_stall_options_in_a_kernel(tmp_path):
    """%ranks start --stall-after, %%ranks --stall-after, %ranks stacks between calls, and a
    stuck cell: its error starts with the verdict and names the cell."""
    from helpers.nbutil import run_notebook
    nb = make_notebook(
        "%load_ext notebook_launch",
        "from notebook_launch.planning.net import free_port\n"
        "%ranks start -n 2 --ui text --port {free_port()} --stall-after 600 --lines-per-second 50",
        "%%ranks\nimport threading, time, torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "def background_work():\n    time.sleep(600)\n"
        "threading.Thread(target=background_work, daemon=True).start()",
        "%ranks stacks",
        "%%ranks --timeout 20 --stall-after 2\nif dist.get_rank() == 0:\n    dist.all_reduce(torch.ones(2))",
        "%ranks stop",
    )
    run_notebook(nb, cwd=str(tmp_path), allow_errors=True)
    cells = nb.cells
    stacks = cell_text(cells[3])
    assert stacks.startswith("no call is running: every rank waits for the next one"), stacks
    assert "background_work() at Cell In[3], line 5" in stacks and "time.sleep(600)" in stacks, stacks
    stuck = cell_text(cells[4])
    assert "stalled: no rank showed progress for 2 s; rank 0 waits in all_reduce #1 (Cell In[5], line 2)" \
        in stuck, stuck
    assert ("timed out after 20 s: rank 0 waits in all_reduce #1 (Cell In[5], line 2); rank 1 never reached it: "
            "it is done with this call (returned)") in stuck, stuck


def test_a_rank_back_from_a_call_but_not_yet_in_its_wait_waits_for_the_next_one():
    """Between calls the notebook may ask while a rank's main thread is still on its way back to the
    wait (the call's report came first): that main thread runs only our serving code, and the rank
    waits for the next call, though another of its threads runs user code (a thread storm's thread
    in threading.run was once named as where the rank was). While a call holds the pool, the same
    main thread is not taken for waiting (it may be on its way into the call), nor is a main thread
    in user code between calls."""
    import notebook_launch
    from notebook_launch.diagnose.hang_verdict import Frame, RankWhereabouts, ThreadStack
    from notebook_launch.persistent.whereabouts import waits_for_a_call

    package = os.path.dirname(notebook_launch.__file__)
    serving = [Frame(os.path.join(package, "rank", "serve.py"), 160, "run_one"),
               Frame(os.path.join(package, "rank", "serve.py"), 157, "serve_calls"),
               Frame(os.path.join(package, "rank", "fork_entry.py"), 30, "body")]
    storm = ThreadStack(2, False, [Frame("/home/me/storm.py", 5, "spin"),
                                   Frame(threading.__file__, 982, "run")], name="Thread-7")

    def rank(main_frames):
        return RankWhereabouts(0, threads=[ThreadStack(1, False, main_frames, name="MainThread"), storm],
                               main_thread=1)

    finishing = rank(serving)
    assert waits_for_a_call(finishing, between_calls=True)
    assert finishing.note == "waits for the next call" and finishing.threads == [storm]
    assert not waits_for_a_call(rank(serving), between_calls=False)
    in_user_code = [Frame("/home/me/train.py", 12, "train")] + serving
    assert not waits_for_a_call(rank(in_user_code), between_calls=True)
