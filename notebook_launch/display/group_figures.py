"""What a group row of the panel says of its ranks (``grouping``): pure data from the run state,
then the words every display shows ('train 40-42%', '400-420/1,000', 'loss=0.12…0.15').

A group's ranks look alike (the same status and bar, ``grouping``), so its row gives each figure
as the range over its ranks: the least and the most done, the slowest and fastest rate, the latest
ETA, each metric's lowest and highest latest value, and CPU and memory per rank as ranges."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..resources import size_text
from ..state import RUNNING, STARTING, RankState, RunState
from . import format as fmt
from .grouping import Row, kind

METRICS_SHOWN = 4


@dataclass(frozen=True)
class Span:
    """The lowest and highest of a figure over a group's ranks."""
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float | None]) -> "Span | None":
        known = [v for v in values if v is not None]
        return cls(min(known), max(known)) if known else None


@dataclass(frozen=True)
class GroupFigures:
    kind: str                            # the ranks' status as rows count it ('running', 'stalled'...)
    desc: str = ""
    total: float | None = None
    n: Span | None = None
    fraction: Span | None = None         # of the bar (0 to 1)
    rate: Span | None = None
    unit: str = "it"
    eta: float | None = None             # the latest of the ranks' ETAs
    metrics: tuple[tuple[str, str], ...] = ()   # (name, 'low…high' or the one value)
    cpu: Span | None = None
    memory: Span | None = None           # resident bytes per rank (peak once ended)
    outcome: str = ""                    # the ranks' common error or end, when they ended so
    phase: str = ""


def group_figures(state: RunState, row: Row) -> GroupFigures:
    ranks = [state.ranks[i] for i in row.members]
    first = ranks[0]
    bars = [rs.main_bar for rs in ranks]
    shown = [bar for bar in bars if bar is not None]
    running = kind(first) in (RUNNING, STARTING)
    etas = [bar.eta for bar in shown if not bar.closed] if kind(first) == RUNNING else []
    outcomes = {fmt.rank_outcome(rs) for rs in ranks}
    return GroupFigures(
        kind=kind(first), desc=shown[0].desc if shown else "", total=shown[0].total if shown else None,
        n=Span.of([bar.n for bar in shown]), fraction=Span.of([_fraction(rs) for rs in ranks]),
        rate=Span.of([bar.rate for bar in shown if bar.rate]), unit=shown[0].unit if shown else "it",
        eta=max([e for e in etas if e is not None], default=None), metrics=_metrics(ranks),
        cpu=Span.of([_cpu(rs) for rs in ranks]), memory=Span.of([_memory(rs) for rs in ranks]),
        outcome=outcomes.pop() if len(outcomes) == 1 else "",
        phase=fmt.phase(first) if running else "")


def _fraction(rs: RankState) -> float:
    from .rows import bar_fraction
    return bar_fraction(rs)


def _cpu(rs: RankState) -> float | None:
    usage = rs.resources
    if usage is None:
        return None
    ended = rs.status not in (RUNNING, STARTING)
    return usage.cpu_average if ended or usage.cpu_percent is None else usage.cpu_percent


def _memory(rs: RankState) -> float | None:
    usage = rs.resources
    if usage is None:
        return None
    return float(usage.peak_rss if rs.status not in (RUNNING, STARTING) else usage.rss)


def _metrics(ranks: list[RankState]) -> tuple[tuple[str, str], ...]:
    names = list(ranks[0].metrics)[-METRICS_SHOWN:]
    found = []
    for name in names:
        values = [rs.metrics[name] for rs in ranks if name in rs.metrics]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(numbers) == len(values) and numbers and min(numbers) != max(numbers):
            found.append((name, f"{fmt.metric_value(min(numbers))}…{fmt.metric_value(max(numbers))}"))
        else:
            found.append((name, fmt.metric_value(values[-1])))
    return tuple(found)


def _span_text(span: Span, show: Any) -> str:
    low, high = show(span.low), show(span.high)
    return low if low == high else f"{low}-{high}"


def bar_words(figures: GroupFigures) -> list[str]:
    """['train 40-42%', '400-420/1000', '118-121 it/s', 'eta 00:05']: each figure whole."""
    words = []
    percent = _span_text(figures.fraction, lambda v: f"{v * 100:.0f}") + "%" if figures.total and figures.fraction \
        else ""
    head = f"{figures.desc} {percent}".strip()
    if head:
        words.append(head)
    if figures.n is not None:
        words.append(_span_text(figures.n, fmt.count) + (f"/{fmt.count(figures.total)}" if figures.total else ""))
    if figures.rate is not None and figures.kind != "stalled":
        words.append(_span_text(figures.rate, lambda v: f"{v:,.1f}" if v < 100 else f"{v:,.0f}")
                     + f" {figures.unit}/s")
    if figures.eta is not None:
        words.append(f"eta {fmt.duration(figures.eta)}")
    return words


def metric_words(figures: GroupFigures) -> list[str]:
    return [f"{name}={value}" for name, value in figures.metrics]


def resource_words(figures: GroupFigures) -> list[str]:
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
    figures = group_figures(state, row)
    from .grouping import row_label
    parts = [row_label(state, row), figures.kind]
    if figures.phase:
        parts.append(f"({figures.phase})")
    parts += bar_words(figures) + metric_words(figures)
    used = resource_words(figures)
    if used:
        parts.append("[" + " · ".join(used) + "]")
    if figures.outcome and figures.outcome != figures.kind:
        parts.append(figures.outcome)
    return " ".join(parts)
