"""``notebook_launcher(..., cluster=RayCluster(...))``: ranks on a Ray cluster, inside the same
run scaffold, supervisor and outcome as a local launch.

What is Ray-specific: connecting (``ray_connect``), gang-placing the ranks and ending
them (``ray_gang``), the rank side (``rank.ray_actor``) and the transport: each rank
connects its events, stdout and stderr back to a listener the notebook opens on the
interface that reaches the cluster (``socket_pipes``), so the supervisor selects on
those sockets as it does on a local rank's pipes, and the display, logs and
errors are the local ones.
"""
from __future__ import annotations

import logging
import pickle
import time
from typing import TYPE_CHECKING, Any, Callable

from .. import cuda_tracking
from ..errors import GuardError, LaunchError
from ..logs import make_run_id
from ..net import source_address_toward
from ..options import DEFAULT_RDZV_TIMEOUT
from ..plan import LaunchPlan, RankSpec
from ..protocol import Failure, FailureKind
from ..rank.runner import Job
from ..rank.spawn_context import capture_context, pickle_job
from ..run import RunContext, run_with_scaffold
from ..state import RunState
from ..supervise import outcome
from ..supervise.supervisor import Supervisor
from . import ray_connect
from .ray_gang import Gang, Placement, RayRank, Waiter, death_reason, visible_devices_by_node
from .socket_pipes import StreamListener

if TYPE_CHECKING:
    from ..cluster import RayCluster
    from ..options import LaunchOptions

log = logging.getLogger("notebook_launch")
RESTARTABLE = (FailureKind.EXCEPTION.value, FailureKind.SIGNAL.value, FailureKind.EXIT.value)


def run_on_ray(options: "LaunchOptions", cluster: "RayCluster", world_size: int) -> list[Any]:
    """Connect, check the cluster can hold the ranks, then run them inside the run scaffold
    (restarting every rank up to ``options.max_restarts`` times after a rank failure)."""
    cuda_before = cuda_tracking.is_cuda_initialized()
    ray = ray_connect.connect(cluster)
    if not cuda_before and cuda_tracking.is_cuda_initialized():  # pragma: no cover - a Ray regression
        raise GuardError("connecting to Ray initialized CUDA in the notebook; please report this")
    nodes = ray_connect.alive_nodes(ray)
    ray_connect.check_resources(world_size, cluster, nodes)
    host = _notebook_address(ray, cluster)
    run_id = make_run_id()
    plan = notebook_plan(world_size, cluster, options.mixed_precision)
    payload = pickle.dumps({"context": capture_context(),
                            "job": pickle_job(Job(options.function, options.args, options.kwargs))},
                           protocol=pickle.HIGHEST_PROTOCOL)
    rdzv_timeout = options.rdzv_timeout or DEFAULT_RDZV_TIMEOUT

    def body(ctx: RunContext) -> list[Any]:
        payload_ref = ray.put(payload)
        attempt = 0
        while True:
            if attempt:
                ctx.state.begin_attempt(attempt, node_rank=0, num_nodes=1, world_size=world_size,
                                        ranks=plan.ranks)
            try:
                return run_attempt(ray, cluster, ctx, payload_ref, host=host, run_id=run_id,
                                   mixed_precision=options.mixed_precision, rdzv_timeout=rdzv_timeout,
                                   timeout=options.timeout, poll_interval=options.poll_interval,
                                   restarts=(attempt, options.max_restarts))
            except LaunchError as error:
                if attempt >= options.max_restarts or error.kind not in RESTARTABLE:
                    raise outcome.with_attempts(error, attempt, options.max_restarts) from None
                attempt += 1
                print(outcome.restart_notice(_failure_of(error), attempt, options.max_restarts, False), flush=True)

    summary = (f"notebook_launch: Ray cluster {ray_connect.gcs_host(ray) or cluster.address}: "
               f"{ray_connect.describe_cluster(nodes)}; {world_size} ranks x "
               f"{dict(cluster.resources_per_rank)}, placement {cluster.placement}")
    return run_with_scaffold(plan, body, run_id=run_id, log_dir=options.log_dir, ui=options.ui,
                             line_prefix=options.line_prefix or "[node {node_rank} rank {rank}]",
                             max_restarts=options.max_restarts, extra_lines=(summary,),
                             display_ranks=options.display_ranks)


def notebook_plan(world_size: int, cluster: "RayCluster", mixed_precision: str) -> LaunchPlan:
    """The notebook's view of the run: one row per global rank (its index is the rank). Each
    rank's real environment is made on its node, once Ray placed it (``rank.ray_actor``)."""
    device = "cuda" if cluster.device_kind == "cuda" else "cpu"
    ranks = tuple(RankSpec(rank, rank, device, {}) for rank in range(world_size))
    return LaunchPlan(num_processes=world_size, num_nodes=1, node_rank=0, world_size=world_size,
                      master_addr="", master_port=0, device_kind=cluster.device_kind,
                      dist_backend="nccl" if cluster.device_kind == "cuda" else "gloo",
                      mixed_precision=mixed_precision, start_method="ray", ranks=ranks)


def run_attempt(ray: Any, cluster: "RayCluster", ctx: RunContext, payload_ref: Any, *, host: str, run_id: str,
                mixed_precision: str, rdzv_timeout: float, timeout: float | None,
                poll_interval: float, restarts: tuple[int, int] = (0, 0)) -> list[Any]:
    """Place, start and supervise one attempt; whatever happens, nothing of it stays on the cluster."""
    state, world_size = ctx.state, ctx.plan.world_size
    gang = Gang(ray, cluster, world_size)
    listener: StreamListener | None = None
    pipes: list[Any] = []
    started = time.monotonic()
    deadline = started + rdzv_timeout

    def waiting() -> None:
        ctx.display.refresh(state)
        if state.stop_requested:
            raise KeyboardInterrupt("notebook_launch: run stopped with the Stop button")

    try:
        for rank_state in state.ranks:
            state.on_line(rank_state.local_rank, "stdout",
                          f"waiting for Ray to place {world_size} ranks x {dict(cluster.resources_per_rank)} "
                          f"({cluster.placement})")
        try:
            placements = gang.reserve(deadline, waiting)
        except TimeoutError:
            raise placement_timeout_error(ray, cluster, world_size, rdzv_timeout, state) from None
        gang.start_actors(placements)
        infos = describe_actors(ray, gang, placements, state, waiting)
        for p, info in zip(placements, infos):
            state.on_placed(p.global_rank, p.node_rank, info["address"])
        master = infos[0]
        devices = visible_devices_by_node(placements, [info["gpu_ids"] for info in infos])
        listener = StreamListener(host, world_size)
        num_nodes = len({p.node_id for p in placements})
        futures = []
        for actor, p, info in zip(gang.actors, placements, infos):
            assignment = rank_assignment(p, info, master, num_nodes=num_nodes, world_size=world_size,
                                         cluster=cluster, mixed_precision=mixed_precision, run_id=run_id,
                                         cuda_visible_devices=devices.get(p.node_id), restarts=restarts)
            futures.append(actor.run.remote(assignment, payload_ref,
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
                    raise outcome.cluster_error(
                        f"{state.ranks[index].node}, rank {index} failed before it connected to the notebook "
                        f"at {host}: {death_reason(exc)}", state, rank=index, kind=FailureKind.EXIT.value) from None

        try:
            pipes = listener.accept_all(deadline, check)
        except TimeoutError as exc:
            raise outcome.cluster_error(f"{exc} within rdzv_timeout={rdzv_timeout:g} s; a firewall between "
                                        f"the cluster and the notebook ({host}) blocks it, or the nodes "
                                        f"reach the notebook through another address", state) from None
        processes = [RayRank(ray, p.global_rank, actor, info["pid"], pipes[p.global_rank])
                     for actor, p, info in zip(gang.actors, placements, infos)]
        gang.waiter = Waiter(ray, futures, processes)
        gang.waiter.start()
        return Supervisor(processes, pipes, state, ctx.display, ctx.logs,
                          timeout=timeout, poll_interval=poll_interval).run()
    finally:
        if listener is not None:
            listener.close(keep=pipes)
        gang.end()


def describe_actors(ray: Any, gang: Gang, placements: list[Placement], state: RunState,
                    waiting: Callable[[], None]) -> list[dict[str, Any]]:
    """Where each actor landed; an actor that cannot start (notebook_launch or a package missing on
    its node, a bad runtime_env) is a LaunchError naming the rank and what to do."""
    calls = [actor.describe.remote(p.global_rank == 0) for actor, p in zip(gang.actors, placements)]
    while ray.wait(calls, num_returns=len(calls), timeout=0.1)[1]:
        waiting()
    infos = []
    for p, call in zip(placements, calls):
        try:
            infos.append(ray.get(call))
        except Exception as exc:
            raise outcome.cluster_error(
                f"the Ray actor of rank {p.global_rank} could not start on its node: {death_reason(exc)}. Every "
                f"node needs notebook_launch (the notebook's version) and the packages your function imports, "
                f"or RayCluster(runtime_env={{...}}) that brings them.", state, rank=p.global_rank,
                kind=FailureKind.EXIT.value) from None
    return infos


def rank_assignment(p: Placement, info: dict[str, Any], master: dict[str, Any], *, num_nodes: int,
                    world_size: int, cluster: "RayCluster", mixed_precision: str, run_id: str,
                    cuda_visible_devices: str | None, restarts: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """What one actor needs to build its rank's environment on its node."""
    cpus = cluster.cpus_per_rank or 1
    return {"global_rank": p.global_rank, "local_rank": p.local_rank, "local_world_size": p.local_world_size,
            "node_rank": p.node_rank, "num_nodes": num_nodes, "world_size": world_size,
            "master_addr": master["address"], "master_port": master["port"],
            "device_kind": cluster.device_kind, "mixed_precision": mixed_precision, "run_id": run_id,
            "cpu_count": max(1, int(cpus * p.local_world_size)), "interface": info["interface"],
            "cuda_visible_devices": cuda_visible_devices, "attempt": restarts[0], "max_restarts": restarts[1]}


def placement_timeout_error(ray: Any, cluster: "RayCluster", world_size: int, rdzv_timeout: float,
                            state: RunState) -> LaunchError:
    free = ray.available_resources()
    wanted = {k: float(v) for k, v in cluster.resources_per_rank.items() if float(v) > 0}
    short = ", ".join(f"{world_size * v:g} {k} requested, {free.get(k, 0):g} free" for k, v in wanted.items())
    return outcome.cluster_error(
        f"Ray could not place {world_size} ranks x {wanted} ({cluster.placement}) within "
        f"rdzv_timeout={rdzv_timeout:g} s: {short}. Other jobs hold the rest; wait for them, lower "
        f"num_processes, or raise rdzv_timeout. No rank was started.", state)


def _failure_of(error: LaunchError) -> Failure:
    """The failure record a restart notice names, from the attempt's LaunchError."""
    headline = str(error).splitlines()[0].split(" failed: ", 1)[-1]
    return Failure(None, error.kind, headline, rank=error.rank)


def _notebook_address(ray: Any, cluster: "RayCluster") -> str:
    """The notebook's address on the interface that reaches the cluster's head."""
    head = ray_connect.gcs_host(ray) or ray_connect.host_of(cluster.address)
    address = source_address_toward(head) if head else None
    if not address:
        raise GuardError(f"cannot tell which local address reaches the Ray cluster (head: {head!r}); "
                         f"ranks could not send their output back to this notebook")
    return address
