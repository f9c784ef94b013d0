"""Engines: where a run's ranks run. This module is their interface, and the one place that picks one.

``Engine`` is what every engine does for the package's entry points: run a launch
(``notebook_launcher``) and start persistent ranks (``start_ranks``). ``engine_for(options,
cluster)`` picks the engine: a ``RayCluster`` or ``SlurmCluster`` is that cluster's engine, a
multi-node or restarting launch is elastic's agent, anything else this machine's
(``ThisMachine``: its plan's start method says fork, spawn or torch_xla: ``launcher_for``).

Each engine is one folder beside this module, holding its notebook side, its rank side and its
persistent transport: ``local`` (fork, spawn, the warm start process), ``xla`` (torch_xla's
launcher, its replicas' records), ``ray`` and ``slurm`` (each on top of ``remote``: what every
engine whose ranks connect back from other machines shares), ``elastic`` (torch elastic's agent
over ``local``'s launchers). ``base`` is the launcher interface every engine implements
(``Launcher``), what a start that waits tells (``StartWatch``) and a start that fails raises
(``StartFailed``).

Owns: the choice of engine. May import: ``base``, the options, and each engine's folder, lazily,
once chosen (an engine's modules load only when it runs). Nothing outside ``engines/`` imports an
engine's folder but through here and ``base`` (tests/test_import_graph.py); no engine imports
another but ``remote`` (and elastic, ``local``'s launchers).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .ray.cluster import RayCluster        # the clusters' descriptions: light, the package's public types
from .slurm.cluster import SlurmCluster

if TYPE_CHECKING:
    from ..planning.options import LaunchOptions
    from ..persistent.pool import Ranks
    from ..wire.plan import PlanStartMethod
    from .base import Launcher

__all__ = ["Engine", "RayCluster", "SlurmCluster", "ThisMachine", "cluster_reports", "engine_for", "launcher_for"]


class Engine(Protocol):
    """Where ranks run, as the entry points see it."""

    name: str
    line_prefix: str | None   # its ranks' line tag unless the launch names one (None: ``[rank N]``)

    def launch(self, options: LaunchOptions) -> list[Any]:
        """Run a launch from its checked options: this node's results, or a LaunchError."""

    def start_ranks(self, parameters: Mapping[str, Any], grace: float) -> Ranks:
        """Persistent ranks from ``start_ranks``' own arguments (``grace``: its checked
        ``interrupt_grace``), started now."""


def engine_for(options: LaunchOptions | None, cluster: object = None) -> Engine:
    """The engine a launch's ``options`` and ``cluster=`` ask for (``options`` None: persistent
    ranks, which have no elastic form). A cluster of another type is refused here, before anything
    starts."""
    if cluster is not None:
        from ..planning.options import validate_cluster_type
        validate_cluster_type(cluster, (RayCluster, SlurmCluster))
        if isinstance(cluster, SlurmCluster):
            from .slurm.engine import SlurmEngine
            return SlurmEngine(cluster)
        from .ray.engine import RayEngine
        assert isinstance(cluster, RayCluster)
        return RayEngine(cluster)
    if options is not None and options.elastic:
        from .elastic.engine import ElasticEngine
        return ElasticEngine()
    return ThisMachine()


def cluster_reports() -> list[tuple[str, str]]:
    """What each cluster engine would use from here (``notebook-launch env``): the Ray cluster
    ``RayCluster()`` would join, the partitions ``sinfo`` lists."""
    from .ray.connect import environment_report
    from .slurm.scheduler import environment_report as slurm_report
    return [("ray", environment_report()), ("slurm", slurm_report())]


def launcher_for(start_method: PlanStartMethod) -> Launcher:
    """The launcher that starts ranks of this machine by ``start_method`` (validated by
    ``options``): ``local``'s fork and spawn, ``xla``'s xmp.spawn. A cluster's launcher needs its
    connected cluster: its engine makes it."""
    if start_method == "xla":
        from .xla.launcher import XlaBackend
        return XlaBackend()
    from .local import get_backend
    return get_backend(start_method)


class ThisMachine:
    """Ranks of this machine, planned first (``prepare.plan_launch``: the start method is known only
    then: a TPU means torch_xla, a notebook holding CUDA the warm start process), then started by
    ``launcher_for`` the plan's start method inside the run scaffold. Persistent ranks are forked or
    spawned (``local``)."""

    name = "local"
    line_prefix: str | None = None

    def launch(self, options: LaunchOptions) -> list[Any]:
        from ..planning import net
        from ..planning.prepare import plan_launch
        from ..rank.runner import Job
        from ..scaffold.run import run_plan
        target, plan, run_id = plan_launch(options)
        try:
            return run_plan(plan, Job(options.function, options.args, options.kwargs), options, run_id=run_id,
                            platform=target.where.platform, launcher=launcher_for(plan.start_method))
        finally:
            net.release_claims(run_id)

    def start_ranks(self, parameters: Mapping[str, Any], grace: float) -> Ranks:
        """Forked or spawned now, planned as a launch is (``plan_launch``: handed to the transport,
        so that ``local`` needs nothing above it)."""
        from ..persistent.pool import Ranks
        from ..planning.prepare import entry_options, plan_launch
        from ..rank.serve import serve_calls
        from .local.persistent import LocalTransport
        options = entry_options(parameters, function=serve_calls, called_as_given=False)
        ranks = Ranks(options, grace, LocalTransport(options, plan_launch))
        ranks._start()
        return ranks
