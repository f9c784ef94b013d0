"""One attempt of an elastic run: the core supervisor, driven a step at a time.

Elastic's agent owns the loop (rendezvous, monitor, restart); the supervisor
owns the ranks of one attempt (pipes, events, output capture, logs,
fail-fast teardown). ``AttemptSupervisor`` is the core ``Supervisor`` with
its ``run`` loop cut into ``step`` calls, so the agent's ``_monitor_workers``
can drive it and nothing about how ranks are watched differs from a plain
single-node launch.
"""
from __future__ import annotations

import re
import time

from ..state import DONE, FAILED
from ..supervisor import Failure, Supervisor

# Errors a rank gets because a rank elsewhere died, not because of its own code.
SECONDARY_PATTERNS = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crash|Broken pipe|"
    r"DistNetworkError|DistBackendError|connectFullMesh|NCCL communicator was aborted|"
    r"Socket Timeout|timed out connecting|Connection refused", re.IGNORECASE)



class AttemptSupervisor(Supervisor):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.results = None

    def step(self, wait: float) -> str:
        """The core step; once done, also load the results (a result that cannot be
        unpickled is a failure), then keep the display alive while other nodes finish."""
        if self.results is not None:   # done: waiting for the other nodes, nothing left to watch
            self.display.refresh(self.state)
            if self.state.stop_requested:
                raise KeyboardInterrupt("notebook_launch: run stopped with the Stop button")
            time.sleep(wait)
            return DONE
        try:
            status = super().step(wait)
        except BaseException:
            self.stop("an interrupt")
            raise
        if status == DONE:
            results = [self._load_result(w) for w in self.watches]
            if self.first_failure is not None:   # a result that could not be unpickled
                self.stop(self._failure_reason())
                return FAILED
            self.results = results
        return status

    def close(self) -> None:
        self.stop("the run ended")
        super().close()

    def results_after_close(self):
        return [self._load_result(w) for w in self.watches]

    def pids(self) -> dict:
        return {w.process.local_rank: w.process.pid for w in self.watches}

    # --- the failure to report ------------------------------------------------
    def chosen_failure(self) -> Failure:
        """The first failure, unless it looks like a consequence (a broken
        connection) and another local rank failed with a cause of its own."""
        first = self.first_failure
        if first is None or not looks_secondary(first):
            return first
        for watch in self.watches:
            error = watch.error
            if error and not SECONDARY_PATTERNS.search(f"{error['type']}: {error['message']}"):
                return Failure(watch.process.local_rank, error.get("kind", "exception"),
                               f"{error['type']}: {error['message']}" if error["message"] else error["type"],
                               error.get("traceback", ""), error["type"], error["message"])
        return first

    def failure_record(self, node: int, attempt: int) -> dict:
        failure = self.chosen_failure()
        rank = self._global(failure.local_rank) if failure.local_rank >= 0 else None
        return {"node": node, "rank": rank, "kind": failure.kind, "headline": failure.headline,
                "traceback": failure.traceback, "exc_type": failure.exc_type,
                "exc_message": failure.exc_message, "attempt": attempt,
                "restartable": failure.kind not in ("timeout", "stopped", "interrupted"),
                "secondary": looks_secondary(failure)}

    def local_error(self, results):
        """The core LaunchError for a failure on this node."""
        error = self._launch_error(self.chosen_failure(), results)
        if self.plan.num_nodes > 1:
            error.node_rank = self.plan.node_rank
        return error


def looks_secondary(failure: Failure) -> bool:
    return bool(SECONDARY_PATTERNS.search(f"{failure.headline}\n{failure.exc_type or ''}"))
