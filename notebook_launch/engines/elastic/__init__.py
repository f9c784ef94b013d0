"""Multi-node launches and restarts on torch elastic's agent, inside the same run
scaffold as a single-node launch (``run.run_with_scaffold``).

Elastic's own launcher (``elastic_launch``) installs SIGTERM/SIGINT/SIGHUP/
SIGQUIT handlers through its process context and never restores them; our
agent does not use that context, and the scaffold saves and restores every
handler around the run so a notebook kernel gets back exactly what it had.

Owns: multi-node launches and restarts under torch elastic's agent. May import: ``engines.base``,
``engines.local``'s launchers, the run scaffold, supervise, diagnose, planning, wire, channels, the rank side;
never another engine.
"""
from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from ...scaffold.run import RunContext, run_with_scaffold

if TYPE_CHECKING:
    from ...planning.options import LaunchOptions
    from ...wire.plan import LaunchPlan
    from ...rank.runner import Job
    from .rendezvous import RendezvousSettings


def run_elastic(plan: "LaunchPlan", job: "Job", options: "LaunchOptions", *, rendezvous: "RendezvousSettings",
                run_id: str, platform: str | None = None) -> list[Any]:
    """Run ``plan``'s ranks under elastic's agent; return this node's results or raise LaunchError."""
    from .agent import ElasticRun, describe

    def body(run: RunContext) -> list[Any]:
        ended = ElasticRun(run=run, job=job, settings=rendezvous).execute()
        # The agent, its rendezvous handler and their TCPStore server (its libuv thread, sockets and
        # port) can sit in a reference cycle once the run is over (a timeout's traceback): freed
        # now, not at the next collection, so the port and the descriptors end with the run.
        gc.collect()
        if ended.error is not None:
            raise ended.error
        if ended.interrupted:
            raise KeyboardInterrupt("notebook_launch: the run was interrupted; every rank on this node was stopped")
        assert ended.results is not None, "an elastic run that succeeded has its ranks' results"
        return ended.results

    from ..local import get_backend   # each attempt's ranks start as this machine's do
    return run_with_scaffold(plan, body, options, run_id=run_id, platform=platform, backend_suffix="+elastic",
                             launcher=get_backend(plan.start_method),
                             extra_lines=(describe(rendezvous, options.max_restarts),))
