"""Where persistent ranks are (``Ranks.stacks()``): every rank asked (``diagnose``), and the answer
read for a pool, where a rank is either in a call or between calls, waiting for the next command.

Apart from the pool because it is a job of its own: the pool only says whether a call holds it
and whose state that call has; telling a rank that waits for the next call from one still in a
call (or hung in it) is this module's.
"""
from __future__ import annotations

import os

from ..channels import RankProcess
from ..diagnose import hang_verdict, stacks as rank_stacks
from ..diagnose.ranks import where_ranks
from ..record.logs import RunLogs
from ..record.state import RUNNING, RunState
from ..supervise import outcome
from ..wire.plan import LaunchPlan
from .transport import exited

COMMANDS_FILE = os.path.join("notebook_launch", "channels", "commands.py")   # where serve_calls waits


def where_report(plan: LaunchPlan, processes: list[RankProcess], state: RunState | None, *, calling: bool,
                 logs: RunLogs | None) -> rank_stacks.WhereReport:
    """``Ranks.stacks()``: ask every rank where it is (``diagnose``); ``state``: the running
    call's (None between calls); ``calling``: whether a call holds the pool."""
    asked: list[tuple[int, RankProcess | None]] = []
    notes: dict[int, str] = {}
    for spec, process in zip(plan.ranks, processes):
        rs = state.ranks[spec.local_rank] if state is not None else None
        if exited(process):
            notes[spec.global_rank] = "ended (the next call restarts the ranks)"
        elif rs is not None and rs.status != RUNNING:
            notes[spec.global_rank] = f"is done with this call ({rs.exit_description or rs.status})"
        asked.append((spec.local_rank, None if spec.global_rank in notes else process))
    global_rank = {spec.local_rank: spec.global_rank for spec in plan.ranks}.__getitem__
    label = outcome.cell_labeller()
    found = where_ranks(asked, global_rank, label, native=calling)   # an idle rank: native frames in our recvmsg
    for where, spec in zip(found, plan.ranks):
        where.note = notes.get(where.rank, where.note)
        if state is not None:
            where.stalled_for = state.stalled_for(spec.local_rank)
    if calling:
        for where in found:   # back in the loop before the call's supervisor read its report
            if waits_for_a_call(where):
                where.note = "is done with this call (its report is on its way)"
        verdict, detail = rank_stacks.where_they_are(found, label)
        verdict = verdict or "no rank could say where it is: " + hang_verdict.notes_text(found)
    else:
        waiting = [where for where in found if waits_for_a_call(where, between_calls=True)]
        verdict = "no call is running: " + (
            "every rank waits for the next one" if len(waiting) == len(found) else
            hang_verdict.notes_text([where for where in found if where not in waiting])
            + "; the others wait for the next call")
        detail = hang_verdict.detail(found, label)
    if logs is not None:
        for local_rank, where in enumerate(found):
            logs.write_block(local_rank, "notebook_launch: where this rank is (ranks.stacks()): "
                             + verdict + "\n"
                             + hang_verdict.detail([where], label, frames_per_thread=1000, whole=True))
    return rank_stacks.WhereReport(verdict, detail)


def waits_for_a_call(where: hang_verdict.RankWhereabouts, between_calls: bool = False) -> bool:
    """A rank between calls: its main thread waits in ``serve_calls`` for the next command. Its
    main thread (our code only) leaves the detail, which keeps the rank's other threads.

    ``between_calls`` (no call holds the pool): a main thread anywhere in our serving code counts
    too, not only in the wait. The notebook has the last call's report before the rank's main thread
    is back in the wait (it closes the call's result file, returns through ``run_one``): asked at
    that moment, a rank whose other threads run user code (a thread storm's) was said to be "in
    run() at threading.py", one of those threads, as if a call still ran there."""
    if where.note == "waits for the next call" and all(t.ident != where.main_thread for t in where.threads):
        return True   # a Ray rank said so itself (diagnose.remote_where.decode_answer)
    frames = where.main_frames()
    main = next((thread for thread in where.threads if thread.ident == where.main_thread), None)
    in_the_wait = bool(frames) and frames[0].filename.endswith(COMMANDS_FILE)
    if not in_the_wait and not (between_calls and main is not None and hang_verdict.is_our_thread(main)):
        return False
    where.threads = [thread for thread in where.threads if thread.frames is not frames]
    where.note = "waits for the next call"
    return True
