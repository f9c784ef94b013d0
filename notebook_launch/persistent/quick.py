"""A warm call that is over at once, finished without a supervisor (issue 45).

Most calls on warm persistent ranks come back in a millisecond: every rank sends its RESULT
and nothing else. For those, building a supervisor (its watcher, hang watch, prompts relay,
turns, and the watcher's drain at the end) was a third of the notebook's CPU per call, and on
two cores the notebook's CPU is most of a call's wall time. So, once the frame is out, the
notebook first looks at the ranks' event pipes itself, for up to ``QUICK_WINDOW``
(``first_look``): when every rank's RESULT came and nothing else did (no line printed, no
other event, no rank ended, no interrupt), the call is finished here (``finish``) with what
a supervisor would have left: the same run state (each row DONE, the resources' last round),
the same session (the panel or the line, the log section), the same results. Anything else
hands what was read, in order, to the call's supervisor, which takes the call from there
(``pool._supervised``): a call that prints, fails, asks for input, runs long or is
interrupted is supervised as it always was. The run state and the session (the panel, the log
section) are built before the look, while the ranks run the call, as for every call.
"""
from __future__ import annotations

import selectors
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..channels import read_ready
from ..display.words import counted
from ..record.state import DONE
from ..scaffold.session import Session
from ..supervise import interrupts, outcome
from ..supervise.resource_watch import ResourceWatch
from ..supervise.supervisor import failure_error
from ..supervise.watch import READ_SIZE, RankWatch
from ..wire import protocol
from .call import RANKS_KEPT, KeptSelector, load_call_results

if TYPE_CHECKING:
    from ..channels import RankPipes, RankProcess
    from ..record.state import RunState
    from ..supervise.oom import MemoryWatch

QUICK_WINDOW = 0.01   # seconds a call may take and still be finished without a supervisor
READ = protocol.EventKind.RESULT
Event = tuple[int, protocol.EventKind, Any]   # (local rank, kind, payload), as read


@dataclass
class FirstLook:
    """What the notebook read of a call before its supervisor: ``events`` in the order read
    (the supervisor's first turn takes them), the pool's kept selector taken for the call
    (``selector``: the supervisor's watcher borrows it; None: there was none to take), and
    whether the call is over with nothing but results (``complete``)."""
    events: list[Event] = field(default_factory=list)
    selector: selectors.BaseSelector | None = None
    complete: bool = False


def first_look(look: FirstLook, kept: KeptSelector, processes: Sequence[RankProcess], pipes: Sequence[RankPipes],
               readers: dict[int, protocol.EventReader], timeout: float | None, held: interrupts.Held) -> None:
    """Read the ranks' event pipes into ``look`` for up to QUICK_WINDOW seconds (the call's
    ``timeout`` if shorter), until every rank sent its RESULT, anything else is there (a line,
    another event, an end) or an interrupt is held. ``look`` takes the pool's kept selector first
    (its caller gives it back unless a supervisor took it over). ``readers``: the call's readers
    of event frames by local rank (the between-calls reader's; a frame may have begun), filled
    for ranks that had none."""
    look.selector = kept.take(processes, pipes)
    if look.selector is None:
        return
    waiting = set(range(len(pipes)))
    deadline = time.monotonic() + (QUICK_WINDOW if timeout is None else min(timeout, QUICK_WINDOW))
    while waiting and not held.pending():
        left = deadline - time.monotonic()
        if left <= 0 or not _read_results(look.selector.select(left), readers, look.events, waiting):
            return
    # every rank is done: nothing else may wait (its output is written before its RESULT)
    look.complete = not waiting and not held.pending() and not look.selector.select(0)


def _read_results(ready: list[tuple[selectors.SelectorKey, int]], readers: dict[int, protocol.EventReader],
                  events: list[Event], waiting: set[int]) -> bool:
    """Read each ready event pipe into ``events``; False when the call is not (only) results: a
    line, an end of a rank or of a pipe, or an event that is not a RESULT (read all the same)."""
    quick = True
    for key, _ in ready:
        local, what = key.data
        if what != "events":
            quick = False
            continue
        data = read_ready(key.fd, READ_SIZE)
        if data is None:
            continue
        if not data:   # its end: the supervisor's watcher sees it again, and closes it
            quick = False
            continue
        reader = readers.get(local)
        if reader is None:
            reader = readers[local] = protocol.EventReader()
        for kind, payload in reader.feed(data):
            events.append((local, kind, payload))
            if kind is READ:
                waiting.discard(local)
            else:
                quick = False
    return quick


@dataclass(frozen=True)
class QuickCall:
    """What finishing a call here needs of its pool (``pool._supervised``)."""
    processes: Sequence[RankProcess]
    pipes: Sequence[RankPipes]
    result_fds: Sequence[int]
    call_number: int
    idle_ranks: frozenset[int]
    memory: MemoryWatch


def finish(state: RunState, session: Session[Any], look: FirstLook, held: interrupts.Held,
           call: QuickCall) -> list[Any]:
    """The call's outcome from what ``first_look`` read (``look.complete``), in its ``session``,
    with what its supervisor would have left: each row DONE, the resources' round
    (``ResourceWatch``), the results; the session then closes the display with the final state.
    An interrupt held since the send is raised first (the ranks are done: they keep their state)."""
    held.release("notebook_launch: interrupted as the call started")
    watches = [RankWatch(process, local, call.pipes[local]) for process in call.processes for local in process.ranks()]
    watches.sort(key=lambda w: w.local_rank)
    for local, _, payload in look.events:
        watches[local].returned(payload)
        idle = state.ranks[local].rank in call.idle_ranks
        state.on_exit(local, DONE, "idle: not in this cell's --ranks" if idle else "returned")
    ResourceWatch(watches, state, session.logs, memory=call.memory).sample()

    def global_rank(local: int) -> int:
        return state.ranks[local].rank

    results, failure = load_call_results(watches, call.result_fds, call.call_number, global_rank)
    if failure is not None:
        error = failure_error(failure, results, state, session.logs, watches)
        session.fail(error)
        raise outcome.with_note(error, RANKS_KEPT) from None
    session.finish(f"{counted(len(results), 'rank')} returned in {state.elapsed:.2f} s")
    return results


__all__ = ["QUICK_WINDOW", "FirstLook", "QuickCall", "finish", "first_look"]
