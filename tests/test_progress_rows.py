"""A rank's row with several bars, a stalled rank, the answer to "Where are they?", and the
cell's line budget, in every display (issues 25 and 20). The states are built with the
RunState methods the supervisor calls; the widgets are real ipywidgets over a recording comm."""
import io
import re
import sys
import time

import pytest

from notebook_launch.errors import LaunchArgumentError
from notebook_launch.planning.options import launch_options
from notebook_launch.display import TextDisplay, choose_display
from notebook_launch.display import format as fmt
from notebook_launch.display import fragments, rows
from notebook_launch.display import html as html_display
from notebook_launch.display.rich_panel import render as rich_render
from notebook_launch.record.state import DONE, STOPPED, RankState, RunState


def make_state(world=2):
    return RunState(run_id="r1", world_size=world, backend="fork", log_dir="/tmp/logs",
                    ranks=[RankState(rank=i, local_rank=i) for i in range(world)])


def lightning_like_run(state, local=0):
    """The bar sequence Lightning's TQDMProgressBar sends: a sanity check, then the training
    bar, a validation bar opened (leave=False) and closed inside each epoch."""
    bar = lambda **fields: state.on_progress(local, {"bars": fields})   # noqa: E731
    bar(b0={"desc": "Sanity Checking", "n": 0, "total": 2})
    bar(b0={"n": 2, "elapsed": 0.2, "closed": True})
    bar(b1={"desc": "Epoch 0", "n": 0, "total": 10})
    bar(b1={"n": 10, "elapsed": 1.0})
    bar(b1={"nested": 1}, b2={"desc": "Validation", "n": 0, "total": 4})   # the rank counts nesting
    yield "validating"
    bar(b2={"n": 4, "elapsed": 0.3, "closed": True})
    yield "validated"
    bar(b1={"desc": "Epoch 1", "n": 3, "elapsed": 0.1})
    yield "training"
    bar(b1={"n": 10, "elapsed": 0.4, "closed": True})


def test_the_row_follows_the_moving_bar_and_ends_on_the_training_bar():
    state = make_state(1)
    rs = state.ranks[0]
    run = lightning_like_run(state)
    assert next(run) == "validating"
    assert rs.main_bar.desc == "Validation"                  # the bar that moves now
    assert [b.desc for b in rs.other_bars()] == ["Epoch 0"]   # the paused one, compactly
    assert "(also Epoch 0 100%)" in fmt.rank_line(rs)
    assert next(run) == "validated" and rs.main_bar.desc == "Epoch 0"
    assert next(run) == "training" and rs.main_bar.desc == "Epoch 1" and rs.other_bars() == []
    list(run)
    state.on_exit(0, DONE, "exit code 0")
    # every bar closed: the outer loop (training, which a validation opened inside), not the
    # sanity check that merely came first, nor the validation that came last
    assert rs.main_bar.desc == "Epoch 1"
    assert "Epoch 1: 100% 10/10" in fmt.rank_line(rs)


def test_nested_loops_show_the_inner_bar_while_running_and_the_outer_one_at_the_end():
    state = make_state(1)
    rs = state.ranks[0]
    state.on_progress(0, {"bars": {"b0": {"desc": "epoch", "n": 0, "total": 3, "nested": 1},
                                   "b1": {"desc": "step", "n": 5, "total": 20}}})
    assert rs.main_bar.desc == "step" and "also epoch 0%" in fmt.other_bars(rs)
    assert "also epoch 0%" in rows.row_html(rs)
    state.on_progress(0, {"bars": {"b1": {"n": 20, "closed": True}, "b0": {"n": 1, "nested": 2},
                                   "b2": {"desc": "step", "n": 0, "total": 20}}})
    assert rs.main_bar.id == "b2"                  # the new inner loop, though the epoch moved too
    state.on_progress(0, {"bars": {"b2": {"n": 20, "closed": True, "elapsed": 9.0},
                                   "b0": {"n": 3, "closed": True, "elapsed": 1.0}}})
    assert rs.main_bar.desc == "epoch"            # the outer loop, though a step bar ran longer


def stalled_state(seconds=75.0):
    state = make_state(3)
    for local in range(3):
        state.on_ready(local, {"pid": 100 + local})
    state.on_stalled(0, time.monotonic() - seconds)
    state.on_stalled(2, time.monotonic() - seconds)
    state.on_progress(1, {"bars": {"b0": {"desc": "eval", "n": 3, "total": 9}}})
    return state


def test_stalled_ranks_are_marked_with_how_long_in_every_display():
    state = stalled_state()
    assert abs(state.stalled_for(0) - 75) < 5 and state.stalled_for(1) is None
    text = fmt.summary(state)
    assert "rank 0 [cpu] stalled 01:1" in text and "rank 2 [cpu] stalled 01:1" in text
    assert "rank 1 [cpu] running" in text and ", stalled," in fmt.header(state)
    page = html_display.render(state)
    assert page.count("nl-stalled") == 2 * 2                 # the row and its status badge, twice
    assert "stalled 01:1" in rows.label_html(state.ranks[0])
    assert "stalled" not in rows.label_html(state.ranks[1])
    from rich.console import Console
    drawn_to = io.StringIO()
    console = Console(file=drawn_to, width=160, color_system=None)
    console.print(rich_render(state))
    drawn = drawn_to.getvalue()
    assert drawn.count("stalled 01:1") == 2 and "running" in drawn
    # a rank that ended is never shown as stalled, whatever the supervisor left behind
    state.on_exit(0, DONE, "exit code 0")
    assert "stalled" not in fmt.rank_line(state.ranks[0])


REPORT = ("ranks 0, 2 wait in all_reduce #57 (Cell In[5], line 12); rank 1 never reached it: "
          "it is in evaluate() at Cell In[5], line 30\n"
          "rank 0:\n  File \"Cell In[5]\", line 12, in train\n    dist.all_reduce(t)\n"
          "rank 1:\n  File \"Cell In[5]\", line 30, in evaluate\n    time.sleep(60) <script>\n")


def test_the_where_report_is_a_verdict_line_then_the_stacks_folded():
    state = stalled_state()
    state.where_requested = True
    assert fragments.where_html(state) == ""
    state.on_where_report(REPORT)
    assert state.where_requested is False and state.where_report == REPORT
    piece = fragments.where_html(state)
    verdict_at, stacks_at = piece.index("ranks 0, 2 wait in all_reduce #57"), piece.index("<details")
    assert verdict_at < stacks_at and "overflow:auto" in piece
    assert "&lt;script&gt;" in piece and "<script>" not in piece
    assert "in evaluate\n    time.sleep(60)" in piece
    assert piece in html_display.render(state)
    assert "where are they: ranks 0, 2 wait in all_reduce #57" in fmt.summary(state)
    assert "rank 0:" not in fmt.summary(state)                 # the summary keeps the verdict only


def test_the_text_display_prints_the_report_once(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    state = stalled_state()
    display = TextDisplay()
    display.refresh(state)
    state.on_where_report(REPORT)
    display.refresh(state)
    display.refresh(state)
    assert out.getvalue().count("where are they: ranks 0, 2 wait") == 1
    assert "in evaluate" in out.getvalue()


class DeliveringPollerStandIn:
    """Stands in for CommPoller in a kernel that delivers the panel's clicks during a run
    (tests/test_browser_panel.py clicks the real one in JupyterLab)."""

    def prepare(self):
        pass

    def watch(self, widget):
        return True

    def poll(self):
        pass

    def close(self):
        pass


@pytest.fixture
def widget_panel(monkeypatch):
    pytest.importorskip("ipywidgets")
    from notebook_launch.display import widget as widget_module
    from helpers.widget_comms import recording_comms
    sent = recording_comms(monkeypatch)
    monkeypatch.setattr(widget_module, "_show", lambda panel, text: None)
    monkeypatch.setattr(widget_module, "CommPoller", DeliveringPollerStandIn)
    state = stalled_state()
    display = widget_module.WidgetDisplay(print_lines=False)
    display.start(state)
    return widget_module, display, state, sent


def test_the_where_button_asks_and_the_panel_draws_the_answer(widget_panel):
    widget_module, display, state, _ = widget_panel
    assert display.where_button.description == "Where are they?" and not display.where_button.disabled
    assert [b.description for b in display.buttons.children] == ["Stop", "Where are they?"]
    display.where_button.click()
    assert state.where_requested is True and state.stop_requested is False
    display._redraw(state, now=time.monotonic() + 10)
    assert display.where_button.disabled and display.where_button.description.startswith("Asking")
    state.on_where_report(REPORT)                            # what the supervisor does
    display._redraw(state, now=time.monotonic() + 20)
    assert not display.where_button.disabled and display.where_button.description == "Where are they?"
    assert "ranks 0, 2 wait in all_reduce #57" in display.where.value
    row_classes = re.findall(r"<tr class='nl-rank ([^']*)'", display.rows.value)
    assert ["nl-stalled" in classes.split() for classes in row_classes] == [True, False, True]
    assert "stalled 01:1" in rows.label_html(state.ranks[0])
    assert "stalled 01:1" in display.rows.value


def test_a_ranks_recent_lines_are_sent_when_its_row_is_opened(widget_panel):
    widget_module, display, state, sent = widget_panel
    for i in range(150):
        state.on_line(1, "stdout", f"line {i}")
    display._redraw(state, now=time.monotonic() + 10)
    assert all(log.value == "" for log in display.logs)      # nothing sent while every row is folded
    display.accordion.selected_index = 1                     # the user opens rank 1's lines
    display._redraw(state, now=time.monotonic() + 10.3)
    assert "line 0\n" in display.logs[1].value and "line 149" in display.logs[1].value   # all recent lines
    assert display.logs[0].value == "" and display.logs[2].value == ""


def cell_line_budget(display) -> int | None:
    """The line budget of a notebook panel's cell (the TextDisplay a widget or HTML panel prints lines with)."""
    from helpers.panel_helpers import panel_of
    from notebook_launch.display.widget import WidgetDisplay
    display = panel_of(display)   # drawn once its run lasts: the panel it would draw
    assert isinstance(display, (WidgetDisplay, html_display.HtmlDisplay)) and display.lines is not None, display
    return display.lines.budget


def test_the_cell_line_budget_is_per_rank_chosen_or_all(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    state = make_state(2)
    for budget, shown in ((5, 5), (None, 500)):
        out.truncate(0)
        out.seek(0)
        display = TextDisplay(stream_is_notebook=True, lines_per_second=budget)
        for i in range(500):
            display.line(state, 0, "stdout", f"x{i}")
        display.line(state, 1, "stdout", "the quiet rank's error")   # a flood does not hide it
        display.close(state)
        assert out.getvalue().count("[rank 0] x") == shown
        assert "[rank 1] the quiet rank's error" in out.getvalue()
        assert ("495 lines not shown here" in out.getvalue()) == (budget == 5)
        assert ('lines_per_second="all"' in out.getvalue()) == (budget == 5)   # the note says how
    pytest.importorskip("ipywidgets")
    assert cell_line_budget(choose_display("widget", lines_per_second=None)) is None
    assert cell_line_budget(choose_display("html", lines_per_second=7)) == 7
    assert cell_line_budget(choose_display("widget")) == 200
    # A bad budget is refused once, where every argument is checked (options, issue 31), before the
    # display is chosen; "all" there means None here.
    for bad in (0, -1, 2.5, True):
        with pytest.raises(LaunchArgumentError, match="lines_per_second"):
            launch_options(function=print, lines_per_second=bad)
    assert launch_options(function=print, lines_per_second="all").lines_per_second is None


def test_a_flood_on_a_ranks_stdout_never_hides_its_own_stderr(monkeypatch):
    """Each stream of a rank has its own cap: a library's warning the rank printed on stderr before
    flooding stdout can reach the notebook after the flood (the two pipes are read in whichever order
    they are ready; it happened to a 32-rank run on a busy machine) and is still shown, and a flood
    on stderr is capped as one on stdout is."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    state = make_state(1)
    display = TextDisplay(stream_is_notebook=True, lines_per_second=5)
    for i in range(50):
        display.line(state, 0, "stdout", f"step {i}")
    display.line(state, 0, "stderr", "Some weights of the model were not initialized")
    for i in range(50):
        display.line(state, 0, "stderr", f"warning {i}")
    display.close(state)
    assert out.getvalue().count("[rank 0] step") == 5 and err.getvalue().count("[rank 0] warning") == 4
    assert "[rank 0] Some weights of the model were not initialized" in err.getvalue()
    assert "91 lines not shown here" in out.getvalue() and "stdout or stderr" in out.getvalue()


def test_a_stalled_row_says_how_long_it_has_not_moved_and_no_rate():
    """Issue 47: a stalled rank's pace over the last window only decays while it waits ('1.40
    s/all_reduce'), a speed it does not have: no display shows a rate, an ETA or a pace for it,
    only its status with how long it has not moved. A rank that ended is never called stalled,
    in its row or in a stop's report (``RunState.stalled_for``)."""
    state = RunState(run_id="r", world_size=1, backend="fork", log_dir="/tmp/r",
                     ranks=[RankState(rank=0, local_rank=0)])
    state.on_ready(0, {"pid": 1})
    state.on_progress(0, {"bars": {"b": {"desc": "train", "n": 10, "total": 100, "rate": 5.0}}})
    for second in range(31):   # 10 all_reduce a second, 72% of the time waiting in them
        state.on_progress(0, {"pace": {"since": 100.0, "at": 100.0 + second, "waiting": 0.72 * second,
                                       "ops": {"all_reduce": [10 * second, 0.72 * second]}, "inside": None,
                                       "first": second == 0, "moved": True}})
    assert "10.0 all_reduce/s, 72% waiting" in fmt.rank_line(state.ranks[0])   # while it moves
    state.on_stalled(0, time.monotonic() - 19)
    texts = [fmt.rank_line(state.ranks[0]), re.sub(r"<[^>]+>", " ", rows.row_html(state.ranks[0]))]
    out = io.StringIO()
    from rich.console import Console
    Console(file=out, width=200, color_system=None).print(rich_render(state))
    texts.append(out.getvalue())
    for text in texts:
        assert "stalled 00:19" in text or "stalled 00:2" in text, text
        assert "/s" not in text and " s/" not in text and "eta" not in text and "waiting" not in text, text
    assert state.stalled_for(0) is not None
    state.on_exit(0, STOPPED, "stopped by notebook_launch")
    assert state.stalled_for(0) is None and fmt.stalled_for(state.ranks[0]) is None
