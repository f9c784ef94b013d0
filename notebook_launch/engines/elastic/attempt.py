"""One attempt of an elastic run: the core supervisor, driven a step at a time.

Elastic's agent owns the loop (rendezvous, monitor, restart); the supervisor
owns the ranks of one attempt (pipes, events, output capture, logs,
fail-fast teardown). ``AttemptSupervisor`` is the core ``Supervisor`` with
its ``run`` loop cut into ``step`` calls, so the agent's ``_monitor_workers``
can drive it and nothing about how ranks are watched differs from a plain
single-node launch.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from ...scaffold import restarts
from ...errors import LaunchError
from ...wire.protocol import Failure
from ...supervise import outcome
from ...diagnose.hang_verdict import RankWhereabouts
from ...supervise.supervisor import Step, Supervisor
from .node_board import BoardUnreachable, NodeBoard

# Errors a rank gets because a rank elsewhere died, not because of its own code.
SECONDARY_PATTERNS = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crash|Broken pipe|"
    r"DistNetworkError|DistBackendError|connectFullMesh|NCCL communicator was aborted|"
    r"Socket Timeout|timed out connecting|Connection refused", re.IGNORECASE)


class AttemptSupervisor(Supervisor):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[Any] | None = None
        self.board: NodeBoard | None = None   # set by the agent: a hang's verdict then covers every node

    def whereabouts(self, native: bool = True) -> list[RankWhereabouts]:
        """Every rank of the run, on every node (the board asks the other nodes' agents)."""
        found = super().whereabouts(native)
        if self.board is None or self.board.num_nodes == 1:
            return found
        try:
            return self.board.ask_where(found, outcome.cell_labeller())
        except BoardUnreachable:
            return found

    def local_whereabouts(self) -> list[RankWhereabouts]:
        """This node's ranks only: what this node answers when another one asks."""
        return super().whereabouts()

    def step(self, wait: float) -> Step:
        """The core step; once done, also load the results (a result that cannot be
        unpickled is a failure), then keep the display alive while other nodes finish."""
        if self.results is not None:   # done: waiting for the other nodes, nothing left to watch
            self.display.refresh(self.state)
            if self.state.stop_requested:
                raise KeyboardInterrupt("notebook_launch: run stopped with the Stop button")
            time.sleep(wait)
            return Step.FINISHED
        try:
            status = super().step(wait)
        except BaseException as exc:
            self.stop(outcome.stop_cause(exc))
            raise
        if status is Step.FINISHED:
            results = self.load_results()
            if self.first_failure is not None:   # a result that could not be unpickled
                self.stop(self.failure_reason())
                return Step.FAILED
            self.results = results
        return status

    def close(self) -> None:
        self.stop("the run ended")
        super().close()

    def pids(self) -> dict[int, int]:
        return {w.local_rank: w.process.pid for w in self.watches}

    # --- the failure to report ------------------------------------------------
    def chosen_failure(self) -> Failure:
        """The first failure, unless it looks like a consequence (a broken
        connection) and another local rank failed with a cause of its own."""
        first = self.first_failure
        assert first is not None
        if not looks_secondary(first):
            return first
        for watch in self.watches:
            if watch.error and not watch.error_after_stop \
                    and not looks_secondary(Failure.from_payload(watch.local_rank, watch.error)):
                return Failure.from_payload(watch.local_rank, watch.error)
        return first

    def failure_record(self, node: int, attempt: int) -> Failure:
        """The failure as the other nodes will read it (global rank, node, attempt)."""
        failure = self.chosen_failure()
        rank = self.global_rank(failure.local_rank) if failure.local_rank is not None else None
        return dataclasses.replace(failure, node=node, rank=rank, attempt=attempt,
                                   restartable=restarts.restartable(failure.kind),
                                   secondary=looks_secondary(failure))

    def local_error(self) -> LaunchError:
        """The core LaunchError for a failure on this node (call after close)."""
        return self.launch_error(self.chosen_failure(), self.load_results())


def looks_secondary(failure: Failure) -> bool:
    return bool(SECONDARY_PATTERNS.search(f"{failure.headline}\n{failure.exc_type or ''}"))
