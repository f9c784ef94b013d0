"""The stop policy: how a run ends the ranks still running once it must stop (a failure, the
timeout, an interrupt, Stop). SIGTERM first, so a rank can clean up; SIGKILL after a grace,
or at once when the user presses Ctrl-C again; then reap, and drain what they wrote last. And
what is left when the run closes (``end_what_is_left``): nothing a rank started outlives it."""
from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Iterable, Sequence

from ..process import leftovers
from ..record.state import STOPPED, RunState
from . import interrupts, outcome

if TYPE_CHECKING:
    from ..channels import RankProcess
    from .watch import RankWatch, Watcher

TERM_GRACE = outcome.TERM_GRACE


def stop_ranks(watches: Sequence["RankWatch"], watcher: "Watcher", state: RunState, reason: str) -> None:
    """SIGTERM every live rank, wait TERM_GRACE (cut short by another Ctrl-C), SIGKILL what
    is left, then drain pipes. ``reason`` ends "after ..." in each stopped rank's row."""
    live = [w for w in watches if w.exit is None]
    # A rank that reported its own exception is already on its way out with exit code 1: a
    # SIGTERM racing its exit would record -15, as if we had stopped it. It gets the grace too.
    to_term = [w for w in live if not leaving_on_its_own(w)]
    for watch in to_term:
        watch.stopped_by_us = signal.SIGTERM
        watch.stop_reason = reason
    for process in distinct(w.process for w in to_term):
        process.signal(signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE
    while any(w.exit is None for w in live) and time.monotonic() < deadline and not interrupts.hurry():
        watcher.pump(0.05)
    hurried = interrupts.hurry()
    for watch in live:
        if watch.exit is None:
            watch.stopped_by_us = signal.SIGKILL
            watch.stop_reason = reason
    for process in distinct(w.process for w in live if w.exit is None):
        process.kill()
    for watch in live:
        if watch.exit is None:
            watch.exit = watch.process.wait()
            watch.pipes.close(watch.pipes.events_w)   # its end is gone: let its event pipe reach EOF
            watch.exited_at = time.monotonic()
            state.on_exit(watch.local_rank, STOPPED,
                          outcome.stopped_description(watch.stop_reason, watch.exit, hurried))
    # No signal after reaping (the pid may be someone else's by now): each rank's group got
    # SIGKILL while the rank was alive or an unreaped zombie (kill() above, on_process_exit).
    drain_deadline = time.monotonic() + 0.5
    while any(w.open_fds for w in watches) and time.monotonic() < drain_deadline:
        watcher.pump(0.05)


def end_what_is_left(watches: Sequence["RankWatch"], processes: Sequence["RankProcess"], run_id: str) -> None:
    """As a run closes, whatever ended it: each live rank's process group ended, what still runs
    killed and reaped, every process handle released, and what left a rank's group (setsid) swept,
    so that nothing a rank started outlives its run."""
    for process in distinct(w.process for w in watches if w.exit is None):
        if process.on_this_machine:   # a Ray actor's pid is its node's: here it may be anyone's group
            leftovers.end_rank_group(process.pid)   # alive or not yet reaped: the group id is still its own
    for watch in watches:
        if watch.exit is None:
            if watch.process.poll() is None:  # a sibling rank may have reaped it already
                watch.process.kill()
            watch.exit = watch.process.wait()
    for process in processes:
        process.release()
    leftovers.sweep(run_id)


def leaving_on_its_own(watch: "RankWatch") -> bool:
    """Whether the rank sent its own ERROR (not one our SIGTERM made it raise) and so exits by itself."""
    return watch.error is not None and not watch.error_after_stop


def distinct(processes: Iterable["RankProcess"]) -> list["RankProcess"]:
    """Each process once (an XLA process carries several ranks)."""
    seen: list["RankProcess"] = []
    for process in processes:
        if not any(process is p for p in seen):
            seen.append(process)
    return seen
