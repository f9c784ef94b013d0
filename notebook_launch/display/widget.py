"""The live ipywidgets panel (ipywidgets 7.7 and 8.x).

Every trait change is one comm message on IOPub, and Jupyter drops IOPub
messages past ~1000/s, so the panel (a) redraws at most MAX_REDRAWS_PER_SECOND,
(b) sends only traits whose value changed, one message per widget thanks to
``hold_sync()``, (c) keeps a sliding one-second window of messages under
MESSAGES_PER_SECOND.

When the run ends (results, error, interrupt, timeout) the panel ends as a picture:
``close()`` replaces the panel's output, through its display id, by static HTML of the
final state (``html.render``: bars, statuses, curves as inline SVG, the error row; no Stop
button, there is nothing left to stop), then closes every widget of the panel (their
layouts and styles too). A saved notebook shows the final panel anywhere (GitHub,
nbviewer, Colab after a reload), and a loop of launches leaves no live widget behind.
Widgets are created and changed from the supervisor's thread only.

Beside Stop, "Where are they?" asks the supervisor where every rank is (it sets
``state.where_requested``; the supervisor answers with ``state.on_where_report``): the
panel then shows the verdict in one line and every rank's stacks, folded. A rank that
shows no sign of progress is marked "stalled" with how long, in amber, on its row.

A rank's recent lines are one click away (the "recent lines" section, one item per
rank): where the kernel delivers the panel's clicks during the run (``CommPoller``), only
the opened rank's lines are sent, all of the state's recent lines (``state.RECENT_LINES``),
refreshed every LOG_REFRESH_SECONDS; elsewhere every rank's last LOG_LINES_SHOWN lines
are kept ready. The cell shows what its line budget allows (``lines_per_second``).
"""
from __future__ import annotations

import collections
import html
import time
from typing import Any

from . import format as fmt
from . import fragments
from .pace import verdict_html
from .curves import curves_html
from .html import RECENT_LINE_CHARS, picture
from .rows import rows_html
from .grouping import GROUP_ABOVE, group_rows
from .base import Display
from ..notebook.kernel_poll import CommPoller
from .cell_budget import DEFAULT_CELL_OUTPUT
from .text import NOTEBOOK_LINES_PER_SECOND, TextDisplay
from ..errors.best_effort import best_effort
from ..notebook.notebook_streams import flushable_streams
from ..record.state import RECENT_LINES, RankState, RunState

MAX_REDRAWS_PER_SECOND = 5
MESSAGES_PER_SECOND = 50       # comm messages per second, under a notebook's IOPub limit
LOG_LINES_SHOWN = 40
LOG_REFRESH_SECONDS = 2.0   # recent lines are one click away; they need not be live
CURVES_REFRESH_SECONDS = 1.0   # the metric charts: one message a second at most


class WidgetDisplay(Display):
    name = "widget"  # what ui= selects it, shown in the launch line

    def __init__(self, line_prefix: str | None = None, print_lines: bool = True,
                 poll_kernel: bool = True, lines_per_second: int | None = NOTEBOOK_LINES_PER_SECOND,
                 cell_output: int | None = DEFAULT_CELL_OUTPUT) -> None:
        super().__init__(line_prefix)
        import ipywidgets
        self.widgets = ipywidgets
        self.lines = TextDisplay(line_prefix, stream_is_notebook=True, lines_per_second=lines_per_second,
                                 cell_output=cell_output) if print_lines else None
        self.poller = CommPoller() if poll_kernel else None
        self.sent: dict[tuple[int, str], Any] = {}   # (id(widget), trait) -> last value sent
        self.window: collections.deque[tuple[float, int]] = collections.deque()   # (time, messages), last second
        self.redraws = 0
        self._last_redraw = 0.0
        self._last_logs = 0.0
        self._lines_seen: dict[int, int] = {}
        self.handle: Any = None
        self.panel: Any = None
        self.closed = False    # the panel ended as a picture; its widgets are closed

    # --- building --------------------------------------------------------
    def start(self, state: RunState) -> None:
        w = self.widgets
        # The buttons first, each routed to the poller as soon as it exists (its subshell made
        # before): a click that reached the kernel before its button was routed waited behind the
        # running cell, and the run never saw it. A panel drawn once its run lasts (deferred.py)
        # appears while a user, or a test, may be waiting to click.
        if self.poller is not None:
            self.poller.prepare()
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop",
                                    tooltip="Stop every rank (like an interrupt)")
        self.stop_button.on_click(lambda _button: setattr(state, "stop_requested", True))
        self._stop_shown = False
        self.where_button = w.Button(description=WHERE_LABEL, icon="search",
                                     tooltip="Show where every rank is: a one-line verdict, then every rank's stack")
        self.where_button.on_click(lambda _button: setattr(state, "where_requested", True))
        self._where_unavailable = False
        for button in (self.stop_button, self.where_button):
            if self.poller is None or not self.poller.watch(button):
                self._where_unavailable = self._where_unavailable or button is self.where_button
                button.disabled = True
                button.tooltip = ("this kernel cannot deliver clicks while the cell runs; "
                                  + ("use the notebook's interrupt (stop) button instead"
                                     if button is self.stop_button else "the verdict comes on a stall or timeout"))
        self.header = w.HTML()
        self.curves = w.HTML()      # the logged metrics as SVG charts (display/curves.py)
        self.curves.add_class("nl-curves-box")
        self._last_curves = 0.0
        # Every rank's row in one widget, the final picture's markup (display/rows.py): the bars line
        # up whatever the labels and figures, and the panel keeps its shape when the run ends.
        self.rows = w.HTML()
        self.rows.add_class("nl-rows-box")
        self._build_logs(state)
        self.where = w.HTML()       # the answer: verdict, then the stacks (fragments.where_html)
        self.slow_rank = w.HTML()   # the rank that holds the others back, when one does (display/pace.py)
        self.buttons = w.HBox([self.stop_button, self.where_button])
        self.panel = _Panel([self.header, self.curves, self.rows, self.slow_rank, self.where, self.accordion,
                             self.buttons])
        self.panel.state = state
        self.panel.add_class("nl-panel")
        self.handle = _show(self.panel, fmt.summary(state))
        self._lines_on_demand = self.poller is not None and self.poller.watch(self.accordion)
        self._rank_chosen = self.choice is not None and self.poller is not None and self.poller.watch(self.choice)
        self._shown_log: int | None = None
        self._redraw(state, now=time.monotonic())

    def _build_logs(self, state: RunState) -> None:
        """A section per rank ("rank 3: recent log lines"); with many ranks (``grouping.GROUP_ABOVE``)
        one section and a menu of the ranks: 256 sections would be a page of their own, and three
        widget models each (the section, its layout and style) sent before the run could start."""
        w = self.widgets
        self.choice: Any = None
        if len(state.ranks) <= GROUP_ABOVE:
            self.logs = [w.HTML() for _ in state.ranks]
            self.accordion = w.Accordion(children=self.logs, selected_index=None)
            for i, rs in enumerate(state.ranks):
                self.accordion.set_title(i, f"rank {rs.rank}: recent log lines")
            return
        self.choice = w.Dropdown(options=[(f"rank {rs.rank}", i) for i, rs in enumerate(state.ranks)], value=0,
                                 description="rank")
        self.logs = [w.HTML()]
        self.log_box = w.VBox([self.choice, self.logs[0]])
        self.accordion = w.Accordion(children=[self.log_box], selected_index=None)
        self.accordion.set_title(0, "recent log lines (choose a rank)")

    def _chosen_rank(self, state: RunState) -> int:
        """The rank the menu shows: the one chosen where the kernel delivers the choice during the
        run, else the first row's (a failed, stalled or slowest rank when there is one)."""
        if self._rank_chosen and self.choice is not None and isinstance(self.choice.value, int):
            return self.choice.value
        return group_rows(state).rows[0].members[0]

    def _show_stopping(self) -> None:
        """The click arrives on another thread (it only sets the flag); the button changes here."""
        self._stop_shown = True
        with self.stop_button.hold_sync():
            self.stop_button.disabled = True
            self.stop_button.description = "Stopping…"

    # --- the supervisor's calls -------------------------------------------
    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        if self.lines is not None:
            self.lines.line(state, local_rank, stream, text)

    def refresh(self, state: RunState) -> None:
        if self.lines is not None:
            self.lines.pump(state)   # merged lines due, the rolling tail (cell_budget)
        if self.poller is not None:
            self.poller.poll()
        if state.stop_requested and self.panel is not None and not self._stop_shown:
            self._show_stopping()
        now = time.monotonic()
        if self.panel is None or self.closed or now - self._last_redraw < 1.0 / MAX_REDRAWS_PER_SECOND:
            return
        self._redraw(state, now=now)

    def close(self, state: RunState) -> None:
        if self.poller is not None:
            self.poller.close()
        if self.panel is not None and not self.closed:
            self.closed = True
            try:
                if self.handle is not None:   # first the picture, so no view of a closed widget shows
                    with flushable_streams():
                        self.handle.update(picture(state), raw=True)
            finally:
                self._empty_values()
                close_widgets(self.widgets_made())
        if self.lines is not None:
            self.lines.close(state)

    def _empty_values(self) -> None:
        """Empty the panel's HTML before its widgets close (the picture has replaced their view):
        a notebook saved by nbclient, nbconvert --execute or papermill keeps every widget model's
        last state, closed ones too, and 100 launches left 100 panels' rows, curves and recent lines
        in its metadata that nothing shows."""
        for widget in [self.header, self.curves, self.rows, self.where, self.slow_rank] + self.logs:
            if getattr(widget, "comm", None) is not None and widget.value:
                with best_effort("emptying a closing widget failed"):
                    widget.value = ""

    def widgets_made(self) -> list[Any]:
        """Every widget of the panel, containers first."""
        made = [self.panel, self.accordion, self.buttons]
        if self.choice is not None:
            made += [self.log_box, self.choice]
        made += [self.header, self.curves, self.rows, self.where, self.stop_button, self.where_button] + self.logs
        made.append(self.slow_rank)
        return made

    # --- drawing -----------------------------------------------------------
    def _redraw(self, state: RunState, now: float) -> None:
        changes = self._changes(state, now)
        if not self._within_budget(len(changes), now):
            return
        for widget, traits in changes:
            with widget.hold_sync():
                for name, value in traits.items():
                    setattr(widget, name, value)
                    self.sent[(id(widget), name)] = value
        self.window.append((now, len(changes)))
        self._last_redraw = now
        self.redraws += 1

    def _within_budget(self, needed: int, now: float) -> bool:
        while self.window and now - self.window[0][0] >= 1.1:   # 0.1 s margin: sends take time
            self.window.popleft()
        used = sum(n for _, n in self.window)
        return needed == 0 or used == 0 or used + needed <= MESSAGES_PER_SECOND

    def _changes(self, state: RunState, now: float) -> list[tuple[Any, dict[str, Any]]]:
        wanted: list[tuple[Any, dict[str, Any]]] = [(self.header, {"value": fragments.header_html(state)})]
        wanted.append((self.rows, {"value": rows_html(state)}))
        wanted.append((self.slow_rank, {"value": verdict_html(state)}))
        wanted.append((self.where, {"value": fragments.where_html(state)}))
        if not self._where_unavailable:
            wanted.append((self.where_button, _where_button_traits(state)))
        if now - self._last_curves >= CURVES_REFRESH_SECONDS:
            self._last_curves = now
            wanted.append((self.curves, {"value": curves_html(state)}))
        wanted += self._log_changes(state, now)
        changes = []
        for widget, traits in wanted:
            diff = {k: v for k, v in traits.items() if self.sent.get((id(widget), k), _UNSET) != v}
            if diff:
                changes.append((widget, diff))
        return changes


    def _log_changes(self, state: RunState, now: float) -> list[tuple[Any, dict[str, Any]]]:
        """A rank's recent lines: on demand (only the opened rank, at once when opened) where
        the panel's clicks reach the kernel, else every rank's last lines every few seconds."""
        if self.choice is not None:
            return self._chosen_log_changes(state, now)
        if self._lines_on_demand:
            opened = self.accordion.selected_index
            if opened is None or not 0 <= opened < len(self.logs):
                self._shown_log = None
                return []
            if opened == self._shown_log and now - self._last_logs < LOG_REFRESH_SECONDS:
                return []
            self._shown_log, self._last_logs = opened, now
            return [(self.logs[opened], {"value": _log_html(state.ranks[opened], RECENT_LINES)})]
        if now - self._last_logs < LOG_REFRESH_SECONDS:
            return []
        self._last_logs = now
        return [(log, {"value": _log_html(rs)}) for rs, log in zip(state.ranks, self.logs)]


    def _chosen_log_changes(self, state: RunState, now: float) -> list[tuple[Any, dict[str, Any]]]:
        """Many ranks: the chosen rank's lines, while its section is open (or every few seconds
        where the section's opening does not reach the kernel)."""
        if self._lines_on_demand and self.accordion.selected_index is None:
            self._shown_log = None
            return []
        chosen = self._chosen_rank(state)
        if chosen == self._shown_log and now - self._last_logs < LOG_REFRESH_SECONDS:
            return []
        self._shown_log, self._last_logs = chosen, now
        count = RECENT_LINES if self._lines_on_demand else LOG_LINES_SHOWN
        return [(self.logs[0], {"value": _log_html(state.ranks[chosen], count)})]


_UNSET = object()
WHERE_LABEL = "Where are they?"


def _where_button_traits(state: RunState) -> dict[str, Any]:
    """Asking... while the supervisor collects the stacks; again once it answered."""
    asking = state.where_requested and state.status == "running"
    return {"description": "Asking the ranks…" if asking else WHERE_LABEL, "disabled": asking}


def _panel_class() -> type:
    import ipywidgets

    class Panel(ipywidgets.VBox):
        """The panel box; its repr is the run summary (frontends without widgets show it)."""
        state = None

        def __repr__(self) -> str:
            return fmt.summary(self.state) if self.state is not None else "notebook_launch panel"

    return Panel


def _Panel(children: list[Any]) -> Any:
    return _panel_class()(children)


def close_widgets(widgets: list[Any]) -> None:
    """Close each widget and the layout and style models it made (ipywidgets closes neither
    with the widget): each close is one comm_close, and the kernel and the browser forget it."""
    for widget in widgets:
        for part in (widget, getattr(widget, "layout", None), getattr(widget, "style", None)):
            if part is not None and hasattr(part, "close"):
                part.close()


def _bundle(panel: Any, text: str) -> dict[str, Any]:
    return {"text/plain": text,
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2, "version_minor": 0, "model_id": panel.model_id}}


def _show(panel: Any, text: str) -> Any:
    from IPython.display import display
    with flushable_streams():
        return display(_bundle(panel, text), raw=True, display_id=True)


def _log_html(rs: RankState, count: int = LOG_LINES_SHOWN) -> str:
    recent = list(rs.lines)[-count:]
    if not recent:
        return "<i>no output yet</i>"
    text = "\n".join(("[stderr] " if stream == "stderr" else "") + fmt.shorten(line, RECENT_LINE_CHARS)
                     for stream, line in recent)
    return f"<pre style='margin:0;max-height:20em;overflow:auto'>{html.escape(text)}</pre>"
