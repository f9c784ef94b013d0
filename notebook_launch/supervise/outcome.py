"""What the end of a run means: how each rank ended, its result, and every LaunchError text.

Nothing here changes the run state; the supervisor records what these
functions decide, and the run scaffold (``run.py``) writes the final status.
"""
from __future__ import annotations

import logging
import os
import re
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..wire import shared_tensors
from ..errors import LaunchError
from ..wire.protocol import Failure, FailureKind, headline_of
from ..record.state import DONE, FAILED, STOPPED, RunState, Status
from ..diagnose import hang_verdict
from ..display.grouping import GROUP_ABOVE, rank_ranges
from .child_failed import RankFailureFacts, exitcode_of, process_failures

if TYPE_CHECKING:
    from ..channels import WaitStatus
    from .watch import RankWatch

LAST_LINES_IN_ERROR = 20  # a crash without a Python traceback shows the rank's last output instead
MESSAGE_LIMIT = 4_000     # characters of an exception message in a LaunchError (or the panel)
TRACEBACK_LIMIT = 32_000  # characters of a traceback in a LaunchError; the rank's log keeps it whole
TERM_GRACE = 2.0          # seconds between SIGTERM and SIGKILL at teardown
log = logging.getLogger("notebook_launch")

# No hint for SIGKILL: the OOM killer's and a hand ``kill -9`` look alike, and only the kernel's
# records tell them apart (``kernel_oom.OomBaseline.verdict``, asked where the process ran)
SIGNAL_HINTS: dict[int, str] = {
    signal.SIGSEGV: "segmentation fault in native code",
    signal.SIGABRT: "aborted (a C++ assertion or std::terminate)",
    signal.SIGBUS: "bus error (often shared memory /dev/shm too small)",
    signal.SIGTERM: "terminated",
}


# --- how a rank ended ---------------------------------------------------------------------

@dataclass(frozen=True)
class RankEnd:
    """The verdict on one rank's end: its status and description, and the failure it
    is (None when it finished, or when it was stopped by us, or already reported one)."""
    status: Status
    description: str
    error: str | None = None
    failure: Failure | None = None


def classify_exit(watch: "RankWatch", status: "WaitStatus", shares_process: bool) -> RankEnd:
    """Decide how a rank ended from its wait status and what it sent before."""
    local = watch.local_rank
    if watch.has_result and watch.result_before_stop and watch.error is None \
            and (status == ("exit", 0) or shares_process or status[0] == "lost"):
        # a rank that shares its process is done once its result arrived,
        # even if the process was then stopped because a sibling failed;
        # and a result that arrived is the rank's result when its exit status was lost
        return RankEnd(DONE, "finished")
    if watch.stopped_by_us is not None and (watch.error is None or watch.error_after_stop):
        # we stopped it: whatever it did then (returned from a SIGTERM handler, raised) is our stop
        return RankEnd(STOPPED, stopped_description(watch.stop_reason, status))
    description = describe_status(status)
    note = watch.process.end_note   # e.g. a Ray actor's death: Ray knows why, no exit status does
    if note and watch.error is None:
        failure = Failure(local, FailureKind.SIGNAL, note)
        return RankEnd(FAILED, note, error=note, failure=failure)
    if watch.error is not None:
        headline = headline_of(watch.error["type"], watch.error["message"])
        return RankEnd(FAILED, description, error=clip_middle(headline, MESSAGE_LIMIT))
    if status == ("exit", 0):
        failure = Failure(local, FailureKind.EXIT, "exited with code 0 without returning from the "
                          "function (os._exit(0) or a library that ended the process)")
    elif status[0] == "signal":
        failure = Failure(local, FailureKind.SIGNAL, description)
    elif status[0] == "lost":
        failure = Failure(local, FailureKind.EXIT, f"{description}, without raising a Python exception "
                          "or returning a result")
    else:
        failure = Failure(local, FailureKind.EXIT, f"{description} without raising a Python "
                          "exception (os._exit, or a crash in C code)")
    return RankEnd(FAILED, description, error=failure.headline, failure=failure)


def describe_status(status: "WaitStatus") -> str:
    kind, value = status
    if kind == "stuck":   # channels.STUCK: it outlived SIGKILL, left behind unreaped
        return ("did not end after SIGKILL (stuck in the kernel, usually a GPU/TPU driver; "
                "left behind: restart the runtime if the device stays busy)")
    if kind == "lost":   # channels.LOST: the notebook's SIGCHLD handling took the status first
        return ("ended, its exit status taken before notebook_launch could read it (the notebook ignores "
                "SIGCHLD or a handler there reaps every child, and Linux before 6.15 keeps no copy)")
    if kind == "signal":
        name = signal.Signals(value).name if value in signal.Signals._value2member_map_ else str(value)
        hint = SIGNAL_HINTS.get(value)
        return f"killed by {name}" + (f", {hint}" if hint else "")
    return f"exit code {value}"


def stopped_description(stop_reason: str, status: "WaitStatus", hurried: bool = False) -> str:
    """``hurried``: Ctrl-C was pressed again during the stop, so SIGKILL came without the grace."""
    if status == ("exit", 0):
        return f"stopped after {stop_reason} (it exited cleanly when asked)"
    if status[0] == "stuck":
        return f"stopped by notebook_launch after {stop_reason}, but it {describe_status(status)}"
    how = "SIGTERM" if status == ("signal", signal.SIGTERM) else describe_status(status)
    if status == ("signal", signal.SIGKILL):
        how = ("SIGKILL at once, Ctrl-C was pressed again" if hurried
               else f"SIGKILL, it ignored SIGTERM for {TERM_GRACE:g} s")
    return f"stopped by notebook_launch ({how}) after {stop_reason}"


def timeout_failure(timeout: float, running_ranks: Sequence[int], verdict: str | None = None,
                    detail: str = "", spent: str = "") -> Failure:
    """The timeout: with ``verdict`` (``hang_verdict``: where the ranks are) its first line says
    where the ranks are, and ``detail`` (each rank's collective and stacks) follows; without one,
    the running ranks are named and ``detail`` says why they could not say where they were.
    ``spent``: what of it went before the ranks ran (" (20 s of it pending in SLURM's queue, ...)")."""
    if verdict is None:
        return Failure(None, FailureKind.TIMEOUT, f"timed out after {timeout:g} s{spent}; ranks still running: "
                       + ", ".join(map(str, running_ranks)), detail=detail)
    return Failure(None, FailureKind.TIMEOUT, f"timed out after {timeout:g} s{spent}: {verdict}", detail=detail)


def stopped_stall_failure(how: str, verdict: str, detail: str) -> Failure:
    """A stalled run the user stopped (``how``: "the Stop button", "an interrupt"): the error
    starts with where the ranks were, and each rank's detail follows."""
    return Failure(None, FailureKind.STOPPED, f"stopped with {how} after the run stalled: {verdict}",
                   detail=detail)


def cell_labeller() -> Callable[[str], str | None]:
    """How the verdict names a file: a cell of this kernel as 'Cell In[5]' (errors.render.cell_label)."""
    from ..errors.render import cell_label
    return cell_label


def load_result(watch: "RankWatch", global_rank: int) -> tuple[Any, Failure | None]:
    """The rank's returned value, unpickled here; a value that cannot be is a failure.
    A value sent only after we stopped the rank is not a result: it did not finish."""
    if not watch.has_result or not watch.result_before_stop or watch.result is None:
        return None, None
    try:   # tensors come back over the pages of the rank's result file, not copied
        return shared_tensors.loads(watch.result, watch.pipes.tensors, discard_stream=True), None
    except OSError as exc:   # a system limit (shared_tensors names it and how to raise it)
        return None, Failure(watch.local_rank, FailureKind.RESULT,
                             f"the result of rank {global_rank} could not be loaded in the notebook: {exc}")
    except MemoryError:
        return None, Failure(watch.local_rank, FailureKind.RESULT,
                             f"the result of rank {global_rank} does not fit in the notebook's memory "
                             f"(MemoryError while loading it): free memory here (del what you no longer "
                             f"need, or restart the kernel) or return less, for example only rank 0's result")
    except Exception as exc:   # why: a result that cannot be unpickled is the rank's failure, said with advice
        return None, Failure(watch.local_rank, FailureKind.RESULT,
                             f"the result of rank {global_rank} could not be unpickled in the notebook "
                             f"({type(exc).__name__}: {exc}); {unpickling_advice(exc)}")


def unpickling_advice(exc: Exception) -> str:
    """What to do about a result the notebook cannot unpickle, from why it cannot."""
    if isinstance(exc, (ImportError, AttributeError)):
        return ("the result holds an instance of a class or function the notebook cannot find (defined "
                "only inside the rank, or in a module the notebook does not have): define it in a notebook "
                "cell or an importable module, or return plain data (dicts, lists, tensors, a state_dict())")
    return "return plain data (numbers, strings, lists, dicts, tensors, a state_dict()) instead"


def crash_report_lines(lines: Sequence[str]) -> list[str]:
    """What to quote from a rank that died without a Python traceback: faulthandler's
    report when there is one (it starts with "Fatal Python error"), else the last lines;
    the report's frames of notebook_launch left out, counted (the rank's log keeps them)."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("Fatal Python error"):
            return without_our_dump_frames(lines[start:start + 2 * LAST_LINES_IN_ERROR])
    return without_our_dump_frames(lines[-LAST_LINES_IN_ERROR:])


_DUMP_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line \d+ in ')   # a frame of faulthandler's report


def without_our_dump_frames(lines: Sequence[str]) -> list[str]:
    """``lines`` with each run of faulthandler frames of ours replaced by a line that counts them."""
    kept: list[str] = []
    hidden = 0
    for line in lines:
        frame = _DUMP_FRAME.match(line)
        if frame is not None and hang_verdict.is_ours(frame["file"]):
            hidden += 1
            continue
        if hidden:
            kept.append(f"    {hang_verdict.hidden_text(hidden)}")
            hidden = 0
        kept.append(line)
    if hidden:
        kept.append(f"    {hang_verdict.hidden_text(hidden)}")
    return kept


# --- the error the user sees --------------------------------------------------------------

def clip_middle(text: str, limit: int, where: str = "the rank's log") -> str:
    """``text`` itself when short enough, else its head and tail around a note saying how much
    was left out and where the whole is: a 5 MB exception message must not make a 10 MB error."""
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    left_out = len(text) - head - tail
    return f"{text[:head]} [... {left_out:,} characters left out; all of it is in {where} ...] {text[-tail:]}"


def failure_facts(watches: Sequence["RankWatch"], state: RunState, failure: Failure) -> list[RankFailureFacts]:
    """What torch's ProcessFailure records need about each failed rank (every rank we
    stopped, for a timeout): its pid, exit code and message."""
    facts = []
    for watch in watches:
        rs = state.ranks[watch.local_rank]
        if failure.local_rank is None:
            include = watch.stopped_by_us is not None
        else:
            include = watch.local_rank == failure.local_rank or rs.status == FAILED
        if not include:
            continue
        if watch.local_rank == failure.local_rank:
            headline, traceback = failure.headline, failure.traceback
        else:
            headline = rs.error or rs.exit_description or failure.headline
            traceback = watch.error["traceback"] if watch.error is not None and rs.status == FAILED else ""
        facts.append(RankFailureFacts(rank=rs.rank, local_rank=watch.local_rank, pid=watch.process.pid,
                                      exitcode=exitcode_of(watch.exit), headline=headline, traceback=traceback))
    return facts


def launch_error(failure: Failure, results: list[Any], state: RunState,
                 facts: Sequence[RankFailureFacts] = ()) -> LaunchError:
    """The LaunchError for a failure on this node: the failing rank, its traceback (or last
    output), what happened to the other ranks, where the logs are. Long messages and
    tracebacks are capped (head and tail); the rank's log has them whole."""
    node = f"node {state.node_rank}, " if state.num_nodes > 1 else ""
    rank: int | None
    where = "the rank's log"
    if failure.local_rank is not None and state.ranks[failure.local_rank].node:
        node = f"{state.ranks[failure.local_rank].node}, "   # ranks on other machines (Ray)
    if failure.local_rank is None:
        first = f"notebook_launch: {failure.headline}"
        rank = None
    else:
        rank = state.ranks[failure.local_rank].rank
        where = os.path.join(state.log_dir, f"rank{rank}.log")
        first = f"{node}rank {rank} failed: {clip_middle(failure.headline, MESSAGE_LIMIT, where)}"
    lines = [first]
    if failure.memory:   # an out-of-memory end: what held the memory, what to do (supervise.oom)
        lines += ["", failure.memory]
    if failure.detail:   # where each rank was (a timeout): whole in the ranks' logs
        lines += ["", "Where each rank was:", clip_middle(failure.detail, TRACEBACK_LIMIT, "the ranks' logs")]
    if failure.traceback:
        lines += ["", f"Traceback from rank {rank}:", clip_middle(failure.traceback.rstrip(), TRACEBACK_LIMIT, where)]
    elif failure.local_rank is not None and state.ranks[failure.local_rank].lines:
        recent = crash_report_lines([text for _, text in state.ranks[failure.local_rank].lines])
        lines += ["", f"Last output of rank {rank}:"] + [f"  {text}" for text in recent]
    lines += ["", "Other ranks:" if rank is not None else "Ranks:"]
    fates = []
    for rs in state.ranks:
        if rs.rank == rank:
            continue
        fate = rs.exit_description or rs.status
        if rs.status == FAILED and rs.error:
            fate = f"also failed: {rs.error}"
        fates.append((rs.rank, f" ({rs.node})" if rs.node else "", str(fate)))
    lines += fate_lines(fates)
    lines.append(f"Logs: {state.log_dir}")
    exc_message = None if failure.exc_message is None else clip_middle(failure.exc_message, MESSAGE_LIMIT, where)
    return LaunchError("\n".join(lines), rank=rank, kind=failure.kind, exc_type=failure.exc_type,
                       exc_message=exc_message,
                       remote_traceback=clip_middle(failure.traceback, TRACEBACK_LIMIT, where) or None,
                       log_dir=state.log_dir, results=results,
                       node_rank=node_rank_of(failure, state),
                       failures=process_failures(list(facts), state.log_dir))


def fate_lines(fates: Sequence[tuple[int, str, str]]) -> list[str]:
    """'  rank 3 (node 1 (10.0.0.2)): finished' for each (rank, where, fate); past
    ``grouping.GROUP_ABOVE`` ranks, as the panel's rows are, ranks that ended alike share a line
    ('  ranks 0-4, 6-31: finished'): the error of a 256-rank run stays a few lines."""
    if len(fates) <= GROUP_ABOVE:
        return [f"  rank {rank}{where}: {fate}" for rank, where, fate in fates]
    alike: dict[str, list[int]] = {}
    for rank, _, fate in fates:
        alike.setdefault(fate, []).append(rank)
    return [f"  rank {ranks[0]}: {fate}" if len(ranks) == 1 else f"  ranks {rank_ranges(ranks, most=12)}: {fate}"
            for fate, ranks in alike.items()]


def node_rank_of(failure: Failure, state: RunState) -> int | None:
    """The failing rank's node: its own when a cluster placed it (Ray), else this node's in a
    multi-node run, else None."""
    if failure.local_rank is not None and state.ranks[failure.local_rank].node_rank is not None:
        return state.ranks[failure.local_rank].node_rank
    return state.node_rank if state.num_nodes > 1 else None


def remote_error(record: Failure, state: RunState) -> LaunchError:
    """The LaunchError on this node for a failure another node posted."""
    node, rank = record.node, record.rank
    rank_words = f", rank {rank}" if rank is not None else ""
    where = f"node {node}'s log of rank {rank}"
    headline = clip_middle(record.headline, MESSAGE_LIMIT, where)
    first = f"node {node}{rank_words} failed: {headline}"
    if rank is None:
        first = f"node {node}: {headline}"
    lines = [first]
    if record.memory:
        lines += ["", record.memory]
    if record.traceback:
        lines += ["", f"Traceback from rank {rank} (node {node}):",
                  clip_middle(record.traceback.rstrip(), TRACEBACK_LIMIT, where)]
    if record.detail:   # a hang diagnosed on that node: where every rank of the run was
        lines += ["", "Where each rank was:", clip_middle(record.detail, TRACEBACK_LIMIT, f"node {node}'s logs")]
    lines += ["", f"Ranks on this node (node {state.node_rank}):"]
    lines += fate_lines([(rs.rank, "", str(rs.exit_description or rs.status)) for rs in state.ranks])
    lines.append(f"Logs of this node: {state.log_dir} (node {node} has its own)")
    # another node's rank: its pid and local rank are not known here (-1); exit code 1
    facts = [] if rank is None else [RankFailureFacts(rank=rank, local_rank=-1, pid=-1, exitcode=1,
                                                      headline=record.headline, traceback=record.traceback)]
    return LaunchError("\n".join(lines), rank=rank, node_rank=node, kind=record.kind,
                       exc_type=record.exc_type,
                       exc_message=None if record.exc_message is None else clip_middle(record.exc_message,
                                                                                        MESSAGE_LIMIT, where),
                       remote_traceback=clip_middle(record.traceback, TRACEBACK_LIMIT, where) or None,
                       log_dir=state.log_dir, results=[None] * len(state.ranks),
                       failures=process_failures(facts, state.log_dir))


def with_attempts(error: LaunchError, used: int, max_restarts: int) -> LaunchError:
    """Add which attempt failed and whether restarts were left (elastic runs with restarts)."""
    if max_restarts > 0:
        note = (f"\nAttempt {used + 1} of {max_restarts + 1}: "
                f"{'no restarts left' if used >= max_restarts else 'not restarted'} "
                f"(max_restarts={max_restarts}).")
        error.args = (error.args[0] + note,)
    return error


def with_note(error: LaunchError, note: str) -> LaunchError:
    """Add a closing line to the error: what became of persistent ranks after it."""
    error.args = (error.args[0] + "\n" + note,)
    return error


INTERRUPT = "an interrupt"   # a stop's reason when the user interrupted (Ctrl-C, the kernel's interrupt)


def stop_cause(exc: BaseException) -> str:
    """What ended the notebook's wait, in the words every stop message uses ("... after {cause}"):
    the user's own exception (an alarm handler's TimeoutError, a SystemExit) is named as itself,
    not called an interrupt."""
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPT
    if isinstance(exc, SystemExit):
        return "sys.exit() in the notebook"
    return f"{type(exc).__name__} raised in the notebook"


def after(reason: str, what: str) -> str:
    """``what`` after ``reason``; only ``what`` when the reason is an interrupt and ``what`` says so
    already ("interrupted after an interrupt", "the interrupt after an interrupt")."""
    return what if reason == INTERRUPT else f"{what} after {reason}"


def ranks_not_back(not_back: Sequence[int], grace: float, cause: str) -> str:
    """Why persistent ranks were stopped: they did not answer the interrupt."""
    who = ", ".join(f"rank {r}" for r in not_back)
    return (f"{who} did not come back within {grace:g} s of {after(cause, 'the interrupt')} (code waiting "
            f"in C, e.g. a gloo collective or barrier, does not return to Python on an interrupt)")


def ranks_lost_note(lost: str) -> str:
    """The closing line of a call's error when its persistent ranks had to be stopped."""
    return (f"Every rank was stopped because {lost}. The next call starts fresh ranks; their state "
            f"(models, variables, process group) is lost.")


def lost_contact_error(exc: Exception, state: RunState) -> LaunchError:
    message = f"node {state.node_rank}: {exc}. This node's ranks were stopped."
    return LaunchError(message, kind=FailureKind.RENDEZVOUS, node_rank=state.node_rank,
                       log_dir=state.log_dir, results=[None] * len(state.ranks))


def rendezvous_error(text: str, *, node_rank: int, num_nodes: int, state: RunState) -> LaunchError:
    message = (f"notebook_launch: {text}\nNo rank was started on this node "
               f"(node_rank={node_rank}, num_nodes={num_nodes}).")
    return LaunchError(message, kind=FailureKind.RENDEZVOUS, node_rank=node_rank,
                       log_dir=state.log_dir, results=[None] * len(state.ranks))


def cluster_error(text: str, state: RunState, *, rank: int | None = None,
                  kind: str = FailureKind.RENDEZVOUS) -> LaunchError:
    """A run on a cluster (Ray) that ended before its ranks ran: placement timed out, ranks could
    not connect back to the notebook, or a rank's actor failed to start."""
    return LaunchError(f"notebook_launch: {text}", rank=rank, kind=kind, log_dir=state.log_dir,
                       results=[None] * len(state.ranks))


def restart_notice(record: Failure, next_attempt: int, max_restarts: int, multi_node: bool) -> str:
    """The line printed when a failed attempt is restarted."""
    rank_words = f", rank {record.rank}" if record.rank is not None else ""
    who = f"node {record.node}{rank_words}" if multi_node else f"rank {record.rank}"
    return (f"notebook_launch: {who} failed ({record.headline}); restarting every rank "
            f"(restart {next_attempt} of {max_restarts})")


def error_summary(error: LaunchError) -> str:
    """The one line the display shows for the run's end."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__

