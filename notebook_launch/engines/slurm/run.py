"""``notebook_launcher(..., cluster=SlurmCluster(...))``: a run on a SLURM allocation, inside the same
run scaffold, launcher interface, supervisor and outcome as a local launch (``run.supervise_ranks``).

What is SLURM-specific is the launcher (``slurm.launcher.SlurmLauncher``) and the rank's side
(``slurm.task``). Here: check what a SLURM launch cannot take, then run the attempts
(``run.supervise_attempts``, under the restart rule Ray's launches and elastic's agent follow).

With ``max_restarts``, a restart runs every rank again as new steps in the same allocation (no new
request to the queue: a busy cluster's wait is paid once); the job is ended once the run is. A
failure the scheduler caused (a time limit, a node failure, preemption) ended the job itself: it
is not restarted, and the error says so (a new allocation could wait in the queue for hours, and a
time limit is the user's own).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import LaunchArgumentError
from ...record.logs import make_run_id
from ...wire.plan import cluster_plan
from ...rank.runner import Job
from ...scaffold.run import RunContext, run_with_scaffold, supervise_attempts
from . import scheduler
from .launcher import SlurmLauncher

if TYPE_CHECKING:
    from ...planning.options import LaunchOptions
    from .cluster import SlurmCluster

def run_on_slurm(options: "LaunchOptions", cluster: "SlurmCluster", world_size: int) -> list[Any]:
    """Ask for the allocation, run the ranks on it inside the run scaffold, and end the job."""
    check_layout(world_size, cluster)
    scheduler.check_commands()
    scheduler.check_can_start(cluster, world_size)   # a job SLURM would queue and never start is not submitted
    run_id = make_run_id()
    launcher = SlurmLauncher(cluster, run_id=run_id, mixed_precision=options.mixed_precision,
                             rendezvous_timeout=options.rendezvous_timeout, max_restarts=options.max_restarts,
                             timeout=options.timeout)
    launcher.hold_job = options.max_restarts > 0   # each attempt's end keeps the job for the next
    plan = cluster_plan(world_size, cluster.device_kind, options.mixed_precision, "slurm")
    job = Job(options.function, options.args, options.kwargs)
    launcher.payload_for(job)   # a function that does not pickle fails here, before anything is queued

    def body(ctx: RunContext) -> list[Any]:
        launcher.folder = ctx.logs.path   # the run folder, made by the scaffold: the nodes read the job there
        try:
            return supervise_attempts(ctx, job, why_not_again=lambda error: launcher.allocation.ended())
        finally:
            launcher.allocation.release()

    return run_with_scaffold(plan, body, options, run_id=run_id, launcher=launcher,
                             extra_lines=(request_summary(cluster, world_size),))


def request_summary(cluster: "SlurmCluster", world_size: int) -> str:
    """The launch line's word on what is asked of SLURM (a launch's and persistent ranks')."""
    where = f"partition {cluster.partition}" if cluster.partition else "the default partition"
    return (f"notebook_launch: SLURM, {where}: {world_size} ranks on {cluster.nodes} node(s), "
            f"{cluster.cpus_per_rank} CPU(s)" + (f" and {cluster.gpus_per_rank} GPU(s)" if cluster.gpus_per_rank
                                                 else "") + " per rank"
            + (f", time limit {cluster.time}" if cluster.time else ""))


def check_layout(world_size: int, cluster: "SlurmCluster") -> None:
    if world_size % cluster.nodes:
        raise LaunchArgumentError(
            f"num_processes={world_size} cannot be spread evenly over SlurmCluster(nodes={cluster.nodes}); "
            f"give a multiple of {cluster.nodes} (each node runs num_processes / nodes ranks)")

