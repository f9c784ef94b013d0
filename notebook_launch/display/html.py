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
from ..notebook_streams import flushable_streams
from ..state import DONE, FAILED, RunState
from .curves import curves_html
from .fragments import BAR_WIDTH, LABEL_WIDTH, ONE_LINE, header_html, info_html, label_html, where_html
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


def render(state: RunState) -> str:
    rows = []
    for rs in state.ranks:
        bar = rs.main_bar
        fraction = 1.0 if (bar is None or bar.fraction is None) and rs.status == DONE else (
            (bar.fraction or 0.0) if bar is not None else 0.0)
        color = fmt.STATUS_COLORS.get(rs.status, "#2563eb")
        background = "#fee2e2" if rs.status == FAILED else "transparent"
        recent = "\n".join(line for _, line in list(rs.lines)[-20:])
        stalled = " nl-stalled" if fmt.stalled_for(rs) is not None else ""
        rows.append(
            f"<tr class='nl-rank nl-status-{rs.status}{stalled}' style='background:{background}'>"
            f"<td style='text-align:left;white-space:nowrap;overflow:hidden'>{label_html(rs)}</td>"
            f"<td><div style='background:#e5e7eb;height:12px;border-radius:3px'>"
            f"<div class='nl-bar' style='width:{fraction * 100:.1f}%;background:{color};height:12px;"
            f"border-radius:3px'></div></div></td>"
            f"<td style='text-align:left'><div class='nl-info' style='{ONE_LINE}'>{info_html(rs)}</div>"
            + (f"<details><summary>recent lines</summary><pre>{html.escape(recent)}</pre></details>"
               if recent else "") + "</td></tr>")
    return (f"<div class='nl-panel'>{header_html(state)}{curves_html(state)}"
            f"<table style='width:100%;border-collapse:collapse;table-layout:fixed'>"
            f"<colgroup><col class='nl-col-label' style='width:{LABEL_WIDTH}'>"
            f"<col class='nl-col-bar' style='width:{BAR_WIDTH}'><col class='nl-col-info'></colgroup>"
            f"{''.join(rows)}</table>{verdict_html(state)}{where_html(state)}</div>")
