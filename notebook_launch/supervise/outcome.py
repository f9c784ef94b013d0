"""What the end of a run means: how each rank ended, its result, and every LaunchError text.

Nothing here changes the run state; the supervisor records what these
functions decide, and the run scaffold (``run.py``) writes the final status.
"""
from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .. import shared_tensors
from ..errors import LaunchError
from ..protocol import Failure, FailureKind, headline_of
from ..state import DONE, FAILED, STOPPED, RunState, Status

if TYPE_CHECKING:
    from ..backends.base import WaitStatus
    from .watch import RankWatch

LAST_LINES_IN_ERROR = 20  # a crash without a Python traceback shows the rank's last output instead
TERM_GRACE = 2.0          # seconds between SIGTERM and SIGKILL at teardown
log = logging.getLogger("notebook_launch")

SIGNAL_HINTS: dict[int, str] = {
    signal.SIGKILL: "possibly out of memory (the kernel's OOM killer sends SIGKILL)",
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
    if watch.has_result and watch.error is None and (status == ("exit", 0) or shares_process):
        # a rank that shares its process is done once its result arrived,
        # even if the process was then stopped because a sibling failed
        return RankEnd(DONE, "finished")
    if watch.stopped_by_us is not None and watch.error is None:
        return RankEnd(STOPPED, stopped_description(watch.stop_reason, status))
    description = describe_status(status)
    if watch.error is not None:
        return RankEnd(FAILED, description, error=headline_of(watch.error["type"], watch.error["message"]))
    if status == ("exit", 0):
        failure = Failure(local, FailureKind.EXIT.value, "exited with code 0 without returning from the "
                          "function (os._exit(0) or a library that ended the process)")
    elif status[0] == "signal":
        failure = Failure(local, FailureKind.SIGNAL.value, description)
    else:
        failure = Failure(local, FailureKind.EXIT.value, f"{description} without raising a Python "
                          "exception (os._exit, or a crash in C code)")
    return RankEnd(FAILED, description, error=failure.headline, failure=failure)


def describe_status(status: "WaitStatus") -> str:
    kind, value = status
    if kind == "signal":
        name = signal.Signals(value).name if value in signal.Signals._value2member_map_ else str(value)
        hint = SIGNAL_HINTS.get(value)
        return f"killed by {name}" + (f", {hint}" if hint else "")
    return f"exit code {value}"


def stopped_description(stop_reason: str, status: "WaitStatus") -> str:
    if status == ("exit", 0):
        return f"stopped after {stop_reason} (it exited cleanly when asked)"
    how = "SIGTERM" if status == ("signal", signal.SIGTERM) else describe_status(status)
    if status == ("signal", signal.SIGKILL):
        how = f"SIGKILL, it ignored SIGTERM for {TERM_GRACE:g} s"
    return f"stopped by notebook_launch ({how}) after {stop_reason}"


def timeout_failure(timeout: float, running_ranks: Sequence[int]) -> Failure:
    return Failure(None, FailureKind.TIMEOUT.value, f"timed out after {timeout:g} s; ranks still running: "
                   + ", ".join(map(str, running_ranks)))


def load_result(watch: "RankWatch", global_rank: int) -> tuple[Any, Failure | None]:
    """The rank's returned value, unpickled here; a value that cannot be is a failure."""
    if not watch.has_result or watch.result is None:
        return None, None
    try:   # tensors come back over the pages of the rank's result file, not copied
        return shared_tensors.loads(watch.result, watch.pipes.tensors), None
    except Exception as exc:
        return None, Failure(watch.local_rank, FailureKind.RESULT.value,
                             f"the result of rank {global_rank} could not be unpickled in the notebook "
                             f"({type(exc).__name__}: {exc}); return plain data or tensors")


def crash_report_lines(lines: Sequence[str]) -> list[str]:
    """What to quote from a rank that died without a Python traceback: faulthandler's
    report when there is one (it starts with "Fatal Python error"), else the last lines."""
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("Fatal Python error"):
            return list(lines[start:start + 2 * LAST_LINES_IN_ERROR])
    return list(lines[-LAST_LINES_IN_ERROR:])


# --- the error the user sees --------------------------------------------------------------

def launch_error(failure: Failure, results: list[Any], state: RunState) -> LaunchError:
    """The LaunchError for a failure on this node: the failing rank, its traceback (or last
    output), what happened to the other ranks, where the logs are."""
    node = f"node {state.node_rank}, " if state.num_nodes > 1 else ""
    rank: int | None
    if failure.local_rank is None:
        first = f"notebook_launch: {failure.headline}"
        rank = None
    else:
        rank = state.ranks[failure.local_rank].rank
        first = f"{node}rank {rank} failed: {failure.headline}"
    lines = [first]
    if failure.traceback:
        lines += ["", f"Traceback from rank {rank}:", failure.traceback.rstrip()]
    elif failure.local_rank is not None and state.ranks[failure.local_rank].lines:
        recent = crash_report_lines([text for _, text in state.ranks[failure.local_rank].lines])
        lines += ["", f"Last output of rank {rank}:"] + [f"  {text}" for text in recent]
    lines += ["", "Other ranks:" if rank is not None else "Ranks:"]
    for rs in state.ranks:
        if rs.rank == rank:
            continue
        fate = rs.exit_description or rs.status
        if rs.status == FAILED and rs.error:
            fate = f"also failed: {rs.error}"
        lines.append(f"  rank {rs.rank}: {fate}")
    lines.append(f"Logs: {state.log_dir}")
    return LaunchError("\n".join(lines), rank=rank, kind=failure.kind, exc_type=failure.exc_type,
                       exc_message=failure.exc_message, remote_traceback=failure.traceback or None,
                       log_dir=state.log_dir, results=results,
                       node_rank=state.node_rank if state.num_nodes > 1 else None)


def remote_error(record: Failure, state: RunState) -> LaunchError:
    """The LaunchError on this node for a failure another node posted."""
    node, rank = record.node, record.rank
    rank_words = f", rank {rank}" if rank is not None else ""
    first = f"node {node}{rank_words} failed: {record.headline}"
    if rank is None:
        first = f"node {node}: {record.headline}"
    lines = [first]
    if record.traceback:
        lines += ["", f"Traceback from rank {rank} (node {node}):", record.traceback.rstrip()]
    lines += ["", f"Ranks on this node (node {state.node_rank}):"]
    for rs in state.ranks:
        lines.append(f"  rank {rs.rank}: {rs.exit_description or rs.status}")
    lines.append(f"Logs of this node: {state.log_dir} (node {node} has its own)")
    return LaunchError("\n".join(lines), rank=rank, node_rank=node, kind=record.kind,
                       exc_type=record.exc_type, exc_message=record.exc_message,
                       remote_traceback=record.traceback or None, log_dir=state.log_dir,
                       results=[None] * len(state.ranks))


def with_attempts(error: LaunchError, used: int, max_restarts: int) -> LaunchError:
    """Add which attempt failed and whether restarts were left (elastic runs with restarts)."""
    if max_restarts > 0:
        note = (f"\nAttempt {used + 1} of {max_restarts + 1}: "
                f"{'no restarts left' if used >= max_restarts else 'not restarted'} "
                f"(max_restarts={max_restarts}).")
        error.args = (error.args[0] + note,)
    return error


def lost_contact_error(exc: Exception, state: RunState) -> LaunchError:
    message = f"node {state.node_rank}: {exc}. This node's ranks were stopped."
    return LaunchError(message, kind=FailureKind.RENDEZVOUS.value, node_rank=state.node_rank,
                       log_dir=state.log_dir, results=[None] * len(state.ranks))


def rendezvous_error(text: str, *, node_rank: int, num_nodes: int, state: RunState) -> LaunchError:
    message = (f"notebook_launch: {text}\nNo rank was started on this node "
               f"(node_rank={node_rank}, num_nodes={num_nodes}).")
    return LaunchError(message, kind=FailureKind.RENDEZVOUS.value, node_rank=node_rank,
                       log_dir=state.log_dir, results=[None] * len(state.ranks))


def restart_notice(record: Failure, next_attempt: int, max_restarts: int, multi_node: bool) -> str:
    """The line printed when a failed attempt is restarted."""
    rank_words = f", rank {record.rank}" if record.rank is not None else ""
    who = f"node {record.node}{rank_words}" if multi_node else f"rank {record.rank}"
    return (f"notebook_launch: {who} failed ({record.headline}); restarting every rank "
            f"(restart {next_attempt} of {max_restarts})")


def error_summary(error: LaunchError) -> str:
    """The one line the display shows for the run's end."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__

