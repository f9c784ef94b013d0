"""The listener a SLURM rank's connections come back to (``RankListener``, made by ``slurm.launcher``),
and what every SLURM rank's handle does alike (``RemoteRank``); the ranks a node's agent forks are
``slurm.agents.AgentRank``."""
from __future__ import annotations

import logging
import os
import select
import signal
from typing import Any, Callable

from ...diagnose.remote_where import WhereAsker
from ...channels import RankProcess, WaitStatus
from ...channels.sockets import STREAMS, SocketPipes, StreamListener

log = logging.getLogger("notebook_launch")
CLUSTER_LINE_PREFIX = "[node {node_rank} rank {rank}]"   # ranks are on several machines: say which


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
    """What the handle of every rank that connected back from another machine does alike (Ray's
    ``ray.gang.RayRank``, an actor; SLURM's ``slurm.agents.AgentRank``, a child of its node's agent;
    and their persistent kinds): signals travel over the rank's events connection (its rank side
    delivers them), SIGKILL or a closed connection is a ``kill``, and where it is is asked over its
    connections with every rank of its run at once. Its process runs on a node (``on_this_machine``)."""

    on_this_machine = False
    persistent = False   # a persistent rank's (its events connection carries the notebook's messages)
    where_asker: WhereAsker | None = None   # its run's ranks, asked where they are together
    pipes: SocketPipes
    sent_signal: int | None = None
    _status: WaitStatus | None = None

    @property
    def reaped(self) -> bool:
        return self._status is not None

    def signal(self, signum: int) -> None:
        """Over the events connection; a persistent rank's carries ``channels.remote_commands``
        messages, where a launch's raw signal frame is never written (the rank would read it as a
        where request and ignore it): anything but an interrupt (a message of its own) ends it."""
        self.sent_signal = signum
        if self.persistent or signum == signal.SIGKILL or not self.pipes.send_signal(signum):
            self.kill()

    def where(self, global_rank: Callable[[int], int]) -> dict[int, Any]:
        """Where this rank is, asked over its connections with every rank of the run at once
        (``diagnose.remote_where``, as Ray ranks are asked: the same connections and answers)."""
        asker = self.where_asker
        return {} if asker is None else asker.ask(self, global_rank)

    def release(self) -> None:
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None

