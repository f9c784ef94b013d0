"""Displays render the run state; they never change it (a Stop button only
sets ``state.stop_requested``). ``choose_display`` picks one for where we run.

Owns: drawing a run's state (panel, text, HTML, rich). May import: record, detect,
notebook, errors; nothing a run needs imports a display's internals.
"""
from __future__ import annotations

import logging
import sys

from .base import Display
from .cell_budget import DEFAULT_CELL_OUTPUT
from .text import NOTEBOOK_LINES_PER_SECOND, SUMMARY_EVERY, TextDisplay

log = logging.getLogger("notebook_launch")
UI_CHOICES = ("auto", "widget", "html", "rich", "text", "none")


def choose_display(ui: str | Display = "auto", *, line_prefix: str | None = None,
                   lines_per_second: int | None = NOTEBOOK_LINES_PER_SECOND, call: bool = False,
                   cell_output: int | None = DEFAULT_CELL_OUTPUT) -> Display:
    """A ``Display`` the caller made (``ui=`` given one: a display of their own) is that display,
    as it is: it was made with its own settings. auto: the widget panel in a Jupyter kernel with
    ipywidgets, a rich panel in a terminal, plain text (with periodic summaries) otherwise, e.g. in CI logs.
    ``lines_per_second``: how many lines a second of each rank the cell shows (the rest are
    counted in a note; every line is in the logs); None shows every line. Only a notebook cell has
    a budget: a terminal or a CI log takes every line. ``cell_output``: the bytes of lines a run leaves
    in a cell (``cell_budget``; None: not bounded). ``call``: one call on persistent ranks, whose
    text ends on one line when it went well (a call may take no time: four lines would be noise).
    A notebook panel, a launch's or a call's, is drawn only once the run lasts (``deferred``)."""
    # options.validate_lines_per_second checked the user's value: this is our own contract
    assert lines_per_second is None or lines_per_second >= 1, lines_per_second
    if isinstance(ui, Display):
        return ui
    if ui == "none":
        return Display(line_prefix=line_prefix)
    if ui == "auto":
        ui = _auto_choice()
    if ui in ("widget", "html"):
        # drawn once the run lasts (display/deferred.py): most calls are over in a millisecond, a
        # quick launch in tens; one over before then leaves its picture (a call that went well, nothing)
        from .deferred import DeferredPanel
        return DeferredPanel(lambda: _panel(ui, line_prefix, lines_per_second, cell_output), ui,
                             line_prefix=line_prefix, call=call)
    if ui == "rich":
        from .rich_panel import RichDisplay
        return RichDisplay(line_prefix=line_prefix)
    notebook = _in_notebook()
    return TextDisplay(line_prefix=line_prefix, stream_is_notebook=notebook,
                       summary_every=None if _is_terminal() else SUMMARY_EVERY,
                       lines_per_second=lines_per_second, brief_when_done=call, cell_output=cell_output)


def _panel(ui: str, line_prefix: str | None, lines_per_second: int | None, cell_output: int | None) -> Display:
    """A notebook panel: the live widget (``ui="widget"``) or the HTML one."""
    if ui == "widget":
        from .widget import WidgetDisplay
        return WidgetDisplay(line_prefix=line_prefix, lines_per_second=lines_per_second, cell_output=cell_output)
    from .html import HtmlDisplay
    return HtmlDisplay(line_prefix=line_prefix, lines_per_second=lines_per_second, cell_output=cell_output)


def _auto_choice() -> str:
    if _in_notebook():
        try:
            import ipywidgets  # noqa: F401
            return "widget"
        except ImportError:
            log.debug("ipywidgets is not installed: the HTML panel stands in for the widget")
            return "html"
    return "rich" if _is_terminal() else "text"


def _is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _in_notebook() -> bool:
    from ..detect.platform import in_ipython_kernel
    return in_ipython_kernel()


__all__ = ["Display", "TextDisplay", "choose_display", "UI_CHOICES"]
