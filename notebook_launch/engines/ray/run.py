"""``notebook_launcher(..., cluster=RayCluster(...))``: a run on a Ray cluster, inside the same
run scaffold, launcher interface, supervisor, outcome and restart rule as a local launch.

The rest of Ray is beside it in this package: connecting (``connect``), the launcher that
gang-places and starts the ranks (``launch.RayLauncher``, with ``gang``); the rank side is
``engines.ray.actor``. Here: connect, check the cluster can hold the ranks, then
run the attempts (``run.supervise_attempts``, as a SLURM launch does).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...notebook import cuda_tracking
from ...errors import GuardError
from ...record.logs import make_run_id
from ...rank.runner import Job
from ...scaffold.run import run_with_scaffold, supervise_attempts
from . import connect as ray_connect
from ...wire.plan import cluster_plan
from .launch import RayLauncher, notebook_address

if TYPE_CHECKING:
    from ...planning.options import LaunchOptions
    from .cluster import RayCluster

def run_on_ray(options: "LaunchOptions", cluster: "RayCluster", world_size: int) -> list[Any]:
    """Connect, check the cluster can hold the ranks, then run them inside the run scaffold
    (restarting every rank up to ``options.max_restarts`` times after a rank failure)."""
    cuda_before = cuda_tracking.is_cuda_initialized()
    ray = ray_connect.connect(cluster)
    if not cuda_before and cuda_tracking.is_cuda_initialized():  # pragma: no cover - a Ray regression
        raise GuardError("connecting to Ray initialized CUDA in the notebook; please report this")
    nodes = ray_connect.alive_nodes(ray)
    ray_connect.check_resources(world_size, cluster, nodes)
    run_id = make_run_id()
    launcher = RayLauncher(ray, cluster, host=notebook_address(ray, cluster), run_id=run_id,
                           mixed_precision=options.mixed_precision,
                           rendezvous_timeout=options.rendezvous_timeout, max_restarts=options.max_restarts)
    plan = cluster_plan(world_size, cluster.device_kind, options.mixed_precision, "ray")
    job = Job(options.function, options.args, options.kwargs)
    launcher.payload_for(job)   # a function that does not pickle fails here, before the run shows
    summary = (f"notebook_launch: Ray cluster {ray_connect.gcs_host(ray) or cluster.address}: "
               f"{ray_connect.describe_cluster(nodes)}; {world_size} ranks x "
               f"{dict(cluster.resources_per_rank)}, placement {cluster.placement}")
    return run_with_scaffold(plan, lambda ctx: supervise_attempts(ctx, job), options, run_id=run_id,
                             launcher=launcher, extra_lines=(summary,))

