"""Multi-node launches and restarts on torch elastic's agent, inside the same run
scaffold as a single-node launch (``run.run_with_scaffold``).

Elastic's own launcher (``elastic_launch``) installs SIGTERM/SIGINT/SIGHUP/
SIGQUIT handlers through its process context and never restores them; our
agent does not use that context, and the scaffold saves and restores every
handler around the run so a notebook kernel gets back exactly what it had.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..run import RunContext, run_with_scaffold

if TYPE_CHECKING:
    from ..plan import LaunchPlan
    from ..rank.runner import Job
    from .rendezvous import RendezvousSettings


def run_elastic(plan: "LaunchPlan", job: "Job", *, rendezvous: "RendezvousSettings", max_restarts: int,
                run_id: str, log_dir: Any, ui: str, timeout: float | None, poll_interval: float,
                line_prefix: str | None, platform: str | None = None,
                display_ranks: frozenset[int] | None = frozenset({0})) -> list[Any]:
    """Run ``plan``'s ranks under elastic's agent; return this node's results or raise LaunchError."""
    from .agent import ElasticRun, describe

    def body(run: RunContext) -> list[Any]:
        kind, value = ElasticRun(run=run, job=job, settings=rendezvous, max_restarts=max_restarts,
                                 poll_interval=poll_interval, timeout=timeout).execute()
        if kind == "results":
            return value
        if kind == "error":
            raise value
        raise KeyboardInterrupt("notebook_launch: the run was interrupted; every rank on this node was stopped")

    return run_with_scaffold(plan, body, run_id=run_id, log_dir=log_dir, ui=ui, line_prefix=line_prefix,
                             platform=platform, backend_suffix="+elastic", max_restarts=max_restarts,
                             extra_lines=(describe(rendezvous, max_restarts),), display_ranks=display_ranks)
