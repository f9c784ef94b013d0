"""A display that watches a run the way a person at the panel does: the display ``ui`` names
draws as it would, and the test's hooks see what the supervisor shows it, when it shows it
(``line`` for each output line, ``refresh`` on each tick, after the tick's stall check and
where-report). A hook acts as the panel's buttons do: ``state.stop_requested`` (Stop),
``state.where_requested`` (Where are they?). Passed as ``ui=``, as a user passes a display."""
from __future__ import annotations

from typing import Callable

from notebook_launch.display import choose_display
from notebook_launch.display.base import Display
from notebook_launch.record.state import RunState

LineHook = Callable[[RunState, int, str, str], None]
RefreshHook = Callable[[RunState], None]


class WatchingDisplay(Display):
    """``ui``'s display, with ``on_line(state, local_rank, stream, text)`` after each line it is
    shown and ``on_refresh(state)`` after each refresh."""

    def __init__(self, ui: str = "text", *, on_line: LineHook | None = None,
                 on_refresh: RefreshHook | None = None) -> None:
        super().__init__()
        self.shown = choose_display(ui)
        self.name = self.shown.name
        self.on_line, self.on_refresh = on_line, on_refresh

    def tag(self, state: RunState, local_rank: int) -> str:
        return self.shown.tag(state, local_rank)

    def start(self, state: RunState) -> None:
        self.shown.start(state)

    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        self.shown.line(state, local_rank, stream, text)
        if self.on_line is not None:
            self.on_line(state, local_rank, stream, text)

    def refresh(self, state: RunState) -> None:
        self.shown.refresh(state)
        if self.on_refresh is not None:
            self.on_refresh(state)

    def prompting(self, state: RunState, showing: bool) -> None:
        self.shown.prompting(state, showing)

    def close(self, state: RunState) -> None:
        self.shown.close(state)


class WhereReports:
    """Each where-report the panel is shown (a stall's or an answer to the button), once, in
    order, with the state it was shown in: what the panel's Where box draws."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._last: str | None = None

    def new(self, state: RunState) -> str | None:
        """The report ``state`` shows if the panel has not shown it yet, else None."""
        text = state.where_report
        if text is None or text == self._last:
            self._last = text
            return None
        self._last = text
        self.texts.append(text)
        return text
