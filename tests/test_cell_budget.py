"""What a run leaves in the cell stays bounded (issue 43, parts 1 and 2): each rank's first lines,
then a rolling tail replaced in place with how many lines are only in the log files and where;
identical lines of several ranks show once, naming the ranks. Pure tests of the model
(``display.cell_budget``), and a real kernel (nbclient) for what a notebook keeps."""
from __future__ import annotations

import json
import math
import pathlib
import re
import textwrap

import pytest

from notebook_launch import LaunchArgumentError, notebook_launcher, start_ranks
from notebook_launch.display.cell_budget import (HEAD_SHARE, NOTE_SHARE, TAIL_LINE_CHARS, TAIL_LINES, CellBudget,
                                                 LineMerger, ranks_tag)


def texts(merged):
    return [(m.text, sorted(m.ranks)) for m in merged]


def test_a_line_every_rank_prints_shows_once_as_soon_as_the_last_one_printed_it():
    merger = LineMerger(4)
    out = []
    for rank in range(4):
        out += merger.add(rank, "stderr", "Some weights were not initialized", now=0.1 * rank)
    assert texts(out) == [("Some weights were not initialized", [0, 1, 2, 3])]


def test_lines_that_differ_at_all_stay_apart_and_keep_their_order():
    merger = LineMerger(2, window=1.0)
    out = merger.add(0, "stdout", "loss 0.51 on rank 0", 0.0) + merger.add(1, "stdout", "loss 0.52 on rank 1", 0.1)
    out += merger.add(0, "stdout", "same", 0.2)
    assert out == []   # each waits its window for the other rank
    out = merger.due(1.15)
    assert texts(out) == [("loss 0.51 on rank 0", [0]), ("loss 0.52 on rank 1", [1])]
    assert texts(merger.due(1.25)) == [("same", [0])]
    assert texts(LineMerger(2).add(0, "stdout", "x", 0.0) + LineMerger(2).add(0, "stderr", "x", 0.0)) == []


def test_a_rank_repeating_a_line_is_two_lines_and_nothing_overtakes():
    merger = LineMerger(3)
    out = merger.add(0, "stdout", "first", 0.0) + merger.add(0, "stdout", "tick", 0.1)
    out += merger.add(0, "stdout", "tick", 0.2)   # rank 0 again: its first tick goes out, after "first"
    assert texts(out) == [("first", [0]), ("tick", [0])]
    assert texts(merger.drain()) == [("tick", [0])]


def test_one_rank_shows_at_once():
    assert texts(LineMerger(1).add(0, "stdout", "hello", 0.0)) == [("hello", [0])]


def test_ranks_are_named_as_a_person_reads_them():
    assert ranks_tag([0, 1, 2, 3, 4, 5, 6, 7]) == "[ranks 0-7] "
    assert ranks_tag([5, 0, 2]) == "[ranks 0, 2, 5] " and ranks_tag([3]) == "[rank 3] "


def test_each_rank_has_its_share_and_the_rest_goes_to_a_bounded_tail():
    cell = CellBudget(total=10_000, ranks=4)
    share = 10_000 * HEAD_SHARE / 4
    line = "x" * 99
    shown = {rank: sum(cell.admit(rank, line) for _ in range(1000)) for rank in (0, 1)}
    assert shown[0] == shown[1] == math.floor(share / 99)     # rank 0's flood left rank 1 its share
    assert cell.admit(2, "the one error that matters")       # and every other rank its own
    assert cell.held == {0: 1000 - shown[0], 1: 1000 - shown[1]} and len(cell.tail) == TAIL_LINES
    assert not cell.admit(0, "y" * 5000) and cell.tail[-1].startswith("y" * TAIL_LINE_CHARS + " [cut here")
    text = cell.tail_text("/runs/r1")
    assert f"{cell.held_lines:,} more lines (rank 0: {cell.held[0]:,}, rank 1: {cell.held[1]:,})" in text
    assert "only in the log files in /runs/r1" in text and len(text) < TAIL_LINES * (TAIL_LINE_CHARS + 40) + 400


def test_notes_have_a_small_share_of_their_own_and_all_means_no_bound():
    cell = CellBudget(total=20_000, ranks=2)
    note = "n" * 99
    assert sum(cell.admit_note(note) for _ in range(100)) == math.floor(20_000 * NOTE_SHARE / 99)
    unbounded = CellBudget(total=None, ranks=2)
    assert all(unbounded.admit(0, "x" * 1000) for _ in range(1000)) and unbounded.held_lines == 0


@pytest.mark.parametrize("bad", [-1, 0, 9_999, float("nan"), 2.5e5, "200kB", "", True, None])
def test_a_bad_budget_is_refused_before_anything_starts(bad, tmp_path):
    with pytest.raises(LaunchArgumentError, match="cell_output must be a whole number of bytes >= 10,000"):
        notebook_launcher(print, num_processes=2, cell_output=bad, log_dir=str(tmp_path / "run"))
    with pytest.raises(LaunchArgumentError, match="cell_output must be"):
        start_ranks(2, cell_output=bad, log_dir=str(tmp_path / "ranks"))
    assert not (tmp_path / "run").exists() and not (tmp_path / "ranks").exists()


LOUD = textwrap.dedent("""
    from notebook_launch import notebook_launcher

    def loud():
        import os, sys, time
        rank = int(os.environ["RANK"])
        print("Some weights of the model were not initialized", file=sys.stderr, flush=True)
        for i in range(2000):
            print(f"rank {{rank}} line {{i:05d}} " + "." * 40, flush=True)
            if i % 150 == 149:
                time.sleep(1.0)   # under the per-second cap: only the byte budget bounds it
        return rank

    notebook_launcher(loud, num_processes=4, cell_output=20_000, log_dir={log_dir!r})
""")


def test_a_loud_run_leaves_a_bounded_cell_and_every_line_in_the_logs(tmp_path):
    from helpers.nbutil import make_notebook, run_notebook
    nb = run_notebook(make_notebook(LOUD.format(log_dir=str(tmp_path))), timeout=300)
    outputs = nb.cells[0].outputs
    streams = "".join(o.text for o in outputs if o.output_type == "stream")
    lines = [line for line in streams.splitlines() if line.startswith("[rank ")]
    assert len(streams.encode()) <= 20_000 * (HEAD_SHARE + NOTE_SHARE) + 400, len(streams)   # + the launch line
    assert {line.split("]")[0] for line in lines} == {"[rank 0", "[rank 1", "[rank 2", "[rank 3"}
    merged = [line for line in streams.splitlines() if "Some weights" in line]
    assert merged == ["[ranks 0-3] Some weights of the model were not initialized"], merged
    tails = [o for o in outputs if o.output_type == "display_data" and "is bounded (cell_output=20,000 bytes)"
             in o.get("data", {}).get("text/plain", "")]
    assert len(tails) == 1, [o.output_type for o in outputs]
    tail = tails[0]["data"]["text/plain"]
    assert f"only in the log files in {tmp_path}" in tail, tail[:400]
    # the rolling tail reaches the run's end: its last line is the last line of the rank that ended last
    # (which rank that is depends on the machine: the four print alike)
    assert re.fullmatch(r"\[rank (\d)\] rank \1 line 01999 \.+", tail.rstrip().splitlines()[-1]), tail[-400:]
    assert len(tail.encode()) < 20_000
    for rank in range(4):
        log = pathlib.Path(tmp_path, f"rank{rank}.log").read_text()
        assert log.count(f"rank {rank} line ") == 2000 and "line 01999" in log
        assert "Some weights of the model were not initialized" in log   # every rank keeps its own
    saved = len(json.dumps(nb.cells[0].outputs))
    assert saved < 200_000, saved   # the panel's picture and the tail included


MANY = textwrap.dedent("""
    from notebook_launch import notebook_launcher, progress

    def many():
        import os, sys, time
        rank = int(os.environ["RANK"])
        # every rank prints the warning once all have started: on a busy machine 32 forks can span
        # more than the one-second window in which identical lines join into one
        open(os.path.join({barrier!r}, f"started-{{rank}}"), "w").close()
        while len(os.listdir({barrier!r})) < 32:
            time.sleep(0.005)
        print("Some weights of the model were not initialized", file=sys.stderr, flush=True)
        for step in progress(range(3000), desc="train"):
            progress.log(loss=1.0 / (step + 1) + rank * 1e-3, lr=1e-3)
            if step % 10 == 0:
                print(f"rank {{rank}} step {{step}} loss {{1.0 / (step + 1):.6f}}", flush=True)
        return rank

    results = notebook_launcher(many, num_processes=32, log_dir={log_dir!r})
    assert results == list(range(32))
""")


def tagged_ranks(line: str) -> list[int]:
    """The ranks a merged line's tag names: '[rank 3] ', '[ranks 0-7] ', '[ranks 0, 2, 5] '."""
    match = re.match(r"\[ranks? ([0-9, -]+)\] ", line)
    assert match, line
    ranks: list[int] = []
    for part in match[1].split(", "):
        first, _, last = part.partition("-")
        ranks.extend(range(int(first), int(last or first) + 1))
    return ranks


@pytest.mark.timeout(600)
def test_a_saved_notebook_of_a_32_rank_run_stays_small(tmp_path):
    """Issue 43, part 4: the cell's lines, the final picture (rows, curves) and the widget state a
    32-rank run leaves make a saved notebook under about 2 MB."""
    import nbformat
    from helpers.nbutil import make_notebook, run_notebook
    (tmp_path / "barrier").mkdir()
    nb = run_notebook(make_notebook(MANY.format(log_dir=str(tmp_path / "logs"), barrier=str(tmp_path / "barrier"))),
                      timeout=540)
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, str(path))
    assert path.stat().st_size < 2_000_000, path.stat().st_size
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.output_type == "stream")
    # The 32 ranks' identical warning joins into one line per one-second window (cell_budget.MERGE_WINDOW).
    # They print it as they leave the barrier; on a busy machine (32 ranks and other tests on 2 cores) the
    # last can leave it seconds after the first, so the warning may take a few lines, never one a rank,
    # and between them every rank is named once.
    warned = [line for line in text.splitlines() if "Some weights of the model were not initialized" in line]
    named = [rank for line in warned for rank in tagged_ranks(line)]
    assert 1 <= len(warned) <= 4 and sorted(named) == list(range(32)), warned
