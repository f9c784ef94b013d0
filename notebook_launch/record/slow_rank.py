"""Which rank holds the others back: the verdict from each rank's pace (issues 34, 47), pure.

Each rank counts its collective calls and the time it spends inside them (``rank.reports.pace``, from
the same wrapped collectives the hang bookkeeping keeps) and sends the totals about once a
second. A collective returns only once every rank of the group entered it, so the time a rank
spends inside one is mostly time spent waiting for the last rank to arrive; the last one to
arrive waits least.

- A rank's **step** is one call of the collective it calls most often (a training loop's
  per-step ``all_reduce``); its **step rate** is that collective's calls a second, shown with
  its name ("12.5 all_reduce/s"). Its **waiting share** is the part of its time spent inside
  collectives. Both are on its row, over the whole run (or the live window).
- The verdict is not read from those totals: it is read from **stretches**, the spans between
  the samples a rank sends that hold at least one returned call and ``STRETCH_SECONDS`` (about
  a second each in a fast loop, one step each when a step takes longer; a long wait inside one
  collective is one stretch, however long). Each stretch has its own waiting share, and a rank's
  **spread** is their quartiles, each stretch counted once: ``low`` (a quarter of its stretches
  waited less), ``typical`` (the median) and ``high``.
- A rank **holds the others back** when (1) its typical share is at least ``SHARE_GAP`` below
  the most-waiting rank's (the others are the "waiters"), (2) the waiters typically spend at
  least ``HELD_BACK`` of their time waiting, (3) it waits less than they do in most stretches:
  its ``high`` is below the waiters' ``low`` (the waiters' median of it), and (4) its own work
  per step is at least ``SLOWER`` times theirs. The ranks make the same calls, so their steps
  take the same time, and the work per step compares as the time outside collectives does:
  (1 - its typical share) / (1 - theirs): the ratio shown ("1.8x"). When the waiters work less
  than ``MIN_WORK`` of their time that division says nothing, and no ratio is shown. The
  waiters' share shown is their median typical share, and the collective named is the one they
  spent most time waiting in.
- A rank with **no pace at all** while the others spend at least ``NOT_REACHED_SHARE`` of
  their time inside collectives has not reached a collective: they wait for it.

Why stretches and quartiles, not the whole run's totals (issue 47): on 13 of 16 runs of
Accelerate's examples, the same work on two ranks, the totals named "rank N is the slowest
(1.3-4.8x)", and ">100x" on tiny runs. A real loop's totals are moved by a few events: rank 0
prepares the data while rank 1 waits in one barrier (``main_process_first``), rank 0 alone
evaluates or logs now and then, the OS runs one rank late for a while and then the other
(2 ranks on 2 cores beside the notebook). A few seconds of one rank waiting are a large part of
a short run's total, and a near-zero work (a rank that did nothing but wait) divided into
another gives any ratio at all. As stretches, each such event is one stretch, or a few, among
many (counted once each, not by their length: a 30 s wait in a barrier is one event), so a
quartile barely moves for them: a rank is named only when it is behind in about three stretches
of four (its ``high`` below the waiters' ``low``), the waiters lose a real part of their time
(waiting 10% is not being held back), and a rank slow only while it loaded its data stops being
named once those stretches are under a quarter of the run's. The evidence:
``tests/test_slow_rank_loops.py`` drives the rank side's real counters through such loops
(``tests/helpers/pace_runs.py``): the totals named a rank in each (1.4x, ">100x"), the stretches
name nobody, and still name a rank 1.5x slower at every step (1.5x). A real 2-rank run of that
shape (``test_slow_rank_launch``: rank 0 prepares 2 s, evaluates 0.5 s twice) had rank 1 waiting
44% of its time in all ("rank 0 is the slowest (1.6x)"), but typically 16-19% of a stretch
against rank 0's 10-12%.

Nothing is said with fewer than two ranks, before each compared rank has ``MIN_STRETCHES``
stretches and ``MIN_CALLS`` calls in ``MIN_SECONDS`` (a tiny run says nothing), or when the
ranks wait alike (a run whose collectives are slow for every rank is not held back by one).
Live, the panel compares each rank's last ``WINDOW`` seconds (and at least its last
``MIN_STRETCHES`` stretches); the final picture compares the whole run. Memory is bounded for a
run of any length: the whole run's stretches are counted in ``SHARE_BINS`` bins
(``ShareTally``), and only the window's are kept one by one. Pure: data in, a verdict out, no
process (``PaceHistory`` folds the samples the ranks send; ``verdict`` decides), so every shape is
tested from plain data.
"""
from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

WINDOW = 20.0            # seconds of each rank's recent samples the live verdict compares
MIN_SECONDS = 1.0        # a rank's pace over less than this says nothing yet
MIN_CALLS = 3            # nor over fewer collective calls
MIN_STRETCHES = 5        # nor over fewer stretches: the verdict needs this many (a tiny run says nothing)
STRETCH_SECONDS = 0.5    # a stretch spans at least this (a sample's worth: a rank's last flush is no stretch)
SLOWER = 1.3             # a rank whose own work per step is this many times the waiters' holds them back...
SHARE_GAP = 0.15         # ...when the waiters' typical share of time inside collectives is this much above its own
HELD_BACK = 0.25         # ...and at least this: waiting 10% of the time is not being held back
MIN_WORK = 0.05          # waiters working less than this part of their time give no ratio (not ">100x")
NOT_REACHED_SHARE = 0.5  # a rank with no pace is waited for when the others spend this much inside collectives
SHARE_BINS = 50          # the whole run's stretches are counted in this many bins of waiting share


@dataclass(frozen=True)
class Spread:
    """How a rank's waiting share varies from stretch to stretch, each stretch counted once."""
    stretches: int
    low: float       # a quarter of its stretches waited less than this part of their time
    typical: float   # half of them
    high: float      # three quarters

    @classmethod
    def of(cls, shares: Iterable[float]) -> Spread:
        """The spread of these stretches' shares (each 0 to 1)."""
        tally = ShareTally()
        for share in shares:
            tally.add(share)
        return tally.spread()


@dataclass
class ShareTally:
    """Stretches' waiting shares counted in ``SHARE_BINS`` bins, with each bin's sum: the same
    memory for a run of hours as for a minute. A quartile reads the mean share of the bin it falls
    in (exact when that bin's stretches waited alike, within 1/SHARE_BINS otherwise)."""
    counts: list[int] = field(default_factory=lambda: [0] * SHARE_BINS)
    sums: list[float] = field(default_factory=lambda: [0.0] * SHARE_BINS)

    def add(self, share: float) -> None:
        share = min(1.0, max(0.0, share))
        index = min(SHARE_BINS - 1, int(share * SHARE_BINS))
        self.counts[index] += 1
        self.sums[index] += share

    def quantile(self, q: float) -> float:
        """The share of the stretch at rank ceil(q * n) (nearest rank), 0 for none."""
        wanted = max(1, math.ceil(q * sum(self.counts)))
        seen = 0
        for count, total in zip(self.counts, self.sums):
            seen += count
            if count and seen >= wanted:
                return total / count
        return 0.0

    def spread(self) -> Spread:
        return Spread(stretches=sum(self.counts), low=self.quantile(0.25), typical=self.quantile(0.5),
                      high=self.quantile(0.75))


@dataclass(frozen=True)
class RankPace:
    """One rank's collectives over a span of its time."""
    rank: int
    seconds: float                                   # the span, on the rank's clock
    ops: Mapping[str, tuple[int, float]]             # collective -> (calls, seconds inside it)
    inside: str | None = None                        # the collective it is inside at the span's end
    spread: Spread | None = None                     # its stretches' waiting shares over the span

    @property
    def calls(self) -> int:
        return sum(calls for calls, _ in self.ops.values())

    @property
    def waiting(self) -> float:
        return sum(seconds for _, seconds in self.ops.values())

    @property
    def share(self) -> float:
        """The part of its time spent inside collectives (0 to 1)."""
        return min(1.0, max(0.0, self.waiting / self.seconds)) if self.seconds > 0 else 0.0

    @property
    def step(self) -> str | None:
        """The collective it calls most often (ties: the one it waited in longest)."""
        called = [(calls, seconds, name) for name, (calls, seconds) in self.ops.items() if calls]
        return max(called)[2] if called else None

    @property
    def steps(self) -> int:
        step = self.step
        return self.ops[step][0] if step is not None else 0

    @property
    def step_rate(self) -> float | None:
        """Calls a second of its step collective."""
        return self.steps / self.seconds if self.seconds > 0 and self.steps else None

    def measured(self) -> bool:
        return (self.seconds >= MIN_SECONDS and self.calls >= MIN_CALLS and self.spread is not None
                and self.spread.stretches >= MIN_STRETCHES)


@dataclass(frozen=True)
class SlowVerdict:
    """Who holds the others back, by how much, and how long the others wait for them."""
    slow: tuple[tuple[int, float | None], ...]   # (rank, its work per step against the waiters'; None: unknown)
    waiting: tuple[int, ...]                     # the ranks that wait for them
    share: float                                 # the waiters' typical share of time inside collectives
    op: str | None                               # the collective they wait in most
    not_reached: bool = False                    # the slow ranks have not reached a collective

    @property
    def text(self) -> str:
        """'rank 2 is the slowest (1.8x); ranks 0, 1, 3 spend 44% of their time waiting for it in
        all_reduce' (no ratio where none is known)."""
        slow = [rank for rank, _ in self.slow]
        one = len(slow) == 1
        if self.not_reached:
            first = f"{_ranks(slow)} {'has' if one else 'have'} not reached a collective yet"
        else:
            known = any(ratio is not None for _, ratio in self.slow)
            ratios = f" ({', '.join(_ratio(ratio) for _, ratio in self.slow)})" if known else ""
            first = f"{_ranks(slow)} {'is' if one else 'are'} the slowest{ratios}"
        waiters = _ranks(list(self.waiting))
        spends = "spends" if len(self.waiting) == 1 else "spend"
        their = "its" if len(self.waiting) == 1 else "their"
        where = f" in {self.op}" if self.op else ""
        return (f"{first}; {waiters} {spends} {round(self.share * 100)}% of {their} time waiting for "
                f"{'it' if one else 'them'}{where}")


def verdict(paces: Mapping[int, RankPace | None]) -> SlowVerdict | None:
    """The slow rank(s), from each rank's pace over comparable spans (rank -> its pace, None for
    a rank that sent none), or None when no rank holds the others back (see the module)."""
    if len(paces) < 2:
        return None
    sent = {rank: pace for rank, pace in paces.items() if pace is not None and pace.seconds > 0}
    missing = sorted(rank for rank, pace in paces.items() if pace is None)
    if missing:
        return _not_reached(missing, sent)
    spreads = {rank: pace.spread for rank, pace in sent.items() if pace.measured() and pace.spread is not None}
    if len(spreads) < 2 or len(spreads) < len(paces):
        return None
    top = max(spread.typical for spread in spreads.values())
    candidates = [rank for rank, spread in spreads.items() if spread.typical <= top - SHARE_GAP]
    waiters = sorted(rank for rank in spreads if rank not in candidates)
    held = statistics.median(spreads[rank].typical for rank in waiters)
    if not candidates or held < HELD_BACK:
        return None
    their_low = statistics.median(spreads[rank].low for rank in waiters)
    their_work = 1.0 - held
    slow = []
    for rank in candidates:
        ratio = (1.0 - spreads[rank].typical) / max(their_work, MIN_WORK)
        if spreads[rank].high < their_low and ratio >= SLOWER:
            slow.append((ratio, rank))
    if not slow:
        return None
    slow.sort(key=lambda item: (-item[0], item[1]))
    # a candidate not slow enough to name (between the two) is neither named nor counted as waiting
    return SlowVerdict(slow=tuple((rank, ratio if their_work >= MIN_WORK else None) for ratio, rank in slow),
                       waiting=tuple(waiters), share=held, op=_waited_in(sent[rank] for rank in waiters))


def _not_reached(missing: list[int], sent: dict[int, RankPace]) -> SlowVerdict | None:
    waiters = sorted(rank for rank, pace in sent.items() if pace.seconds >= MIN_SECONDS)
    if not waiters or len(waiters) < len(sent):
        return None
    share = statistics.median(sent[rank].share for rank in waiters)
    if share < NOT_REACHED_SHARE:
        return None
    return SlowVerdict(slow=tuple((rank, None) for rank in missing), waiting=tuple(waiters), share=share,
                       op=_waited_in(sent[rank] for rank in waiters), not_reached=True)


def _waited_in(paces: Any) -> str | None:
    totals: dict[str, float] = collections.defaultdict(float)
    for pace in paces:
        for name, (_, seconds) in pace.ops.items():
            totals[name] += seconds
    return max(totals, key=lambda name: totals[name]) if totals else None


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(rank) for rank in ranks)


def _ratio(ratio: float | None) -> str:
    if ratio is None:
        return "?"
    if ratio == float("inf") or ratio >= 100:
        return ">100x"
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


def row_text(pace: RankPace | None) -> str:
    """A rank's pace in a few words for its row: '12.5 all_reduce/s, 44% waiting'; a rate only
    over ``MIN_CALLS`` calls of its step in ``MIN_SECONDS`` (one barrier read "752.6 barrier/s,
    100% waiting", one final all_gather "371 all_gather/s": not a pace, one call's length)."""
    if pace is None or pace.seconds <= 0:
        return ""
    rate, step = pace.step_rate, pace.step
    if rate is None or step is None or pace.steps < MIN_CALLS or pace.seconds < MIN_SECONDS:
        return f"in {pace.inside}" if pace.inside else ""
    speed = f"{rate:.1f} {step}/s" if rate >= 1 else f"{1 / rate:.2f} s/{step}"
    return f"{speed}, {round(pace.share * 100)}% waiting"


def only_waiting(payload: Any) -> bool:
    """Whether a PROGRESS payload says nothing but that the rank still waits inside the same
    collective: no sign of progress for stall detection (a hung all_reduce stays quiet)."""
    if not isinstance(payload, Mapping) or payload.get("bars") or payload.get("metrics") or payload.get("series"):
        return False
    pace = payload.get("pace")
    return isinstance(pace, Mapping) and pace.get("moved") is False


# --- folding the samples a rank sends ------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """A rank's cumulative totals at ``at`` (its clock): see ``rank.reports.pace`` for the payload."""
    at: float
    ops: Mapping[str, tuple[int, float]]
    inside: str | None = None

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Sample:
        ops = {str(name): (int(tally[0]), float(tally[1])) for name, tally in dict(payload.get("ops") or {}).items()}
        return cls(at=float(payload["at"]), ops=ops, inside=payload.get("inside"))


def span(rank: int, old: Sample, new: Sample) -> RankPace:
    """The pace between two samples of one rank."""
    ops = {}
    for name, (calls, seconds) in new.ops.items():
        before = old.ops.get(name, (0, 0.0))
        ops[name] = (max(0, calls - before[0]), max(0.0, seconds - before[1]))
    return RankPace(rank=rank, seconds=max(0.0, new.at - old.at), ops=ops, inside=new.inside)


@dataclass
class PaceHistory:
    """One rank's samples as the notebook received them: the first (or zero, when the rank says
    it is its first: it counts from its first collective) for the whole run, those of the last
    ``WINDOW`` seconds for the live window, and its stretches: every one of the run counted in
    ``stretches``, the recent ones (the window's, and at least ``MIN_STRETCHES``) one by one."""
    start: Sample | None = None
    recent: collections.deque[Sample] = field(default_factory=collections.deque)
    opened: Sample | None = None                     # where the stretch under way began
    stretches: ShareTally = field(default_factory=ShareTally)
    last_stretches: collections.deque[tuple[float, float]] = field(default_factory=collections.deque)  # (end, share)

    def add(self, payload: Mapping[str, Any]) -> None:
        try:
            sample = Sample.from_payload(payload)
        except (KeyError, TypeError, ValueError, IndexError):
            return   # a sample from another version of the rank side: no pace rather than a failure
        if self.start is None:
            since = payload.get("since")
            self.start = Sample(at=float(since), ops={}) if payload.get("first") and since is not None else sample
            self.recent.append(self.start)
            self.opened = self.start
        self.recent.append(sample)
        while len(self.recent) > 2 and self.recent[1].at <= sample.at - WINDOW:
            self.recent.popleft()
        self._close_stretch(sample)

    def _close_stretch(self, sample: Sample) -> None:
        """End the stretch under way at this sample if it holds a returned call and STRETCH_SECONDS."""
        if self.opened is None:
            return
        stretch = span(-1, self.opened, sample)
        if stretch.calls < 1 or stretch.seconds < STRETCH_SECONDS:
            return
        self.opened = sample
        self.stretches.add(stretch.share)
        self.last_stretches.append((sample.at, stretch.share))
        while len(self.last_stretches) > MIN_STRETCHES and self.last_stretches[0][0] <= sample.at - WINDOW:
            self.last_stretches.popleft()

    def whole_run(self, rank: int) -> RankPace | None:
        if self.start is None:
            return None
        return _with_spread(span(rank, self.start, self.recent[-1]), self.stretches.spread())

    def window(self, rank: int) -> RankPace | None:
        if not self.recent:
            return None
        spread = Spread.of(share for _, share in self.last_stretches)
        return _with_spread(span(rank, self.recent[0], self.recent[-1]), spread)


def _with_spread(pace: RankPace, spread: Spread) -> RankPace:
    return RankPace(rank=pace.rank, seconds=pace.seconds, ops=pace.ops, inside=pace.inside, spread=spread)
