"""Run state: what the supervisor knows about a run, folded from rank events.

Displays only read it. Keeping the model apart from how it is drawn lets the
widget, HTML, rich and text displays (and tests) share one source of truth.
The methods here are the only writers of the rank fields.
"""
from __future__ import annotations

import collections
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from . import group_join
from .metrics import Series, fold_series
from .slow_rank import PaceHistory
from .resources import MachineMemory, RankUsage

if TYPE_CHECKING:
    from ..wire.plan import RankSpec


class Status(str, enum.Enum):
    """A rank's or a run's status, in the order a rank normally goes through them.
    A str, so displays compare and print it as its value."""
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


STARTING, RUNNING, DONE, FAILED, STOPPED = (Status.STARTING, Status.RUNNING, Status.DONE,
                                            Status.FAILED, Status.STOPPED)

RECENT_LINES = 200
MAX_BARS = 32   # a loop that makes a new bar per epoch must not grow the state without bound


@dataclass
class Bar:
    """One progress bar of one rank."""
    id: str
    desc: str = ""
    n: float = 0
    total: float | None = None
    unit: str = "it"
    rate: float | None = None   # units per second, as measured in the rank
    elapsed: float = 0.0        # seconds since the bar started, in the rank
    closed: bool = False
    moved: int = 0              # the rank's fold number when the bar last opened or advanced
    nested: int = 0             # how many bars opened and closed while this one was open (outer loops
                                # have many); counted in the rank, the one place that knows the order of events
    inner: bool = False         # it closed while a bar open before it still was: an inner loop
    opened: float = 0.0         # when it opened and closed, on the rank's clock: bars that ran side by
    ended: float | None = None  # side overlap (two tasks of one rich Progress)

    def overlaps(self, other: "Bar") -> bool:
        """Whether the two bars were open at the same time (both of one rank)."""
        return self.opened < (other.ended if other.ended is not None else float("inf")) and \
            other.opened < (self.ended if self.ended is not None else float("inf"))

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, self.n / self.total)

    @property
    def eta(self) -> float | None:
        if not self.total or not self.rate:
            return None
        return max(0.0, (self.total - self.n) / self.rate)


@dataclass
class RankState:
    rank: int                    # global rank
    local_rank: int
    device: str = "cpu"
    pid: int | None = None
    node: str = ""                        # where the rank runs when that is not this machine (Ray)
    node_rank: int | None = None          # its node's index there (NODE_RANK)
    status: Status = STARTING
    bars: dict[str, Bar] = field(default_factory=dict)          # id -> Bar, in creation order
    metrics: dict[str, Any] = field(default_factory=dict)       # name -> scalar
    curves: dict[str, Series] = field(default_factory=dict)     # name -> decimated curve (numeric metrics)
    lines: collections.deque[tuple[str, str]] = field(default_factory=lambda: collections.deque(maxlen=RECENT_LINES))
    exit_description: str | None = None   # e.g. "exit code 0", "killed by SIGKILL"
    error: str | None = None              # one line: "ValueError: boom"
    updates: int = 0                      # progress events folded, for displays that diff
    stalled_since: float | None = None    # monotonic time of its last sign of progress, while stalled
    pace: PaceHistory = field(default_factory=PaceHistory)   # its collectives' calls and waits (slow_rank)
    resources: RankUsage | None = None    # its CPU, memory and GPU as last sampled (by itself on another machine)
    own_memory_shown: bool = True   # every row says memory one way: own of resident only when all ranks' own is known
    phase: str = ""                 # what it does while it starts ('importing torch'), said by the notebook or the rank
    group_join: str = ""            # '', 'joining', 'joined': its init_process_group (group_join.py)

    def stalled_for(self, now: float | None = None) -> float | None:
        """Seconds this rank has shown no sign of progress while it still runs, or None: the one
        answer the panel's row, its status and a stop's report give (a rank that ended is never
        stalled, whatever mark the last stall check left)."""
        if self.stalled_since is None or self.status not in (RUNNING, STARTING):
            return None
        return max(0.0, (time.monotonic() if now is None else now) - self.stalled_since)

    @property
    def last_line(self) -> str:
        return self.lines[-1][1] if self.lines else ""

    @property
    def main_bar(self) -> "Bar | None":
        """The bar a rank's row shows: the open bar that moved last (ties: the newest, the
        innermost loop), so the row follows whatever the rank is doing now: Lightning's
        validation bar while it validates, its training bar again after. When every bar is
        closed, the outermost loop: the bar most others ran inside (the epochs around the
        steps, the training around each validation), then the longest (to when its work was
        done: of two tasks side by side, the one that finished last), so a run never ends on a
        short loop that merely came first (Lightning's "Sanity Checking 2/2")."""
        best: Bar | None = None
        for bar in self.bars.values():
            if not bar.closed and (best is None or bar.moved >= best.moved):
                best = bar
        if best is not None:
            return best
        outer = [bar for bar in self.bars.values() if not bar.inner] or list(self.bars.values())
        for bar in outer:
            if best is None or (bar.nested, bar.elapsed) > (best.nested, best.elapsed):
                best = bar
        return best

    def other_bars(self, limit: int = 2) -> list[Bar]:
        """The bars besides ``main_bar`` for a compact mention on the same row (one row per rank
        keeps 8 ranks readable; see ``display.format.other_bars``): while one is open, the other
        open ones, outermost first; once all closed (the final picture), those that ran side by
        side with it (two rich tasks), never the inner loops, so no bar of the run is dropped."""
        main = self.main_bar
        if main is not None and main.closed:
            return [bar for bar in self.bars.values()
                    if bar is not main and not bar.inner and bar.overlaps(main)][:limit]
        return [bar for bar in self.bars.values() if not bar.closed and bar is not main][:limit]


@dataclass
class RunState:
    run_id: str
    world_size: int
    backend: str
    log_dir: str
    ranks: list[RankState]                # RankState per local rank
    node_rank: int = 0
    num_nodes: int = 1
    attempt: int = 0                      # restart number (0: first attempt)
    max_restarts: int = 0                 # restarts allowed (elastic path); attempts = max_restarts + 1
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None
    status: Status = RUNNING              # running, done, failed, stopped
    summary: str | None = None            # final one-line outcome
    stop_requested: bool = False          # set by a display's Stop button
    where_requested: bool = False         # set by the panel's "Where are they?" button; the supervisor answers
    where_report: str | None = None       # its answer: a one-line verdict, then every rank's stacks
    where_report_is_stall: bool = False   # ``where_report`` says where a stall found the ranks
    machine: MachineMemory | None = None  # this machine's memory as last sampled (the header shows it)

    @property
    def elapsed(self) -> float:
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at

    # --- folding -----------------------------------------------------------
    def on_ready(self, local_rank: int, payload: dict[str, Any]) -> None:
        rs = self.ranks[local_rank]
        rs.pid = payload.get("pid", rs.pid)
        rs.device = payload.get("device", rs.device)
        if rs.status == STARTING:
            rs.status = RUNNING

    def on_placed(self, local_rank: int, node_rank: int, address: str) -> None:
        """A cluster placed the rank on a node (Ray): its row says where, its line that it starts."""
        rs = self.ranks[local_rank]
        rs.node, rs.node_rank = f"node {node_rank} ({address})", node_rank
        rs.lines.append(("stdout", f"starting on {rs.node}"))

    def on_progress(self, local_rank: int, payload: dict[str, Any]) -> None:
        """Fold a batched progress event: {"bars": {id: {...}}, "metrics": {...}}."""
        rs = self.ranks[local_rank]
        fold = rs.updates + 1
        for bar_id, fields in payload.get("bars", {}).items():
            bar = rs.bars.get(bar_id)
            if bar is None:
                bar = rs.bars[bar_id] = Bar(id=bar_id, moved=fold)
            elif "n" in fields and fields["n"] != bar.n:
                bar.moved = fold
            for key, value in fields.items():
                setattr(bar, key, value)
        rs.metrics.update(payload.get("metrics", {}))
        if payload.get("series"):
            fold_series(rs.curves, payload["series"])
        if payload.get("pace"):
            rs.pace.add(payload["pace"])
        if "phase" in payload:   # the rank's own: joining the process group (rank.group.joining)
            group_join.step(rs, payload["phase"])
            group_join.name_missing(self.ranks, self.world_size, [r.status in (STARTING, RUNNING) for r in self.ranks])
        if len(rs.bars) > MAX_BARS:
            _prune_closed_bars(rs.bars)
        rs.updates += 1
        if rs.status == STARTING:
            rs.status = RUNNING

    def on_resources(self, usage: dict[int, RankUsage], machine: MachineMemory | None) -> None:
        """A sampling round (``supervise.resources``): local rank -> its usage, and the machine's memory."""
        for local_rank, found in usage.items():
            self.ranks[local_rank].resources = found
        # One form for every row: "own of resident" only when every sampled rank's own pages were read
        # (a rank whose were not read yet once said "327.3 MiB resident" beside "17.6 MiB own of ...").
        own = all(rs.resources.peak_uss is not None for rs in self.ranks if rs.resources is not None)
        for rs in self.ranks:
            rs.own_memory_shown = own
        if machine is not None:
            self.machine = machine

    def on_stalled(self, local_rank: int, since: float | None) -> None:
        """The rank shows no sign of progress since ``since`` (None: it is not stalled)."""
        self.ranks[local_rank].stalled_since = since
        self._forget_cleared_stall()

    def _forget_cleared_stall(self) -> None:
        """A stall's report ("stalled: ... never reached it") is true while the ranks are stalled;
        once none is (they went on, or finished), the panel and the run's final picture must not
        keep saying it. What was found stays in the ranks' logs; an answer to the Where button stays."""
        if self.where_report_is_stall and all(rs.stalled_since is None for rs in self.ranks):
            self.where_report, self.where_report_is_stall = None, False

    def stalled_for(self, local_rank: int) -> float | None:
        """Seconds the rank has been stalled, or None (``RankState.stalled_for``)."""
        return self.ranks[local_rank].stalled_for()

    def on_phase(self, local_rank: int | None, text: str) -> None:
        """What rank ``local_rank`` (None: every rank) does while it starts; '' when it is done with it."""
        for rs in self.ranks if local_rank is None else [self.ranks[local_rank]]:
            rs.phase = text

    def on_where_report(self, text: str) -> None:
        """The supervisor's answer to "Where are they?" (or to a stall): the panels draw it.
        Clears the request, so the button can ask again."""
        self.where_report = text
        self.where_report_is_stall = False
        self.where_requested = False

    def on_stall_report(self, text: str) -> None:
        """Where a stall found the ranks: drawn as an answer to "Where are they?" is, until the
        stall clears (``_forget_cleared_stall``)."""
        self.on_where_report(text)
        self.where_report_is_stall = True

    def on_line(self, local_rank: int, stream: str, text: str) -> None:
        self.ranks[local_rank].lines.append((stream, text))

    def on_exit(self, local_rank: int, status: Status, description: str, error: str | None = None) -> None:
        rs = self.ranks[local_rank]
        rs.status = status
        rs.phase = ""
        rs.exit_description = description
        if error is not None:
            rs.error = error
        if status == DONE:
            for bar in rs.bars.values():
                bar.closed = True
            rs.stalled_since = None   # it finished: whatever it waited for came
            self._forget_cleared_stall()

    def finish(self, status: Status, summary: str) -> None:
        """The run's outcome (written by the run scaffold, ``run.py``, only)."""
        self.status = status
        self.summary = summary
        self.ended_at = time.monotonic()

    def begin_attempt(self, attempt: int, *, node_rank: int, num_nodes: int, world_size: int,
                      ranks: Sequence["RankSpec"]) -> None:
        """A restarted (or first) elastic attempt: ranks as elastic assigned them, fresh rows."""
        self.attempt = attempt
        self.node_rank, self.num_nodes, self.world_size = node_rank, num_nodes, world_size
        for rs, spec in zip(self.ranks, ranks):
            rs.rank, rs.status, rs.pid = spec.global_rank, STARTING, None
            rs.bars, rs.metrics, rs.curves = {}, {}, {}
            rs.pace = PaceHistory()
            rs.exit_description = rs.error = None
            rs.resources = None
            rs.phase = ""
            rs.group_join = group_join.NOT_YET


def _prune_closed_bars(bars: dict[str, Bar]) -> None:
    """Drop the oldest closed bars, keeping the first one (the run-level bar)."""
    ids = list(bars)
    for bar_id in ids[1:]:
        if len(bars) <= MAX_BARS:
            break
        if bars[bar_id].closed:
            del bars[bar_id]
