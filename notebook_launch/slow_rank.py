"""Which rank holds the others back: the verdict from each rank's pace (issue 34), pure.

Each rank counts its collective calls and the time it spends inside them (``rank.pace``, from
the same wrapped collectives the hang bookkeeping keeps) and sends the totals about once a
second. A collective returns only once every rank of the group entered it, so the time a rank
spends inside one is mostly time spent waiting for the last rank to arrive; the last one to
arrive waits least. From that:

- A rank's **step** is one call of the collective it calls most often (a training loop's
  per-step ``all_reduce``); its **step rate** is that collective's calls a second, shown with
  its name ("12.5 all_reduce/s"). Its **waiting share** is the part of its time spent inside
  collectives. Its **time per step** is the time it spends outside collectives (its own work:
  the forward and backward pass, its data loader) per step.
- A rank **holds the others back** when its waiting share is at least ``SHARE_GAP`` below the
  most-waiting rank's, and its time per step is at least ``SLOWER`` times the median of the
  ranks that wait (the "waiters"). The ratio shown ("1.8x") is that one: its own work per
  step against theirs. The waiters' share shown is their median waiting share, and the
  collective named is the one they spent most time waiting in.
- A rank with **no pace at all** while the others spend at least ``NOT_REACHED_SHARE`` of
  their time inside collectives has not reached a collective: they wait for it.

Nothing is said with fewer than two ranks, before each compared rank has ``MIN_CALLS`` calls
in ``MIN_SECONDS``, or when the ranks wait alike (a run whose collectives are slow for every
rank is not held back by one). Live, the panel compares the last ``WINDOW`` seconds of each
rank's own clock (a rank slow only while it loaded its data stops being named); the final
picture compares the whole run. Pure: data in, a verdict out, no process (``PaceHistory`` folds
the samples the ranks send; ``verdict`` decides), so every shape is tested from plain data.
"""
from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

WINDOW = 20.0            # seconds of each rank's recent samples the live verdict compares
MIN_SECONDS = 1.0        # a rank's pace over less than this says nothing yet
MIN_CALLS = 3            # nor over fewer collective calls
SLOWER = 1.3             # a rank whose own work per step is this many times the waiters' holds them back...
SHARE_GAP = 0.15         # ...when the waiters' share of time inside collectives is this much above its own
NOT_REACHED_SHARE = 0.5  # a rank with no pace is waited for when the others spend this much inside collectives


@dataclass(frozen=True)
class RankPace:
    """One rank's collectives over a span of its time."""
    rank: int
    seconds: float                                   # the span, on the rank's clock
    ops: Mapping[str, tuple[int, float]]             # collective -> (calls, seconds inside it)
    inside: str | None = None                        # the collective it is inside at the span's end

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

    @property
    def work_per_step(self) -> float | None:
        """Seconds outside collectives (its own work) per step."""
        steps = self.steps
        return max(0.0, self.seconds - self.waiting) / steps if steps else None

    def measured(self) -> bool:
        return self.seconds >= MIN_SECONDS and self.calls >= MIN_CALLS


@dataclass(frozen=True)
class SlowVerdict:
    """Who holds the others back, by how much, and how long the others wait for them."""
    slow: tuple[tuple[int, float | None], ...]   # (rank, its work per step against the waiters'; None: no pace)
    waiting: tuple[int, ...]                     # the ranks that wait for them
    share: float                                 # the waiters' median share of time inside collectives
    op: str | None                               # the collective they wait in most
    not_reached: bool = False                    # the slow ranks have not reached a collective

    @property
    def text(self) -> str:
        """'rank 2 is the slowest (1.8x); ranks 0, 1, 3 spend 44% of their time waiting for it in
        all_reduce'."""
        slow = [rank for rank, _ in self.slow]
        one = len(slow) == 1
        if self.not_reached:
            first = f"{_ranks(slow)} {'has' if one else 'have'} not reached a collective yet"
        else:
            ratios = ", ".join(_ratio(ratio) for _, ratio in self.slow)
            first = f"{_ranks(slow)} {'is' if one else 'are'} the slowest ({ratios})"
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
    measured = {rank: pace for rank, pace in sent.items() if pace.measured()}
    if len(measured) < 2 or len(measured) < len(paces):
        return None
    top = max(pace.share for pace in measured.values())
    candidates = [rank for rank, pace in measured.items() if pace.share <= top - SHARE_GAP]
    waiters = sorted(rank for rank in measured if rank not in candidates)
    works = [measured[rank].work_per_step for rank in waiters]
    baseline = statistics.median(work for work in works if work is not None) if any(
        work is not None for work in works) else None
    if not candidates or baseline is None:
        return None
    slow = []
    for rank in candidates:
        work = measured[rank].work_per_step
        if work is not None and work >= SLOWER * baseline:
            slow.append((rank, work / baseline if baseline > 0 else float("inf")))
    if not slow:
        return None
    slow.sort(key=lambda item: (-item[1], item[0]))
    # a candidate not slow enough to name (between the two) is neither named nor counted as waiting
    return SlowVerdict(slow=tuple(slow), waiting=tuple(waiters),
                       share=statistics.median(measured[rank].share for rank in waiters),
                       op=_waited_in(measured[rank] for rank in waiters))


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
    """A rank's cumulative totals at ``at`` (its clock): see ``rank.pace`` for the payload."""
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
    """One rank's samples as the notebook received them: the first (or zero, when the rank
    says it is its first: it counts from its first collective) for the whole run, and those of
    the last ``WINDOW`` seconds for the live verdict."""
    start: Sample | None = None
    recent: collections.deque[Sample] = field(default_factory=collections.deque)

    def add(self, payload: Mapping[str, Any]) -> None:
        try:
            sample = Sample.from_payload(payload)
        except (KeyError, TypeError, ValueError, IndexError):
            return   # a sample from another version of the rank side: no pace rather than a failure
        if self.start is None:
            since = payload.get("since")
            self.start = Sample(at=float(since), ops={}) if payload.get("first") and since is not None else sample
            self.recent.append(self.start)
        self.recent.append(sample)
        while len(self.recent) > 2 and self.recent[1].at <= sample.at - WINDOW:
            self.recent.popleft()

    def whole_run(self, rank: int) -> RankPace | None:
        if self.start is None:
            return None
        return span(rank, self.start, self.recent[-1])

    def window(self, rank: int) -> RankPace | None:
        if not self.recent:
            return None
        return span(rank, self.recent[0], self.recent[-1])
