"""The ranks' pace as every display shows it (issue 34): a few words on each rank's row
("12.5 all_reduce/s, 44% waiting") and, when one rank holds the others back, one line under
the rows ("rank 2 is the slowest (1.8x); ranks 0, 1, 3 spend 44% of their time waiting for it
in all_reduce"). What is measured and how the verdict is reached: ``slow_rank``.

While the run goes, the last ``slow_rank.WINDOW`` seconds of each rank are compared (at least
its last ``slow_rank.MIN_STRETCHES`` stretches: the panel follows what the ranks do now); once it
ended well, the whole run (the final picture and summary). A run that failed or was stopped
says nothing of pace: its ranks' last waits were for the rank that failed, which its error names
already."""
from __future__ import annotations

from ..record import slow_rank
from ..record.state import DONE, RUNNING, RankState, RunState

VERDICT_COLOR = "#b45309"   # amber, as a stall: a thing to look at, not a failure


def _whole_run(status: str) -> bool | None:
    """True: compare whole runs; False: the recent window; None: say nothing."""
    if status == RUNNING:
        return False
    return True if status == DONE else None


def rank_pace(rs: RankState, status: str | None = None) -> slow_rank.RankPace | None:
    """The rank's pace as its row shows it (``status``: the run's, for the verdict; by default
    the rank's own: a rank done while others run shows its whole run)."""
    whole = _whole_run(rs.status if status is None else status)
    if whole is None:
        return None
    return rs.pace.whole_run(rs.rank) if whole else rs.pace.window(rs.rank)


def rank_text(rs: RankState) -> str:
    """'12.5 all_reduce/s, 44% waiting', or '' for a rank with no pace (no collective yet). A
    stalled rank has none: its rate over the last window only decays while it waits ('1.40
    s/all_reduce'), a speed it does not have; its row says how long it has not moved."""
    if rs.stalled_for() is not None:
        return ""
    return slow_rank.row_text(rank_pace(rs))


def _found(state: RunState) -> slow_rank.SlowVerdict | None:
    if _whole_run(state.status) is None:
        return None
    return slow_rank.verdict({rs.rank: rank_pace(rs, state.status) for rs in state.ranks})


def verdict(state: RunState) -> str | None:
    """The slow rank named, or None when no rank holds the others back."""
    found = _found(state)
    return None if found is None else found.text


def slow_ranks(state: RunState) -> list[int]:
    """The global ranks the verdict names as holding the others back (the grouped rows keep them)."""
    found = _found(state)
    return [] if found is None else [rank for rank, _ in found.slow]


def verdict_html(state: RunState) -> str:
    """The verdict as the panels show it under the rows; empty when there is none."""
    from html import escape   # only HTML displays draw this (see curves._escape)
    text = verdict(state)
    if text is None:
        return ""
    return (f"<div class='nl-slow-rank' style='font-size:13px;line-height:20px;"
            f"border-left:4px solid {VERDICT_COLOR};padding:2px 8px;margin:4px 0'><b>Pace:</b> {escape(text)}</div>")
