"""HTML fragments shared by the widget panel and the HTML table: the run header,
a rank's label, and a rank's one-line info (bar text, metrics, outcome or last line)."""
from __future__ import annotations

import html

from ..state import FAILED, RUNNING, STOPPED, RankState, RunState
from . import format as fmt


def header_html(state: RunState) -> str:
    status = fmt.run_status(state)
    color = fmt.STATUS_COLORS.get(status, "#2563eb" if status == RUNNING else "#d97706")
    outcome = fmt.outcome(state)
    summary = f"<div class='nl-summary'>{html.escape(outcome)}</div>" if outcome else ""
    return (f"<div class='nl-header'><b>notebook_launch</b> run <code>{html.escape(state.run_id)}</code>"
            f" &middot; {state.world_size} rank{'s' if state.world_size != 1 else ''}"
            f" &middot; {html.escape(state.backend)}"
            f" &middot; <span style='color:{color};font-weight:bold'>{html.escape(status)}</span>"
            f" &middot; {fmt.duration(state.elapsed)}"
            f" &middot; logs: <code>{html.escape(state.log_dir)}</code>{summary}</div>")


def label_html(rs: RankState) -> str:
    color = fmt.STATUS_COLORS.get(rs.status, "#6b7280")
    return (f"<span class='nl-label'><b>rank {rs.rank}</b> <small>{html.escape(fmt.placement(rs))}</small> "
            f"<span class='nl-status' style='background:{color};color:white;border-radius:3px;"
            f"padding:0 4px'>{html.escape(rs.status)}</span></span>")


def info_html(rs: RankState) -> str:
    parts = []
    bar = rs.main_bar
    if bar is not None:
        label = f"{html.escape(bar.desc)} " if bar.desc else ""
        parts.append(f"<span class='nl-bar-text'>{label}{html.escape(fmt.bar_percent(bar).strip())} "
                     f"{html.escape(fmt.bar_details(bar, running=rs.status == RUNNING))}</span>")
    if rs.metrics:
        parts.append(f"<span class='nl-metrics'><code>{html.escape(fmt.metrics(rs))}</code></span>")
    outcome = fmt.rank_outcome(rs)
    if outcome:
        color = fmt.STATUS_COLORS[FAILED] if rs.status == FAILED else fmt.STATUS_COLORS[STOPPED]
        parts.append(f"<span class='nl-error' style='color:{color};font-weight:bold'>"
                     f"{html.escape(fmt.shorten(outcome, 160))}</span>")
    elif rs.last_line:
        parts.append(f"<span class='nl-last-line' style='color:#6b7280'>"
                     f"{html.escape(fmt.shorten(rs.last_line, 100))}</span>")
    return " &nbsp; ".join(parts)
