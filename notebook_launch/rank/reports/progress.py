"""In-rank progress API: ``for batch in progress(loader, desc="train")``.

Inside a launched rank every bar reports to the parent's panel; outside a
launch ``progress`` is a plain pass-through (iterating costs nothing extra).

Why it is cheap: the loop only counts and compares with a threshold (no
clock read, no lock, no I/O per item). Every few milliseconds of work the
bar publishes its count; one daemon "flusher" thread per rank batches what
changed and sends at most ``MAX_SENDS_PER_SECOND`` PROGRESS events to the
parent, whatever the step rate. A final flush happens when a bar closes
(queued) and when the rank ends (``flush()``, called by the worker before
RESULT/ERROR, so the parent's last state is exact).

Bars are the rank's own. A process the rank forks (a DataLoader worker, a
multiprocessing pool's worker) inherits the channel, but its bars are not
drawn: they iterate as outside a launch. Its bars would otherwise share the
rank's row, and the row follows the bar that moved last: a worker's per-item
bars would stand where the rank's loader bar belongs (and its reporter, a new
one, would number its bars from "b0" again, over the rank's). Its metrics
(``log``) still reach the rank's row.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from typing import Any, Iterable, Iterator

from ...wire import protocol
from ...wire.fork_locks import ForkRenewedLock
from . import pace

log_ = logging.getLogger("notebook_launch")

MAX_SENDS_PER_SECOND = 10
SEND_INTERVAL = 1.0 / MAX_SENDS_PER_SECOND
CHECK_TARGET = 0.02      # aim to publish a bar's count about every 20 ms of loop time
MAX_CHECK_EVERY = 1 << 20
STALE_AFTER = 0.5        # a bar silent this long gets checked on its very next step
# A rate is measured over at least this long: the Trainer's first update moves its bar 0 -> 2 in one
# call, and a send microseconds later divided 2 by microseconds (7,378 step/s for 43), which the
# smoothing carried to the end of a short run.
RATE_SPAN = 0.5

_monotonic = time.monotonic


def scalar(value: Any) -> Any:
    """Metrics become plain Python scalars right away (a tensor is read now, not later)."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:   # why: a metric whose item() fails is tried as float()
            log_.debug("metric %r has an item() that failed; trying float()", type(value), exc_info=True)
    try:
        return float(value)
    except Exception:   # why: a metric that is no number is shown as text
        log_.debug("metric of type %s is shown as text", type(value).__name__)
        return str(value)[:80]


def series_of(logged: list[dict[str, Any]]) -> dict[str, list[int | float]]:
    """Every numeric value logged since the last send, by metric, in logging order: the
    curves and metrics.jsonl get every point, though events go out at most 10 times a second."""
    series: dict[str, list[int | float]] = {}
    for metrics in logged:
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values = series.get(name)
                if values is None:
                    values = series[name] = []
                values.append(value)
    return series


class _Reporter:
    """The rank's single batching point between bars and the event channel."""

    def __init__(self, writer: protocol.EventWriter) -> None:
        self.writer = writer
        self.pid = os.getpid()
        # A process the rank forked has the rank's writer: its bars are not drawn (see the module)
        self.draws_bars = getattr(writer, "pid", self.pid) == self.pid
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()   # take-and-send is one step: events leave in logging order
        self.live: dict[str, Progress] = {}    # bar id -> bar (open bars)
        self.dirty: dict[str, Progress] = {}   # bar id -> bar whose fields changed
        self.metrics: dict[str, Any] = {}            # latest value of each metric not yet sent
        self.logged: list[dict[str, Any]] = []       # every log() call's metrics since the last send
        self.sent: dict[str, dict[str, Any]] = {}    # bar id -> last fields sent
        self.ids = itertools.count()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.sends = 0

    def register(self, bar: Progress) -> str:
        with self.lock:
            bar_id = f"b{next(self.ids)}"
            bar._outers = tuple(self.live)   # the bars open around it (see ``closed``)
            self.live[bar_id] = bar
            self.dirty[bar_id] = bar
        self._ensure_thread()
        return bar_id

    def touch(self, bar: Progress) -> None:
        self.dirty[bar._id] = bar   # dict assignment is atomic under the GIL

    def closed(self, bar: Progress) -> None:
        with self.lock:
            self.live.pop(bar._id, None)
            # Nesting is counted here, where the order of events is known (a batch holds a bar's
            # latest fields only): a bar that opened and closed while another was open ran inside
            # it (a step loop in an epoch loop, a validation in training). Two bars that ran side
            # by side (two tasks of one rich Progress, closed together when it stops) are not nested.
            for outer_id in bar._outers:
                outer = self.live.get(outer_id)
                if outer is not None:
                    outer._nested += 1
                    self.dirty[outer_id] = outer
                    bar._inner = True
            self.dirty[bar._id] = bar
        self.wake.set()

    def log(self, metrics: dict[str, Any]) -> None:
        with self.lock:
            self.metrics.update(metrics)
            self.logged.append(metrics)
        if self.thread is None:   # log() without any bar: the flusher still sends (and frees) them
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            thread = threading.Thread(target=self._run, name="notebook_launch-progress", daemon=True)
            self.thread = thread
            thread.start()

    def _run(self) -> None:
        while True:
            self.wake.wait(SEND_INTERVAL)
            self.wake.clear()
            if protocol.current() is not self.writer:   # the channel was replaced or removed
                return
            started = _monotonic()
            try:
                self.flush()
            except Exception:   # why: the parent went away: nothing left to report to
                log_.debug("progress events cannot be sent any more; the flusher stops", exc_info=True)
                return
            self._poke_stale(started)
            time.sleep(max(0.0, SEND_INTERVAL - (_monotonic() - started)))

    def _poke_stale(self, now: float) -> None:
        """A loop that slowed down a lot would not publish for a long time: make it check now."""
        for bar in list(self.live.values()):
            if now - bar._checked_at > STALE_AFTER:
                bar._next_check = 0

    def payload(self, final: bool = False) -> dict[str, Any] | None:
        with self.lock:
            dirty, self.dirty = self.dirty, {}
            metrics, self.metrics = self.metrics, {}
            logged, self.logged = self.logged, []
        bars = {}
        for bar_id, bar in dirty.items():
            fields = bar._fields()
            last = self.sent.get(bar_id, {})
            changed = {k: v for k, v in fields.items() if last.get(k) != v}
            if changed:
                bars[bar_id] = changed
                last.update(changed)
                self.sent[bar_id] = last
            if fields["closed"]:
                self.sent.pop(bar_id, None)
        # the rank's collective calls and waits, once a second (``pace``): its own process's only
        pace_sample = pace.sample(force=final) if self.draws_bars else None
        if not bars and not metrics and pace_sample is None:
            return None
        data = {"bars": bars, "metrics": metrics, "series": series_of(logged)}
        if pace_sample is not None:
            data["pace"] = pace_sample
        return data

    def flush(self, final: bool = False) -> None:
        """Send what changed now (one PROGRESS event at most); ``final``: the rank's last."""
        if os.getpid() != self.pid:
            return
        # The flusher thread and the rank's final flush() may both get here: without the lock
        # the batch taken first could be sent second, and values would reach the file out of order.
        with self.send_lock:
            for bar in list(self.live.values()):
                bar._publish(_monotonic())
            data = self.payload(final)
            if data is not None:
                self.writer.send(protocol.PROGRESS, data)
                self.sends += 1


_reporter: _Reporter | None = None
_reporter_lock = ForkRenewedLock()   # a forked child (a DataLoader worker) makes its own reporter


def reporter() -> _Reporter | None:
    """The rank's reporter, or None outside a launch (or in a process a rank forked)."""
    global _reporter
    writer = protocol.current()
    if writer is None:
        return None
    rep = _reporter
    if rep is not None and rep.writer is writer and rep.pid == os.getpid():
        return rep
    with _reporter_lock:
        if _reporter is None or _reporter.writer is not writer or _reporter.pid != os.getpid():
            _reporter = _Reporter(writer)
        return _reporter


def flush() -> None:
    """Send every bar's final count now; the worker calls this before RESULT or ERROR."""
    rep = _reporter
    if rep is not None and rep.pid == os.getpid():
        for bar in list(rep.live.values()):
            bar._checked_at = _monotonic()
        rep.flush(final=True)


def keep_sending() -> None:
    """Start the flusher thread if no bar or metric has yet: the rank's first collective calls
    this, so its pace reaches the panel though its loop has no bar."""
    rep = reporter()
    if rep is not None and rep.draws_bars:
        rep._ensure_thread()


def log(**metrics: Any) -> None:
    """Show scalars (loss=..., lr=...) on this rank's row; a no-op outside a launch."""
    rep = reporter()
    if rep is not None and metrics:
        rep.log({k: scalar(v) for k, v in metrics.items()})


class Progress:
    """A progress bar for the panel: ``for x in progress(it, desc="train")`` or manual ``update(n)``.

    Metrics: ``update(1, loss=l)``, ``set_postfix(loss=l)`` or ``log(loss=l)``.
    Outside a launch nothing is reported and iteration is the iterable's own.
    """

    def __init__(self, iterable: Iterable[Any] | None = None, desc: str = "", total: float | None = None,
                 unit: str = "it", initial: float = 0) -> None:
        self.iterable = iterable
        self.desc = desc or ""
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self.total = total
        self.unit = unit
        self.n = initial
        self.closed = False
        self._nested = 0   # bars that opened and closed while this one was open (outer loops have many)
        self._outers: tuple[str, ...] = ()   # ids of the bars open when this one opened
        self._inner = False                  # it closed inside one of them: an inner loop
        self._finished_at: float | None = None   # when n first reached total (its work was done)
        self._started = _monotonic()
        self._checked_at = self._started
        self._check_every = 1
        self._next_check = initial + 1
        rep = reporter()
        self._reporter = rep if rep is not None and rep.draws_bars else None
        self._id: str = self._reporter.register(self) if self._reporter is not None else ""
        self._rate: float | None = None
        self._initial = initial
        self._last_n = initial
        self._last_t = self._started

    # --- the hot path ----------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._reporter is None:
            return iter(self.iterable or ())
        return self._counting_iter()

    def _counting_iter(self) -> Iterator[Any]:
        n = self.n
        try:
            for item in self.iterable or ():
                yield item
                n += 1
                if n >= self._next_check:
                    self.n = n
                    self._check()
        finally:
            self.n = n
            self.close()

    def update(self, n: float = 1, **metrics: Any) -> None:
        """Advance by ``n`` (manual bars); keyword arguments are metrics."""
        if self._reporter is None:
            return
        self.n += n
        if self.total and self.n >= self.total and self._finished_at is None:
            self._finished_at = _monotonic()   # a task done before its Progress stops (rich) ended here
        if metrics:
            log(**metrics)
        # A count that moved back (a mirrored library bar set lower: the Trainer's 9/8 corrected to 8/8)
        # is published now: waiting for the next threshold would leave the higher count the last one sent.
        if self.n >= self._next_check or n < 0:
            self._check()

    # --- off the hot path ------------------------------------------------
    def _check(self) -> None:
        """Publish the count; adapt how many steps pass between checks to ~CHECK_TARGET s."""
        now = _monotonic()
        spent = now - self._checked_at
        if spent < CHECK_TARGET / 2 and self._check_every < MAX_CHECK_EVERY:
            self._check_every *= 2
        elif spent > CHECK_TARGET * 2 and self._check_every > 1:
            self._check_every //= 2
        self._checked_at = now
        self._next_check = self.n + self._check_every
        if self._reporter is not None:
            self._reporter.touch(self)

    def _publish(self, now: float) -> None:
        """Called by the flusher: fold the rate (smoothed, like tqdm) from the last published count,
        over ``RATE_SPAN`` at least."""
        dt = self._checked_at - self._last_t
        if dt >= RATE_SPAN and self.n != self._last_n:
            instant = (self.n - self._last_n) / dt
            self._rate = instant if self._rate is None else 0.3 * instant + 0.7 * self._rate
            self._last_n, self._last_t = self.n, self._checked_at
            if self._reporter is not None:
                self._reporter.touch(self)

    def _fields(self) -> dict[str, Any]:
        end = self._checked_at if not self.closed else self._closed_at
        if self._finished_at is not None:
            end = min(end, self._finished_at)
        return {"desc": self.desc, "n": self.n, "total": self.total, "unit": self.unit,
                "rate": None if self._rate is None else round(self._rate, 3),
                "elapsed": round(end - self._started, 3), "closed": self.closed, "nested": self._nested,
                "inner": self._inner, "opened": round(self._started, 3),
                "ended": round(self._closed_at, 3) if self.closed else None}

    def set_description(self, desc: str) -> None:
        self.desc = desc
        if self._reporter is not None:
            self._reporter.touch(self)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, **metrics: Any) -> None:
        metrics = dict(ordered_dict or {}, **metrics)
        log(**metrics)

    @staticmethod
    def log(**metrics: Any) -> None:
        log(**metrics)

    def reset(self, total: float | None = None) -> None:
        self.n = 0
        self._initial = self._last_n = 0
        self._rate = None
        self._finished_at = None
        self._started = self._last_t = self._checked_at = _monotonic()
        self._next_check = 1
        self._check_every = 1
        if total is not None:
            self.total = total
        if self._reporter is not None:
            self._reporter.touch(self)

    def close(self) -> None:
        if self.closed or self._reporter is None:
            self.closed = True
            return
        self._closed_at = self._checked_at = _monotonic()
        self._publish(self._closed_at)
        done_at = self._finished_at or self._closed_at
        if self._rate is None and done_at > self._started and self.n != self._initial:   # shorter than RATE_SPAN
            self._rate = (self.n - self._initial) / (done_at - self._started)
        self.closed = True
        if self._reporter is not None:
            self._reporter.closed(self)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self.total) if self.total is not None else len(self.iterable)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        total = "?" if self.total is None else self.total
        return f"Progress(desc={self.desc!r}, n={self.n}, total={total})"


# The public name, as in ``from notebook_launch import progress``.
progress = Progress
