"""The supervisor's half of hang diagnosis: it watches a run for a stall, and says where the ranks
are whenever that is wanted (the panel's "Where are they?" button, a stall, the timeout, Stop,
Ctrl-C), into the run state the panel draws and every rank's log.

Why a collaborator of its own: what it keeps (the stall watch, the last answer, why the last
asking had no verdict) is none of the supervision loop's business, which only tells it what it
saw and when an answer is wanted. Why in ``supervise`` and not in ``diagnose``: collecting,
parsing, the verdict and stall detection are ``diagnose``'s, and ``diagnose`` imports none of its
callers, nor the run state or the logs (``tests/test_import_graph.py``); this is where its answers
meet those.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Sequence

from ..diagnose import hang_verdict, stacks
from ..diagnose.hang_verdict import RankWhereabouts
from ..diagnose.ranks import stack_fingerprints, where_ranks
from ..diagnose.stall import StallWatch
from ..record.state import RUNNING, STARTING, RunState
from . import outcome

if TYPE_CHECKING:
    from ..record.logs import LogWriter
    from .watch import RankWatch

log = logging.getLogger("notebook_launch")
Ask = Callable[[bool], "list[RankWhereabouts]"]   # native frames or not -> where every rank of the run is


class HangWatch:
    """Stall detection and where-reports for one supervised run. ``ask``: where every rank of the
    run is (the supervisor's ``whereabouts``: elastic's adds the other nodes' ranks; by default this
    run's own, ``local_whereabouts``); ``waits_for_answer``: whether a rank waits for the user's
    answer to its input() (not a stall); ``done_note``: what the verdict says of a live rank done
    with the run, ``{how}`` replaced by how ("returned")."""

    def __init__(self, watches: Sequence[RankWatch], state: RunState, logs: LogWriter, *,
                 stall_after: float | None, global_rank: Callable[[int], int],
                 waits_for_answer: Callable[[int], bool], done_note: str = "is done ({how})",
                 ask: Ask | None = None) -> None:
        self.watches = watches
        self.state = state
        self.logs = logs
        self.global_rank = global_rank
        self.waits_for_answer = waits_for_answer
        self.done_note = done_note
        self.ask: Ask = ask or self.local_whereabouts
        self.stalls = None if stall_after is None else StallWatch(stall_after, time.monotonic(),
                                                                  stack=stack_fingerprints)
        self.last_found: list[RankWhereabouts] = []   # the last answer of ask()
        self.where_problem = "they were not asked"   # why the last where_they_are had no verdict

    def saw(self, local_rank: int) -> None:
        """A sign of progress from ``local_rank`` (an event that is one, an output line)."""
        if self.stalls is not None:
            self.stalls.saw(local_rank, time.monotonic())

    def check(self) -> None:
        """Mark the live ranks stalled when the whole run shows no sign of progress (see ``stall``);
        the moment it becomes stalled, say where every rank is (logs, and the panel through
        ``report``). Nothing is stopped."""
        if self.stalls is None:
            return
        now = time.monotonic()
        live = [(w.local_rank, w.process.pid if w.process.on_this_machine else None) for w in self.watches
                if w.exit is None and self.state.ranks[w.local_rank].status == RUNNING]
        for local, _pid in live:
            if self.waits_for_answer(local):   # waiting for the user's answer is not a stall
                self.stalls.saw(local, now)
        was_stalled = self.stalled()
        if any(pid is None for _local, pid in live):   # a rank we cannot watch (on another machine) may
            stalled: dict[int, float | None] = {}        # work silently: no claim that the run is stuck
        else:
            stalled = self.stalls.check_all(live, now)
        for rs in self.state.ranks:
            since = stalled.get(rs.local_rank)
            if since != rs.stalled_since:
                self.state.on_stalled(rs.local_rank, since)
        if not was_stalled and any(since is not None for since in stalled.values()):
            self.report(f"stalled: no rank showed progress for {self.stalls.stall_after:g} s", stall=True)

    def stalled(self) -> bool:
        """Whether the run is marked stalled now (``check``)."""
        return any(rs.stalled_since is not None for rs in self.state.ranks)

    def at_stop(self, when: str) -> tuple[bool, str | None, str]:
        """As the user stops the run (Stop, Ctrl-C), which is often a hung one: whether it was
        stalled, the verdict and the detail (``where_they_are``, without py-spy's seconds)."""
        stalled = self.stalled()
        verdict, detail = self.where_they_are(when, native=False)
        return stalled, verdict, detail

    def report(self, why: str, stall: bool = False) -> None:
        """Collect where every rank is and put the verdict and the (shortened) stacks in the state's
        ``where_report`` (``stall``: its stall report); the whole stacks go to each rank's log, the
        verdict to every rank's log."""
        verdict, detail = self.where_they_are(why)
        if verdict is None:
            text = self.nobody_could_say()
            for local_rank in range(len(self.state.ranks)):
                self.logs.write_block(local_rank, f"notebook_launch: where the ranks were ({why}): {text}")
        else:
            text = f"{verdict}\n\n{detail}" if detail else verdict
        if stall:
            self.state.on_stall_report(f"{why}; {text}")
        else:
            self.state.on_where_report(text)

    def nobody_could_say(self) -> str:
        """Why the last asking had no verdict, so that a blind report can be looked into."""
        return f"no rank could say where it is: {self.where_problem}"

    def where_they_are(self, why: str = "", native: bool = True) -> tuple[str | None, str]:
        """The one-line verdict on where the ranks are and the detail (every rank's stacks), the
        whole of it also written to each rank's log (``why``: when, for the log's heading);
        (None, "") when no rank could say (ranks that are not ours to ask: no whereabouts record).
        ``native``: add native frames where py-spy is installed (seconds: not on an interrupt)."""
        try:
            found = self.last_found = self.ask(native)
            if self.stalls is not None:   # what answering cost the ranks is no sign of progress
                self.stalls.asked(time.monotonic())
        except Exception as exc:   # why: a diagnosis must never stand in the way of the stop
            log.debug("could not collect the ranks' whereabouts", exc_info=True)
            self.where_problem = f"asking them failed ({type(exc).__name__}: {exc})"
            return None, ""
        label = outcome.cell_labeller()
        verdict, detail = stacks.where_they_are(found, label)
        if verdict is None:
            self.where_problem = hang_verdict.notes_text(found)
            return None, ""
        whole = hang_verdict.detail(found, label, frames_per_thread=1000, whole=True)
        heading = f"notebook_launch: where the ranks were{f' ({why})' if why else ''}: {verdict}\n"
        for watch, where in zip(self.watches, found):   # the verdict, then this rank's whole detail
            self.logs.write_block(watch.local_rank,
                                  heading + hang_verdict.detail([where], label, frames_per_thread=1000, whole=True))
        log.debug("where the ranks were:\n%s", whole)
        return verdict, detail

    def local_whereabouts(self, native: bool = True) -> list[RankWhereabouts]:
        """Every rank of this run, asked where it is (``diagnose.ranks``); the ended ones say how they
        ended, and a rank done with the run (a persistent rank that returned from the call) is not asked."""
        asked = [(w.local_rank, w.process if w.exit is None and self.state.ranks[w.local_rank].status
                  in (STARTING, RUNNING) else None) for w in self.watches]
        found = where_ranks(asked, self.global_rank, outcome.cell_labeller(), native=native)
        for watch, where in zip(self.watches, found):
            rs = self.state.ranks[watch.local_rank]
            if watch.exit is not None:
                where.note = f"ended ({rs.exit_description or rs.status})"
            elif rs.status not in (STARTING, RUNNING):
                where.note = self.done_note.format(how=rs.exit_description or str(rs.status))
            where.stalled_for = self.state.stalled_for(watch.local_rank)
        return found
