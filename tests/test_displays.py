"""Which display is chosen, and what the rich, text and HTML displays show."""
import io

import pytest

from notebook_launch.display import TextDisplay, choose_display
from notebook_launch.display import html as html_display
from notebook_launch.display.rich_panel import RichDisplay
from notebook_launch.record.state import DONE, FAILED, RankState, RunState


def finished_state():
    state = RunState(run_id="r9", world_size=2, backend="fork", log_dir="/tmp/r9",
                     ranks=[RankState(rank=i, local_rank=i) for i in range(2)])
    state.on_progress(0, {"bars": {"b0": {"desc": "train", "n": 100, "total": 100, "rate": 50.0}},
                          "metrics": {"loss": 0.125}})
    state.on_progress(1, {"bars": {"b0": {"desc": "train", "n": 40, "total": 100}}})
    state.on_line(0, "stdout", "epoch 1 done")
    state.on_exit(0, DONE, "finished")
    state.on_exit(1, FAILED, "exit code 1", error="ValueError: boom")
    state.finish(FAILED, "rank 1 failed: ValueError: boom")
    return state


def test_forced_choices_and_auto_outside_a_kernel(monkeypatch):
    assert type(choose_display("none")).__name__ == "Display"
    assert isinstance(choose_display("text"), TextDisplay)
    assert type(choose_display("rich")).__name__ == "RichDisplay"
    # a notebook panel is drawn once its run lasts (display/deferred.py): a launch's and a call's
    from notebook_launch.display.deferred import DeferredPanel
    html, call = choose_display("html"), choose_display("html", call=True)
    assert isinstance(html, DeferredPanel) and not html.call
    assert type(html._make()).__name__ == "HtmlDisplay"
    assert isinstance(call, DeferredPanel) and call.call
    pytest.importorskip("ipywidgets")
    widget = choose_display("widget")
    assert isinstance(widget, DeferredPanel) and type(widget._make()).__name__ == "WidgetDisplay"
    monkeypatch.setattr("sys.stdout", io.StringIO())          # not a terminal: CI logs
    auto = choose_display("auto")
    assert isinstance(auto, TextDisplay) and auto.summary_every is not None


def test_auto_picks_rich_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr("sys.stdout", Tty())
    assert type(choose_display("auto")).__name__ == "RichDisplay"


def test_rich_panel_shows_ranks_and_the_error():
    from rich.console import Console
    out = io.StringIO()
    display = RichDisplay(console=Console(file=out, width=160, force_terminal=False, color_system=None))
    state = finished_state()
    display.start(state)
    display.line(state, 0, "stdout", "hello from rank 0")
    display.close(state)
    text = out.getvalue()
    assert "[rank 0] hello from rank 0" in text
    assert "rank 1" in text and "failed" in text and "ValueError: boom" in text
    assert "100/100" in text and "loss=0.125" in text and "logs: /tmp/r9" in text


def test_text_display_prints_periodic_and_final_summaries(capsys):
    display = TextDisplay(summary_every=0.0)
    state = finished_state()
    display.refresh(state)
    display.close(state)
    out = capsys.readouterr().out
    assert out.count("notebook_launch run r9: 2 ranks, fork, failed") == 2
    assert "rank 1 [cpu] failed train: 40% 40/100 ValueError: boom" in out


def test_html_render_marks_the_failed_row_red():
    page = html_display.render(finished_state())
    assert "nl-status-failed" in page and "#fee2e2" in page and "ValueError: boom" in page
    assert "width:100.0%" in page and "width:40.0%" in page


def test_a_call_that_went_well_ends_on_one_line_and_a_failed_one_on_the_summary(capsys):
    """A call on persistent ranks (``choose_display(call=True)``): one line when it went well,
    even for a call that took no time (issue 35); the whole summary when it did not."""
    display = choose_display("text", call=True)
    assert isinstance(display, TextDisplay)
    display.summary_every = 15.0   # as in a notebook cell (not a terminal)
    done = RunState(run_id="r9-call1", world_size=2, backend="fork, persistent", log_dir="/tmp/r9",
                    ranks=[RankState(rank=i, local_rank=i) for i in range(2)])
    for rank in range(2):
        done.on_exit(rank, DONE, "returned")
    done.finish(DONE, "2 ranks returned in 0.00 s")
    display.close(done)
    assert capsys.readouterr().out == "2 ranks returned in 0.00 s\n"
    display.close(finished_state())
    out = capsys.readouterr().out
    assert "notebook_launch run r9: 2 ranks, fork, failed" in out and "rank 1 [cpu] failed" in out


def test_the_live_rows_are_the_final_pictures_rows_and_cut_no_figure():
    """The live widget panel draws every rank's row with the final picture's markup (one table:
    the bars line up, the panel keeps its shape when the run ends; issues 35 and 47), and no
    figure is cut with an ellipsis: a row too long for the output wraps between whole figures.
    Only a rank's last output line may be shortened (its whole text is in "recent lines")."""
    pytest.importorskip("ipywidgets")
    import re
    from notebook_launch.display import rows
    from notebook_launch.display.widget import WidgetDisplay, close_widgets
    state = finished_state()
    state.ranks[1].error = "ValueError: " + "a long message " * 12   # wraps over lines, whole
    display = WidgetDisplay(print_lines=False, poll_kernel=False)
    display.start(state)
    try:
        assert display.rows.value == rows.rows_html(state)
        assert rows.rows_html(state) in html_display.render(state)
    finally:
        close_widgets(display.widgets_made())
    page = html_display.render(state)
    clipped = re.findall(r"<(\w+) class='([\w -]+)'[^>]*text-overflow", page)
    assert [cls for _tag, cls in clipped] == ["nl-last-line"], clipped
    assert "…" not in re.sub(r"<[^>]+>", "", page) and state.ranks[1].error.strip() in page
    figures = re.findall(r"<span style='white-space:nowrap'>([^<]*)</span>", rows.row_html(state.ranks[0]))
    assert figures[:3] == ["train 100%", "100/100", "50.0 it/s"], figures
