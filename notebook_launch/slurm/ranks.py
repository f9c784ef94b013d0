"""The listener a SLURM rank's connections come back to (``RankListener``, made by ``slurm.launcher``),
what every SLURM rank's handle does alike (``RemoteRank``), and a rank that is its own ``srun`` step
seen as its process (``SlurmRank``). The ranks a node's agent forks are ``slurm.agents.AgentRank``."""
from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
from typing import Any, Callable

from ..ray.where import WhereAsker
from ..channels import RankProcess, WaitStatus
from ..channels.sockets import STREAMS, SocketPipes, StreamListener

log = logging.getLogger("notebook_launch")


class RankListener(StreamListener):
    """The listener, able to tell whether a rank whose srun already ended had connected first: a
    rank that returns at once ends before its connections are accepted (they wait in the queue)."""

    def connected(self, rank: int) -> bool:
        while select.select([self.sock], [], [], 0)[0]:   # take what waits in the listen queue first
            before = len(self._fds)
            self._accept_one()
            if len(self._fds) == before:
                break
        return all((rank, stream) in self._fds for stream in range(len(STREAMS)))


class RemoteRank(RankProcess):
    """What every SLURM rank's handle does alike, whatever stands for its process (its own srun
    step: ``SlurmRank``; a child of its node's agent: ``agents.AgentRank``): signals travel over
    the rank's events connection (``slurm.task`` delivers them), SIGKILL or a closed connection
    is a ``kill``, and where it is is asked over its connections. Its process runs on a node
    (``on_this_machine``)."""

    on_this_machine = False
    where_asker: WhereAsker | None = None   # its run's ranks, asked where they are together
    pipes: SocketPipes
    sent_signal: int | None = None
    _status: WaitStatus | None = None

    @property
    def reaped(self) -> bool:
        return self._status is not None

    def signal(self, signum: int) -> None:
        self.sent_signal = signum
        if signum == signal.SIGKILL or not self.pipes.send_signal(signum):
            self.kill()

    def where(self, global_rank: Callable[[int], int]) -> dict[int, Any]:
        """Where this rank is, asked over its connections with every rank of the run at once
        (``ray.where``, as Ray ranks are asked: the same connections and answers)."""
        asker = self.where_asker
        return {} if asker is None else asker.ask(self, global_rank)

    def release(self) -> None:
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None


class SlurmRank(RemoteRank):
    """A rank's ``srun`` step seen as its process: a kill is SIGTERM to srun, which has SLURM cancel
    the step. Its pid is srun's, on this machine."""

    def __init__(self, local_rank: int, popen: subprocess.Popen, pidfd: int, pipes: SocketPipes,
                 end_cause: Callable[[int, int], str | None]) -> None:
        """``pidfd``: srun's, opened as it started (it may have ended and been reaped since);
        ``end_cause(rank, exit code)``: what the scheduler says ended it (``SlurmLauncher.end_cause``)."""
        self.local_rank = local_rank
        self.popen = popen
        self.pid = popen.pid
        self.pipes = pipes
        self.end_cause = end_cause
        self.sent_signal: int | None = None
        self._status: WaitStatus | None = None
        self.sentinel: int | None = pidfd

    def poll(self) -> WaitStatus | None:
        if self._status is None:
            code = self.popen.poll()
            if code is not None:
                if self.sent_signal is None:   # the scheduler may know why (a time limit, a node failure)
                    self.end_note = self.end_cause(self.local_rank, code)
                self._status = ("signal", code - 128) if code > 128 else ("exit", code)
        return self._status

    def kill(self) -> None:
        self.sent_signal = signal.SIGKILL
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)   # srun: cancel the step, SIGKILL its task
            except ProcessLookupError:
                log.debug("srun of rank %d is gone already", self.local_rank)
