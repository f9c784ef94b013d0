"""A notebook panel (widget or HTML) drawn only once its run has lasted ``PANEL_AFTER`` seconds.

Why: a warm call on persistent ranks is over in a millisecond, and the widget panel of one call
was 33 widgets and about 75 comm messages, opened and closed again: in a Jupyter kernel a
trivial ``ranks.run(f)`` took 32 ms with it against 0.6 ms without (issue 45), and a loop of
calls left a picture per call in the cell. A quick launch paid the same 30-40 ms to build a live
panel that nobody could watch before it became its picture. So the panel is made when there is
something to watch: the run still runs after ``PANEL_AFTER`` (tqdm's ``delay`` does the same for
bars), a rank printed a line (the panel stays above its lines, as in every run), a rank waits at
a prompt, or (a launch) a rank shows a ``display()`` output (the panel stays above it).

A run over before then ends as it would have: a launch leaves its final picture (the same static
HTML the live panel becomes, published once, no widget made); a call that went well leaves no
output, its results are the cell's value; a call that failed or was stopped leaves its picture,
which shows which rank.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from ..record.state import DONE
from .base import Display

if TYPE_CHECKING:
    from ..record.state import RunState

PANEL_AFTER = 0.5        # seconds a run goes on before its panel is drawn


class DeferredPanel(Display):
    """The display ``make()`` returns, made and started only when there is something to watch
    (see the module); until then every call to it costs a comparison. ``call``: one call on
    persistent ranks (a quick one that went well leaves nothing; a rank's ``display()`` does not
    draw the panel, a cell's outputs are the call's own); else a launch."""

    def __init__(self, make: Callable[[], Display], name: str, line_prefix: str | None = None,
                 after: float = PANEL_AFTER, call: bool = True) -> None:
        super().__init__(line_prefix)
        self.name = name        # the panel's: what ui= selected
        self.after = after
        self.call = call
        self._make = make
        self.shown: Display | None = None   # the panel, once made
        self._started = 0.0

    def start(self, state: RunState) -> None:
        self._started = time.monotonic()

    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        self._panel(state).line(state, local_rank, stream, text)

    def refresh(self, state: RunState) -> None:
        if self.shown is None and time.monotonic() - self._started < self.after:
            return
        self._panel(state).refresh(state)

    def prompting(self, state: RunState, showing: bool) -> None:
        if showing or self.shown is not None:
            self._panel(state).prompting(state, showing)

    def before_output(self, state: RunState) -> None:
        if not self.call:
            self._panel(state)

    def close(self, state: RunState) -> None:
        if self.shown is not None:
            self.shown.close(state)
        elif not (self.call and state.status == DONE):   # a call that went well: the results say it
            self._picture(state)

    def _picture(self, state: RunState) -> None:
        """The final picture alone, as the live panel's ``close`` leaves it (``html.render``)."""
        from IPython.display import display

        from ..notebook.notebook_streams import flushable_streams
        from .html import picture
        with flushable_streams():
            display(picture(state), raw=True)

    def _panel(self, state: RunState) -> Display:
        if self.shown is None:
            self.shown = self._make()
            self.shown.start(state)
        return self.shown


__all__ = ["PANEL_AFTER", "DeferredPanel"]
