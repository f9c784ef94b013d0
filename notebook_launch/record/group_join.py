"""What a rank's row says while it joins the process group, and which peers it waits for.

A rank's ``init_process_group`` can take seconds (or until the timeout) when a peer is late: a
gloo group connects every pair of ranks, so each waits for the last one to call it. The rank
says when it starts and ends joining (``rank.group.joining``, its own PROGRESS event); the notebook,
which sees every rank of this machine, names the ones not joining yet: "joining the process
group, waiting for rank 2". Nothing is asked of the ranks for that: it is what their rows say
already. Named only when every rank of the run is a row here (one machine): with peers on other
machines the missing ones cannot be known.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .state import RankState

JOINING = "joining the process group"   # the phase a rank reports while init_process_group runs
JOINED = ""                             # the phase it reports once the group is made
NOT_YET, IN_PROGRESS, DONE = "", "joining", "joined"   # RankState.group_join


def step(rank_state: RankState, phase: str) -> None:
    """Fold the phase a rank reported (``JOINING`` or ``JOINED``) into its row."""
    if phase == JOINING:
        rank_state.group_join = IN_PROGRESS
    elif rank_state.group_join == IN_PROGRESS:
        rank_state.group_join = DONE
    rank_state.phase = phase


def name_missing(ranks: Sequence[RankState], world_size: int, alive: Sequence[bool]) -> None:
    """Each joining rank's phase names the live ranks that have not started joining (one machine)."""
    missing = [rs.rank for rs, live in zip(ranks, alive) if live and rs.group_join == NOT_YET]
    known = len(ranks) == world_size
    for rs in ranks:
        if rs.group_join == IN_PROGRESS:
            rs.phase = f"{JOINING}, waiting for {ranks_phrase(missing)}" if missing and known else JOINING


def ranks_phrase(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 0-7', 'ranks 0, 2, 5'."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ranks {ordered[0]}-{ordered[-1]}"
    return "ranks " + ", ".join(str(rank) for rank in ordered)
