"""The ranks of one attempt on Ray: a placement group (all ranks or none), one actor per
rank, each actor's end as a ``RankProcess`` the supervisor can select on, and an end
that leaves nothing on the cluster.

Ranks are grouped by node as torchrun numbers them: nodes in the order of their
first bundle, global ranks contiguous per node, ``LOCAL_RANK`` within the node.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ...errors.best_effort import best_effort
from ...channels import WaitStatus
from ..remote.handle import RemoteRank

if TYPE_CHECKING:
    from .cluster import RayCluster
    from ...channels.sockets import SocketPipes

log = logging.getLogger("notebook_launch")
WAIT_TICK = 0.1
GONE_TIMEOUT = 30.0    # seconds to wait for Ray to report killed actors dead


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its bundle, node and place among the node's ranks."""
    global_rank: int
    bundle: int
    node_id: str
    node_rank: int
    local_rank: int
    local_world_size: int


def assign_ranks(bundle_nodes: Sequence[str]) -> list[Placement]:
    """Ranks grouped by node: nodes ordered by their first bundle, ranks contiguous per node."""
    order: list[str] = []
    for node in bundle_nodes:
        if node not in order:
            order.append(node)
    placements: list[Placement] = []
    for node_rank, node in enumerate(order):
        bundles = [b for b, n in enumerate(bundle_nodes) if n == node]
        for local_rank, bundle in enumerate(bundles):
            placements.append(Placement(len(placements), bundle, node, node_rank, local_rank, len(bundles)))
    return placements


def visible_devices_by_node(placements: Sequence[Placement], gpu_ids: Sequence[Sequence[str]]) -> dict[str, str]:
    """Per node, the GPUs of its ranks in local-rank order (as Ray Train shares them), so
    ``cuda:LOCAL_RANK`` is each rank's own GPU and NCCL sees its peers on the node."""
    by_node: dict[str, list[str]] = {}
    for placement in sorted(placements, key=lambda p: (p.node_rank, p.local_rank)):
        ids = by_node.setdefault(placement.node_id, [])
        for gpu in gpu_ids[placement.global_rank]:
            if gpu not in ids:
                ids.append(gpu)
    return {node: ",".join(ids) for node, ids in by_node.items() if ids}


class RayRank(RemoteRank):
    """A rank's actor seen as a process (a ``remote.handle.RemoteRank``): it ends when its ``run``
    call returns (the exit code) or the actor dies; a kill is ``ray.kill``. Its pid is the actor's
    on the actor's node: nothing of this machine's /proc speaks for it. Its gang's ``Waiter`` makes
    it one of the ranks asked where they are together (``where_asker``)."""

    def __init__(self, ray: Any, local_rank: int, actor: Any, pid: int, pipes: "SocketPipes") -> None:
        self.ray = ray
        self.local_rank = local_rank
        self.actor = actor
        self.pid = pid
        self.pipes = pipes
        self.end_note: str | None = None
        self.sent_signal: int | None = None
        self._status: WaitStatus | None = None
        self._sentinel_r, self._sentinel_w = os.pipe()
        os.set_blocking(self._sentinel_r, False)
        self.sentinel = self._sentinel_r

    def poll(self) -> WaitStatus | None:
        return self._status

    def ended(self, status: WaitStatus, note: str | None = None) -> None:
        """Called by the waiter thread once the actor's run returned or the actor died."""
        self.end_note = note
        self._status = status
        try:
            os.write(self._sentinel_w, b"x")
        except OSError:
            log.debug("rank %d's sentinel is closed", self.local_rank, exc_info=True)

    def kill(self) -> None:
        self.sent_signal = signal.SIGKILL
        with best_effort("ray.kill of rank %d failed", self.local_rank):
            self.ray.kill(self.actor, no_restart=True)

    def release(self) -> None:
        for fd in (self._sentinel_r, self._sentinel_w):
            if fd is not None:
                os.close(fd)
        self._sentinel_r = self._sentinel_w = None  # type: ignore[assignment]
        self.sentinel = None


class PersistentRayRank(RayRank):
    """A persistent rank's actor (``ray.persistent``): a signal ends it (``RemoteRank.signal``)."""

    persistent = True


class Waiter(threading.Thread):
    """Turns the actors' ``run`` futures into ends of RayRank: ``ray.wait`` in one thread,
    each end written to the rank's sentinel, which the supervisor's selector watches."""

    def __init__(self, ray: Any, futures: Sequence[Any], ranks: Sequence[RayRank]) -> None:
        super().__init__(name="notebook_launch-ray-waiter", daemon=True)
        self.ray = ray
        self.pending = {future: rank for future, rank in zip(futures, ranks)}
        self._halt = threading.Event()
        from ...diagnose.remote_where import WhereAsker
        asker = WhereAsker(ranks)   # the gang's ranks are asked where they are together
        for rank in ranks:
            rank.where_asker = asker

    def run(self) -> None:
        while self.pending and not self._halt.is_set():
            try:
                ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=WAIT_TICK)
            except Exception:   # why: a failed wait is tried again next tick; the pending ranks are still awaited
                log.debug("ray.wait failed", exc_info=True)
                time.sleep(WAIT_TICK)
                continue
            for future in ready:
                rank = self.pending.pop(future)
                rank.ended(*end_of(self.ray, future, rank.sent_signal))

    def stop(self) -> None:
        self._halt.set()


def end_of(ray: Any, future: Any, sent_signal: int | None) -> tuple[WaitStatus, str | None]:
    """How a rank's ``run`` call ended: its exit code, or the actor's death and Ray's reason."""
    try:
        code = int(ray.get(future))
    except Exception as exc:  # why: RayActorError, ActorDiedError, node death...: any is the rank's end
        if sent_signal is not None:
            return ("signal", sent_signal), None
        return ("signal", signal.SIGKILL), death_reason(exc)
    if sent_signal is not None and code != 0:   # it unwound on the notebook's SIGTERM (engines.ray.actor)
        return ("signal", sent_signal), None
    return ("exit", code), None


def death_reason(exc: BaseException) -> str:
    """Ray's reason for an actor's death, in one line."""
    text = " ".join(str(exc).split())
    for marker in ("The actor died because its node has died", "The actor is dead because its node has died"):
        if marker in text:
            return "its Ray actor died because its node died (node lost)"
    if type(exc).__name__ == "ActorUnavailableError":   # the connection to it broke (max_restarts=0: for good)
        return "its Ray actor is unreachable (its worker process or its node went away)"
    if "unexpectedly" in text or "SIGKILL" in text or "killed" in text:
        return "its Ray actor died unexpectedly (the worker process was killed or crashed)"
    if type(exc).__name__.startswith("RayTaskError"):   # the call raised instead of the actor dying
        last = [line for line in str(exc).strip().splitlines() if line.strip()][-1:]
        return f"its Ray actor raised {last[0].strip()[:300] if last else type(exc).__name__}"
    return f"its Ray actor died: {type(exc).__name__}: {text[:300]}"


class Gang:
    """One attempt's placement group and actors; ``end()`` removes both and waits until Ray
    reports every actor dead, so nothing of the run stays on the cluster."""
    NAME = "notebook_launch"   # placement groups are named NAME-<notebook pid>-<random>

    def __init__(self, ray: Any, cluster: "RayCluster", world_size: int) -> None:
        self.ray = ray
        self.cluster = cluster
        self.world_size = world_size
        self.group: Any = None
        self.actors: list[Any] = []
        self.waiter: Waiter | None = None

    def group_name(self) -> str:
        """The placement group's name: unique, since Ray refuses a second live group of a name (two
        launches from one notebook, or a launch beside persistent ranks), and saying whose it is."""
        return f"{self.NAME}-{os.getpid()}-{secrets.token_hex(4)}"

    def reserve(self, deadline: float, on_wait: Callable[[], None]) -> list[Placement]:
        """Create the placement group and wait until Ray placed every bundle (or ``deadline``:
        TimeoutError). ``on_wait`` runs every tick (panel refresh, Stop, interrupt)."""
        from ray.util.placement_group import placement_group, placement_group_table
        bundle = {k: float(v) for k, v in self.cluster.resources_per_rank.items() if float(v) > 0}
        self.group = placement_group([dict(bundle) for _ in range(self.world_size)],
                                     strategy=self.cluster.placement, name=self.group_name())
        ready = self.group.ready()
        while True:
            done, _ = self.ray.wait([ready], timeout=WAIT_TICK)
            if done:
                break
            on_wait()
            if time.monotonic() > deadline:
                raise TimeoutError("placement group not ready")
        table = placement_group_table(self.group)
        nodes = table["bundles_to_node_id"]
        return assign_ranks([nodes[b] for b in range(self.world_size)])

    def start_actors(self, placements: Sequence[Placement]) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .actor import RankActor
        resources = {k: float(v) for k, v in self.cluster.resources_per_rank.items()
                     if k not in ("CPU", "GPU", "memory") and float(v) > 0}
        remote = self.ray.remote(RankActor)
        for placement in placements:
            options: dict[str, Any] = {
                "num_cpus": self.cluster.cpus_per_rank, "num_gpus": self.cluster.gpus_per_rank,
                "resources": resources, "max_restarts": 0, "max_task_retries": 0,
                "name": None,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=placement.bundle,
                    placement_group_capture_child_tasks=True)}
            if "memory" in self.cluster.resources_per_rank:
                options["memory"] = float(self.cluster.resources_per_rank["memory"])
            if self.cluster.runtime_env:
                options["runtime_env"] = dict(self.cluster.runtime_env)
            self.actors.append(remote.options(**options).remote())

    def end(self) -> None:
        """Kill every actor, remove the placement group, wait until Ray says they are gone."""
        if self.waiter is not None:
            self.waiter.stop()
        for actor in self.actors:
            with best_effort("ray.kill failed"):
                self.ray.kill(actor, no_restart=True)
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group
            with best_effort("removing the placement group failed"):
                remove_placement_group(self.group)
        self._wait_actors_gone()
        if self.waiter is not None:
            self.waiter.join(timeout=2 * WAIT_TICK + 1)
        self.actors = []
        self.group = None

    def _wait_actors_gone(self) -> None:
        """Return once Ray reports every killed actor DEAD (its worker is then being torn down),
        or after GONE_TIMEOUT. A pending call on a killed actor fails once Ray knows it is dead."""
        deadline = time.monotonic() + GONE_TIMEOUT
        for actor in self.actors:
            try:
                self.ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # why: a killed actor's call fails (dead, as wanted) or times out; the table is read next
                log.debug("actor gone", exc_info=True)
        while self.actors and time.monotonic() < deadline and not all(map(_actor_dead, self.actors)):
            time.sleep(WAIT_TICK)


class PersistentGang(Gang):
    """The persistent ranks' gang, whose placement group says it holds persistent ranks."""

    NAME = "notebook_launch-ranks"


def _actor_dead(actor: Any) -> bool:
    """Whether Ray's control store says the actor is DEAD (True when it cannot be asked)."""
    try:
        from ray._private import state
        info = state.actors(actor_id=actor._actor_id.hex())
    except Exception:   # why: a table that cannot be read (a private API) leaves ray.kill trusted
        log.debug("cannot read the actor table; trusting ray.kill", exc_info=True)
        return True
    return not info or info.get("State") == "DEAD"
