"""The Ray launcher: ranks as Ray actors of one placement group, started through the same
``Launcher`` interface as fork, spawn and xla (``start(plan, job, channels) -> processes``).

``start`` places the gang (all ranks or none), starts one actor per rank, tells each its
rank's environment and has it connect its events, stdout, stderr and answers back to a
listener the notebook opens on the interface that reaches the cluster (``channels.sockets``):
those sockets are the channels it hands back, so the supervisor selects on them as it does
on a local rank's pipes. ``end`` leaves nothing on the cluster. Each ``start`` is one attempt;
restarts are ``run.supervise_attempts`` (``ray.run``), under the rule elastic's agent follows.

Persistent ranks on Ray (``engines.ray.persistent``) start through the same ``start`` with
``persistent=True``: the same placement, actors, environment and connections, but each actor's
job serves calls until told to stop (``engines.remote.serve``), its events connection carries calls
instead of signal frames (``gang.PersistentRayRank``), and its placement group is named as
persistent ranks' (``gang.PersistentGang``).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from ...channels import RankPipes, RankProcess
from ...channels.sockets import StreamListener
from ...errors import GuardError
from ...planning.net import source_address_toward
from ...wire.plan import LaunchPlan
from ...wire.protocol import FailureKind
from ..base import StartFailed
from ..remote.assignment import RankAssignment
from ..remote.launcher import ConnectBackLauncher
from . import connect as ray_connect
from .gang import (Gang, PersistentGang, PersistentRayRank, Placement, RayRank, Waiter, death_reason,
                       visible_devices_by_node)

if TYPE_CHECKING:
    from .cluster import RayCluster
    from ...rank.runner import Job

log = logging.getLogger("notebook_launch")


class RayLauncher(ConnectBackLauncher):
    """Starts a plan's ranks (one row per global rank: ``plan.cluster_plan``) as Ray actors."""

    name = "ray"
    peers = "the cluster"

    def __init__(self, ray: Any, cluster: "RayCluster", *, host: str, run_id: str, mixed_precision: str,
                 rendezvous_timeout: float, max_restarts: int = 0, persistent: bool = False) -> None:
        self.ray = ray
        self.cluster = cluster
        self.host = host                      # the notebook's address toward the cluster
        self.run_id = run_id
        self.mixed_precision = mixed_precision
        self.rendezvous_timeout = rendezvous_timeout   # for the placement and the connections back
        self.max_restarts = max_restarts
        self.persistent = persistent          # the actors serve calls until told to stop (persistent ranks)
        self.attempts = 0                     # starts so far: each start is one attempt
        self._payload_ref: Any = None
        self._gang: Gang | None = None
        self.placements: list[Placement] = []   # where the last start placed each rank, by global rank
        self.addresses: list[str] = []          # each rank's node address, by global rank

    def payload_for(self, job: "Job") -> bytes:
        """The shared payload (``ConnectBackLauncher``); a new job's is put into Ray's store anew."""
        if self._shipped is None or self._shipped[0] is not job:
            self._payload_ref = None
        return super().payload_for(job)

    def start(self, plan: "LaunchPlan", job: "Job", channels: list[RankPipes]) -> list[RankProcess]:
        """Place, start and connect one attempt's actors; the accepted connections go into ``channels``.
        While Ray places and starts them, ``start_watch`` is told and ticked (it may stop the start)."""
        ray, cluster, watch, world_size = self.ray, self.cluster, self.start_watch, plan.world_size
        payload = self.payload_for(job)
        if self._payload_ref is None:
            self._payload_ref = ray.put(payload)
        restarts = (self.attempts, self.max_restarts)
        self.attempts += 1
        self._gang = gang = (PersistentGang if self.persistent else Gang)(ray, cluster, world_size)
        self._handed = []
        self.placements, self.addresses = [], []
        deadline = time.monotonic() + self.rendezvous_timeout
        waiting = watch.tick
        watch.waiting_for(f"waiting for Ray to place {world_size} ranks x {dict(cluster.resources_per_rank)} "
                          f"({cluster.placement})")
        try:
            placements = gang.reserve(deadline, waiting)
        except TimeoutError:
            raise placement_timeout_error(ray, cluster, world_size, self.rendezvous_timeout) from None
        gang.start_actors(placements)
        infos = describe_actors(ray, gang, placements, waiting)
        for p, info in zip(placements, infos):
            watch.placed(p.global_rank, p.node_rank, info["address"])
        master = infos[0]
        devices = visible_devices_by_node(placements, [info["gpu_ids"] for info in infos])
        self._listener = listener = StreamListener(self.host, world_size)
        num_nodes = len({p.node_id for p in placements})
        futures = []
        for actor, p, info in zip(gang.actors, placements, infos):
            assignment = rank_assignment(p, info, master, num_nodes=num_nodes, world_size=world_size,
                                         cluster=cluster, mixed_precision=self.mixed_precision,
                                         run_id=self.run_id, cuda_visible_devices=devices.get(p.node_id),
                                         restarts=restarts, persistent=self.persistent)
            futures.append(actor.run.remote(assignment, self._payload_ref,
                                            (listener.address[0], listener.address[1], listener.token)))

        def check() -> None:
            """A run call that returned connected first (its streams wait in the listen queue);
            one that raised never connected: its actor died or could not reach the notebook."""
            waiting()
            done, _ = ray.wait(futures, num_returns=len(futures), timeout=0)
            for future in done:
                index = futures.index(future)
                try:
                    ray.get(future)
                except Exception as exc:
                    node = f"node {placements[index].node_rank} ({infos[index]['address']})"
                    raise StartFailed(
                        f"{node}, rank {index} failed before it connected to the notebook "
                        f"at {self.host}: {death_reason(exc)}", rank=index, kind=FailureKind.EXIT) from None

        pipes = self.accept(listener, deadline, check, self.host, channels)   # persistent ranks live on
        rank_type = PersistentRayRank if self.persistent else RayRank
        processes = [rank_type(ray, p.global_rank, actor, info["pid"], pipes[p.global_rank])
                     for actor, p, info in zip(gang.actors, placements, infos)]
        self.placements, self.addresses = list(placements), [info["address"] for info in infos]
        gang.waiter = Waiter(ray, futures, processes)
        gang.waiter.start()
        return list(processes)

    def end(self) -> None:
        """Close the listener (and any connection not handed on) and end the gang: kill every
        actor, remove the placement group, wait until Ray says they are gone."""
        try:
            self.close_listener()
        finally:
            if self._gang is not None:
                self._gang.end()
            self._gang = None


def describe_actors(ray: Any, gang: Gang, placements: list[Placement],
                    waiting: Callable[[], None]) -> list[dict[str, Any]]:
    """Where each actor landed; an actor that cannot start (notebook_launch or a package missing on
    its node, a bad runtime_env) fails the start, naming the rank and what to do."""
    calls = [actor.describe.remote(p.global_rank == 0) for actor, p in zip(gang.actors, placements)]
    while ray.wait(calls, num_returns=len(calls), timeout=0.1)[1]:
        waiting()
    infos = []
    for p, call in zip(placements, calls):
        try:
            infos.append(ray.get(call))
        except Exception as exc:
            raise StartFailed(
                f"the Ray actor of rank {p.global_rank} could not start on its node: {death_reason(exc)}. Every "
                f"node needs notebook_launch (the notebook's version) and the packages your function imports, "
                f"or RayCluster(runtime_env={{...}}) that brings them.", rank=p.global_rank,
                kind=FailureKind.EXIT) from None
    return infos


def rank_assignment(p: Placement, info: dict[str, Any], master: dict[str, Any], *, num_nodes: int,
                    world_size: int, cluster: "RayCluster", mixed_precision: str, run_id: str,
                    cuda_visible_devices: str | None, restarts: tuple[int, int] = (0, 0),
                    persistent: bool = False) -> RankAssignment:
    """What one actor needs to build its rank's environment on its node."""
    cpus = cluster.cpus_per_rank or 1
    return RankAssignment(
        global_rank=p.global_rank, local_rank=p.local_rank, local_world_size=p.local_world_size,
        node_rank=p.node_rank, num_nodes=num_nodes, world_size=world_size, master_addr=master["address"],
        master_port=master["port"], device_kind=cluster.device_kind, mixed_precision=mixed_precision,
        run_id=run_id, cpu_count=max(1, int(cpus * p.local_world_size)), interface=info["interface"],
        cuda_visible_devices=cuda_visible_devices, attempt=restarts[0], max_restarts=restarts[1],
        persistent=persistent)


def placement_timeout_error(ray: Any, cluster: "RayCluster", world_size: int, rdzv_timeout: float) -> StartFailed:
    free = ray.available_resources()
    wanted = {k: float(v) for k, v in cluster.resources_per_rank.items() if float(v) > 0}
    short = ", ".join(f"{world_size * v:g} {k} requested, {free.get(k, 0):g} free" for k, v in wanted.items())
    return StartFailed(
        f"Ray could not place {world_size} ranks x {wanted} ({cluster.placement}) within "
        f"rdzv_timeout={rdzv_timeout:g} s: {short}. Other jobs hold the rest; wait for them, lower "
        f"num_processes, or raise rdzv_timeout. No rank was started.")


def notebook_address(ray: Any, cluster: "RayCluster") -> str:
    """The notebook's address on the interface that reaches the cluster's head."""
    head = ray_connect.gcs_host(ray) or ray_connect.host_of(cluster.address)
    address = source_address_toward(head) if head else None
    if not address:
        raise GuardError(f"cannot tell which local address reaches the Ray cluster (head: {head!r}); "
                         f"ranks could not send their output back to this notebook")
    return address

