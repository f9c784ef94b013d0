"""Persistent ranks on a Ray cluster: ``start_ranks(n, cluster=RayCluster(...))``.

The same ``Ranks`` as local persistent ranks (``pool``), over its own transport
(``RayTransport``, a ``transport.RankTransport``): one call at a time, each supervised
by ``call.CallSupervisor`` with the same panel, logs, LaunchError texts, interrupt and
timeout rules, and the between-calls reader. What differs is where the ranks live:

- starting: through the launcher interface, as every start path (``engines.base``):
  ``RayLauncher(persistent=True).start`` places the ranks of a Ray launch
  (``ray.launch``): one placement group, one actor per rank
  (``engines.ray.actor.RankActor``), each connecting its streams back to the notebook
  (``channels.sockets``); the actor's job is ``engines.remote.serve.serve_ray_calls``, which serves
  calls until STOP. The panel shows each rank's node;
- talking to a rank: a local rank gets calls on a Unix socket with memfds and shares an
  ``InterruptSlot`` in memory; a Ray rank gets them on its events connection
  (``channels.remote_commands`` messages): a call's frame with its tensor bytes, and an interrupt
  that names its call (``engines.remote.persistent.MessageSlot``);
- ending: ``close()`` sends STOP, then kills the actors and removes the placement group and
  waits until Ray reports the actors dead (``RayLauncher.end``, ``ray.gang.Gang.end``). The actors belong to the
  notebook's Ray driver (not detached) and the group to its job: when the notebook's kernel
  dies, Ray ends both; a rank whose connection to the notebook ends also exits by itself;
- a lost rank: a rank (or a node) lost during a call fails the call as on a Ray launch; a
  rank lost between calls (its node died) makes the next call a LaunchError naming the
  ranks and their node, after every rank was stopped; the call after that starts fresh
  ranks and says so.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...record.logs import make_run_id
from ...planning.options import LaunchOptions, check_display_ranks_exist, validate_cluster_launch, validate_cluster_type
from ...planning.prepare import entry_options
from . import connect as ray_connect
from .gang import Placement
from ...wire.plan import cluster_plan
from .launch import RayLauncher, notebook_address
from ..remote.serve import serve_ray_calls
from ...rank.runner import Job
from ...scaffold.session import plan_state
from ...persistent.pool import Ranks
from ..remote.persistent import RemoteTransport, lost_between_calls_error
from ...persistent.transport import LogsFor, LostBetweenCalls

if TYPE_CHECKING:
    from ...channels import RankProcess
    from ...record.logs import RunLogs
    from ...wire.plan import LaunchPlan
    from .cluster import RayCluster

log = logging.getLogger("notebook_launch")
SEND_TICK = 1.0   # seconds between checks while a rank's connection does not take more bytes


def start_ray_ranks(cluster: "RayCluster", parameters: Mapping[str, Any], grace: float) -> "RayRanks":
    """``start_ranks(num_processes, cluster=...)``: place and start the ranks now (see the module).
    ``parameters``: ``start_ranks``' own, checked as its are (``grace``: its ``interrupt_grace``,
    checked there); ``use_port`` and ``master_addr`` are not used (rank 0's node picks the port
    and address), and a ``start_method`` is refused (Ray starts the actors)."""
    from .cluster import RayCluster
    validate_cluster_type(cluster, RayCluster)
    options = entry_options(parameters, function=serve_ray_calls, called_as_given=False)
    validate_cluster_launch(options)
    ranks = RayRanks(options, grace, RayTransport(options, cluster))
    ranks._start()
    return ranks


class RayRanks(Ranks):
    """Persistent ranks as Ray actors; made by ``start_ranks(..., cluster=)``, used as ``Ranks``,
    with where each rank runs (``nodes``)."""

    def __init__(self, options: LaunchOptions, grace: float, transport: RayTransport) -> None:
        super().__init__(options, grace, transport)
        self.ray = transport

    @property
    def cluster(self) -> "RayCluster":
        return self.ray.cluster

    @property
    def nodes(self) -> list[str]:
        """Where each rank runs, by global rank: "node N (address)"."""
        return self.ray.nodes

    def __repr__(self) -> str:
        text = super().__repr__()
        return text.replace("<Ranks:", "<Ranks on Ray:", 1)


class RayTransport(RemoteTransport):
    """Ranks as Ray actors, reached over their events connections (see the module)."""

    def __init__(self, options: LaunchOptions, cluster: "RayCluster") -> None:
        super().__init__()
        self.backend_name = "ray, persistent"
        self.options, self.cluster = options, cluster
        self.summary = ""
        self._placements: list[Placement] = []
        self._addresses: list[str] = []

    @property
    def nodes(self) -> list[str]:
        """Where each rank runs, by global rank: "node N (address)"."""
        return [f"node {p.node_rank} ({a})" for p, a in zip(self._placements, self._addresses)]

    def start(self, logs_for: LogsFor) -> LaunchPlan:
        """Start the ranks as every start path does (``engines.base``): the launcher's channels,
        then ``RayLauncher.start`` with ``persistent=True`` (actors that serve calls)."""
        cluster, options = self.cluster, self.options
        world_size = options.num_processes or 0
        ray = ray_connect.connect(cluster)
        nodes = ray_connect.alive_nodes(ray)
        ray_connect.check_resources(world_size, cluster, nodes)
        run_id = make_run_id()
        plan = cluster_plan(world_size, cluster.device_kind, options.mixed_precision, "ray")
        check_display_ranks_exist(options.display_ranks, plan.world_size)
        logs = logs_for(plan, run_id)
        if not self.summary:
            self.summary = (f"notebook_launch: Ray cluster {ray_connect.gcs_host(ray) or cluster.address}: "
                            f"{ray_connect.describe_cluster(nodes)}; {world_size} ranks x "
                            f"{dict(cluster.resources_per_rank)}, placement {cluster.placement}")
        state = plan_state(plan, run_id, self.backend_name, logs.path)   # a failed start's LaunchError
        # one launcher per start: fresh ranks after a loss are a new start, not an elastic restart
        # (TORCHELASTIC_RESTART_COUNT stays 0, as for local persistent ranks)
        launcher = RayLauncher(ray, cluster, host=notebook_address(ray, cluster), run_id=run_id,
                               mixed_precision=options.mixed_precision,
                               rendezvous_timeout=options.rendezvous_timeout, persistent=True)
        # nothing is drawn while Ray places the ranks: the launcher's own StartWatch
        self.start_through(launcher, plan, Job(serve_ray_calls, (cluster.device_kind,)), state)
        self._placements = launcher.placements
        self._addresses = launcher.addresses
        return plan

    def where_lines(self, plan: LaunchPlan, where: str) -> tuple[str, ...]:
        return self.summary, f"notebook_launch: {where}"

    def place(self, rank: int) -> tuple[int, int]:
        placement = self._placements[rank]
        return placement.local_rank, placement.node_rank

    def lost_between_calls(self, gone: list[RankProcess], logs: RunLogs, num_processes: int) -> LostBetweenCalls:
        """A LaunchError naming the ranks lost and their node, before fresh ranks start with the
        next call."""
        nodes = {self._placements[p.local_rank].node_id for p in gone}
        node_lost = any("node" in (p.end_note or "") for p in gone)
        lost = sorted({p.local_rank for p in gone} | ({pl.global_rank for pl in self._placements
                                                       if pl.node_id in nodes} if node_lost else set()))
        where = sorted({self.nodes[r] for r in lost})
        reason = next((p.end_note for p in gone if p.end_note), None) or "its Ray actor ended"
        return lost_between_calls_error(lost, where, reason, logs, num_processes,
                                        node_rank=self._placements[lost[0]].node_rank)
