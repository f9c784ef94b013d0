"""A rich live panel for terminals. Redrawn from the supervisor's thread only
(no rich refresh thread), at most REDRAWS_PER_SECOND; rank lines print above it."""
from __future__ import annotations

import time
from typing import Any

from . import format as fmt
from . import pace
from ..record.state import DONE, FAILED, STOPPED, Bar, RunState
from .base import Display
from .group_figures import group_figures
from .grouping import Row, group_rows, row_label
from .words import counted

REDRAWS_PER_SECOND = 4


class RichDisplay(Display):
    name = "rich"  # what ui= selects it, shown in the launch line
    def __init__(self, line_prefix: str | None = None, console: Any = None) -> None:
        super().__init__(line_prefix)
        from rich.console import Console
        self.console = console or Console()
        self.live: Any = None
        self._last = 0.0
        self._paused = False   # stopped while a rank's prompt waits in the terminal
        self._where_shown: str | None = None

    def start(self, state: RunState) -> None:
        from rich.live import Live
        self.live = Live(render(state), console=self.console, auto_refresh=False,
                         transient=False, redirect_stdout=False, redirect_stderr=False)
        self.live.start(refresh=True)

    def line(self, state: RunState, local_rank: int, stream: str, text: str) -> None:
        from rich.text import Text
        tag = Text(self.tag(state, local_rank), style="red" if stream == "stderr" else "cyan")
        self.console.print(tag + Text(text), soft_wrap=True, highlight=False)

    def refresh(self, state: RunState) -> None:
        if state.where_report and state.where_report != self._where_shown:
            # the whole report once, above the panel (which keeps its verdict line)
            self._where_shown = state.where_report
            from rich.text import Text
            self.console.print(Text(f"where are they: {state.where_report.rstrip()}"), soft_wrap=True,
                               highlight=False)
        now = time.monotonic()
        if self.live is None or now - self._last < 1.0 / REDRAWS_PER_SECOND:
            return
        self._last = now
        self.live.update(render(state), refresh=True)

    def prompting(self, state: RunState, showing: bool) -> None:
        """Stop the live panel while a rank's prompt waits below it (redraws would overwrite what
        is typed); the panel stays on screen as it was and starts again after the answer."""
        if showing and self.live is not None:
            self.live.stop()
            self.live = None
            self._paused = True
        elif not showing and self._paused:
            self._paused = False
            self.start(state)

    def close(self, state: RunState) -> None:
        if self._paused:   # closed while a prompt waited: show the final panel once
            self._paused = False
            self.console.print(render(state))
        if self.live is not None:
            self.live.update(render(state), refresh=True)
            self.live.stop()
            self.live = None


NARROW = 120   # columns: below this a row's figures wrap under its rank, status and bar


class _Picture:
    """The panel, laid out for the width it is drawn at (rich asks with the console's options)."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield _panel(self.state, narrow=options.max_width < NARROW)


def render(state: RunState) -> Any:
    """The panel as rich draws it: one line per rank where there is room; below ``NARROW``
    columns each rank's figures wrap under its name, status and bar (at 80 columns rich squeezed
    whole columns away: the demo's final rows lost "rank N" and their status)."""
    return _Picture(state)


def _panel(state: RunState, narrow: bool) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(padding=(0, 1), expand=True)
    if narrow:
        for column in ("rank", "status", "bar", "details"):
            table.add_column(column, no_wrap=column != "details", ratio=2 if column == "details" else
                             (1 if column == "bar" else None), min_width=8 if column == "bar" else None)
    else:
        for column in ("rank", "device", "status", "bar", "progress", "metrics", "resources", "last"):
            table.add_column(column, no_wrap=True, ratio=3 if column in ("bar", "last") else None,
                             min_width=12 if column == "bar" else None)
    for row in group_rows(state).rows:
        if not row.single:
            _add_group(table, state, row, narrow)
            continue
        rs = state.ranks[row.members[0]]
        cells = _row(rs)
        if row.why == "slowest":
            cells["progress"] += " (slowest)"
        if narrow:
            details = " · ".join(part for part in (fmt.placement(rs), cells["progress"], cells["metrics"],
                                                   cells["resources"]) if part)
            table.add_row(f"rank {rs.rank}", cells["status"], cells["bar"],
                          Text.assemble(details, ("  " if details else ""), cells["last"]))
        else:
            table.add_row(f"rank {rs.rank}", fmt.placement(rs), cells["status"], cells["bar"], cells["progress"],
                          cells["metrics"], Text(cells["resources"], style="dim"), cells["last"])
    title = (f"notebook_launch {state.run_id} · {counted(state.world_size, 'rank')}{fmt.whole(state)} · "
             f"{state.backend} · "
             f"{fmt.run_status(state)} · {fmt.duration(state.elapsed)}"
             + (f" · machine {fmt.machine(state)}" if state.machine is not None else ""))
    subtitle = f"logs: {state.log_dir}"
    border = {FAILED: "red", DONE: "green", STOPPED: "yellow"}.get(state.status, "blue")
    verdict = fmt.where_verdict(state)
    slow = pace.verdict(state)
    notes = [Text(f"pace: {slow}", style="yellow")] if slow else []
    if verdict:   # the stacks themselves are long: the cell or terminal gets them in the report
        notes.append(Text(f"where are they: {verdict}", style="bold yellow"))
    body: Any = Group(table, *notes) if notes else table
    return Panel(body, title=title, subtitle=subtitle, border_style=border)


def _add_group(table: Any, state: RunState, row: Row, narrow: bool) -> None:
    """A group of ranks that look alike (``grouping``), in the rank rows' columns: figures as ranges."""
    from rich.progress_bar import ProgressBar
    from rich.text import Text
    figures = group_figures(state, row)
    style = "bold yellow" if figures.kind == "stalled" else fmt.RICH_STYLES.get(figures.kind, "")
    low = figures.fraction.low if figures.fraction else 0.0
    drawn = ProgressBar(total=1.0, completed=low, complete_style=style or "blue", finished_style="green")
    progress = " ".join(([figures.phase] if figures.phase else []) + fmt.group_bar_words(figures))
    metrics = " ".join(fmt.group_metric_words(figures))
    used = " · ".join(fmt.group_resource_words(figures))
    last = Text(fmt.shorten(figures.outcome, 120), style="bold red" if figures.kind == FAILED else "dim")
    label = f"{row_label(state, row)} ×{len(row.members)}"
    if narrow:
        details = " · ".join(part for part in (progress, metrics, used) if part)
        table.add_row(label, Text(figures.kind, style=style), drawn, Text.assemble(details, "  ", last))
    else:
        table.add_row(label, "", Text(figures.kind, style=style), drawn, progress, metrics, Text(used, style="dim"),
                      last)


def _row(rs: Any) -> dict[str, Any]:
    """One rank's cells: its bar drawn, status, progress words, metrics, resources, last line."""
    from rich.progress_bar import ProgressBar
    from rich.text import Text
    style = fmt.RICH_STYLES.get(rs.status, "")
    stalled = fmt.stalled_for(rs) is not None
    bar = rs.main_bar
    if bar is not None and bar.total:
        drawn = ProgressBar(total=float(bar.total), completed=float(min(bar.n, bar.total)),
                            complete_style=style or "blue", finished_style="green")
        progress = f"{bar.desc + ' ' if bar.desc else ''}{bar_text(bar, rs.status == 'running', stalled)}"
    else:
        drawn = ProgressBar(total=None if rs.status != DONE else 1.0,
                            completed=1.0 if rs.status == DONE else 0.0)
        progress = bar_text(bar, stalled=stalled) if bar is not None else fmt.phase(rs)   # 'joining the ...'
    others = fmt.other_bars(rs)
    if others:
        progress += f" ({others})"
    speed = pace.rank_text(rs)
    if speed:
        progress += f" ({speed})"
    outcome = fmt.rank_outcome(rs)
    last = Text(fmt.shorten(outcome, 120), style="bold red") if outcome else \
        Text(fmt.shorten(rs.last_line, 80), style="dim")
    return {"bar": drawn, "status": Text(fmt.rank_status(rs), style="bold yellow" if stalled else style),
            "progress": progress, "metrics": fmt.metrics(rs, limit=3, sparklines=True),
            "resources": fmt.resources(rs), "last": last}


def bar_text(bar: Bar, running: bool = True, stalled: bool = False) -> str:
    if bar is None:
        return ""
    return f"{fmt.bar_percent(bar).strip()} {fmt.bar_details(bar, running, stalled)}".strip()
