"""A pure description of a launch: who runs where, with which environment.

Nothing here starts a process or touches a device, so every rule about ranks,
ports and environment variables can be unit-tested directly.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

log = logging.getLogger("notebook_launch")

LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")

# What the ranks compute on, decided once by detect/ (CUDA GPUs, TPU chips through torch_xla ("xla"),
# TPU devices through TorchTPU ("tpu": torch_tpu's PrivateUse1 device, one rank per device, started by
# "spawn"), or CPU) and compared as a string everywhere after: the alias lets mypy catch a misspelt kind.
DeviceKind = Literal["cpu", "cuda", "xla", "tpu"]
# The torch.distributed backend a device kind's ranks use (dist_backend_for); "tpu" is the process
# group backend torch_tpu registers for its device.
DistBackend = Literal["gloo", "nccl", "xla", "tpu"]
# How ranks start on this machine (``engines.local.get_backend``): fork (the notebook's globals are
# inherited), spawn (fresh interpreters; TorchTPU's ranks too) or xla (torch_xla's xmp.spawn). The user's start_method
# becomes one in options; a Ray launch (cluster=) has no start method, and its plan says "ray".
StartMethod = Literal["fork", "spawn", "xla"]
# How a plan's ranks start: a start method, "ray" (Ray actors, which only ray.run can start) or
# "slurm" (srun steps of a SLURM allocation, which only slurm.run can start).
PlanStartMethod = Literal[StartMethod, "ray", "slurm"]


@dataclass(frozen=True)
class RankSpec:
    global_rank: int
    local_rank: int
    device: str                 # "cpu", "cuda:0", "xla", "tpu" (each TorchTPU rank sees its own device only)
    env: dict[str, str]         # variables this rank adds to the inherited environment


@dataclass(frozen=True)
class LaunchPlan:
    num_processes: int          # ranks on this node
    num_nodes: int
    node_rank: int
    world_size: int
    master_addr: str
    master_port: int
    device_kind: DeviceKind
    dist_backend: DistBackend   # what init_process_group() picks
    mixed_precision: str
    start_method: PlanStartMethod
    ranks: tuple[RankSpec, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)   # things the launcher should tell the user


def nccl_workarounds(gpu_names: Sequence[str], driver_version: str | None) -> dict[str, str]:
    """NCCL switches consumer RTX 40xx cards need with drivers older than 550:
    peer-to-peer and InfiniBand transports hang there (Accelerate applies the same rule)."""
    if not gpu_names:
        return {}
    rtx40 = any("RTX 40" in name for name in gpu_names)
    major: int | None
    try:
        major = int(str(driver_version).split(".")[0])
    except (TypeError, ValueError):
        major = None
    if rtx40 and (major is None or major < 550):
        return {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
    return {}


def omp_threads(num_local: int, cpu_count: int) -> int:
    """Share the cores out between local ranks so they do not oversubscribe."""
    return max(1, cpu_count // max(1, num_local))


SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def dist_backend_for(device_kind: DeviceKind) -> DistBackend:
    """The torch.distributed backend ranks of this device kind use (what init_process_group() picks)."""
    backends: dict[DeviceKind, DistBackend] = {"cpu": "gloo", "cuda": "nccl", "xla": "xla", "tpu": "tpu"}
    return backends[device_kind]


def socket_interface_environment(interface: str | None, user_env: Mapping[str, str]) -> dict[str, str]:
    """Bind gloo and NCCL to ``interface`` (the one that reaches rank 0's node; they would otherwise
    pick the first one up, e.g. docker0); a variable the user set wins."""
    if not interface:
        return {}
    return {name: interface for name in SOCKET_IFNAME_VARIABLES if name not in user_env}


def rank_environment(*, global_rank: int, local_rank: int, num_processes: int, num_nodes: int,
                     node_rank: int, world_size: int, master_addr: str, master_port: int,
                     device_kind: DeviceKind, mixed_precision: str, run_id: str, user_env: Mapping[str, str],
                     cpu_count: int, gpu_names: Sequence[str] = (),
                     driver_version: str | None = None, restart_count: int = 0, max_restarts: int = 0,
                     interface: str | None = None, rdzv_id: str | None = None,
                     use_agent_store: bool | None = None) -> dict[str, str]:
    """Every variable torch.distributed, Accelerate and Lightning Fabric read in a rank: what
    torchrun's agent sets (torch/distributed/elastic/agent/server/local_elastic_agent.py), plus
    what Accelerate's notebook_launcher exports (accelerate/launchers.py patches NPROC,
    NODE_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, MIXED_PRECISION into the environment its
    ranks inherit; PrepareForLaunch adds FORK_LAUNCHED=1 on its TPU path), so user code that
    reads them finds them. ``ACCELERATE_VARIABLE_DIFFERENCES`` lists where the values differ.
    The one builder of a rank's environment: local launches, elastic attempts (``restart_count``,
    ``max_restarts``, the ``interface`` toward rank 0's node, the rendezvous' ``rdzv_id`` as
    TORCHELASTIC_RUN_ID, and ``use_agent_store=False``: each attempt's ranks meet on a fresh store
    that rank 0 hosts, whatever the inherited environment says) and Ray ranks on their node."""
    env = {
        "RANK": str(global_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(num_processes),
        "GROUP_RANK": str(node_rank),
        "NODE_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(num_nodes),
        "ROLE_RANK": str(global_rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "ACCELERATE_MIXED_PRECISION": mixed_precision,   # what Accelerator()/PartialState read
        "MIXED_PRECISION": mixed_precision,              # Accelerate's notebook_launcher exports these two
        "NPROC": str(num_processes),
        "NOTEBOOK_LAUNCH_RUN_ID": run_id,
        # torchrun's markers: torch.distributed.is_torchelastic_launched() reads the run id, and
        # Lightning Fabric/Trainer then pick TorchElasticEnvironment (processes exist, join them,
        # and check devices * num_nodes == WORLD_SIZE) instead of starting processes of their own.
        "TORCHELASTIC_RUN_ID": run_id if rdzv_id is None else rdzv_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "NOTEBOOK_LAUNCH_RANK": str(global_rank),
    }
    if use_agent_store is not None:
        env["TORCHELASTIC_USE_AGENT_STORE"] = str(use_agent_store)
    if device_kind == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
    if device_kind == "xla":
        env["FORK_LAUNCHED"] = "1"   # Accelerate's TPU path (PrepareForLaunch) sets it in every replica
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in user_env:   # torchrun's agent's default
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    if "OMP_NUM_THREADS" not in user_env:
        env["OMP_NUM_THREADS"] = str(omp_threads(num_processes, cpu_count))
    if num_nodes == 1 and master_addr in LOOPBACK_ADDRESSES and "GLOO_SOCKET_IFNAME" not in user_env:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update(socket_interface_environment(interface, user_env))
    if device_kind == "cuda":
        for key, value in nccl_workarounds(gpu_names, driver_version).items():
            if key not in user_env:
                env[key] = value
    return env


# Where a rank's environment differs from what Accelerate's notebook_launcher (1.15) gives its
# ranks, and why: (variable, Accelerate's value, ours, why). The docs' Accelerate guide renders this one.
ACCELERATE_VARIABLE_DIFFERENCES: tuple[tuple[str, str, str, str], ...] = (
    ("TORCHELASTIC_RUN_ID", '"none" (rdzv_id\'s default)', "the launch's run id (NOTEBOOK_LAUNCH_RUN_ID)",
     "a run id per launch names its log folder and keeps a relaunch from joining a stale rendezvous; "
     "rdzv_id= still sets the multi-node rendezvous id"),
    ("ACCELERATE_MIXED_PRECISION", "unset (only MIXED_PRECISION is exported)", "mixed_precision=",
     "Accelerator() and PartialState read ACCELERATE_MIXED_PRECISION, so mixed_precision= takes effect "
     "in the ranks; MIXED_PRECISION is exported too"),
    ("ACCELERATE_USE_CPU", "unset (on CPU Accelerate runs the function once, in the notebook)", '"true" on CPU',
     "ranks on a CPU-only machine are real processes; Accelerate must not look for a GPU there"),
    ("TORCHELASTIC_USE_AGENT_STORE", '"True" (torchrun\'s agent hosts the store)', "unset",
     "rank 0 hosts the rendezvous store itself: with it True, every rank would connect to a store no one "
     "hosts (elastic attempts set it to \"False\")"),
    ("FORK_LAUNCHED", '"1" on TPU only (its xmp.spawn path)', '"1" on TPU only',
     "the same; on GPU and CPU neither sets it (it makes destroy_process_group() a no-op)"),
    ("OMP_NUM_THREADS", "inherited", "cores / local ranks, unless you set it",
     "ranks would otherwise each use every core and oversubscribe the machine"),
    ("GLOO_SOCKET_IFNAME", "inherited", '"lo" for a one-machine launch on a loopback address, unless you set it',
     "gloo otherwise picks the interface of the host name, which hosted notebooks cannot always reach"),
    ("NOTEBOOK_LAUNCH_RANK, NOTEBOOK_LAUNCH_RUN_ID", "unset", "the rank, the run id",
     "ours: a rank knows it is one (a nested launch is refused) and which run it belongs to"),
)


def build_plan(*, num_processes: int, num_nodes: int, node_rank: int, master_addr: str,
               master_port: int, device_kind: DeviceKind, mixed_precision: str, start_method: StartMethod,
               run_id: str, user_env: Mapping[str, str] | None = None, cpu_count: int | None = None,
               gpu_names: Sequence[str] = (), driver_version: str | None = None,
               notes: Sequence[str] = (), device_env: Mapping[str, str] | None = None) -> LaunchPlan:
    """Describe the ranks of this node. Arguments are assumed validated (see options).
    ``device_env``: variables every rank has alike that its device's runtime reads (TorchTPU's
    slicebuilder addresses and topology, ``detect.torch_tpu.launch_environment``)."""
    user_env = dict(os.environ if user_env is None else user_env)
    cpu_count = cpu_count or available_cpus()
    world_size = num_processes * num_nodes
    ranks: list[RankSpec] = []
    for local_rank in range(num_processes):
        global_rank = node_rank * num_processes + local_rank
        device = {"cpu": "cpu", "cuda": f"cuda:{local_rank}", "xla": "xla", "tpu": "tpu"}[device_kind]
        env = dict(device_env or {})
        env.update(rank_environment(
            global_rank=global_rank, local_rank=local_rank, num_processes=num_processes,
            num_nodes=num_nodes, node_rank=node_rank, world_size=world_size,
            master_addr=master_addr, master_port=master_port, device_kind=device_kind,
            mixed_precision=mixed_precision, run_id=run_id, user_env=user_env,
            cpu_count=cpu_count, gpu_names=gpu_names, driver_version=driver_version))
        ranks.append(RankSpec(global_rank, local_rank, device, env))
    return LaunchPlan(
        num_processes=num_processes, num_nodes=num_nodes, node_rank=node_rank,
        world_size=world_size, master_addr=master_addr, master_port=master_port,
        device_kind=device_kind, dist_backend=dist_backend_for(device_kind),
        mixed_precision=mixed_precision, start_method=start_method,
        ranks=tuple(ranks), notes=tuple(notes))


def cluster_plan(world_size: int, device_kind: DeviceKind, mixed_precision: str,
                 start_method: Literal["ray", "slurm"]) -> LaunchPlan:
    """The notebook's view of a run on a cluster engine: one row per global rank (its index is the
    rank), with no environment: each rank's real one is made on its node, once the engine placed it
    (``engines.ray.actor``, ``engines.slurm.task``)."""
    device = "cuda" if device_kind == "cuda" else "cpu"
    ranks = tuple(RankSpec(rank, rank, device, {}) for rank in range(world_size))
    return LaunchPlan(num_processes=world_size, num_nodes=1, node_rank=0, world_size=world_size,
                      master_addr="", master_port=0, device_kind=device_kind,
                      dist_backend=dist_backend_for(device_kind), mixed_precision=mixed_precision,
                      start_method=start_method, ranks=ranks)


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        log.debug("no CPU affinity here; counting every CPU")
        return os.cpu_count() or 1
