"""Logged metrics drawn as small curves: inline SVG for the widget and HTML panels,
a one-line sparkline for the rich and text displays. No plotting library.

One chart per metric (the first ``MAX_CHARTS`` metrics logged, counters such as
``step`` or ``epoch`` left out), one line per rank in that rank's colour (a line
per rank shows a straggler or a diverging rank at a glance; ranks that agree
overlap). A line has at most ``MAX_POINTS`` points however long the run: its first
and last logged points, and between them the lowest and the highest point of each
bucket of steps (min-max decimation: a spike on any rank stays on its line, and the
line looks as the whole series would). Each chart has its scale: the value axis
labelled with the lowest and highest value logged (logarithmic, marked 'log', for
values all positive that span more than two decades), the step axis (the values
logged, counted from 0) with its first and last step.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from ..record.metrics import Series

if TYPE_CHECKING:
    from ..record.state import RankState, RunState

Point = tuple[float, float, float, float]    # (step, mean, min, max) of a bucket (sparklines)
LinePoint = tuple[float, float]              # (step, value) of a logged point (charts)
P = TypeVar("P", Point, LinePoint)

MAX_CHARTS = 4
WIDTH, HEIGHT = 260, 64          # px of one chart's plot area
AXIS_LEFT, AXIS_BOTTOM = 44, 13   # px beside and under it for the axes' labels
AXIS_FONT = "font-size='9' fill='#6b7280' font-family='sans-serif'"
MAX_POINTS = WIDTH // 2          # per line: a point every 2 px is as fine as the eye sees here
LOG_SPAN = 100.0                 # values all positive spanning more than this factor: a log axis
MAX_DECADE_LINES = 12            # powers of ten marked across a log chart at most
RANK_COLORS = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")
SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 12
NOT_CHARTED = ("step", "global_step", "epoch")   # counters logged as metrics: a diagonal says nothing


def _escape(text: str) -> str:
    """``html.escape``, imported when an HTML chart is first drawn: the text display (every plain
    Python launch's summary) draws none, and the html module (its entity table) cost a first launch
    in a fresh process over a millisecond at its end."""
    import html
    return html.escape(text)


def metric_names(state: RunState) -> list[str]:
    """Metrics with a curve, in the order they first appeared (rank by rank)."""
    names: dict[str, None] = {}
    for rs in state.ranks:
        for name in rs.curves:
            if name not in NOT_CHARTED:
                names.setdefault(name, None)
    return list(names)[:MAX_CHARTS]


def _resample(points: list[Point], limit: int) -> list[Point]:
    """At most ``limit`` (step, mean, min, max) points: neighbours averaged, extremes kept (sparklines)."""
    if len(points) <= limit:
        return points
    out = []
    for i in range(limit):
        chunk = points[i * len(points) // limit:(i + 1) * len(points) // limit]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk),
                    min(p[2] for p in chunk), max(p[3] for p in chunk)))
    return out


def _finite(points: Sequence[P]) -> list[P]:
    """The points with no infinite (or NaN) coordinate: no place on a chart."""
    return [p for p in points if all(math.isfinite(v) for v in p)]


def _value(point: LinePoint) -> float:
    return point[1]


def min_max_points(points: Sequence[LinePoint], limit: int) -> list[LinePoint]:
    """At most ``limit`` of ``points`` ((step, value) in step order), drawn as the whole line
    would be: the first and the last point kept, and the m points between split into
    k = (limit - 2) // 2 buckets of neighbours (bucket b: those ``[b * m // k, (b + 1) * m // k)``),
    each giving its lowest and its highest point in step order, so a single spike stays on the
    line and the scale's ends are the real lowest and highest values."""
    if len(points) <= limit:
        return list(points)
    inner, buckets = points[1:-1], max(1, (limit - 2) // 2)
    out = [points[0]]
    for b in range(buckets):
        chunk = inner[b * len(inner) // buckets:(b + 1) * len(inner) // buckets]
        low, high = min(chunk, key=_value), max(chunk, key=_value)
        out.extend((low,) if low == high else sorted((low, high)))
    out.append(points[-1])
    return out


def log_axis(low: float, high: float) -> bool:
    """A log value axis for values all positive that span more than two decades: on a linear one
    a loss falling from 4.3 to 6e-8 is a flat line at the bottom after its first steps. Values
    at or below 0 (no logarithm) or within two decades keep the linear axis."""
    return 0 < low and high > low * LOG_SPAN


def chart_svg(name: str, series_by_rank: list[tuple[int, Series]]) -> str:
    """One metric: ``series_by_rank`` is [(rank, Series)] of the ranks that logged it."""
    lines = [(rank, min_max_points(_finite(series.extremes()), MAX_POINTS)) for rank, series in series_by_rank]
    lines = [(rank, pts) for rank, pts in lines if pts]
    if not lines:
        return ""
    values = [value for _, pts in lines for _, value in pts]
    low, high = min(values), max(values)
    log = log_axis(low, high)
    if _flat(low, high):
        low, high = low - 0.5, high + 0.5
    bottom, top = (math.log10(low), math.log10(high)) if log else (low, high)
    last_step = max(max(series.total for _, series in series_by_rank) - 1, max(pts[-1][0] for _, pts in lines), 1)

    def xy(step: float, value: float) -> str:
        x = AXIS_LEFT + step / last_step * (WIDTH - 2) + 1
        scaled = math.log10(value) if log else value
        y = HEIGHT - 1 - (min(max(scaled, bottom), top) - bottom) / (top - bottom) * (HEIGHT - 2)
        return f"{x:.1f},{y:.1f}"

    parts = []
    for rank, pts in lines:
        if len(pts) == 1:
            pts = pts * 2
        path = "M" + " L".join(xy(s, v) for s, v in pts)
        parts.append(f"<path class='nl-curve nl-curve-rank{rank}' d='{path}' fill='none' "
                     f"stroke='{_color(rank)}' stroke-width='1.5'><title>rank {rank}</title></path>")
    first_rank, first = series_by_rank[0]
    latest = "" if first.last is None else f" {first.last:.4g}"
    title = (f"<div class='nl-curve-title' style='font-size:11px;color:#374151'><b>{_escape(name)}</b>"
             f"{_escape(latest)} <span style='color:#9ca3af'>rank {first_rank} · "
             f"{first.total} pts · {low:.4g}…{high:.4g}{' · log scale' if log else ''}</span></div>")
    width, height = AXIS_LEFT + WIDTH, HEIGHT + AXIS_BOTTOM
    return (f"<div class='nl-chart' data-metric='{_escape(name)}' style='display:inline-block;"
            f"margin:0 12px 4px 0;vertical-align:top'>{title}"
            f"<svg class='nl-curves-svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}'>"
            f"<rect x='{AXIS_LEFT}' y='0' width='{WIDTH}' height='{HEIGHT}' fill='#f9fafb' stroke='#e5e7eb'/>"
            f"{''.join(parts)}{_axes(low, high, last_step)}{_decades(bottom, top) if log else ''}</svg></div>")


def _axes(low: float, high: float, last_step: float) -> str:
    """The scale: ticks and labels of the highest and lowest value drawn (left) and of the first
    and last step (below), 'step' between them."""
    left, right, bottom = AXIS_LEFT, AXIS_LEFT + WIDTH, HEIGHT
    ticks = "".join(f"<line x1='{left - 3}' y1='{y}' x2='{left}' y2='{y}' stroke='#9ca3af'/>" for y in (1, bottom - 1))
    ticks += "".join(f"<line x1='{x}' y1='{bottom}' x2='{x}' y2='{bottom + 3}' stroke='#9ca3af'/>"
                     for x in (left + 1, right - 1))
    return (f"<g class='nl-axes'>{ticks}"
            f"<text class='nl-axis-max' x='{left - 4}' y='9' text-anchor='end' {AXIS_FONT}>{_tick(high)}</text>"
            f"<text class='nl-axis-min' x='{left - 4}' y='{bottom - 1}' text-anchor='end' {AXIS_FONT}>"
            f"{_tick(low)}</text>"
            f"<text class='nl-axis-step-first' x='{left + 1}' y='{bottom + 12}' {AXIS_FONT}>0</text>"
            f"<text class='nl-axis-step-name' x='{left + WIDTH // 2}' y='{bottom + 12}' text-anchor='middle' "
            f"{AXIS_FONT}>step</text>"
            f"<text class='nl-axis-step-last' x='{right - 1}' y='{bottom + 12}' text-anchor='end' {AXIS_FONT}>"
            f"{_tick(last_step)}</text></g>")


def _decades(bottom: float, top: float) -> str:
    """A log axis says so: 'log' beside it, and a faint line across at each power of ten
    between its ends (every n-th when there are over ``MAX_DECADE_LINES``)."""
    first, last = math.ceil(bottom), math.floor(top)
    every = max(1, math.ceil((last - first + 1) / MAX_DECADE_LINES))
    ys = [HEIGHT - 1 - (e - bottom) / (top - bottom) * (HEIGHT - 2) for e in range(first, last + 1, every)]
    grid = "".join(f"M{AXIS_LEFT},{y:.1f}h{WIDTH}" for y in ys)
    return (f"<path class='nl-axis-decades' d='{grid or 'M0,0'}' stroke='#e5e7eb' stroke-width='0.5' fill='none'>"
            f"<title>powers of ten</title></path>"
            f"<text class='nl-axis-scale' x='{AXIS_LEFT - 4}' y='{HEIGHT // 2 + 3}' text-anchor='end' "
            f"font-style='italic' {AXIS_FONT}>log</text>")


def _tick(value: float) -> str:
    """A scale label: whole numbers as they are, others to 4 significant digits."""
    return _escape(f"{value:.0f}" if float(value).is_integer() else f"{value:.4g}")


def _flat(low: float, high: float) -> bool:
    """A constant metric (its values, or its bucket means, differ only by rounding) draws as a flat line."""
    return high - low <= 1e-9 * max(abs(low), abs(high), 1e-300)


def _color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def drawn_ranks(state: RunState) -> list[tuple[RankState, str]]:
    """The ranks with a line, and what the legend calls each: every rank ('rank 3'); with many
    ranks (``grouping``) one line per row of the panel: each rank with a row of its own (failed,
    stalled, slowest), and for each group its first rank ('rank 0 for ranks 0-4, 6-31'): 256 lines
    on a 260 px chart say nothing, and would cost the widget hundreds of kB a redraw."""
    from .grouping import GROUP_ABOVE, representatives
    return [(rs, f"rank {rs.rank}" if group is None else f"rank {rs.rank} for {group}")
            for rs, group in representatives(state)][:GROUP_ABOVE]


def curves_html(state: RunState) -> str:
    """Every chart in one block (empty when nothing numeric was logged)."""
    charts = []
    drawn = drawn_ranks(state)
    for name in metric_names(state):
        series = [(rs.rank, rs.curves[name]) for rs, _ in drawn if name in rs.curves]
        if series:
            charts.append(chart_svg(name, series))
    charts = [c for c in charts if c]
    if not charts:
        return ""
    legend = ""
    if len(drawn) > 1:
        legend = "<div class='nl-curve-legend' style='font-size:11px'>" + " ".join(
            f"<span style='color:{_color(rs.rank)}'>━ {_escape(name)}</span>" for rs, name in drawn) + "</div>"
    return f"<div class='nl-curves'>{''.join(charts)}{legend}</div>"


def sparkline(series: Series, width: int = SPARK_WIDTH) -> str:
    """'▇▅▄▃▂▁▁' -- the curve's shape in a few characters (the means of ``width`` slices), on
    the chart's scale: logarithmic for values all positive spanning more than two decades."""
    points = _finite(_resample(series.points(), width))
    if not points:
        return ""
    means = [p[1] for p in points]
    if log_axis(min(p[2] for p in points), max(p[3] for p in points)):
        means = [math.log10(v) for v in means]
    low, high = min(means), max(means)
    if _flat(low, high):
        return SPARK[0] * len(means)
    return "".join(SPARK[min(len(SPARK) - 1, int((v - low) / (high - low) * len(SPARK)))] for v in means)
