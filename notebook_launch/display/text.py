"""Plain text: rank-tagged lines to the cell or terminal, one write per line."""
from __future__ import annotations

import time

from typing import TYPE_CHECKING, Any

from ..record.line_prefix import DEFAULT_TEMPLATE
from ..notebook.notebook_streams import ERR, OUT, flushable_streams, notebook_stream
from .base import Display
from .cell_budget import DEFAULT_CELL_OUTPUT, CellBudget, LineMerger, ranks_tag
from .words import counted
from ..record.state import DONE

if TYPE_CHECKING:
    from ..record.state import RunState

# A notebook drops output past ~1000 messages/s (IOPub rate limit) and the
# browser slows to a crawl long before a million lines; the log files keep all.
# The default cell budget; ``notebook_launcher(lines_per_second=...)`` chooses another,
# or "all" (None here): every line, for a user who would rather see them than keep the
# browser quick.
NOTEBOOK_LINES_PER_SECOND = 200


SUMMARY_EVERY = 15.0   # seconds between plain-text status summaries (CI logs)
TAIL_UPDATES_PER_SECOND = 2   # the rolling tail is replaced in place at most this often


class TextDisplay(Display):
    """Tagged lines; with ``summary_every`` also a periodic per-rank summary
    (output that is not a terminal cannot redraw a panel, e.g. CI logs).

    In a notebook, each rank has a budget of ``lines_per_second`` lines a second in the
    cell (None: no budget). Per rank, so a rank that floods the output cannot hide
    another rank's few lines (often the one error that matters). And what the run leaves in the
    cell is bounded (``cell_output`` bytes; None: not): identical lines of several ranks show once,
    and past each rank's share its lines go to a rolling tail replaced in place (``cell_budget``)."""
    name = "text"  # what ui= selects it, shown in the launch line

    def __init__(self, line_prefix: str | None = None, stream_is_notebook: bool = False,
                 summary_every: float | None = None,
                 lines_per_second: int | None = NOTEBOOK_LINES_PER_SECOND, brief_when_done: bool = False,
                 cell_output: int | None = DEFAULT_CELL_OUTPUT) -> None:
        super().__init__(line_prefix)
        self.notebook = stream_is_notebook
        self.cell_output = cell_output if stream_is_notebook else None
        # identical lines merge under the default tag only: a template of the user's names one rank
        self.merges = stream_is_notebook and self.line_prefix.template == DEFAULT_TEMPLATE
        self.merger: LineMerger | None = None
        self.cell: CellBudget | None = None
        self.tail: Any = None          # the rolling tail's display handle, once a line went to it
        self._tail_shown = (0, 0.0)    # (lines held back when last drawn, when)
        self._late_suppressed = 0      # lines over the per-second cap counted after the notes' share
        self.summary_every = summary_every
        # a call on persistent ranks that went well ends on its one-line outcome, not the whole summary
        self.brief_when_done = brief_when_done
        self._last_summary = time.monotonic()
        # Only a notebook needs a budget: a terminal or a CI log takes every line.
        self.budget = lines_per_second if stream_is_notebook else None
        self._where_shown: str | None = None
        self._window_start = time.monotonic()
        # (local rank, stream) -> lines shown in this second: each stream of a rank has its own cap, so
        # a flood on stdout never hides the same rank's stderr (a library's warning printed before the
        # flood can still arrive after it: the two pipes are read in whichever order they are ready)
        self._window_counts: dict[tuple[int, str], int] = {}
        self._suppressed = 0

    def start(self, state: RunState) -> None:
        self._ready(state)

    def _ready(self, state: RunState) -> None:
        if self.merger is None and self.merges:
            self.merger = LineMerger(len(state.ranks))
        if self.cell is None and self.cell_output is not None:
            self.cell = CellBudget(self.cell_output, len(state.ranks))

    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        if self.budget is not None and not self._within_budget(local_rank, stream):
            self._suppressed += 1
            return
        self._ready(state)
        if self.merger is None:
            self._show(state, [local_rank], stream, text)
            return
        for merged in self.merger.add(local_rank, stream, text, time.monotonic()):
            self._show(state, merged.ranks, merged.stream, merged.text)

    def _show(self, state: RunState, local_ranks: list[int], stream: str, text: str) -> None:
        """A line, tagged with its rank (or every rank that printed it), to the cell or the tail."""
        tag = (self.tag(state, local_ranks[0]) if len(local_ranks) == 1
               else ranks_tag([state.ranks[local].rank for local in local_ranks]))
        if self.cell is None or self.cell.admit(local_ranks[0], f"{tag}{text}"):
            notebook_stream(stream).write(f"{tag}{text}\n")

    def pump(self, state: RunState, final: bool = False) -> None:
        """Lines whose merge window ended, and the rolling tail redrawn (at most
        TAIL_UPDATES_PER_SECOND): the panels call it on every refresh, as ``refresh`` does."""
        if self.merger is not None:
            for merged in (self.merger.drain() if final else self.merger.due(time.monotonic())):
                self._show(state, merged.ranks, merged.stream, merged.text)
        self._draw_tail(state, final)

    def _draw_tail(self, state: RunState, final: bool) -> None:
        cell = self.cell
        if cell is None or not cell.held_lines:
            return
        now = time.monotonic()
        held, drawn_at = self._tail_shown
        if held == cell.held_lines and not (final and self._late_suppressed):
            return
        if not final and now - drawn_at < 1.0 / TAIL_UPDATES_PER_SECOND:
            return
        late = (f"[notebook_launch] {counted(self._late_suppressed, 'line')} more over the cap of {self.budget} a "
                f"second were not shown" if self._late_suppressed else "")
        bundle = {"text/plain": cell.tail_text(state.log_dir, late)}
        from IPython.display import display
        with flushable_streams():
            if self.tail is None:
                self.tail = display(bundle, raw=True, display_id=True)
            else:
                self.tail.update(bundle, raw=True)
        self._tail_shown = (cell.held_lines, now)

    def _within_budget(self, local_rank: int, stream: str) -> bool:
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._report_suppressed()
            self._window_start = now
            self._window_counts.clear()
        shown = self._window_counts.get((local_rank, stream), 0) + 1
        self._window_counts[(local_rank, stream)] = shown
        return self.budget is None or shown <= self.budget

    def _report_suppressed(self) -> None:
        if self._suppressed:
            note = (f"[notebook_launch] {counted(self._suppressed, 'line')} not shown here "
                    f"(more than {self.budget} a second from a rank's stdout or stderr, too fast for the notebook); "
                    f"every line is in the log folder, a rank's recent lines in the panel's \"recent lines\", "
                    f"and notebook_launcher(..., lines_per_second=\"all\") shows them all here\n")
            if self.cell is None or self.cell.admit_note(note):
                OUT.write(note)
            else:   # the notes' share is spent: the rolling tail counts them
                self._late_suppressed += self._suppressed
            self._suppressed = 0

    def refresh(self, state: RunState) -> None:
        self.pump(state)
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
        self._report_suppressed()
        self.pump(state, final=True)
        if self.summary_every is not None:
            if self.brief_when_done and state.status == DONE and state.summary:
                OUT.write(state.summary + "\n")
            else:
                self._print_summary(state)
        OUT.flush()
        ERR.flush()
