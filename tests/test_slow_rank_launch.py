"""The slow rank named in real launches (issue 34 item 4): 4 gloo ranks, each sleeping before
every all_reduce (its "work"), one of them longer. The panel (live, while the run goes) and the
final summary name it and how long the others wait for it; a balanced run names nobody; a rank
that has not reached its first collective is named while the others wait in it. Two ranks doing
the same work as a real loop does it (random work per step, rank 0 preparing the data while
rank 1 waits, rank 0 alone evaluating now and then) name nobody (issue 47).

Nothing here waits for a time: a run ends after its steps, and the rank that has not reached
its collective is let go by the test the moment the panel names it. The verdict's arithmetic
is tested from plain data in test_slow_rank.py."""
from __future__ import annotations

import os
import re

import pytest

from helpers.watching import WatchingDisplay

from notebook_launch import notebook_launcher
from notebook_launch.display import pace as pace_display
from notebook_launch.planning.net import free_port
from notebook_launch.record.state import RunState

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

WORK = 0.05        # seconds each rank "works" (sleeps) before each all_reduce
SLOWER_BY = 0.10   # what the slow rank adds: 3x the others' work
STEPS = 50         # 7.5 s for the slow rank: the verdict needs slow_rank.MIN_STRETCHES (about a second each)


def sleeps_before_each_all_reduce(slow_rank: int, steps: int):
    import time
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1)
    for _ in range(steps):
        time.sleep(WORK + (SLOWER_BY if rank == slow_rank else 0.0))
        dist.all_reduce(t)
    dist.destroy_process_group()
    return rank


PREPARE = 2.0      # seconds rank 0 prepares the data while rank 1 waits in a barrier (main_process_first)
EVAL = 0.5         # seconds of an evaluation rank 0 alone runs...
EVAL_EVERY = 50    # ...every this many steps
NOISY_STEPS = 150  # each 20-60 ms of work on both ranks: about 8 s


def the_same_work_with_noise(steps: int):
    """What a real loop does on two ranks with the same work (see PREPARE, EVAL)."""
    import random
    import time
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    draw = random.Random(0)
    works = [draw.uniform(0.02, 0.06) for _ in range(steps)]
    random.Random(rank + 1).shuffle(works)   # the same work on both ranks, each step's another
    t = torch.ones(1)
    dist.barrier()
    if rank == 0:
        time.sleep(PREPARE)
    dist.barrier()
    for step, work in enumerate(works, start=1):
        time.sleep(work)
        if rank == 0 and step % EVAL_EVERY == 0:
            time.sleep(EVAL)
        dist.all_reduce(t)
    dist.destroy_process_group()
    return rank


def late_to_its_first_all_reduce(flag: str):
    """Rank 3 waits (outside any collective) for the test's flag; the others sit in all_reduce."""
    import time
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 3:
        while not os.path.exists(flag):
            time.sleep(0.05)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return rank


@pytest.fixture
def live_verdicts():
    """The panel's verdict each time the display is refreshed while the run goes (what every
    display draws from the same state), a hook run with each one, and the text display that
    sees them (passed as the launch's ``ui``)."""
    seen: list[str] = []
    hooks: list = []

    def watch(state):
        if state.status == "running":
            text = pace_display.verdict(state)
            if text is not None:
                seen.append(text)
                for hook in hooks:
                    hook(text)

    return seen, hooks, WatchingDisplay(on_refresh=watch)


def launch(function, args, log_dir, ui="text"):
    return notebook_launcher(function, args, num_processes=4, log_dir=log_dir, ui=ui,
                             use_port=str(free_port()), timeout=240)


def test_the_slow_rank_is_named_live_and_in_the_final_summary(log_dir, live_verdicts, capsys):
    seen, _, display = live_verdicts
    assert launch(sleeps_before_each_all_reduce, (2, STEPS), log_dir, ui=display) == [0, 1, 2, 3]
    out = capsys.readouterr().out
    # the final summary: the whole run compared
    [line] = [line for line in out.splitlines() if line.startswith("pace: ")]
    found = re.fullmatch(r"pace: rank 2 is the slowest \(([\d.]+)x\); ranks 0, 1, 3 spend (\d+)% of their "
                         r"time waiting for it in all_reduce", line)
    assert found, out
    # rank 2 works 0.15 s a step, the others 0.05 s: they wait most of each step
    assert float(found.group(1)) >= 2.0 and int(found.group(2)) >= 50, line
    for rank in range(4):
        row = [row for row in out.splitlines() if row.startswith(f"  rank {rank} [cpu] done")]
        assert row and re.search(r"\([\d.]+ all_reduce/s, \d+% waiting\)", row[0]), out
    # while it ran, the panel said so too (its recent window)
    assert any(text.startswith("rank 2 is the slowest (") and "ranks 0, 1, 3 spend" in text for text in seen), seen


def test_a_balanced_run_names_nobody(log_dir, capsys):
    assert launch(sleeps_before_each_all_reduce, (-1, STEPS), log_dir) == [0, 1, 2, 3]
    out = capsys.readouterr().out
    assert "pace: " not in out and "slowest" not in out, out
    assert len(re.findall(r"\([\d.]+ all_reduce/s, \d+% waiting\)", out)) == 4, out


def test_the_same_work_on_two_noisy_ranks_names_nobody(log_dir, capsys):
    """Rank 1 waits for rank 0 a third of its time in all (the whole run's totals named 'rank 0 is
    the slowest (1.4x)'), but in a few stretches only: the final picture names nobody, from a run
    long enough to judge (each rank has the stretches a verdict needs)."""
    seen: list[RunState] = []
    display = WatchingDisplay(on_refresh=lambda state: seen.append(state) if not seen else None)
    assert notebook_launcher(the_same_work_with_noise, (NOISY_STEPS,), num_processes=2, log_dir=log_dir,
                             ui=display, use_port=str(free_port()), timeout=240) == [0, 1]
    out = capsys.readouterr().out
    assert "pace: " not in out and "slowest" not in out, out
    [state] = seen
    assert state.status == "done" and pace_display.verdict(state) is None
    for rs in state.ranks:
        whole = rs.pace.whole_run(rs.rank)
        assert whole is not None and whole.measured(), (rs.rank, whole)


def test_a_rank_that_has_not_reached_its_collective_is_named_while_the_others_wait(log_dir, tmp_path,
                                                                                   live_verdicts):
    seen, hooks, display = live_verdicts
    flag = tmp_path / "go"
    hooks.append(lambda text: flag.touch() if "has not reached" in text else None)
    assert launch(late_to_its_first_all_reduce, (str(flag),), log_dir, ui=display) == [0, 1, 2, 3]
    named = [text for text in seen if "has not reached" in text]
    assert named and re.fullmatch(r"rank 3 has not reached a collective yet; ranks 0, 1, 2 spend \d+% of "
                                  r"their time waiting for it in all_reduce", named[0]), seen


SLOW_IN_A_CELL = '''
import time
import torch
import torch.distributed as dist
from notebook_launch import notebook_launcher

def train(steps):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1)
    for _ in range(steps):
        time.sleep(0.05 + (0.1 if rank == 2 else 0.0))
        dist.all_reduce(t)
    dist.destroy_process_group()
    return rank
'''


def test_the_widget_panel_in_a_kernel_ends_on_a_picture_that_names_the_slow_rank():
    pytest.importorskip("nbclient")
    from helpers.nbutil import make_notebook, run_notebook
    nb = run_notebook(make_notebook(SLOW_IN_A_CELL, f"notebook_launcher(train, args=({STEPS},), num_processes=4)"),
                      timeout=240, allow_errors=True)
    cell = nb.cells[1]
    pictures = [out for out in cell.outputs if out.output_type == "display_data"
                and "nl-panel" in out.data.get("text/html", "")]
    assert len(pictures) == 1, cell.outputs
    page, summary = pictures[0].data["text/html"], pictures[0].data["text/plain"]
    assert re.search(r"<div class='nl-slow-rank'[^>]*><b>Pace:</b> rank 2 is the slowest \([\d.]+x\); "
                     r"ranks 0, 1, 3 spend \d+% of their time waiting for it in all_reduce</div>", page), page
    assert page.count("class='nl-pace'") == 4
    assert "pace: rank 2 is the slowest (" in summary, summary
