"""What a run leaves in the cell stays bounded, however long and however loud (issue 43). Pure:
lines in, decisions out; ``text.TextDisplay`` writes what these say.

Measured before: 4 ranks printing 100 lines a second each (under the per-rank cap) left 2.4 MB in
the cell after two minutes, about 75 MB of cell output and 100 MB of saved notebook an hour; a
browser tab and an .ipynb of that size are unusable long before a 6-hour run ends, and Colab's and
JupyterLab's own limits drop output without saying which. Two rules keep it bounded:

- **Identical lines show once** (``LineMerger``): a line every rank prints alike (a library's
  warning, "Some weights of the model were not initialized ...") within ``MERGE_WINDOW`` seconds
  shows once, naming the ranks (``[ranks 0-7] ...``); lines that differ at all (the rank number, a
  value) stay apart. The rank log files keep every rank's own line. Each line waits at most the
  window, and no longer once every rank printed it.
- **A byte budget** (``CellBudget``, ``cell_output=``, 200 kB by default): each rank's first lines
  are appended to the cell up to its share of the head (three quarters of the budget, split
  among the ranks: a rank that floods cannot use another's share); after that a rank's lines go
  to one rolling tail, a display that is replaced in place (so it never grows): the last
  ``TAIL_LINES`` lines and a plain line saying how many lines are only in the ranks' log files,
  and where. Our own notes (lines over the per-second cap) have a small share of their own.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

DEFAULT_CELL_OUTPUT = 200_000   # bytes of a run's lines in the cell (``cell_output=``)
MIN_CELL_OUTPUT = 10_000        # less would not hold one screen of every rank's first lines
HEAD_SHARE = 0.75               # the ranks' first lines; the rest: the rolling tail and our notes
NOTE_SHARE = 0.05
TAIL_LINES = 40
TAIL_LINE_CHARS = 400           # a line in the tail is cut past this (it is whole in the log file)
MERGE_WINDOW = 1.0              # seconds identical lines of several ranks are waited for


@dataclass
class Merged:
    """One line to show: its text, the stream, and every local rank that printed it."""
    stream: str
    text: str
    ranks: list[int]
    first_at: float


class LineMerger:
    """Holds each line up to ``window`` seconds, so that the same line from other ranks joins it."""

    def __init__(self, world: int, window: float = MERGE_WINDOW) -> None:
        self.world = world
        self.window = window
        self.pending: collections.OrderedDict[tuple[str, str], Merged] = collections.OrderedDict()

    def add(self, local_rank: int, stream: str, text: str, now: float) -> list[Merged]:
        """Take a line; returns what is ready now (in the order the lines came)."""
        if self.world < 2:
            return self.due(now) + [Merged(stream, text, [local_rank], now)]
        key = (stream, text)
        ready = self.due(now)
        entry = self.pending.get(key)
        if entry is not None and local_rank in entry.ranks:   # the same rank again: the first goes out first
            ready += self._release_through(key)
            entry = None
        if entry is None:
            self.pending[key] = Merged(stream, text, [local_rank], now)
            return ready
        entry.ranks.append(local_rank)
        if len(entry.ranks) == self.world:   # every rank printed it: nothing more can join
            ready += self._release_through(key)
        return ready

    def due(self, now: float) -> list[Merged]:
        """Lines that waited their window, in order (a later line never overtakes an earlier one)."""
        ready = []
        while self.pending:
            key, entry = next(iter(self.pending.items()))
            if now - entry.first_at < self.window:
                break
            ready.append(self.pending.pop(key))
        return ready

    def drain(self) -> list[Merged]:
        ready = list(self.pending.values())
        self.pending.clear()
        return ready

    def _release_through(self, key: tuple[str, str]) -> list[Merged]:
        """``key``'s line and every line that came before it (order kept)."""
        ready = []
        while self.pending:
            first, entry = self.pending.popitem(last=False)
            ready.append(entry)
            if first == key:
                break
        return ready


def ranks_tag(ranks: list[int]) -> str:
    """'[rank 3] ', '[ranks 0-7] ', '[ranks 0, 2, 5] ' (global ranks, sorted)."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"[rank {ordered[0]}] "
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"[ranks {ordered[0]}-{ordered[-1]}] "
    return "[ranks " + ", ".join(str(rank) for rank in ordered) + "] "


@dataclass
class CellBudget:
    """Where each line goes: appended to the cell (within its rank's share of the head) or to the
    rolling tail; ``total`` None: every line is appended (``cell_output="all"``)."""
    total: int | None
    ranks: int
    used: dict[int, int] = field(default_factory=dict)       # local rank -> bytes appended
    notes_used: int = 0
    held: dict[int, int] = field(default_factory=dict)       # local rank -> lines only in its log file
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))

    @property
    def share(self) -> float:
        assert self.total is not None
        return self.total * HEAD_SHARE / max(1, self.ranks)

    def admit(self, local_rank: int, line: str) -> bool:
        """True: append ``line`` to the cell; False: it went to the tail (and the rank's count)."""
        if self.total is None:
            return True
        size = len(line.encode("utf-8", "replace"))
        if self.used.get(local_rank, 0) + size <= self.share:
            self.used[local_rank] = self.used.get(local_rank, 0) + size
            return True
        self.held[local_rank] = self.held.get(local_rank, 0) + 1
        self.tail.append(line if len(line) <= TAIL_LINE_CHARS else line[:TAIL_LINE_CHARS] + " [cut here: whole "
                         "in the log file]")
        return False

    def admit_note(self, note: str) -> bool:
        """Our own note (lines over the per-second cap): appended while its share lasts."""
        if self.total is None:
            return True
        size = len(note.encode("utf-8", "replace"))
        if self.notes_used + size <= self.total * NOTE_SHARE:
            self.notes_used += size
            return True
        return False

    @property
    def held_lines(self) -> int:
        return sum(self.held.values())

    def tail_text(self, where: str, late_note: str = "") -> str:
        """The rolling tail: what is only in the log files and where, then the last lines."""
        counts = ", ".join(f"rank {rank}: {count:,}" for rank, count in sorted(self.held.items()))
        head = (f"[notebook_launch] this run's output in the cell is bounded (cell_output={self.total:,} bytes); "
                f"{self.held_lines:,} more lines ({counts}) are only in the log files in {where}. "
                f"The last {len(self.tail)}:")
        return "\n".join([head, *self.tail] + ([late_note] if late_note else []))
