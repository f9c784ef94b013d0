"""Words and numbers shared by every display, so a rank reads the same in the
widget, the HTML table, the rich panel, text summaries and the text repr."""
from __future__ import annotations

from typing import Any

from ..record.resources import machine_memory_text, size_text, usage_text
from ..record.state import DONE, FAILED, RUNNING, STARTING, STOPPED, Bar, RankState, RunState
from .curves import sparkline
from .group_figures import GroupFigures, Span
from .grouping import GROUP_ABOVE, Row, group_rows, rank_outcome, row_label
from .pace import rank_text as pace_text
from .pace import verdict as pace_verdict

STATUS_COLORS: dict[str, str] = {STARTING: "#6b7280", RUNNING: "#2563eb", DONE: "#16a34a",
                 FAILED: "#dc2626", STOPPED: "#d97706"}
STALLED_COLOR = "#b45309"   # amber: waiting, not failed; the user decides what to do
RICH_STYLES: dict[str, str] = {STARTING: "dim", RUNNING: "blue", DONE: "green", FAILED: "bold red", STOPPED: "yellow"}
BAR_STYLES: dict[str, str] = {DONE: "success", FAILED: "danger", STOPPED: "warning"}   # ipywidgets bar_style


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def count(value: float | None) -> str:
    if value is None:
        return "?"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    value = int(value)
    if value >= 10_000_000:
        return f"{value / 1e6:.0f}M"
    if value >= 1_000_000:
        return f"{value / 1e6:.1f}M".replace(".0M", "M")
    if value >= 100_000:
        return f"{value / 1e3:.0f}k"
    return str(value)


def rate(bar: Bar) -> str:
    if not bar.rate:
        return ""
    if bar.rate >= 1:
        return f"{bar.rate:,.1f} {bar.unit}/s" if bar.rate < 100 else f"{bar.rate:,.0f} {bar.unit}/s"
    return f"{1 / bar.rate:.2f} s/{bar.unit}"


def bar_counts(bar: Bar) -> str:
    total = f"/{count(bar.total)}" if bar.total else ""
    return f"{count(bar.n)}{total}"


def bar_percent(bar: Bar) -> str:
    fraction = bar.fraction
    return "" if fraction is None else f"{fraction * 100:3.0f}%"


def bar_details(bar: Bar, running: bool = True, stalled: bool = False) -> str:
    """'1,000/5,000 120.0 it/s eta 00:33' -- counts, rate, then ETA while the rank runs. A
    ``stalled`` rank's row has neither: its last rate is not its speed now, nor is there an ETA."""
    return " ".join(_bar_figures(bar, running, stalled))


def _bar_figures(bar: Bar, running: bool, stalled: bool) -> list[str]:
    parts = [bar_counts(bar)]
    if stalled:
        return parts
    speed = rate(bar)
    if speed:
        parts.append(speed)
    if running and not bar.closed and bar.eta is not None:
        parts.append(f"eta {duration(bar.eta)}")
    elif bar.elapsed:
        parts.append(f"in {duration(bar.elapsed)}")
    return parts


def bar_words(bar: Bar, running: bool = True, stalled: bool = False) -> list[str]:
    """``bar_summary`` as its figures, each whole: ['train 40%', '400/1,000', '120.0 it/s',
    'eta 00:05'] (a row that must wrap breaks between them, never inside one)."""
    head = f"{bar.desc} {bar_percent(bar).strip()}".strip()
    return ([head] if head else []) + _bar_figures(bar, running, stalled)


def metric_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def metric_words(rank_state: RankState, limit: int = 6) -> list[str]:
    """['loss=0.123', 'lr=0.001']: ``metrics``, one figure each."""
    return [f"{k}={metric_value(v)}" for k, v in list(rank_state.metrics.items())[-limit:]]


def metrics(rank_state: RankState, limit: int = 6, sparklines: bool = False) -> str:
    """'loss=0.123 lr=0.001'; with ``sparklines`` each curve's shape follows its value
    ('loss=0.123 ▇▅▃▂▁'), for displays that cannot draw the panel's charts."""
    items = list(rank_state.metrics.items())[-limit:]
    if not sparklines:
        return " ".join(f"{k}={metric_value(v)}" for k, v in items)
    parts = []
    for name, value in items:
        series = rank_state.curves.get(name)
        shape = sparkline(series) if series is not None and series.total > 1 else ""
        parts.append(f"{name}={metric_value(value)}" + (f" {shape}" if shape else ""))
    return " ".join(parts)


def placement(rank_state: RankState) -> str:
    """The rank's device, and its node when it runs on another machine (Ray): 'cpu on node 1 (10.0.0.2)'."""
    return f"{rank_state.device} on {rank_state.node}" if rank_state.node else rank_state.device


def stalled_for(rank_state: RankState) -> float | None:
    """Seconds a still-running rank has shown no sign of progress, or None (``RankState.stalled_for``)."""
    return rank_state.stalled_for()


def phase(rank_state: RankState) -> str:
    """What a rank does while it starts ('importing torch', 'joining the process group'), until its
    row has something of its own to show (a bar); '' once it has, or when it ended."""
    if rank_state.status not in (RUNNING, STARTING) or not rank_state.phase or rank_state.main_bar is not None:
        return ""
    return rank_state.phase


def row_bar_details(rank_state: RankState, bar: Bar) -> str:
    """``bar_details`` of the bar a rank's row shows, as the rank is now (running, stalled)."""
    return bar_details(bar, running=rank_state.status == RUNNING, stalled=stalled_for(rank_state) is not None)


def rank_status(rank_state: RankState) -> str:
    """'running', 'done', ..., or 'stalled 02:13' for a rank waiting with no sign of progress."""
    stalled = stalled_for(rank_state)
    return f"stalled {duration(stalled)}" if stalled is not None else str(rank_state.status)


def bar_summary(bar: Bar, running: bool = True, stalled: bool = False) -> str:
    """'train: 40% 400/1,000 120.0 it/s eta 00:05'."""
    label = f"{bar.desc}: " if bar.desc else ""
    return f"{label}{bar_percent(bar).strip()} {bar_details(bar, running=running, stalled=stalled)}".strip()


def other_bars(rank_state: RankState) -> str:
    """The rank's other open bars in a few words ('also Epoch 1 40%, val 3/10'): a rank has
    one row whatever its number of bars (Lightning's train/validation, nested epoch/step
    loops), so 8 ranks stay 8 rows that line up; the row's bar is the one moving
    (``RankState.main_bar``), the others are context."""
    others = rank_state.other_bars()
    if not others:
        return ""
    words = []
    for bar in others:
        amount = bar_percent(bar).strip() or bar_counts(bar)
        words.append(f"{shorten(bar.desc, 24)} {amount}".strip())
    return "also " + ", ".join(words)


def rank_line(rank_state: RankState, width: int = 60) -> str:
    """One plain-text line per rank, for summaries and the text repr."""
    outcome = rank_outcome(rank_state)
    status = rank_status(rank_state)
    parts = [f"rank {rank_state.rank}", f"[{placement(rank_state)}]"]
    if not outcome.startswith(status):   # 'stopped by notebook_launch ...' says it already
        parts.append(status)
    starting = phase(rank_state)
    if starting:
        parts.append(f"({starting})")
    bar = rank_state.main_bar
    if bar is not None:
        parts.append(bar_summary(bar, running=rank_state.status == RUNNING,
                                 stalled=stalled_for(rank_state) is not None))
        others = other_bars(rank_state)
        if others:
            parts.append(f"({others})")
    if rank_state.metrics:
        parts.append(metrics(rank_state, sparklines=True))
    pace = pace_text(rank_state)
    if pace:
        parts.append(f"({pace})")
    used = resources(rank_state)
    if used:
        parts.append(f"[{used}]")
    if outcome:
        parts.append(outcome)
    elif rank_state.last_line:
        parts.append("| " + shorten(rank_state.last_line, width))
    return " ".join(parts)


def resources(rank_state: RankState) -> str:
    """The rank's CPU, memory and GPU as last sampled ('cpu 97% · 820.0 MiB own of 1.2 GiB
    resident'), its life's average and peak once it ended; '' where nothing was sampled (a rank
    on another machine)."""
    if rank_state.resources is None:
        return ""
    return usage_text(rank_state.resources, ended=rank_state.status not in (RUNNING, STARTING),
                      own=rank_state.own_memory_shown)


def machine(state: RunState) -> str:
    """'memory 24.0 GiB, 12.3 GiB available' (this machine's), '' before the first sample."""
    return "" if state.machine is None else machine_memory_text(state.machine)


def outcome(state: RunState) -> str | None:
    """The run's final one-liner; a Stop click reads better than the generic 'interrupted'."""
    if state.stop_requested and state.status == STOPPED:
        return "stopped with the Stop button"
    return state.summary


def whole(state: RunState) -> str:
    """What the header adds when the rows are grouped (``grouping``): the ranks by status and the
    nodes, ' (29 running, 1 stalled, 1 done, 1 failed; 4 nodes)'; '' with a row per rank."""
    if len(state.ranks) <= GROUP_ABOVE:
        return ""
    grouping = group_rows(state)
    nodes = f"; {grouping.nodes} nodes" if grouping.nodes > 1 else ""
    return f" ({grouping.counts_text()}{nodes})"


def header(state: RunState) -> str:
    return (f"notebook_launch run {state.run_id}: {state.world_size} rank"
            f"{'s' if state.world_size != 1 else ''}{whole(state)}, {state.backend}, {run_status(state)}, "
            f"{duration(state.elapsed)} elapsed, "
            + (f"machine {machine(state)}, " if state.machine is not None else "") + f"logs: {state.log_dir}")


def summary(state: RunState) -> str:
    """Multi-line plain text: header, one line per rank, the slow rank when one holds the others
    back (``pace``), the verdict of "Where are they?" (its first line) and the outcome when known."""
    lines = [header(state)] + ["  " + line for line in row_lines(state)]
    slow = pace_verdict(state)
    if slow:
        lines.append(f"pace: {slow}")
    verdict = where_verdict(state)
    if verdict:
        lines.append(f"where are they: {verdict}")
    ending = outcome(state)
    if ending:
        lines.append(ending)
    return "\n".join(lines)


def row_lines(state: RunState) -> list[str]:
    """A line per row of the panel: a rank's (``rank_line``), or a group's when there are many
    ranks (``grouping``: the failed, stalled and slowest ranks keep their own)."""
    found = []
    for row in group_rows(state).rows:
        if row.single:
            rs = state.ranks[row.members[0]]
            found.append(rank_line(rs) + (" (the slowest)" if row.why == "slowest" else ""))
        else:
            found.append(group_line(state, row))
    return found


def where_verdict(state: RunState) -> str | None:
    """The first line of the supervisor's answer to "Where are they?" (the verdict)."""
    if not state.where_report:
        return None
    return state.where_report.strip().splitlines()[0] if state.where_report.strip() else None


def where_details(state: RunState) -> str:
    """What follows the verdict: every rank's stacks."""
    if not state.where_report:
        return ""
    lines = state.where_report.strip().splitlines()
    return "\n".join(lines[1:]).strip("\n")


def shorten(text: str, width: int) -> str:
    text = text.replace("\t", "    ")
    return text if len(text) <= width else text[:width - 1] + "…"


def run_status(state: RunState) -> str:
    """The run's status as a person would say it while it runs."""
    if state.status != RUNNING:
        return state.status
    if state.stop_requested:
        return "stopping"
    if any(rs.status == FAILED for rs in state.ranks):
        return "failing"
    if any(stalled_for(rs) is not None for rs in state.ranks):
        return "stalled"
    if all(rs.status == DONE for rs in state.ranks):
        return DONE
    return RUNNING


# --- a group of ranks that look alike (many ranks: ``grouping``, ``group_figures``) ---

def _span_text(span: Span, show: Any) -> str:
    low, high = show(span.low), show(span.high)
    return low if low == high else f"{low}-{high}"


def group_bar_words(figures: GroupFigures) -> list[str]:
    """['train 40-42%', '400-420/1000', '118-121 it/s', 'eta 00:05']: each figure whole."""
    words = []
    percent = _span_text(figures.fraction, lambda v: f"{v * 100:.0f}") + "%" if figures.total and figures.fraction \
        else ""
    head = f"{figures.desc} {percent}".strip()
    if head:
        words.append(head)
    if figures.n is not None:
        words.append(_span_text(figures.n, count) + (f"/{count(figures.total)}" if figures.total else ""))
    if figures.rate is not None and figures.kind != "stalled":
        words.append(_span_text(figures.rate, lambda v: f"{v:,.1f}" if v < 100 else f"{v:,.0f}")
                     + f" {figures.unit}/s")
    if figures.eta is not None:
        words.append(f"eta {duration(figures.eta)}")
    return words


def group_metric_words(figures: GroupFigures) -> list[str]:
    return [f"{name}={value}" for name, value in figures.metrics]


def group_resource_words(figures: GroupFigures) -> list[str]:
    """['cpu 95-99%', '0.8-1.2 GiB resident'] per rank; a rank that ended: its average and peak."""
    ended = figures.kind not in (RUNNING, STARTING, "stalled")
    words = []
    if figures.cpu is not None:
        words.append(("avg " if ended else "") + "cpu " + _span_text(figures.cpu, lambda v: f"{v:.0f}") + "%")
    if figures.memory is not None:
        words.append(("peak " if ended else "") + _span_text(figures.memory, lambda v: size_text(int(v)))
                     + " resident each")
    return words


def group_line(state: RunState, row: Row) -> str:
    """A group row as one line of plain text (summaries, the text repr)."""
    from .group_figures import group_figures
    figures = group_figures(state, row)
    parts = [row_label(state, row), figures.kind]
    if figures.phase:
        parts.append(f"({figures.phase})")
    parts += group_bar_words(figures) + group_metric_words(figures)
    used = group_resource_words(figures)
    if used:
        parts.append("[" + " · ".join(used) + "]")
    if figures.outcome and figures.outcome != figures.kind:
        parts.append(figures.outcome)
    return " ".join(parts)
