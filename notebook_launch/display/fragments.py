"""HTML fragments shared by the widget panel and the HTML table: the run header,
a rank's label, and a rank's one-line info (bar text, metrics, outcome or last line)."""
from __future__ import annotations

import html

from ..state import FAILED, RUNNING, STOPPED, RankState, RunState
from . import format as fmt
from .pace import rank_text as pace_text

# A rank's row: its label, its bar, its info. The live widget panel and its final picture (the
# HTML table) give the columns the same widths and keep the info on one line, so the panel does
# not change its shape when the run ends.
LABEL_WIDTH, BAR_WIDTH = "190px", "32%"
ONE_LINE = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis"


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
            + (f" &middot; <span class='nl-machine'>machine {html.escape(fmt.machine(state))}</span>"
               if state.machine is not None else "")
            + f" &middot; logs: <code>{html.escape(state.log_dir)}</code>{summary}</div>")


def label_html(rs: RankState) -> str:
    """'rank 3 cpu [running]'; a rank waiting with no sign of progress reads '[stalled 02:13]', in amber."""
    stalled = fmt.stalled_for(rs) is not None
    color = fmt.STALLED_COLOR if stalled else fmt.STATUS_COLORS.get(rs.status, "#6b7280")
    kind = "nl-status nl-stalled" if stalled else "nl-status"
    return (f"<span class='nl-label'><b>rank {rs.rank}</b> <small>{html.escape(fmt.placement(rs))}</small> "
            f"<span class='{kind}' style='background:{color};color:white;border-radius:3px;"
            f"padding:0 4px'>{html.escape(fmt.rank_status(rs))}</span></span>")


def info_html(rs: RankState) -> str:
    parts = []
    bar = rs.main_bar
    if bar is not None:
        label = f"{html.escape(bar.desc)} " if bar.desc else ""
        parts.append(f"<span class='nl-bar-text'>{label}{html.escape(fmt.bar_percent(bar).strip())} "
                     f"{html.escape(fmt.row_bar_details(rs, bar))}</span>")
        others = fmt.other_bars(rs)
        if others:
            parts.append(f"<span class='nl-other-bars' style='color:#6b7280'>{html.escape(others)}</span>")
    if rs.metrics:
        parts.append(f"<span class='nl-metrics'><code>{html.escape(fmt.metrics(rs))}</code></span>")
    pace = pace_text(rs)
    if pace:
        parts.append(f"<span class='nl-pace' style='color:#6b7280'>{html.escape(pace)}</span>")
    used = fmt.resources(rs)
    if used:
        parts.append(f"<span class='nl-resources' style='color:#4b5563' title='own: pages only this rank "
                     f"holds (USS); resident counts those it shares, for a forked rank the notebook&#39;s'>"
                     f"{html.escape(used)}</span>")
    outcome = fmt.rank_outcome(rs)
    if outcome:
        color = fmt.STATUS_COLORS[FAILED] if rs.status == FAILED else fmt.STATUS_COLORS[STOPPED]
        parts.append(f"<span class='nl-error' style='color:{color};font-weight:bold'>"
                     f"{html.escape(fmt.shorten(outcome, 160))}</span>")
    elif rs.last_line:
        parts.append(f"<span class='nl-last-line' style='color:#6b7280'>"
                     f"{html.escape(fmt.shorten(rs.last_line, 100))}</span>")
    return " &nbsp; ".join(parts)


def where_html(state: RunState) -> str:
    """The answer to "Where are they?": the verdict in one line, then every rank's stacks,
    folded and scrollable (they can be long); empty until there is an answer."""
    verdict = fmt.where_verdict(state)
    if verdict is None:
        return ""
    details = fmt.where_details(state)
    stacks = (f"<details class='nl-where-stacks'><summary>every rank's stack</summary>"
              f"<pre style='margin:0;max-height:24em;overflow:auto;font-size:90%'>{html.escape(details)}</pre>"
              f"</details>") if details else ""
    return (f"<div class='nl-where' style='border-left:4px solid {fmt.STALLED_COLOR};padding:2px 8px;margin:4px 0'>"
            f"<div class='nl-where-verdict'><b>Where are they?</b> {html.escape(verdict)}</div>{stacks}</div>")
