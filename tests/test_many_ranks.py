"""Many ranks on one panel (issue 43, part 5), from synthetic run states: past GROUP_ABOVE ranks the
rows are grouped (display/grouping.py), the failed, stalled and slowest ranks keep their own row,
the header says the whole, and every display (the widget's rows and final picture, the rich
panel, the text summary) draws the same rows. No process: the real 32-rank launch in a kernel is
tests/test_many_ranks_notebook.py."""
import dataclasses
import io
import re
import time

import pytest
from rich.console import Console

from notebook_launch.display import format as fmt
from notebook_launch.display import html as html_display
from notebook_launch.display.curves import drawn_ranks
from notebook_launch.display.grouping import (GROUP_ABOVE, MAX_GROUPS, MAX_SINGLES, Grouping, group_rows,
                                              rank_ranges)
from notebook_launch.display.rich_panel import RichDisplay
from notebook_launch.display.rows import rows_html
from notebook_launch.record.state import DONE, FAILED, RankState, RunState

FAILED_RANK, STALLED_RANK, SLOW_RANK = 5, 9, 7


def make_state(world, nodes=1, troubles=True, lines=0):
    """``world`` ranks spread evenly over ``nodes`` (as a cluster launch places them: node_rank set),
    training alike (steps 400-402 of 1000, a loss, a curve); with ``troubles`` rank 5 failed, rank 9
    stalled for 100 s and rank 7 far behind (step 100)."""
    per = world // nodes
    state = RunState(run_id="many", world_size=world, backend="gloo", log_dir="/tmp/many",
                     ranks=[RankState(rank=i, local_rank=i, node_rank=i // per if nodes > 1 else None)
                            for i in range(world)])
    for i in range(world):
        state.on_ready(i, {"pid": 1000 + i})
        state.on_progress(i, {"bars": {"b": {"desc": "train", "n": 400 + i % 3, "total": 1000,
                                             "rate": 120.0 + i % 5}},
                              "metrics": {"loss": 0.5 + i / 10_000},
                              "series": {"loss": [1.0 / (j + 1) for j in range(300)]}})
        for j in range(lines):
            state.on_line(i, "stdout", f"rank {i} line {j} " + "x" * 2000)
    if troubles:
        state.on_progress(SLOW_RANK, {"bars": {"b": {"n": 100}}})
        state.on_exit(FAILED_RANK, FAILED, "exit code 1", error="ValueError: boom on rank 5")
        state.on_stalled(STALLED_RANK, time.monotonic() - 100)
    return state


def rich_text(state, width=200):
    out = io.StringIO()
    display = RichDisplay(console=Console(file=out, width=width, force_terminal=False, color_system=None))
    display.start(state)
    display.close(state)
    return out.getvalue()


def visible(page):
    return re.sub(r"<[^>]+>", "", page)


SHAPES = [(32, 1), (64, 1), (256, 1), (256, 4), (256, 32)]


@pytest.mark.parametrize("world,nodes", SHAPES)
def test_rows_are_few_every_rank_is_in_one_and_the_troubled_ones_are_alone(world, nodes):
    state = make_state(world, nodes)
    grouping = group_rows(state)
    assert grouping.grouped
    members = sorted(i for row in grouping.rows for i in row.members)
    assert members == list(range(world))                               # each rank in exactly one row
    singles = {row.members[0]: row.why for row in grouping.rows if row.single}
    assert singles == {FAILED_RANK: "failed", STALLED_RANK: "stalled", SLOW_RANK: "slowest"}
    assert [row.members[0] for row in grouping.rows[:3]] == [FAILED_RANK, STALLED_RANK, SLOW_RANK]   # on top
    assert len(grouping.rows) <= 3 + (nodes if nodes <= MAX_GROUPS else 1)
    assert grouping.counts == (("running", world - 2), ("stalled", 1), ("failed", 1))
    assert grouping.nodes == nodes
    with pytest.raises(dataclasses.FrozenInstanceError):
        grouping.rows = ()   # type: ignore[misc]


def test_ranks_over_a_few_nodes_are_grouped_by_node_and_over_many_merge():
    four = group_rows(make_state(256, 4))
    assert [row.nodes for row in four.rows if not row.single] == [(0,), (1,), (2,), (3,)]
    many = group_rows(make_state(256, 32))
    [group] = [row for row in many.rows if not row.single]
    assert len(group.nodes) == 32 and len(group.members) == 253
    assert "on 32 nodes" in fmt.summary(make_state(256, 32))


def test_up_to_the_threshold_every_rank_has_its_row():
    state = make_state(GROUP_ABOVE)
    grouping = group_rows(state)
    assert not grouping.grouped and [row.members for row in grouping.rows] == [(i,) for i in range(GROUP_ABOVE)]
    assert fmt.whole(state) == ""                                       # the header as before
    assert rows_html(state).count("<tr class='nl-rank") == GROUP_ABOVE
    assert len(drawn_ranks(state)) == GROUP_ABOVE


def test_ranks_alike_collapse_into_one_row():
    state = make_state(64, troubles=False)
    [row] = group_rows(state).rows
    assert len(row.members) == 64
    assert fmt.summary(state).splitlines()[1] == \
        "  ranks 0-63 running train 40% 400-402/1000 120-124 it/s eta 00:05 loss=0.5…0.5063"


def test_a_failure_that_takes_every_rank_with_it_stays_a_few_rows():
    """Rank 3 fails; the 255 others fail after it with their peer's follow-on error: MAX_SINGLES
    ranks have their own row, the rest one row per error."""
    state = make_state(256, troubles=False)
    state.on_exit(3, FAILED, "exit code 1", error="ValueError: the real error")
    for i in range(256):
        if i != 3:
            state.on_exit(i, FAILED, "exit code 1", error="RuntimeError: Connection closed by peer")
    grouping = group_rows(state)
    singles = [row for row in grouping.rows if row.single]
    assert len(singles) == MAX_SINGLES and singles[0].members == (0,) and singles[3].members == (3,)
    [rest] = [row for row in grouping.rows if not row.single]
    assert len(rest.members) == 256 - MAX_SINGLES
    summary = fmt.summary(state)
    assert "rank 3 [cpu] failed" in summary and "ValueError: the real error" in summary
    assert "ranks 8-255 failed" in summary and "Connection closed by peer" in summary
    assert grouping.counts == (("failed", 256),)


def test_rows_of_different_looks_stay_apart_and_many_groups_merge_by_status():
    state = make_state(64, troubles=False)
    for i in range(0, 64, 2):   # half the ranks on another loop
        state.on_progress(i, {"bars": {"v": {"desc": "validate", "n": 3, "total": 10}}})
    assert len(group_rows(state).rows) == 2
    for i in range(64):         # every rank its own bar: too many looks, one row per status
        state.on_progress(i, {"bars": {f"x{i}": {"desc": f"loop {i}", "n": 1, "total": 10}}})
    state.on_exit(0, DONE, "exit code 0")
    rows = group_rows(state).rows
    assert len(rows) <= MAX_GROUPS and sorted(len(row.members) for row in rows) == [1, 63]


@pytest.mark.parametrize("world,nodes", [(32, 1), (256, 4), (256, 32)])
def test_every_display_draws_the_rows_and_says_the_whole(world, nodes):
    state = make_state(world, nodes)
    whole = f"{world - 2} running, 1 stalled, 1 failed"
    page = html_display.render(state)
    texts = {"html": visible(page), "rich": rich_text(state), "rich narrow": rich_text(state, 90),
             "summary": fmt.summary(state)}
    for name, text in texts.items():
        flat = " ".join(text.replace("│", " ").split())   # the rich panel's lines, wrapped in its frame
        assert whole in flat, (name, text)
        # stalled 100 s when the state was made; the clock runs on while 256 ranks are drawn four ways
        # (a busy machine took over a second): 01:40 to 01:49
        assert "ValueError: boom on rank 5" in flat and "stalled 01:4" in flat, (name, text)
        assert "ranks 0-4, 6, 8, 10-" in flat, (name, text)
    assert page.count("<tr class='nl-group") == (nodes if nodes <= MAX_GROUPS else 1)
    assert page.count("<tr class='nl-rank") == 3
    assert "nl-slowest" in page and "(the slowest)" in texts["summary"]


def test_the_picture_of_256_ranks_stays_small():
    """Lines for the rows only (one per group), the recent lines of a rank per row, each line cut:
    the final picture of 256 loud ranks (lines of 2,000 characters) is no bigger than one of 8."""
    state = make_state(256, 4, lines=30)
    page = html_display.render(state)
    eight = html_display.render(make_state(8, troubles=False, lines=30))
    assert len(page) < min(len(eight), 250_000), (len(page), len(eight))
    assert page.count("class='nl-curve nl-curve-rank") == 7      # 3 ranks alone + 4 node groups
    assert page.count("<details class='nl-recent-lines'>") == 7
    assert "rank 0 (of ranks 0-4, 6, 8, 10-63 on node 0): recent log lines" in page


def test_rank_ranges_are_short():
    assert rank_ranges([3, 0, 1, 2, 5]) == "0-3, 5"
    assert rank_ranges(list(range(0, 40, 2))) == "0, 2, 4, … (20 ranks)"
    assert isinstance(group_rows(make_state(2, troubles=False)), Grouping)


def test_the_widget_has_one_recent_lines_section_with_a_menu_of_the_ranks(monkeypatch):
    """Past GROUP_ABOVE ranks the live panel's recent lines are one section and a menu, not a
    section per rank (3 widget models each); where the kernel cannot deliver the menu's choice
    during the run it shows the first row's rank: the failed one."""
    pytest.importorskip("ipywidgets")
    from helpers.widget_comms import recording_comms

    from notebook_launch.display.widget import WidgetDisplay
    sent = recording_comms(monkeypatch)
    state = make_state(64)
    for i in (0, FAILED_RANK):
        state.on_line(i, "stdout", f"a line of rank {i}")
    display = WidgetDisplay(print_lines=False, poll_kernel=False)
    display.start(state)
    assert len(display.accordion.children) == 1 and len(display.choice.options) == 64
    assert len([m for m in sent if m["type"] == "comm_open"]) < 40   # not 3 per rank
    assert f"a line of rank {FAILED_RANK}" in display.logs[0].value
    display._rank_chosen, display.choice.value = True, 0   # as a choice the kernel delivered
    display._redraw(state, now=time.monotonic() + 60)
    assert "a line of rank 0" in display.logs[0].value
    display.close(state)
    assert sorted(m["comm_id"] for m in sent if m["type"] == "comm_close") == \
        sorted(m["comm_id"] for m in sent if m["type"] == "comm_open")
