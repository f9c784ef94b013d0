"""A rank's pace: how often it calls its collectives and how long it waits inside them (issue 34).

The wrapped collectives of ``whereabouts`` (the hang bookkeeping) already run around every
``torch.distributed`` collective the rank's own code calls; they also tell this module when
one starts and ends. Two clock reads and a few additions per collective, no system call, no
lock, nothing sent: the progress flusher thread (``progress``) takes a ``sample`` at most once
a second and sends it with its PROGRESS event, and the notebook's ``pace`` module compares
the ranks.

Why the time inside a collective is waiting: a collective returns only once every rank of its
group has entered it, so a rank that enters early spends the time until the last one arrives
inside it. The rank that arrives last waits least: it is the one the others wait for. (The
time includes the transfer itself, which every rank pays alike; the notebook compares ranks,
so that part cancels out.)

What is counted, honestly:

- The collectives the rank's Python code calls: ``all_reduce``, ``broadcast``, ``barrier``...
  (``whereabouts.COLLECTIVES``), each call once (``all_gather_object``'s inner collectives are
  part of it). Not ``init_process_group``, ``new_group`` or ``destroy_process_group``, which
  are no step of a loop.
- Not the gradient all-reduces of DDP (they run in torch's C++ reducer, never through the
  Python functions), nor the wait of an ``async_op=True`` collective or ``isend``/``irecv``,
  which happens later in ``work.wait()``: a rank that waits only there shows its calls but
  little waiting.
- A "step" is one call of the collective the rank calls most often (in a training loop, its
  per-step ``all_reduce``): the step rate is that collective's calls per second, and shown
  with its name ("12.5 all_reduce/s"), so it is never mistaken for the loop's own rate (a
  progress bar's rate stays on the row as it was).

The clock starts when the rank enters its first counted collective: what came before
(imports, loading a model) is no part of its pace. Each process keeps its own (a process the
rank forks starts afresh, see ``whereabouts``); ``NOTEBOOK_LAUNCH_WHEREABOUTS=0`` leaves it
out with the rest of the bookkeeping.

A sample (the PROGRESS payload's ``"pace"``), cumulative since that first collective, on the
rank's own monotonic clock::

    {"since": first entry, "at": the time the totals hold to (now while inside a collective,
     else the last return from one), "waiting": seconds inside collectives (the current one
     too), "ops": {name: [calls, seconds inside]}, "inside": name or None, "first": True on the
     first sample the process sends (the notebook then counts from zero, not from it),
     "moved": whether a call returned since the last sample}

A sample sent while the rank waits in one collective ("moved" false) is no sign of progress:
the notebook's stall detection must still see a rank stuck in an all_reduce as quiet.
"""
from __future__ import annotations

import time
from typing import Any, Callable

SAMPLE_INTERVAL = 1.0   # seconds between samples sent: the panel's verdict needs no more
_clock = time.monotonic


class Pace:
    """One process's collective counters, written by the thread that calls the collectives and
    read by the flusher thread (``sample``): each field is a single store under the GIL, and a
    sample that straddles one call is off by that call only."""

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.since: float | None = None      # when the first counted collective was entered
        self.last = 0.0                      # when the last one returned
        self.ops: dict[str, list[Any]] = {}  # name -> [calls, seconds inside]
        self.inside: str | None = None       # the collective the rank is inside now
        self.entered = 0.0                   # when it entered it
        self.on_first = on_first             # starts whatever sends the samples (the progress flusher)
        self.sent = 0                        # samples taken for sending
        self.sent_at = -SAMPLE_INTERVAL
        self.sent_calls = -1

    def enter(self, name: str) -> float:
        """A counted collective starts; returns the time it did, for ``leave``."""
        now = _clock()
        if self.since is None:
            self.since = now
            if self.on_first is not None:
                self.on_first()
        self.entered = now   # before ``inside``: a sample that sees the name sees its time
        self.inside = name
        return now

    def leave(self, name: str, entered: float) -> None:
        now = _clock()
        self.inside = None   # first: a sample taken meanwhile misses this call, never counts it twice
        tally = self.ops.get(name)
        if tally is None:
            tally = self.ops[name] = [0, 0.0]
        tally[0] += 1
        tally[1] += now - entered
        self.last = now

    def sample(self, force: bool = False) -> dict[str, Any] | None:
        """The totals to send now, or None: nothing counted yet, less than ``SAMPLE_INTERVAL``
        since the last sample (unless ``force``: the rank's final flush), or nothing changed
        (no call returned and none is under way)."""
        since = self.since
        if since is None:
            return None
        now = _clock()
        if not force and now - self.sent_at < SAMPLE_INTERVAL:
            return None
        # the totals first, then what is under way: a call that returns meanwhile is missed by
        # this sample (the next one has it), never counted both as returned and as under way
        last = self.last
        ops = {name: [tally[0], tally[1]] for name, tally in list(self.ops.items())}
        inside = self.inside
        entered = self.entered
        calls = sum(tally[0] for tally in ops.values())
        waiting = sum(tally[1] for tally in ops.values())
        if inside is None and calls == self.sent_calls:
            return None
        at = last if calls else since
        if inside is not None:   # the wait under way counts, up to now
            current = max(0.0, now - entered)
            waiting += current
            ops.setdefault(inside, [0, 0.0])[1] += current
            at = now
        moved = calls != self.sent_calls
        self.sent += 1
        self.sent_at, self.sent_calls = now, calls
        return {"since": since, "at": at, "waiting": waiting, "ops": ops, "inside": inside,
                "first": self.sent == 1, "moved": moved}


_current: Pace | None = None


def install(pace: Pace | None) -> None:
    """This process's counters (``whereabouts`` makes one per process that keeps a record)."""
    global _current
    _current = pace


def current() -> Pace | None:
    return _current


def sample(force: bool = False) -> dict[str, Any] | None:
    """This process's sample to send, if one is due (see ``Pace.sample``)."""
    pace = _current
    return None if pace is None else pace.sample(force)
