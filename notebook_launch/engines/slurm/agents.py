"""The notebook's side of a node's agent (``slurm.node_agent``): its ``srun`` step (``NodeAgent``)
and each rank the agent forked, seen as a process (``AgentRank``). ``slurm.launcher`` makes both.

A forked rank is no child of the notebook: its end comes from the agent, one line per rank on
the step's stdout, read by one thread per node that turns it into the rank's status and makes the
rank's sentinel (a pipe's read end) readable. If the agent itself ends first (SLURM cancelled or
killed its step: a time limit, a node failure, a memory kill, the notebook's own cancel), the
ranks it had not reported end with the step's exit code, as a rank's own step did before.

When SLURM kills a node's step for its memory, it kills the agent and the ranks together, in no
set order: the rank that grew (``culprit``) must still be the one the supervisor sees end first,
so the run's error is that rank's. The ranks that go with it are held back until its end was
taken, both those the dying agent never reported and those it saw killed just before it died.
When SLURM ends the job because a node failed, the ranks of that node are seen to end before those
of the steps SLURM cancelled on the nodes that live on (``node_failure``).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from typing import Callable

from ...channels import WaitStatus
from ...channels.sockets import SocketPipes
from .node_failure import NodeFailureOrder
from ..remote.handle import RemoteRank

log = logging.getLogger("notebook_launch")
# Seconds a rank the agent saw SIGKILLed waits for the agent's own end, when another rank holds the
# most memory: SLURM killing the step for memory reaches the agent within this; a rank killed alone
# (the kernel's OOM killer, a user's kill) is then released as it came.
KILLED_WITH_THE_STEP_WITHIN = 5.0


class NodeAgent:
    """One node's step: ``popen`` is its ``srun`` (stdout a pipe: the agent's reports), ``ranks``
    the global ranks it forks. ``ends[rank]`` is (status, said by the agent) once the rank ended.
    ``name`` is the node's, ``said()`` what srun and the step said (its output file), and ``order``
    is shared by the launch's agents (``node_failure``)."""

    def __init__(self, node_rank: int, ranks: range, popen: subprocess.Popen, *, name: str = "",
                 said: Callable[[], str] = lambda: "", order: NodeFailureOrder | None = None) -> None:
        self.node_rank = node_rank
        self.name = name
        self.said = said
        self.order = order or NodeFailureOrder()
        self.ranks = ranks
        self.popen = popen
        self.killed = False   # the notebook ended the step (every rank of it was sent SIGKILL)
        self.ends: dict[int, tuple[WaitStatus, bool]] = {}
        self._lock = threading.Lock()
        self._pipes = {rank: os.pipe() for rank in ranks}   # rank -> (sentinel, its write end)
        self._handed: set[int] = set()   # ranks whose sentinel an AgentRank owns
        self.largest: int | None = None   # the rank the agent last saw holding clearly the most memory
        self._deferred: list[int] = []   # ranks whose end waits behind the culprit's (``taken``)
        self._holder: int | None = None   # the rank whose taken end releases them
        self._released: set[int] = set()  # ranks whose sentinel is readable (its write end closed)
        self._taken: set[int] = set()     # ranks whose end the supervisor took
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"notebook_launch-slurm-node{node_rank}")
        self._reader.start()

    def sentinel(self, rank: int) -> int:
        """A fd that becomes readable once ``rank`` ended; the caller owns it from now on."""
        self._handed.add(rank)
        return self._pipes[rank][0]

    def _read(self) -> None:
        stdout = self.popen.stdout
        assert stdout is not None, "the agent's stdout is a pipe"
        for line in stdout:
            try:
                rank_text, kind, value = line.decode().split()
                if kind == "largest":
                    self.largest = int(rank_text)
                else:
                    self._ended(int(rank_text), (kind, int(value)))
            except ValueError:
                log.debug("node %d's agent said %r", self.node_rank, line)
        code = self.popen.wait()
        if not self.killed:   # SLURM cancelled it because another node failed: that node's ranks first
            self.order.wait_turn(self.said(), self.name)
        status: WaitStatus = ("signal", code - 128) if code > 128 else ("exit", code)
        # the agent died with the ranks it had not reported (SLURM ended its step): the rank that
        # held the most memory ends first (a node's step is killed for the memory of all its
        # ranks), the others only once its end was taken (``taken``), so the supervisor sees the
        # cause before the ranks that went with it
        with self._lock:
            first = self.culprit()
            self._holder = first if first is not None and first not in self._taken else None
            for rank in self.ranks:
                if rank not in self.ends:
                    self.ends[rank] = (status, False)
                    self._deferred.append(rank)
            if self._holder is None:
                self._release()
            else:
                self._release_one(self._holder)

    def culprit(self) -> int | None:
        """The rank the node's step was most likely killed for, when SLURM killed it for its memory:
        the one the agent last saw holding clearly the most (a node with one rank: that rank)."""
        if self.largest is not None:
            return self.largest
        return self.ranks[0] if len(self.ranks) == 1 else None

    def taken(self, rank: int) -> None:
        """The supervisor took ``rank``'s end: the ranks held back behind it end now."""
        self.order.taken(self.said(), self.name)
        with self._lock:
            self._taken.add(rank)
            if rank in (self._holder, self.culprit()):
                self._release()

    def _release(self) -> None:
        """(Under the lock) every held-back rank ends now."""
        deferred, self._deferred = self._deferred, []
        for rank in deferred:
            self._release_one(rank)

    def _release_one(self, rank: int) -> None:
        """(Under the lock) ``rank``'s sentinel becomes readable, once."""
        if rank in self._deferred:
            self._deferred.remove(rank)
        if rank not in self._released:
            self._released.add(rank)
            os.close(self._pipes[rank][1])

    def _ended(self, rank: int, status: WaitStatus) -> None:
        """The agent reported ``rank``'s end. One SIGKILLed while another rank holds the most memory
        waits behind that rank (see the module), for ``KILLED_WITH_THE_STEP_WITHIN`` seconds at most."""
        with self._lock:
            if rank not in self._pipes or rank in self.ends:
                return
            self.ends[rank] = (status, True)
            culprit = self.culprit()
            if status == ("signal", signal.SIGKILL) and not self.killed and culprit not in (None, rank, *self._taken):
                self._deferred.append(rank)
                timer = threading.Timer(KILLED_WITH_THE_STEP_WITHIN, self._release_if_held, (rank,))
                timer.daemon = True
                timer.start()
                return
            self._release_one(rank)

    def _release_if_held(self, rank: int) -> None:
        """The step did not end with the rank's kill: it was killed alone, so it ends as it came."""
        with self._lock:
            if self._holder is None and rank in self._deferred:
                self._release_one(rank)

    def kill(self) -> None:
        """End the step (SIGTERM to srun: SLURM cancels it and SIGKILLs every process in it)."""
        self.killed = True
        self.order.open()   # the notebook ends every step: no end waits for another node's
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                log.debug("srun of node %d is gone already", self.node_rank)

    def close(self, timeout: float) -> None:
        """Once srun was reaped: the reader has seen its end (``timeout`` seconds at most), and the
        sentinels no rank took (a start that failed) are closed."""
        self._reader.join(timeout)
        if not self._reader.is_alive() and self.popen.stdout is not None:
            self.popen.stdout.close()
        with self._lock:
            self._holder = None
            self._release()
        for rank, (sentinel, _) in self._pipes.items():
            if rank not in self._handed:
                os.close(sentinel)
        self._handed.update(self._pipes)


class AgentRank(RemoteRank):
    """A rank its node's agent forked: a kill ends its node's step, so every rank of that node. Its
    pid is the node step's ``srun``, on this machine."""

    def __init__(self, local_rank: int, agent: NodeAgent, pipes: SocketPipes,
                 end_cause: Callable[[int, int], str | None]) -> None:
        """``end_cause(rank, exit code)``: what the scheduler says ended it (``SlurmLauncher.end_cause``)."""
        self.local_rank = local_rank
        self.agent = agent
        self.pid = agent.popen.pid
        self.pipes = pipes
        self.end_cause = end_cause
        self.sent_signal: int | None = None
        self._status: WaitStatus | None = None
        self.sentinel: int | None = agent.sentinel(local_rank)

    def poll(self) -> WaitStatus | None:
        if self._status is None:
            end = self.agent.ends.get(self.local_rank)
            if end is not None:
                status, by_agent = end
                code = 128 + status[1] if status[0] == "signal" else status[1]
                # the scheduler may know why (a time limit, a node failure), unless we ended it or it
                # exited cleanly by itself
                if self.sent_signal is None and not self.agent.killed and not (by_agent and code == 0):
                    self.end_note = self.end_cause(self.local_rank, code)
                self._status = status
                self.agent.taken(self.local_rank)
        return self._status

    def kill(self) -> None:
        self.sent_signal = signal.SIGKILL
        self.agent.kill()


class PersistentAgentRank(AgentRank):
    """A persistent rank (``slurm.persistent``): a signal ends it (``RemoteRank.signal``), and the
    kill ends its node's step, so the node's other ranks too: the pool then starts every rank again
    on a new allocation."""

    persistent = True
