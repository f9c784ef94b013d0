"""Connecting the notebook to a Ray cluster, and what the cluster has.

Imported only when ``cluster=`` is given (or by ``notebook-launch env`` when Ray is
installed). Connecting must leave the notebook as it was: no CUDA (the notebook
only drives the cluster), and the kernel's SIGTERM/SIGINT handlers restored
(``ray.init`` installs its own that call ``sys.exit``).
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ...errors.best_effort import best_effort
from ...errors import GuardError, LaunchArgumentError
from ...scaffold.signal_handlers import restore_signal_handlers, save_signal_handlers

if TYPE_CHECKING:
    from .cluster import RayCluster

log = logging.getLogger("notebook_launch")


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    resources: Mapping[str, float]

    def amount(self, name: str) -> float:
        return float(self.resources.get(name, 0.0))


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LaunchArgumentError(
            "cluster=RayCluster(...) needs Ray in the notebook's environment: "
            "pip install 'ray[default]' (or, in a clone of notebook_launch, pip install '.[ray]'), "
            "then restart the kernel."
        ) from None
    return ray


def connect(cluster: "RayCluster") -> Any:
    """The ``ray`` module, connected to ``cluster.address`` (or to the Ray this notebook started)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if cluster.address is None:
        raise LaunchArgumentError(
            "RayCluster(address=None) uses the Ray this notebook connected to, but ray.init() was not "
            "called; call ray.init(...) first or pass address='auto' / 'host:port' / 'ray://host:port'")
    check_reachable(cluster.address)
    saved = save_signal_handlers()
    try:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise GuardError(
            f"could not connect to the Ray cluster at address={cluster.address!r}: {exc}. Start one with "
            f"`ray start --head` (or check the address: 'auto' finds the cluster this machine belongs to, "
            f"'host:6379' names a head's GCS, 'ray://host:10001' goes through Ray Client).") from None
    finally:
        restore_signal_handlers(saved)
    return ray


REACH_TIMEOUT = 5.0


def check_reachable(address: str, timeout: float = REACH_TIMEOUT) -> None:
    """Refuse within seconds an address where no Ray head answers: ``ray.init`` retries a closed or
    unreachable GCS address inside C++ for minutes (over 200 s for '127.0.0.1:1'), where neither
    ``timeout=`` nor a Jupyter interrupt reach it. Only a TCP connection is tried (no Ray protocol):
    'auto' is checked against the address it stands for (RAY_ADDRESS, or the cluster `ray start`
    left on this machine); with none, ``ray.init`` itself says so at once."""
    target = address
    if address == "auto":
        found = os.environ.get("RAY_ADDRESS") or _current_cluster_address()
        if not found:
            return
        target = found
    host_port = target.split("://", 1)[-1].rstrip("/")
    host, _, port_text = host_port.rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit():   # not a form we can probe: ray.init judges it
        return
    try:
        with socket.create_connection((host, int(port_text)), timeout=timeout):
            return
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
    via = f" (address={address!r} stands for {target!r})" if target != address else ""
    raise GuardError(
        f"could not connect to the Ray cluster at address={address!r}{via}: a TCP connection to "
        f"{host}:{port_text} failed ({reason}, tried for up to {timeout:g} s). Nothing was started. What to "
        f"do: start the head with `ray start --head` and pass the address it prints ('host:6379', or "
        f"'ray://host:10001' for Ray Client), or check that this machine can reach it.")


def alive_nodes(ray: Any) -> list[NodeInfo]:
    return [NodeInfo(n["NodeID"], n["NodeManagerAddress"], dict(n.get("Resources", {})))
            for n in ray.nodes() if n.get("Alive")]


def gcs_host(ray: Any) -> str | None:
    """The head's address, to find the local interface that reaches the cluster."""
    with best_effort("no GCS address in the runtime context"):
        return str(ray.get_runtime_context().gcs_address).rsplit(":", 1)[0]
    return None


def host_of(address: str | None) -> str | None:
    """'ray://head:10001' or 'head:6379' -> 'head' (None for 'auto' or None)."""
    if not address or address == "auto":
        return None
    return address.split("://", 1)[-1].rsplit(":", 1)[0] or None


def describe_cluster(nodes: Sequence[NodeInfo]) -> str:
    """'2 nodes, 8 CPUs, 0 GPUs (10.0.0.1: 4 CPU; 10.0.0.2: 4 CPU)'."""
    cpus = sum(n.amount("CPU") for n in nodes)
    gpus = sum(n.amount("GPU") for n in nodes)
    each = "; ".join(f"{n.address}: {_amount(n.amount('CPU'))} CPU"
                     + (f", {_amount(n.amount('GPU'))} GPU" if n.amount("GPU") else "") for n in nodes)
    return (f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, {_amount(cpus)} CPUs, "
            f"{_amount(gpus)} GPUs ({each})")


def check_resources(num_processes: int, cluster: "RayCluster", nodes: Sequence[NodeInfo]) -> None:
    """Refuse a request the cluster cannot ever hold, naming what is missing, e.g.
    "16 ranks x 1 GPU requested; the cluster has 8 GPUs on 2 nodes"."""
    per_rank = {k: float(v) for k, v in cluster.resources_per_rank.items() if float(v) > 0}
    where = f"on {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    problems = []
    for name, amount in per_rank.items():
        total = sum(n.amount(name) for n in nodes)
        if num_processes * amount > total:
            problems.append(f"{num_processes} ranks x {_amount(amount)} {name} requested; the cluster has "
                            f"{_amount(total)} {name}{'s' if name in ('CPU', 'GPU') else ''} {where}")
        elif not any(n.amount(name) >= amount for n in nodes):
            problems.append(f"each rank needs {_amount(amount)} {name} on one node; the largest node has "
                            f"{_amount(max((n.amount(name) for n in nodes), default=0))}")
    if not problems and cluster.placement == "STRICT_SPREAD" and num_processes > len(nodes):
        problems.append(f"placement='STRICT_SPREAD' puts at most one rank per node: {num_processes} ranks "
                        f"requested; the cluster has {len(nodes)} node{'s' if len(nodes) != 1 else ''}")
    if not problems and not _fits(num_processes, per_rank, nodes, cluster.placement):
        problems.append(f"{num_processes} ranks x {_resources(per_rank)} do not fit on the nodes' free shapes")
    if problems:
        raise GuardError(
            "Not enough resources on the Ray cluster: " + "; ".join(problems) + ".\nThe cluster: "
            + describe_cluster(nodes) + ". What to do: lower num_processes or resources_per_rank, or add "
            "nodes to the cluster.")


def _fits(num_processes: int, per_rank: Mapping[str, float], nodes: Sequence[NodeInfo], placement: str) -> bool:
    """Whether the bundles fit on the nodes' totals at all (not whether they are free now)."""
    capacity = 0
    for node in nodes:
        counts = [int(node.amount(name) // amount) for name, amount in per_rank.items()]
        fit = min(counts) if counts else 0
        capacity += min(fit, 1) if placement == "STRICT_SPREAD" else fit
    return capacity >= num_processes


def _amount(value: float) -> str:
    return f"{value:g}"


def _resources(per_rank: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {_amount(v)}" for k, v in per_rank.items()) + "}"


def environment_report() -> str:
    """For ``notebook-launch env``: Ray's version and the cluster this machine belongs to (nodes,
    CPUs, GPUs). Ray is imported, and a cluster asked, only when one is configured here
    (RAY_ADDRESS, or `ray start` on this machine); a Ray cluster is never started."""
    import importlib.metadata
    try:
        version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        # notebook_launch is not on PyPI: 'notebook_launch[ray]' would find nothing there
        return "not installed (pip install 'ray[default]' for cluster=RayCluster(...))"
    address = os.environ.get("RAY_ADDRESS") or _current_cluster_address()
    if not address:
        return f"ray {version}; no cluster configured here (set RAY_ADDRESS or run `ray start`)"
    import ray
    if not ray.is_initialized():
        saved = save_signal_handlers()
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
        except Exception as exc:  # why: a stale address is said in the report; the environment report must not fail
            return f"ray {version}; no cluster reachable at {address} ({type(exc).__name__}: {exc})"
        finally:
            restore_signal_handlers(saved)
    return f"ray {version}; cluster at {gcs_host(ray) or address}: {describe_cluster(alive_nodes(ray))}"


def _current_cluster_address() -> str | None:
    """The address `ray start --head` on this machine left in Ray's default temp folder."""
    import tempfile
    try:
        with open(os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")) as f:
            return f.read().strip() or None
    except OSError:
        return None
