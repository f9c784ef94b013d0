"""notebook_launcher: options -> preflight -> target -> plan -> run scaffold -> launcher.start ->
supervisor -> results."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from . import fd_budget, net, preflight
from .detect.target import LaunchTarget, launch_target
from .errors import GuardError, LaunchArgumentError, LaunchError
from .logs import make_run_id
from .options import (DEFAULT_LINES_PER_SECOND, DEFAULT_USE_PORT, LaunchOptions, check_display_ranks_exist,
                      launch_options, validate_cluster_launch, validate_cluster_type, validate_elastic_start_method)
from .plan import LaunchPlan, build_plan
from .rank.runner import Job
from .run import run_plan
from .supervise.stall import DEFAULT_STALL_AFTER

if TYPE_CHECKING:
    from .cluster import RayCluster


def notebook_launcher(function: Callable[..., Any], args: tuple | list = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: int | str = DEFAULT_USE_PORT,
                      master_addr: str = "127.0.0.1", node_rank: int = 0, num_nodes: int = 1,
                      rdzv_backend: str = "static", rdzv_endpoint: str = "",
                      rdzv_conf: Mapping[str, Any] | None = None, rdzv_id: str = "none",
                      max_restarts: int = 0, monitor_interval: float = 0.1,
                      log_line_prefix_template: str | None = None, *, kwargs: dict[str, Any] | None = None,
                      start_method: str | None = None, timeout: float | None = None,
                      log_dir: str | os.PathLike[str] | None = None, ui: str = "auto",
                      rdzv_timeout: float | None = None,
                      display_ranks: int | Iterable[int] | str | None = None,
                      cluster: "RayCluster | None" = None,
                      stall_after: float | None = DEFAULT_STALL_AFTER,
                      lines_per_second: int | str = DEFAULT_LINES_PER_SECOND) -> list[Any]:
    """Run ``function(*args, **kwargs)`` on ``num_processes`` ranks and return every rank's result.

    The first fourteen parameters mean what they mean in Hugging Face Accelerate's
    ``notebook_launcher``, so swapping the import is enough. Beyond them:

    kwargs: keyword arguments for ``function``.
    start_method: "fork" (default where safe), "spawn" (ships the function with cloudpickle) or
        "xla" (torch_xla's xmp.spawn; the default when a TPU or PJRT_DEVICE is found, and then
        num_processes counts XLA devices: None or all of them, or 1).
    timeout: seconds after which every rank is stopped and LaunchError names those still running.
    log_dir: folder for the per-rank logs; by default a new folder per run in the user cache.
    ui: "auto", "widget", "html", "rich", "text" or "none".
    rdzv_timeout: seconds every node has to join the rendezvous (multi-node or max_restarts > 0);
        default rdzv_conf's "join_timeout"/"timeout", else 900 s (torch elastic's default).
        With cluster=, how long to wait for Ray to place every rank.
    display_ranks: whose IPython display() calls (HTML, images, the Transformers Trainer's
        notebook progress) the cell shows: None for rank 0, a global rank or a list of them, or "all".
    cluster: RayCluster(address=..., resources_per_rank=..., placement=...) runs num_processes ranks
        as Ray actors on that cluster (one placement group), instead of processes on this machine.
    stall_after: seconds a live rank may show no sign of progress (no output, progress() step or
        CPU time) before it is marked stalled; nothing is stopped. None: not watched.
        Default DEFAULT_STALL_AFTER (supervise/stall.py).
    lines_per_second: how many output lines a second of each rank the cell shows (a flood of
        prints would otherwise slow the kernel and bury the panel); the rest are in the rank's
        log file. "all": every line.

    Returns a list with each local rank's return value, in rank order (tensors moved to CPU).
    Raises LaunchError when a rank fails (naming it, with its traceback), GuardError when
    launching now would misbehave, LaunchArgumentError for invalid arguments.
    """
    __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
    try:
        preflight.check_not_inside_rank()
        options = launch_options(
            function=function, args=args, num_processes=num_processes, mixed_precision=mixed_precision,
            use_port=use_port, master_addr=master_addr, node_rank=node_rank, num_nodes=num_nodes,
            rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf, rdzv_id=rdzv_id,
            max_restarts=max_restarts, monitor_interval=monitor_interval,
            log_line_prefix_template=log_line_prefix_template, kwargs=kwargs, start_method=start_method,
            timeout=timeout, log_dir=log_dir, ui=ui, rdzv_timeout=rdzv_timeout, display_ranks=display_ranks,
            stall_after=stall_after, lines_per_second=lines_per_second)
        if cluster is not None:
            return launch_on_cluster(options, cluster)
        return launch(options)
    except (LaunchError, GuardError, LaunchArgumentError, KeyboardInterrupt) as err:
        if isinstance(err, LaunchError):   # torch elastic's ChildFailedError.name: the entrypoint's name
            err.name = getattr(function, "__name__", type(function).__name__)
        # The user needs the rank's traceback (in the message), not our supervisor's frames.
        raise err.with_traceback(None) from None


def launch_on_cluster(options: LaunchOptions, cluster: "RayCluster") -> list[Any]:
    """cluster=: the ranks run on a Ray cluster (Ray is imported only here)."""
    from .cluster import RayCluster
    validate_cluster_type(cluster, RayCluster)
    world_size = validate_cluster_launch(options)
    from .run_ray import run_on_ray
    return run_on_ray(options, cluster, world_size)


def launch(options: LaunchOptions) -> list[Any]:
    """The launch itself, from validated options; notebook_launcher only trims the traceback of its errors."""
    target, plan, run_id = plan_launch(options)
    try:
        return _run(options, target, plan, run_id)
    finally:
        net.release_claims(run_id)


def _run(options: LaunchOptions, target: LaunchTarget, plan: LaunchPlan, run_id: str) -> list[Any]:
    job = Job(options.function, options.args, options.kwargs)
    if options.elastic:
        from .elastic import run_elastic
        from .elastic.rendezvous import settings_for
        rendezvous = settings_for(options, port=plan.master_port)
        return run_elastic(plan, job, options, rendezvous=rendezvous, run_id=run_id,
                           platform=target.where.platform)
    return run_plan(plan, job, options, run_id=run_id, platform=target.where.platform)


def check_master_addr(master_addr: str, *, node_rank: int, num_nodes: int) -> None:
    """A master_addr the ranks cannot reach would leave them waiting in C++ until torch's own timeout."""
    problem = net.store_address_problem(master_addr, hosts_store=node_rank == 0)
    if problem is None:
        return
    advice = ("pass node 0's address that every node reaches (the same on every node)" if num_nodes > 1
              else "leave master_addr at its default '127.0.0.1' on one machine")
    raise LaunchArgumentError(f"{problem}. What to do: {advice}.")


def plan_launch(options: LaunchOptions) -> tuple[LaunchTarget, LaunchPlan, str]:
    """Detect, check the notebook's state, settle the port and describe this node's ranks:
    what every way of starting ranks (a launch, persistent ranks) does before starting them.
    The port stays claimed among this machine's launches until ``net.release_claims(run_id)``."""
    target = launch_target(options.start_method, options.num_processes)
    if options.elastic:
        validate_elastic_start_method(target.start_method)
    preflight.check_no_accelerate_state()
    preflight.check_cuda_not_initialized(target.start_method, target.device_count)
    if target.start_method == "xla":
        preflight.check_runtime_not_initialized()

    notes = list(target.notes)
    raised_limit = fd_budget.ensure_fd_budget(target.num_processes)   # before any pipe or log file opens
    if raised_limit:
        notes.append(raised_limit)
    port = options.port
    run_id = make_run_id()
    if not (options.elastic and options.rdzv_endpoint):  # an explicit rdzv_endpoint names the store's host and port
        check_master_addr(options.master_addr, node_rank=options.node_rank, num_nodes=options.num_nodes)
        claim = preflight.resolve_port(port, explicit=not options.port_is_default, node_rank=options.node_rank,
                                       notes=notes, multi_node=options.num_nodes > 1)
        net.hold_claim(run_id, claim)
        port = claim.port
    try:
        return target, _plan(options, target, port, run_id, notes), run_id
    except BaseException:
        net.release_claims(run_id)
        raise


def _plan(options: LaunchOptions, target: LaunchTarget, port: int, run_id: str, notes: list[str]) -> LaunchPlan:
    gpus = target.gpus()
    plan = build_plan(
        num_processes=target.num_processes, num_nodes=options.num_nodes, node_rank=options.node_rank,
        master_addr=options.master_addr, master_port=port, device_kind=target.device_kind,
        mixed_precision=options.mixed_precision, start_method=target.start_method, run_id=run_id,
        gpu_names=[g[0] for g in gpus], driver_version=gpus[0][1] if gpus else None, notes=notes)
    check_display_ranks_exist(options.display_ranks, plan.world_size)
    return plan
