"""The ranks' rows, one markup for the live widget panel (one HTML widget holds them all) and for
its final picture (``html.render``), so the panel keeps its shape when the run ends (issue 47).

A table of two columns: the label ('rank 0 cpu [running]', never wrapped: the label column is as
wide as the widest label, so every row's bar starts at the same x) and the row's body, a wrapping
line of items: the bar first (the same width in every row: a share of the one body column), then
the figures. Each figure is one item that never breaks inside ('50,000/50,000', 'cpu 97%',
'820.0 MiB own of 1.2 GiB resident'): where the output is too narrow for the whole row, the next
figure goes to a second line that starts under the bar, whole, and nothing is cut with '...'.
The rank's last output line is the one thing that yields: it takes the room left on the line and
is shortened there; its whole text is one click away in "recent lines".

Everything is styled inline: the widget's HTML and a notebook's rendered HTML (which right-aligns
table cells, pads them and sets its own font size and line height) then draw the same thing.
"""
from __future__ import annotations

import html

from ..record.state import FAILED, STOPPED, RankState, RunState
from . import format as fmt
from .group_figures import bar_fraction, group_figures
from .grouping import Row, group_rows, row_label
from .pace import rank_text as pace_text

FONT = "font-size:13px;line-height:20px"
# The bar: a share of the body column, bounded so a wide output keeps room for the figures and a
# narrow one a bar worth reading.
BAR = "flex:none;width:25%;min-width:100px;max-width:260px;height:12px;background:#e5e7eb;border-radius:3px"
CELL = "padding:2px 10px 2px 0;border:none;text-align:left;line-height:20px;background:inherit"
ITEM = "white-space:nowrap"
GAP = 10   # px between two items of a row
MUTED = "color:#6b7280"
BADGE_WIDTH = "6.6em"   # 'stalled 00:06' fits: a badge that grows as a stall ages moves no bar


def rows_html(state: RunState) -> str:
    """Every row as one table: a row per rank, or with many ranks the rows ``grouping`` says (the
    failed, stalled and slowest ranks on their own, the others grouped where they look alike)."""
    drawn = []
    for row in group_rows(state).rows:
        drawn.append(row_html(state.ranks[row.members[0]], row.why) if row.single else group_html(state, row))
    rows = "".join(drawn)
    return (f"<table class='nl-rows' style='width:100%;border-collapse:collapse;table-layout:auto;margin:0;"
            f"{FONT}'><tbody>{rows}</tbody></table>")


def row_html(rs: RankState, why: str = "rank") -> str:
    background = "#fee2e2" if rs.status == FAILED else "transparent"
    stalled = " nl-stalled" if fmt.stalled_for(rs) is not None else ""
    slowest = f" <small class='nl-slowest' style='{MUTED}'>slowest</small>" if why == "slowest" else ""
    return (f"<tr class='nl-rank nl-status-{rs.status}{stalled}' style='background:{background}'>"
            f"<td class='nl-label-cell' style='{CELL};width:1px;white-space:nowrap;vertical-align:top'>"
            f"{label_html(rs)}{slowest}</td>"
            f"<td class='nl-body' style='{CELL};vertical-align:top;padding-right:0'>"
            f"<div class='nl-items' style='display:flex;flex-wrap:wrap;align-items:center;column-gap:{GAP}px'>"
            f"{bar_html(rs)}{''.join(items(rs))}</div></td></tr>")


def group_html(state: RunState, row: Row) -> str:
    """A group of ranks that look alike, in the rank rows' columns: 'ranks 0-4, 6-31 ×30 [running]',
    a bar filled to the least done of them (lighter to the most done), the figures as ranges."""
    figures = group_figures(state, row)
    color = fmt.STALLED_COLOR if figures.kind == "stalled" else fmt.STATUS_COLORS.get(figures.kind, "#6b7280")
    label = (f"<span class='nl-label'><b>{html.escape(row_label(state, row))}</b> "
             f"<small>×{len(row.members)}</small> "
             f"<span class='nl-status' style='display:inline-block;min-width:{BADGE_WIDTH};text-align:center;"
             f"background:{color};color:white;border-radius:3px;padding:0 4px;line-height:18px'>"
             f"{html.escape(figures.kind)}</span></span>")
    low, high = (figures.fraction.low, figures.fraction.high) if figures.fraction else (0.0, 0.0)
    bar = (f"<div class='nl-bar-track' style='{BAR};display:flex'>"
           f"<div class='nl-bar' style='width:{low * 100:.1f}%;background:{color};height:12px;border-radius:3px'>"
           f"</div><div class='nl-bar-spread' style='width:{(high - low) * 100:.1f}%;background:{color};"
           f"opacity:0.35;height:12px'></div></div>")
    found = []
    if figures.phase:
        found.append(f"<span class='nl-phase' style='{ITEM};font-style:italic;{MUTED}'>"
                     f"{html.escape(figures.phase)}</span>")
    words = fmt.group_bar_words(figures)
    if words:
        found.append(figures_item("nl-bar-text", words))
    if figures.metrics:
        found.append(figures_item("nl-metrics", fmt.group_metric_words(figures),
                                  "font-size:12px;font-family:monospace"))
    used = fmt.group_resource_words(figures)
    if used:
        found.append(figures_item("nl-resources", used, "color:#4b5563", joiner=" · "))
    if figures.outcome:
        found.append(f"<span class='nl-error' style='color:{color};font-weight:bold'>"
                     f"{html.escape(fmt.shorten(figures.outcome, 300))}</span>")
    return (f"<tr class='nl-group nl-status-{figures.kind}' style='background:transparent'>"
            f"<td class='nl-label-cell' style='{CELL};width:1px;white-space:nowrap;vertical-align:top'>{label}</td>"
            f"<td class='nl-body' style='{CELL};vertical-align:top;padding-right:0'>"
            f"<div class='nl-items' style='display:flex;flex-wrap:wrap;align-items:center;column-gap:{GAP}px'>"
            f"{bar}{''.join(found)}</div></td></tr>")


def label_html(rs: RankState) -> str:
    """'rank 3 cpu [running]'; a rank waiting with no sign of progress reads '[stalled 02:13]', in amber."""
    stalled = fmt.stalled_for(rs) is not None
    color = fmt.STALLED_COLOR if stalled else fmt.STATUS_COLORS.get(rs.status, "#6b7280")
    kind = "nl-status nl-stalled" if stalled else "nl-status"
    return (f"<span class='nl-label'><b>rank {rs.rank}</b> <small>{html.escape(fmt.placement(rs))}</small> "
            f"<span class='{kind}' style='display:inline-block;min-width:{BADGE_WIDTH};text-align:center;"
            f"background:{color};color:white;border-radius:3px;padding:0 4px;line-height:18px'>"
            f"{html.escape(fmt.rank_status(rs))}</span></span>")


def bar_html(rs: RankState) -> str:
    color = fmt.STATUS_COLORS.get(rs.status, "#2563eb")
    return (f"<div class='nl-bar-track' style='{BAR}'><div class='nl-bar' style='width:{bar_fraction(rs) * 100:.1f}%;"
            f"background:{color};height:12px;border-radius:3px'></div></div>")


def figures_item(cls: str, parts: list[str], style: str = "", joiner: str = " ", title: str = "") -> str:
    """One item of several figures: the line may break between two of them, never inside one."""
    inner = html.escape(joiner).join(f"<span style='{ITEM}'>{html.escape(p)}</span>" for p in parts if p)
    hint = f" title='{html.escape(title)}'" if title else ""
    return f"<span class='{cls}' style='{style}'{hint}>{inner}</span>"


def items(rs: RankState) -> list[str]:
    """The row's figures after its bar, in the order a person reads them."""
    found = []
    phase = fmt.phase(rs)
    if phase:
        found.append(f"<span class='nl-phase' style='{ITEM};font-style:italic;{MUTED}'>{html.escape(phase)}</span>")
    bar = rs.main_bar
    if bar is not None:
        found.append(figures_item("nl-bar-text", fmt.bar_words(bar, running=rs.status == "running",
                                                          stalled=fmt.stalled_for(rs) is not None)))
        others = fmt.other_bars(rs)
        if others:
            found.append(f"<span class='nl-other-bars' style='{ITEM};{MUTED}'>{html.escape(others)}</span>")
    if rs.metrics:
        found.append("<code class='nl-metrics' style='font-size:12px;background:none;padding:0'>"
                     + " ".join(f"<span style='{ITEM}'>{html.escape(m)}</span>" for m in fmt.metric_words(rs))
                     + "</code>")
    pace = pace_text(rs)
    if pace:
        found.append(f"<span class='nl-pace' style='{ITEM};{MUTED}'>{html.escape(pace)}</span>")
    used = fmt.resources(rs)
    if used:
        found.append(figures_item("nl-resources", used.split(" · "), "color:#4b5563", joiner=" · ",
                             title="own: pages only this rank holds (USS); resident counts those it shares, "
                                   "for a forked rank the notebook's"))
    outcome = fmt.rank_outcome(rs)
    if outcome:
        color = fmt.STATUS_COLORS[FAILED] if rs.status == FAILED else fmt.STATUS_COLORS[STOPPED]
        found.append(f"<span class='nl-error' style='color:{color};font-weight:bold'>"
                     f"{html.escape(fmt.shorten(outcome, 300))}</span>")
    elif rs.last_line:
        # no size of its own (a width of 0, the gap before it taken back by its margin, the space shown
        # inside it): it never takes a line of its own, nor widens the row; it shows in the room the
        # figures left on their last line
        found.append(f"<span class='nl-last-line' style='flex:1 1 0;width:0;min-width:0;margin-left:-{GAP}px;"
                     f"white-space:nowrap;overflow:hidden;text-overflow:ellipsis;{MUTED}' "
                     f"title='{html.escape(fmt.shorten(rs.last_line, 300))}'><span style='padding-left:{GAP}px'>"
                     f"{html.escape(fmt.shorten(rs.last_line, 200))}</span></span>")
    return found
