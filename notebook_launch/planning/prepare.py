"""Preparation, what every way of starting ranks does before starting them: options ->
preflight -> target -> plan. ``entry_options`` turns an entry point's parameters into the
checked ``LaunchOptions``; ``plan_launch`` detects, checks the notebook's state, settles the
port and describes this node's ranks. The API (``launcher.notebook_launcher``, and
``ranks.start_ranks`` with its cluster forms) calls these and nothing below them, so the
launch path and persistent ranks prepare the same way and the API module is imported by
nothing of ours for its internals."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

from . import fd_budget, net
from . import preflight
from ..detect import torch_tpu
from ..detect.platform import start_process_possible
from ..errors import LaunchArgumentError
from ..record.logs import make_run_id
from .options import (LaunchOptions, check_display_ranks_exist, check_world_size, launch_options,
                      validate_elastic_start_method)
from ..wire.plan import LaunchPlan, build_plan
from ..process.leftovers import note_start, start_keeper_ahead
from .target import LaunchTarget, launch_target

# Parameters an entry point has that are not launch options: each entry point uses them itself
# (``cluster=`` picks where the ranks run; ``interrupt_grace`` belongs to persistent ranks).
ENTRY_POINT_ONLY = frozenset({"cluster", "interrupt_grace"})
OPTION_NAMES = frozenset(inspect.signature(launch_options).parameters) - {"called_as_given"}


def entry_options(parameters: Mapping[str, Any], *, called_as_given: bool = True, **ours: Any) -> LaunchOptions:
    """The one way an entry point makes its ``LaunchOptions``: its ``parameters`` as it was called
    (its ``locals()``, taken first thing), with ``ours`` (what the entry point sets itself, such as
    the serve loop persistent ranks run) over them; an option the entry point does not have
    keeps ``notebook_launcher``'s default. ``launch_options`` checks every value, once.
    A parameter that is neither a launch option nor in ``ENTRY_POINT_ONLY`` is our mistake
    (TypeError), so a parameter added to an entry point is never dropped on the way."""
    unknown = sorted(set(parameters) - OPTION_NAMES - ENTRY_POINT_ONLY) + sorted(set(ours) - OPTION_NAMES)
    if unknown:
        raise TypeError(f"entry_options: not launch options: {', '.join(unknown)} (add them to launch_options, "
                        f"or to ENTRY_POINT_ONLY if the entry point uses them itself)")
    given = {name: value for name, value in parameters.items() if name in OPTION_NAMES}
    return launch_options(**{**given, **ours}, called_as_given=called_as_given)


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
    target = spawn_where_fork_would_be_refused(options, launch_target(options.start_method, options.num_processes))
    if options.elastic:
        validate_elastic_start_method(target.start_method)
    preflight.check_no_accelerate_state()
    preflight.check_cuda_not_initialized(target.start_method, target.device_count)
    if target.start_method == "xla" or target.device_kind == "tpu":
        preflight.check_runtime_not_initialized()
    if target.device_kind == "tpu" and options.elastic:
        raise LaunchArgumentError(
            "TorchTPU ranks run on one machine without restarts here: num_nodes > 1 and max_restarts > 0 "
            "are not supported with TPU devices yet. Launch with num_nodes=1 and max_restarts=0, or set "
            "NOTEBOOK_LAUNCH_DEVICE=cpu for CPU ranks.")

    check_world_size(target.num_processes, options.num_nodes)   # num_processes=None: known only now
    notes = list(target.notes)
    raised_limit = fd_budget.ensure_fd_budget(   # before any pipe or log file opens
        fd_budget.local_need(target.num_processes, num_nodes=options.num_nodes, node_rank=options.node_rank))
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
        device_env = _device_environment(target, run_id)
        plan = _plan(options, target, port, run_id, notes, device_env)
    except BaseException:
        net.release_claims(run_id)
        raise
    note_start(run_id)     # where the pid counter stands: the run's sweep reads only processes started since
    start_keeper_ahead()   # every check passed: ranks will start (the keeper's start runs beside what follows)
    return target, plan, run_id


def spawn_where_fork_would_be_refused(options: LaunchOptions, target: LaunchTarget) -> LaunchTarget:
    """A notebook that holds a CUDA context (or whose CUDA runtime a fork would carry to GPU ranks)
    cannot fork its ranks. Where the user did not ask for fork, the ranks start from the warm start
    process instead (``engines.local.start_process``: as fast, and sharing nothing of the notebook's
    CUDA), saying so in the launch line; an explicit ``start_method="fork"`` is still refused with
    what to do (``preflight.check_cuda_not_initialized``)."""
    if options.start_method is not None or target.start_method != "fork" or not start_process_possible():
        return target
    why = preflight.why_not_fork(target.device_count)
    if why is None:
        return target
    note = (f"{why}: ranks start from the warm start process (start_method='spawn'), the function and its "
            f"arguments sent by value")
    return dataclasses.replace(target, start_method="spawn", notes=target.notes + (note,))


def _device_environment(target: LaunchTarget, run_id: str) -> dict[str, str]:
    """What every rank's device runtime reads alike: for TorchTPU, one slicebuilder port per rank,
    claimed among this machine's launches until the run ends (as the rendezvous port is)."""
    if target.device_kind != "tpu" or target.torch_tpu is None:
        return {}
    ports = []
    for _ in range(target.num_processes):
        claim = net.claim_any_free_port()
        net.hold_claim(run_id, claim)
        ports.append(claim.port)
    return torch_tpu.launch_environment(target.num_processes, ports, target.torch_tpu)


def _plan(options: LaunchOptions, target: LaunchTarget, port: int, run_id: str, notes: list[str],
          device_env: dict[str, str]) -> LaunchPlan:
    gpus = target.gpus()
    plan = build_plan(
        num_processes=target.num_processes, num_nodes=options.num_nodes, node_rank=options.node_rank,
        master_addr=options.master_addr, master_port=port, device_kind=target.device_kind,
        mixed_precision=options.mixed_precision, start_method=target.start_method, run_id=run_id,
        gpu_names=[g[0] for g in gpus], driver_version=gpus[0][1] if gpus else None, notes=notes,
        device_env=device_env)
    check_display_ranks_exist(options.display_ranks, plan.world_size)
    return plan
