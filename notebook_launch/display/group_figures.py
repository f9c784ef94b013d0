"""What a group row of the panel says of its ranks (``grouping``): pure data from the run state;
``format.group_words`` and the like say it as every display shows it ('train 40-42%',
'400-420/1,000', 'loss=0.12…0.15').

A group's ranks look alike (the same status and bar, ``grouping``), so its row gives each figure
as the range over its ranks: the least and the most done, the slowest and fastest rate, the latest
ETA, each metric's lowest and highest latest value, and CPU and memory per rank as ranges."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..record.state import DONE, RUNNING, STARTING, RankState, RunState
from .grouping import Row, kind, rank_outcome

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
    outcomes = {rank_outcome(rs) for rs in ranks}
    return GroupFigures(
        kind=kind(first), desc=shown[0].desc if shown else "", total=shown[0].total if shown else None,
        n=Span.of([bar.n for bar in shown]), fraction=Span.of([bar_fraction(rs) for rs in ranks]),
        rate=Span.of([bar.rate for bar in shown if bar.rate]), unit=shown[0].unit if shown else "it",
        eta=max([e for e in etas if e is not None], default=None), metrics=_metrics(ranks),
        cpu=Span.of([_cpu(rs) for rs in ranks]), memory=Span.of([_memory(rs) for rs in ranks]),
        outcome=outcomes.pop() if len(outcomes) == 1 else "",
        phase=first.phase if running and first.main_bar is None else "")


def bar_fraction(rs: RankState) -> float:
    """How much of its row's bar a rank did (0 to 1); a rank done, or whose bar closed, did it all."""
    bar = rs.main_bar
    if bar is None or bar.fraction is None:
        return 1.0 if rs.status == DONE or (bar is not None and bar.closed) else 0.0
    return bar.fraction





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
            found.append((name, f"{_value(min(numbers))}…{_value(max(numbers))}"))
        else:
            found.append((name, _value(values[-1])))
    return tuple(found)


def _value(value: Any) -> str:
    """A metric's value as every row shows it (``format.metric_value``)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
