"""Elastic as an ``engines.Engine``: a multi-node or restarting launch of this machine's ranks,
under torch elastic's agent (``run_elastic``), started by ``local``'s launchers."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...planning.options import LaunchOptions
    from ...persistent.pool import Ranks


class ElasticEngine:
    """This machine's ranks as one node of an elastic run (``num_nodes > 1`` or ``max_restarts``)."""

    name = "elastic"
    line_prefix: str | None = None

    def launch(self, options: LaunchOptions) -> list[Any]:
        from ...planning import net
        from ...planning.prepare import plan_launch
        from ...rank.runner import Job
        from . import run_elastic
        from .rendezvous import settings_for
        target, plan, run_id = plan_launch(options)
        try:
            return run_elastic(plan, Job(options.function, options.args, options.kwargs), options,
                               rendezvous=settings_for(options, port=plan.master_port), run_id=run_id,
                               platform=target.where.platform)
        finally:
            net.release_claims(run_id)

    def start_ranks(self, parameters: Mapping[str, Any], grace: float) -> Ranks:
        raise AssertionError("persistent ranks have no elastic form: engine_for(None, ...) never picks it")
