"""Which rows the panel draws when there are many ranks (issue 43, part 5): pure, run state in,
a frozen ``Grouping`` out; every display draws the rows it says (the widget's and the final
picture's rows, the rich panel, the text summary).

Up to ``GROUP_ABOVE`` ranks, each rank has its row, as always. Past that (32 or 64 ranks on one
machine, 256 over a cluster) one row per rank is a page to scroll where the rank that matters is
lost, so:

- **The ranks that matter keep a row of their own**, at the top: every failed rank, every stalled
  rank, and the slowest (the ranks the pace verdict names, ``display.pace``, and the rank furthest
  behind on the bar most ranks share, when it is more than ``BEHIND`` of the bar behind). At most
  ``MAX_SINGLES`` of them: past that (a failure that took every rank with it) the rest join rows
  of ranks that failed alike (the same error) or stalled alike, which name every rank they hold.
- **The other ranks are grouped by what they look alike in**: the same status, the same bar
  (its description and total) or the same start-up phase, on the same node when the ranks span
  nodes (a cluster launch). A group's row says its ranks ('ranks 0-4, 6-31'), how far they got
  (the least and the most: '400-412/1000'), their rates, metrics and resources as ranges. A
  group of one rank is that rank's row.
- **The rows stay few**: when there are more than ``MAX_GROUPS`` groups (32 nodes), the nodes
  merge (a row then says how many nodes it spans); when still more, the groups are by status
  alone: at most one row per status.

The header says the whole run whatever the rows (``counts``: running, stalled, done, failed...;
the nodes). A rank's every line stays in its log file, its recent lines one click away.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from ..record.state import DONE, FAILED, RUNNING, STARTING, STOPPED, RankState, RunState
from .pace import slow_ranks

GROUP_ABOVE = 16    # more ranks than this: their rows are grouped
MAX_SINGLES = 8     # ranks with a row of their own at most (failed first, then stalled, then the slowest)
MAX_GROUPS = 12     # group rows at most before nodes merge (then: one row per status)
BEHIND = 0.05       # a rank this share of its bar's total (or of the median step) behind the median is the slowest
STALLED = "stalled"
KINDS = (STARTING, RUNNING, STALLED, DONE, FAILED, STOPPED)   # the header's order


@dataclass(frozen=True)
class Row:
    """One row of the panel: one rank (``members`` of one) or a group of ranks that look alike."""
    members: tuple[int, ...]   # local ranks (indices of ``state.ranks``), in rank order
    why: str                   # one rank: 'failed', 'stalled', 'slowest' or 'rank'; a group: 'alike'
    nodes: tuple[int, ...]     # the nodes its ranks run on (one, when grouped by node)

    @property
    def single(self) -> bool:
        return len(self.members) == 1


@dataclass(frozen=True)
class Grouping:
    """The rows to draw and what the header says of the whole."""
    rows: tuple[Row, ...]
    grouped: bool                            # some row holds several ranks
    counts: tuple[tuple[str, int], ...]      # (kind, ranks) for each kind present, in ``KINDS`` order
    nodes: int                               # nodes the ranks span (1: one machine)

    def counts_text(self) -> str:
        """'29 running, 1 stalled, 1 done, 1 failed'."""
        return ", ".join(f"{n} {kind}" for kind, n in self.counts)


def kind(rs: RankState) -> str:
    """The rank's status as the rows count it: a running rank with no sign of progress is 'stalled'."""
    return STALLED if rs.stalled_for() is not None else str(rs.status)


def node_of(state: RunState, rs: RankState) -> int:
    return state.node_rank if rs.node_rank is None else rs.node_rank


def group_rows(state: RunState, group_above: int = GROUP_ABOVE) -> Grouping:
    """The panel's rows for this state (see the module)."""
    ranks = state.ranks
    tally = collections.Counter(kind(rs) for rs in ranks)
    counts = tuple((k, tally[k]) for k in KINDS if tally[k])
    nodes = sorted({node_of(state, rs) for rs in ranks})
    if len(ranks) <= group_above:
        each = tuple(Row((i,), "rank", (node_of(state, rs),)) for i, rs in enumerate(ranks))
        return Grouping(each, False, counts, len(nodes))
    singles = _standouts(state)
    alone = {i for i, _ in singles}
    rest = [i for i in range(len(ranks)) if i not in alone]
    rows = [Row((i,), why, (node_of(state, ranks[i]),)) for i, why in singles] + _groups(state, rest, len(nodes) > 1)
    return Grouping(tuple(rows), any(not row.single for row in rows), counts, len(nodes))


def _standouts(state: RunState) -> list[tuple[int, str]]:
    """(local rank, why) of the ranks with a row of their own, failed first, at most MAX_SINGLES."""
    ranks = state.ranks
    found: list[tuple[int, str]] = [(i, "failed") for i, rs in enumerate(ranks) if rs.status == FAILED]
    found += [(i, "stalled") for i, rs in enumerate(ranks) if kind(rs) == STALLED]
    seen = {i for i, _ in found}
    for i in _slowest(state):
        if i not in seen:
            found.append((i, "slowest"))
            seen.add(i)
    return found[:MAX_SINGLES]


def _slowest(state: RunState) -> list[int]:
    """The ranks the pace verdict names, then the running rank furthest behind on the bar most
    running ranks share, when it is more than ``BEHIND`` of the bar behind their median (ranks a
    step or two apart are alike: which is last changes every moment)."""
    by_rank = {rs.rank: i for i, rs in enumerate(state.ranks)}
    slow = [by_rank[rank] for rank in slow_ranks(state) if rank in by_rank]
    running = [(i, rs.main_bar) for i, rs in enumerate(state.ranks) if kind(rs) == RUNNING]
    bars = [(i, bar) for i, bar in running if bar is not None and not bar.closed]
    if bars:
        common = collections.Counter((bar.desc, bar.total) for _, bar in bars).most_common(1)[0][0]
        alike = sorted((bar.n, i) for i, bar in bars if (bar.desc, bar.total) == common)
        median = alike[len(alike) // 2][0]
        if len(alike) > 1 and median - alike[0][0] > BEHIND * (common[1] or median):
            slow.append(alike[0][1])
    return slow


def _alike_key(state: RunState, rs: RankState, by_node: bool, by_bar: bool) -> Hashable:
    """What two ranks must share to share a row."""
    k = kind(rs)
    key: tuple[Any, ...] = (k,)
    if by_bar:
        bar = rs.main_bar
        key += ((bar.desc, bar.total) if bar is not None else (rs.phase if k in (STARTING, RUNNING) else ""),)
        if k == FAILED:
            key += (rs.error or rs.exit_description or "",)
    if by_node:
        key += (node_of(state, rs),)
    return key


def _groups(state: RunState, rest: list[int], spans_nodes: bool) -> list[Row]:
    """The rows of the ranks without one of their own: by node and look, then by look, then by status."""
    levels: list[Callable[[RankState], Hashable]] = []
    if spans_nodes:
        levels.append(lambda rs: _alike_key(state, rs, by_node=True, by_bar=True))
    levels.append(lambda rs: _alike_key(state, rs, by_node=False, by_bar=True))
    levels.append(lambda rs: _alike_key(state, rs, by_node=False, by_bar=False))
    for level, key in enumerate(levels):
        buckets: dict[Hashable, list[int]] = {}
        for i in rest:
            buckets.setdefault(key(state.ranks[i]), []).append(i)
        if len(buckets) <= MAX_GROUPS or level == len(levels) - 1:
            break
    rows = []
    for members in buckets.values():
        nodes = tuple(sorted({node_of(state, state.ranks[i]) for i in members}))
        rows.append(Row(tuple(members), "rank" if len(members) == 1 else "alike", nodes))
    return sorted(rows, key=lambda row: row.members[0])


def rank_ranges(ranks: list[int], most: int = 4) -> str:
    """'0-4, 6-31' (sorted); past ``most`` runs, the first ones and how many ranks in all."""
    ordered = sorted(ranks)
    runs: list[tuple[int, int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    words = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(words) > most:
        return ", ".join(words[:most - 1]) + f", … ({len(ordered)} ranks)"
    return ", ".join(words)


def row_label(state: RunState, row: Row) -> str:
    """'rank 5', 'ranks 0-4, 6-31', with the node when a group is one node's ('ranks 8-15 on node 1')."""
    ranks = [state.ranks[i].rank for i in row.members]
    if row.single:
        return f"rank {ranks[0]}"
    where = ""
    if len({node_of(state, rs) for rs in state.ranks}) > 1:
        where = f" on node {row.nodes[0]}" if len(row.nodes) == 1 else f" on {len(row.nodes)} nodes"
    return f"ranks {rank_ranges(ranks)}{where}"


def rank_outcome(rank_state: RankState) -> str:
    """What a person needs from a finished rank: its error line, or how it ended ('' while it runs
    or when it ended well). Every row says it this way, a rank's and a group's alike."""
    if rank_state.status == FAILED:
        return rank_state.error or rank_state.exit_description or "failed"
    if rank_state.status == STOPPED:
        return rank_state.exit_description or "stopped"
    return ""


def representatives(state: RunState) -> list[tuple[RankState, str | None]]:
    """One rank for each row of the panel, and the row's label when the row is a group (None: the
    rank's own row): what the curves draw a line for and the picture folds recent lines of. Up to
    GROUP_ABOVE ranks every rank is its own row."""
    if len(state.ranks) <= GROUP_ABOVE:
        return [(rs, None) for rs in state.ranks]
    return [(state.ranks[row.members[0]], None if row.single else row_label(state, row))
            for row in group_rows(state).rows]
