"""An HTML table updated in place through a display id, for frontends without
widgets (nbconvert, some viewers). One IOPub message per redraw, at most
REDRAWS_PER_SECOND, plus the exact final state in ``close()``.

``render`` is also the widget panel's picture once its run ended (display/widget.py):
plain HTML and inline SVG only, no script, so any viewer of a saved notebook shows it.
Cells are aligned left explicitly: JupyterLab right-aligns table cells in outputs."""
from __future__ import annotations

import html
import time
from typing import Any

from . import format as fmt
from .base import Display
from .text import TextDisplay
from ..notebook.notebook_streams import flushable_streams
from ..record.state import RankState, RunState
from .curves import curves_html
from .fragments import FONT, footer_html, header_html, where_html
from .rows import rows_html
from .pace import verdict_html
from .cell_budget import DEFAULT_CELL_OUTPUT
from .text import NOTEBOOK_LINES_PER_SECOND

REDRAWS_PER_SECOND = 2


class HtmlDisplay(Display):
    name = "html"  # what ui= selects it, shown in the launch line
    def __init__(self, line_prefix: str | None = None, print_lines: bool = True,
                 lines_per_second: int | None = NOTEBOOK_LINES_PER_SECOND,
                 cell_output: int | None = DEFAULT_CELL_OUTPUT) -> None:
        super().__init__(line_prefix)
        self.lines = TextDisplay(line_prefix, stream_is_notebook=True, lines_per_second=lines_per_second,
                                 cell_output=cell_output) if print_lines else None
        self.handle: Any = None
        self._last = 0.0
        self._last_html: str | None = None

    def start(self, state: RunState) -> None:
        from IPython.display import display
        self._last_html = render(state)
        with flushable_streams():
            self.handle = display({"text/html": self._last_html, "text/plain": fmt.summary(state)},
                                  raw=True, display_id=True)

    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        if self.lines is not None:
            self.lines.line(state, local_rank, stream, text)

    def refresh(self, state: RunState, final: bool = False) -> None:
        if self.lines is not None and not final:
            self.lines.pump(state)   # merged lines due, the rolling tail (cell_budget)
        now = time.monotonic()
        if self.handle is None or (not final and now - self._last < 1.0 / REDRAWS_PER_SECOND):
            return
        page = render(state)
        if page != self._last_html or final:
            with flushable_streams():
                self.handle.update({"text/html": page, "text/plain": fmt.summary(state)}, raw=True)
            self._last_html = page
        self._last = now

    def close(self, state: RunState) -> None:
        self.refresh(state, final=True)
        if self.lines is not None:
            self.lines.close(state)


def picture(state: RunState) -> dict[str, str]:
    """The run's final picture as a display bundle: what a live panel (widget or HTML) leaves in the
    cell when its run ended, and a run over before its panel was drawn leaves (``deferred``)."""
    return {"text/html": render(state), "text/plain": fmt.summary(state)}


def render(state: RunState) -> str:
    """The panel as HTML: the live panel's pieces in its order, with the same markup for the rows
    (``rows``), each rank's recent lines folded where the live panel has its "recent lines"
    sections, and the run's outcome on the line where it had its buttons."""
    return (f"<div class='nl-panel' style='{FONT}'>{header_html(state)}{curves_html(state)}"
            f"{rows_html(state)}{verdict_html(state)}{where_html(state)}{recent_lines_html(state)}"
            f"{footer_html(state)}</div>")


# Like the live panel's sections (ipywidgets' Accordion): one folded block per rank, as tall.
SECTION = ("border:1px solid #e0e0e0;background:#eeeeee;padding:6px 12px;margin-top:4px;cursor:pointer;"
           "font-weight:bold;line-height:26px")


def recent_lines_html(state: RunState) -> str:
    """Each rank's last lines, folded, one section per rank as in the live panel; with many ranks
    (``grouping``) one per row: each rank with a row of its own, and a group's first rank (every
    rank's lines are in its log file): 256 sections would be a page of their own."""
    sections = []
    for rs, name in recent_sections(state):
        recent = "\n".join(fmt.shorten(line, RECENT_LINE_CHARS) for _, line in list(rs.lines)[-20:])
        body = (f"<pre style='margin:0;padding:6px 12px;max-height:20em;overflow:auto'>{html.escape(recent)}</pre>"
                if recent else "<i style='padding:6px 12px;display:block'>no output</i>")
        sections.append(f"<details class='nl-recent-lines'><summary style='{SECTION}'>{html.escape(name)}: "
                        f"recent log lines</summary>{body}</details>")
    return f"<div class='nl-recent'>{''.join(sections)}</div>"


RECENT_LINE_CHARS = 1000   # a line of the recent lines (the picture's, the panel's) is cut past this: a rank's
                           # line may be 64 kB (line_splitter.MAX_LINE); it is whole in the log file


def recent_sections(state: RunState) -> list[tuple[RankState, str]]:
    """The ranks whose recent lines the picture folds in, and what each section is called."""
    from .grouping import representatives
    return [(rs, f"rank {rs.rank}" if group is None else f"rank {rs.rank} (of {group})")
            for rs, group in representatives(state)]
