"""Plain text: rank-tagged lines to the cell or terminal, one write per line."""
from __future__ import annotations

import time

from typing import TYPE_CHECKING

from ..notebook_streams import ERR, OUT, notebook_stream
from .base import Display
from .words import counted
from ..state import DONE

if TYPE_CHECKING:
    from ..state import RunState

# A notebook drops output past ~1000 messages/s (IOPub rate limit) and the
# browser slows to a crawl long before a million lines; the log files keep all.
# The default cell budget; ``notebook_launcher(lines_per_second=...)`` chooses another,
# or "all" (None here): every line, for a user who would rather see them than keep the
# browser quick.
NOTEBOOK_LINES_PER_SECOND = 200


SUMMARY_EVERY = 15.0   # seconds between plain-text status summaries (CI logs)


class TextDisplay(Display):
    """Tagged lines; with ``summary_every`` also a periodic per-rank summary
    (output that is not a terminal cannot redraw a panel, e.g. CI logs).

    In a notebook, each rank has a budget of ``lines_per_second`` lines a second in the
    cell (None: no budget). Per rank, so a rank that floods the output cannot hide
    another rank's few lines (often the one error that matters)."""
    name = "text"  # what ui= selects it, shown in the launch line

    def __init__(self, line_prefix: str | None = None, stream_is_notebook: bool = False,
                 summary_every: float | None = None,
                 lines_per_second: int | None = NOTEBOOK_LINES_PER_SECOND, brief_when_done: bool = False) -> None:
        super().__init__(line_prefix)
        self.summary_every = summary_every
        # a call on persistent ranks that went well ends on its one-line outcome, not the whole summary
        self.brief_when_done = brief_when_done
        self._last_summary = time.monotonic()
        # Only a notebook needs a budget: a terminal or a CI log takes every line.
        self.budget = lines_per_second if stream_is_notebook else None
        self._where_shown: str | None = None
        self._window_start = time.monotonic()
        self._window_counts: dict[int, int] = {}   # local rank -> lines shown in this second
        self._suppressed = 0

    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        if self.budget is not None and not self._within_budget(local_rank):
            self._suppressed += 1
            return
        notebook_stream(stream).write(f"{self.tag(state, local_rank)}{text}\n")

    def _within_budget(self, local_rank: int) -> bool:
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._report_suppressed()
            self._window_start = now
            self._window_counts.clear()
        shown = self._window_counts.get(local_rank, 0) + 1
        self._window_counts[local_rank] = shown
        return self.budget is None or shown <= self.budget

    def _report_suppressed(self) -> None:
        if self._suppressed:
            OUT.write(f"[notebook_launch] {counted(self._suppressed, 'line')} not shown here "
                             f"(more than {self.budget} a second from a rank, too fast for the notebook); "
                             f"every line is in the log folder, a rank's recent lines in the panel's \"recent lines\", "
                             f"and notebook_launcher(..., lines_per_second=\"all\") shows them all here\n")
            self._suppressed = 0

    def refresh(self, state: RunState) -> None:
        self._print_where(state)
        if self.summary_every is None:
            return
        now = time.monotonic()
        if now - self._last_summary >= self.summary_every:
            self._last_summary = now
            self._print_summary(state)

    def _print_where(self, state: RunState) -> None:
        """The answer to "Where are they?" (or a stall's report), once each time it changes:
        the text display has no panel to draw it in."""
        report = state.where_report
        if report and report != self._where_shown:
            self._where_shown = report
            OUT.write(f"[notebook_launch] where are they: {report.rstrip()}\n")

    def _print_summary(self, state: RunState) -> None:
        from . import format as fmt
        OUT.write(fmt.summary(state) + "\n")

    def close(self, state: RunState) -> None:
        if self.summary_every is not None:
            if self.brief_when_done and state.status == DONE and state.summary:
                OUT.write(state.summary + "\n")
            else:
                self._print_summary(state)
        self._report_suppressed()
        OUT.flush()
        ERR.flush()
