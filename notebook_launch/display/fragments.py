"""HTML fragments shared by the widget panel and its final picture (the HTML display): the run
header, the picture's last line, the answer to "Where are they?"; the ranks' rows are ``rows``."""
from __future__ import annotations

import html

from ..record.state import RUNNING, RunState
from . import format as fmt
from . import rows

# The panel's pieces are styled inline with one font and line height: the live panel's widgets
# (whose HTML has a 28 px line height of its own) and the final picture (a notebook's rendered
# HTML) then draw them alike, and the picture keeps the panel's height.
FONT = rows.FONT
CODE = "font-size:12px;background:none;padding:0"


def header_html(state: RunState) -> str:
    status = fmt.run_status(state)
    color = fmt.STATUS_COLORS.get(status, "#2563eb" if status == RUNNING else "#d97706")
    whole = fmt.whole(state)   # many ranks: how many run, are done, failed... (the rows are grouped)
    return (f"<div class='nl-header' style='{FONT}'><b>notebook_launch</b> run "
            f"<code style='{CODE}'>{html.escape(state.run_id)}</code>"
            f" &middot; {state.world_size} rank{'s' if state.world_size != 1 else ''}"
            + (f"<span class='nl-whole'>{html.escape(whole)}</span>" if whole else "")
            + f" &middot; {html.escape(state.backend)}"
            f" &middot; <span style='color:{color};font-weight:bold'>{html.escape(status)}</span>"
            f" &middot; {fmt.duration(state.elapsed)}"
            + (f" &middot; <span class='nl-machine'>machine {html.escape(fmt.machine(state))}</span>"
               if state.machine is not None else "")
            + f" &middot; logs: <code style='{CODE}'>{html.escape(state.log_dir)}</code></div>")


def footer_html(state: RunState) -> str:
    """The final picture's last line, where the live panel had its buttons: the run's outcome."""
    outcome = fmt.outcome(state)
    summary = f"<span class='nl-summary'>{html.escape(outcome)}</span>" if outcome else ""
    return (f"<div class='nl-footer' style='{FONT};min-height:32px;margin-top:4px;display:flex;"
            f"align-items:center'>{summary}</div>")


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
    return (f"<div class='nl-where' style='{FONT};border-left:4px solid {fmt.STALLED_COLOR};padding:2px 8px;"
            f"margin:4px 0'>"
            f"<div class='nl-where-verdict'><b>Where are they?</b> {html.escape(verdict)}</div>{stacks}</div>")
