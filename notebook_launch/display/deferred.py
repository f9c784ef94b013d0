"""A call's notebook panel, drawn only once the call has lasted ``CALL_PANEL_AFTER`` seconds.

Why: a warm call on persistent ranks is over in a millisecond, and the widget panel of one
call was 33 widgets and about 75 comm messages, opened and closed again: in a Jupyter kernel a
trivial ``ranks.run(f)`` took 32 ms with it against 0.6 ms without (issue 45), and a loop of
calls left a picture per call in the cell. So a call's panel (widget or HTML) is made when
there is something to watch: the call still runs after ``CALL_PANEL_AFTER`` (tqdm's ``delay``
does the same for bars), a rank printed a line (the panel stays above its lines, as in every
run), or a rank waits at a prompt. A call that ends well before then leaves no output: its
results are the cell's value. One that fails or is stopped before then is drawn as it ends, so
its picture shows which rank failed, as any failed run's does.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from ..record.state import DONE
from .base import Display

if TYPE_CHECKING:
    from ..record.state import RunState

CALL_PANEL_AFTER = 0.5   # seconds a call runs before its panel is drawn


class DeferredPanel(Display):
    """The display ``make()`` returns, made and started only when there is something to watch
    (see the module); until then every call to it costs a comparison."""

    def __init__(self, make: Callable[[], Display], name: str, line_prefix: str | None = None,
                 after: float = CALL_PANEL_AFTER) -> None:
        super().__init__(line_prefix)
        self.name = name        # the panel's: what ui= selected
        self.after = after
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

    def close(self, state: RunState) -> None:
        if self.shown is None and state.status == DONE:
            return   # over before there was anything to watch: the results say it
        self._panel(state).close(state)

    def _panel(self, state: RunState) -> Display:
        if self.shown is None:
            self.shown = self._make()
            self.shown.start(state)
        return self.shown


__all__ = ["CALL_PANEL_AFTER", "DeferredPanel"]
