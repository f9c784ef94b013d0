"""Where the ranks of a run are: the one way a launch's supervisor (its timeout, Stop, Ctrl-C, the
"Where are they?" button, a stall's report; elastic's attempts, and through them other nodes)
and ``Ranks.stacks()`` ask them.

Each rank is asked the way its process answers (``RankProcess.where``): a process that answers
for its ranks itself (XLA's launcher, for every replica it carries; a Ray actor, over its
connections) is asked once; every other live rank is its own process on this machine, asked by
its pid through ``stacks.collect``, all of them at once (one wait, however many ranks). What a
Python stack cannot show (native frames, stuck forked children) is added for those ranks.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

from ..errors.best_effort import best_effort
from ..channels import RankProcess
from . import stacks
from .hang_verdict import Labeller, RankWhereabouts
from .stall import Fingerprint

log = logging.getLogger("notebook_launch")
SHARED_NOTE = "was not asked (it shares its process with other ranks)"
REMOTE_NOTE = "was not asked (its process runs on another machine)"
STACK_SAMPLE_WAIT = 0.5   # seconds a stall's stack sample waits for the ranks' answers


def where_ranks(ranks: Sequence[tuple[int, RankProcess | None]], global_rank: Callable[[int], int],
                label: Labeller, native: bool = True) -> list[RankWhereabouts]:
    """Where each of ``ranks`` ((local rank, its process, or None where it is not to be asked:
    ended, or done with the run) is now, in their order; a rank not asked says "was not running",
    which the caller replaces with why. ``native``: add py-spy's native frames where it is
    installed (seconds; not on an interrupt)."""
    answers, answering = _self_answers([process for _local, process in ranks if process is not None], global_rank)
    by_pid = [(global_rank(local), _pid_to_ask(process) if local not in answering else None)
              for local, process in ranks]
    found = stacks.collect(by_pid)
    for index, (local, process) in enumerate(ranks):
        if local in answers:
            found[index] = answers[local]
        elif process is not None and (local in answering or _pid_to_ask(process) is None):
            found[index].note = REMOTE_NOTE if not process.on_this_machine else SHARED_NOTE
    # native frames and stuck children are extras: the Python stacks stand alone
    with best_effort("could not add what the Python stacks cannot show"):
        stacks.add_beyond_python(found, by_pid, label, native=native)
    return found


def _pid_to_ask(process: RankProcess | None) -> int | None:
    """The pid to ask for a rank of ``process`` on this machine; None for one carrying several ranks
    (its pid is none of theirs alone) or of another machine (another process here may carry its pid)."""
    if process is None or not process.on_this_machine or len(process.ranks()) != 1:
        return None
    return process.pid


def _self_answers(processes: Sequence[RankProcess], global_rank: Callable[[int], int]
                  ) -> tuple[dict[int, RankWhereabouts], set[int]]:
    """(local rank -> answer, the local ranks whose process answers for them itself), each process
    asked once; one whose asking fails says so for each of its ranks, and the others still answer."""
    answers: dict[int, RankWhereabouts] = {}
    answering: set[int] = set()
    seen: set[int] = set()
    for process in processes:
        if id(process) in seen:
            continue
        seen.add(id(process))
        try:
            got = process.where(global_rank)
        except Exception as exc:   # why: a diagnosis must never stand in the way of the stop
            log.debug("a process could not be asked where its ranks are", exc_info=True)
            got = {local: RankWhereabouts(global_rank(local), note=f"could not be asked ({exc})")
                   for local in process.ranks()}
        if got is not None:
            answering.update(process.ranks())
            answers.update(got)
    return answers, answering


def stack_fingerprints(pids: dict[int, int]) -> dict[int, Fingerprint]:
    """Local rank -> its main thread's frames and collective number now (what a stall sample
    compares: ``stall.StallWatch(stack=)``), or None where the rank could not say; ``pids``: local
    rank -> pid of the live ranks of this machine."""
    found = stacks.collect(list(pids.items()), wait=STACK_SAMPLE_WAIT)
    return {local: (tuple(where.main_frames()), where.inside or where.last) if where.threads else None
            for local, where in zip(pids, found)}
