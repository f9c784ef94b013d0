"""The SLURM job a launch's ranks run in (``Allocation``), on the notebook's side: asked for, named
when the scheduler ended it, and ended. ``slurm.launcher.SlurmLauncher`` holds one and starts its
steps in it.

``ask`` runs ``salloc --no-shell`` (no batch script, no shell) and waits while the job is queued:
its ``StartWatch`` is told, so every rank's row and the cell say "pending (Resources)", and ticked,
so Stop cancels it; a pending reason that never ends (``feasibility``) or the launch's ``timeout=``
running out in the queue ends it, saying so. Before it, the watchdog (``slurm.watchdog``) starts:
it cancels the job if the notebook dies. A launch with ``max_restarts`` runs every attempt in the
one job (``ended`` says when the scheduler ended it, so no attempt can run in it again); ``release``
scancels it, waits until SLURM holds nothing of it (``end_wait``: the cell is told what it waits
for, and a node whose slurmd does not answer is not waited for) and lets the watchdog go.
"""
from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable

from ..base import StartFailed, StartWatch
from ...errors import GuardError
from ...wire.protocol import FailureKind
from . import scheduler
from .feasibility import never_starting_reason, reason_words
from .records import Node

if TYPE_CHECKING:
    from .cluster import SlurmCluster

log = logging.getLogger("notebook_launch")
TICK = 0.1            # seconds between looks at salloc and the panel while the job waits
STATE_EVERY = 1.0     # seconds between questions to the scheduler while it waits
GONE_TIMEOUT = 60.0   # seconds for SLURM to end a cancelled job's processes
SAY_AFTER = 5.0      # seconds a cancelled job may take to end before the cell is told what it waits for
END_RECORDED = 5.0    # seconds scontrol may take to record the end of a job whose rank SLURM killed
ALLOCATION = re.compile(r"job allocation (\d+)")


class Allocation:
    """One job of ``cluster``'s shape named ``job_name``: ``job_id`` once SLURM queued it, ``nodes``
    ((name, address) in node order) once granted."""

    def __init__(self, cluster: "SlurmCluster", job_name: str) -> None:
        self.cluster = cluster
        self.job_name = job_name
        self.job_id: str | None = None
        self.nodes: list[tuple[str, str]] = []
        self.ended_by: str | None = None   # what the scheduler did to the job, once a rank's end said it
        self._salloc: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self._cancelled = False    # the job was cancelled and waited for
        self.queued = 0.0          # seconds the job waited in the queue before it was granted
        self.say: Callable[[str], None] = lambda text: None   # the cell, once ``ask`` was given a watch

    def ask(self, watch: StartWatch, per_node: int, folder: Path, timeout: float | None = None) -> None:
        """salloc, waiting while the job is queued: the watch is ticked (the panel stays live), told
        why the job waits ("pending (Resources)": every rank's row, and once in the cell), and Stop
        or an interrupt cancels it (the launcher's ``end``, then ``release``). A job whose pending
        reason says it can never start (``feasibility.never_starting_reason``), or still pending
        ``timeout`` seconds after it was submitted, ends the start (StartFailed); ``queued`` is
        how long it waited."""
        self.say = watch.announce
        self._watchdog = start_watchdog(self.job_name)
        said_path = folder / "salloc.out"
        with open(said_path, "wb") as out:
            self._salloc = salloc = subprocess.Popen(
                scheduler.salloc_argv(self.cluster, per_node, self.job_name), env=scheduler.slurm_environment(),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        submitted = time.monotonic()
        shown, asked, reason = "", 0.0, ""
        while True:
            said = said_path.read_text(errors="replace")
            found = ALLOCATION.search(said)
            if found:
                self.job_id = found.group(1)
            code = salloc.poll()
            if code is not None:
                break
            watch.tick()
            if self.job_id and time.monotonic() - asked > STATE_EVERY:
                asked = time.monotonic()
                info = scheduler.job_info(self.job_id)
                reason = info.reason if info.state == "PENDING" else ""
                if reason:
                    self._check_reason(reason, per_node)
                news = f"pending ({reason})" if reason else info.state.lower()
                if news != shown:
                    shown = news
                    watch.waiting_for(f"SLURM job {self.job_id} {news}")
                    watch.announce(f"SLURM job {self.job_id} {news}"
                                   + ("; Stop or Ctrl-C cancels it" if reason else ""))
            if timeout is not None and time.monotonic() - submitted > timeout and (reason or not self.job_id):
                raise StartFailed(still_pending(timeout, self.job_id, reason), kind=FailureKind.TIMEOUT)
            time.sleep(TICK)
        self.queued = time.monotonic() - submitted
        self._granted(code, said, watch)

    def _granted(self, code: int, said: str, watch: StartWatch) -> None:
        """salloc ended with ``code``: the job runs (its nodes are read) or the start fails, saying why."""
        if code or not self.job_id:
            refused = self.refusal_cause()
            raise StartFailed(
                (f"{refused}. " if refused else "")
                + f"SLURM did not grant the allocation (salloc exit code {code}); salloc said:\n{said.strip()}")
        job = scheduler.job_info(self.job_id)
        if job.state != "RUNNING":
            raise StartFailed(f"SLURM job {self.job_id} is {job.state} right after it was granted ({job.reason})")
        watch.announce(f"SLURM job {self.job_id} runs on {job.node_list}, time limit {job.time_limit or 'UNLIMITED'}")
        self.nodes = scheduler.node_addresses(job.node_list)

    def _check_reason(self, reason: str, per_node: int) -> None:
        """End the wait of a job whose pending ``reason`` says it can never start, with what the
        cluster has (``feasibility``), where scontrol says it."""
        meaning = never_starting_reason(reason)
        if meaning is None:
            return
        why = scheduler.why_never_starts(self.cluster, per_node * self.cluster.nodes)
        raise StartFailed(f"SLURM job {self.job_id} can never start: it is pending ({reason}): {meaning}"
                          + (f"; {why}" if why else "") + ". The job was cancelled.")

    def refusal_cause(self) -> str | None:
        """What the scheduler's record says ended a job that was queued but never granted (salloc
        only says "Job has been cancelled"): a --deadline it could no longer meet (DEADLINE), an
        scancel, nodes that did not boot."""
        if self.job_id is None:
            return None
        try:
            return scheduler.job_info(self.job_id).end_cause()
        except (GuardError, OSError, subprocess.SubprocessError):
            log.debug("could not ask SLURM about job %s", self.job_id, exc_info=True)
            return None

    def scheduler_cause(self, signalled: bool) -> str | None:
        """What the scheduler's record says ended the job (a time limit, a node failure, ...), if it
        did; a rank it killed (``signalled``) may end before the record says so: asked again for
        up to END_RECORDED seconds."""
        assert self.job_id is not None
        deadline = time.monotonic() + (END_RECORDED if signalled else 0)
        while True:
            try:
                info = scheduler.job_info(self.job_id)
            except (GuardError, OSError, subprocess.SubprocessError):
                log.debug("could not ask SLURM about job %s", self.job_id, exc_info=True)
                return None
            cause = info.end_cause()
            if cause or not info.live or time.monotonic() > deadline:
                return cause
            time.sleep(0.2)

    def ended(self) -> str | None:
        """Why the job can take no further attempt, once the scheduler ended it (a time limit, a node
        failure, preemption, a cancel); None while it runs. Asked after a failed attempt's end."""
        if self.job_id is None:
            return None
        cause = self.ended_by   # srun's "Node failure on node1" comes before the node is marked down
        if cause is None:
            try:
                info = scheduler.job_info(self.job_id)
            except (GuardError, OSError, subprocess.SubprocessError):
                log.debug("could not ask SLURM about job %s", self.job_id, exc_info=True)
                return None
            if info.state == "RUNNING":
                return None
            cause = info.end_cause() or f"its state is {info.state} ({info.reason})"
        return (f"Not restarted: SLURM job {self.job_id} ended ({cause}), so no attempt can run in its "
                f"allocation again; run the launch again to ask SLURM for a new one.")

    def cancel(self) -> None:
        """scancel the job and wait until it is gone (once), or give its request up while salloc waits."""
        if self._cancelled:
            return
        if self.job_id is not None:
            self._cancelled = True
            cancel_and_wait(self.job_id, self.say)
        elif self._salloc is not None and self._salloc.poll() is None:
            self._salloc.send_signal(signal.SIGTERM)   # not queued yet: salloc gives the request up

    def reap_salloc(self) -> None:
        if self._salloc is not None:
            reap(self._salloc)

    def release(self) -> None:
        """Leave nothing of the job: cancelled and gone from the nodes (or its request given up while
        salloc waits), salloc reaped, the watchdog let go."""
        try:
            self.cancel()
            self.reap_salloc()
        finally:
            self._salloc = None
            if self._watchdog is not None:
                stop_watchdog(self._watchdog)
                self._watchdog = None


def still_pending(timeout: float, job_id: str | None, reason: str) -> str:
    """The error of a ``timeout`` that ran out while the job waited in the queue for ``reason``
    (its pending reason; "" before scontrol said one)."""
    where = (f"SLURM job {job_id} was still pending in the queue after {timeout:g} s"
             + (f": reason {reason_words(reason)}" if reason else "") if job_id
             else f"salloc had not queued the job after {timeout:g} s")
    return (f"timeout={timeout:g} s ran out before the ranks started: {where}. No rank ran; the job was "
            f"cancelled. timeout= counts the wait in SLURM's queue too: give one with room for it, or "
            f"timeout=None to wait as long as the queue takes")


def cancel_and_wait(job_id: str, say: Callable[[str], None] = lambda text: None) -> None:
    """scancel, then until SLURM holds nothing of the job (its processes on every node ended), as
    ``end_wait`` decides: GONE_TIMEOUT at most, the cell told (``say``) what it waits for once it
    takes SAY_AFTER seconds, and no wait for nodes whose slurmd does not answer. A scheduler that
    does not answer is logged, never raised: the run's own error must reach the cell (and the
    watchdog cancels the job again when it is let go)."""
    start, said = time.monotonic(), False
    try:
        scheduler.cancel(job_id)
        while True:
            completing = scheduler.completing_on(job_id)
            live = bool(completing) or scheduler.job_info(job_id).live
            nodes = scheduler.nodes_of(completing) if completing else []
            done, text = end_wait(job_id, live, completing, nodes, time.monotonic() - start, said)
            if text:
                say(text)
                said = True
            if done:
                return
            time.sleep(0.1 if time.monotonic() - start < SAY_AFTER else 0.5)
    except (GuardError, OSError, subprocess.SubprocessError):
        log.debug("could not cancel SLURM job %s or see it end", job_id, exc_info=True)


def end_wait(job_id: str, live: bool, completing: str, nodes: list[Node], waited: float,
             said: bool) -> tuple[bool, str]:
    """The wait for a cancelled job's end, after ``waited`` seconds: whether it is over, and what
    to tell the cell now. ``live``: SLURM still holds the job; ``completing``: the nodes (a
    hostlist) where it still ends the job's processes, and ``nodes`` what scontrol says of them.
    Nodes whose slurmd does not answer (NOT_RESPONDING, DOWN) are not waited for: SLURM ends the
    job there only once they answer again or are marked DOWN, minutes later on most clusters
    (SlurmdTimeout), while every rank's result may be in already."""
    if not live:
        return True, ""
    silent = [node for node in nodes if not node.answers]
    if completing and silent and len(silent) == len(nodes):
        states = ", ".join(f"{node.name}: {node.state}" for node in silent)
        return True, (f"SLURM job {job_id} is cancelled but not yet ended on {completing}, whose slurmd does not "
                      f"answer ({states}): not waiting for it (SLURM ends the job there once the node answers "
                      f"again or is marked DOWN)")
    if waited > GONE_TIMEOUT:
        return True, (f"SLURM job {job_id} is still not ended {GONE_TIMEOUT:g} s after scancel"
                      + (f" (completing on {completing})" if completing else "") + "; not waiting longer")
    if waited > SAY_AFTER and not said:
        return False, (f"waiting for SLURM to end job {job_id}"
                       + (f" on {completing} (COMPLETING: its processes there are being ended)" if completing else "")
                       + f", {GONE_TIMEOUT - waited:.0f} s more at most")
    return False, ""


def reap(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=GONE_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_watchdog(job_name: str) -> subprocess.Popen:
    """The process that cancels the job if the notebook dies (``slurm.watchdog``): its file run as a
    script in isolated mode (standard library only), not ``-m notebook_launch...``, which would
    import the whole package first (a quarter of a second of CPU, while the nodes' agents import torch)."""
    env = scheduler.slurm_environment()
    return subprocess.Popen([sys.executable, "-I", str(Path(__file__).with_name("watchdog.py")), job_name], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop_watchdog(watchdog: subprocess.Popen) -> None:
    stdin: IO[bytes] | None = watchdog.stdin
    if stdin is not None:
        stdin.close()
    reap(watchdog)
