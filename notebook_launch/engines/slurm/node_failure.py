"""Which ranks the supervisor sees end first when a node of the job fails.

When a node dies (power, network, its slurmd), slurmctld marks it down after its timeouts and ends
the job NODE_FAIL: it cancels the steps on the nodes that still live, and tells the failed node's
``srun`` its node failed. Both ``srun``s end at about the same time, in no set order, and the run's
error is the rank whose end the supervisor sees first. It must be a rank of the node that failed:
"rank 0 ... a node failed" names a rank that ran on a healthy node. So a step SLURM cancelled for
another node's failure (its ``srun`` printed ``CANCELLED ... DUE TO NODE FAILURE``) holds its ranks'
ends until a rank of a failed node (its ``srun`` printed ``Node failure on <its node>``) was taken,
``FAILED_NODE_WITHIN`` seconds at most (a node whose srun says nothing of it ends as it came).

Why the srun's words and not the time a rank's connections closed: a node that loses power or its
network closes no connection, and its ranks' sockets stay open until TCP gives up on them.
"""
from __future__ import annotations

import re
import threading

NODE_FAILURE = re.compile(r"Node failure on (\S+)")
CANCELLED_FOR_NODE_FAILURE = re.compile(r"CANCELLED AT \S+ DUE TO NODE FAILURE")
# Seconds a healthy node's cancelled step waits for the failed node's srun: both hear from slurmctld
# in the same moment, give or take its message retries.
FAILED_NODE_WITHIN = 10.0


def failed_here(said: str, node: str) -> bool:
    """Whether a node step's ``srun`` output ``said`` its own ``node`` failed."""
    return any(match.group(1) == node for match in NODE_FAILURE.finditer(said))


def cancelled_for_another_node(said: str, node: str) -> bool:
    """Whether SLURM cancelled the step on ``node`` because another node of the job failed."""
    return CANCELLED_FOR_NODE_FAILURE.search(said) is not None and not failed_here(said, node)


class NodeFailureOrder:
    """Shared by one launch's node agents: a healthy node's step waits (``wait_turn``) until a failed
    node's rank was taken (``taken``), or until the notebook ends the steps itself (``open``)."""

    def __init__(self) -> None:
        self._failed_node_seen = threading.Event()

    def wait_turn(self, said: str, node: str) -> None:
        """(A node agent's reader, once its ``srun`` ended, before its ranks end) hold this node's
        ranks behind a failed node's when SLURM cancelled its step for another node's failure."""
        if cancelled_for_another_node(said, node):
            self._failed_node_seen.wait(FAILED_NODE_WITHIN)

    def taken(self, said: str, node: str) -> None:
        """The supervisor took the end of a rank on ``node``, whose srun output is ``said``."""
        if failed_here(said, node):
            self.open()

    def open(self) -> None:
        """Nothing waits any more (a failed node's rank was seen, or the notebook ends the steps)."""
        self._failed_node_seen.set()
