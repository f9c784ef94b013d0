"""``RayCluster``: where ``notebook_launcher(..., cluster=...)`` runs its ranks.

A plain description, checked when it is made (every check of its own fields is
here, before anything connects); importing it imports nothing of Ray, so a
notebook that never passes ``cluster=`` never pays for Ray (or needs it).
The launch itself is ``ray.run`` (with ``ray.launch.RayLauncher``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from ...errors import LaunchArgumentError

if TYPE_CHECKING:
    from ...wire.plan import DeviceKind

DEFAULT_RESOURCES = {"CPU": 1.0}
RAY_PLACEMENTS = ("PACK", "SPREAD", "STRICT_SPREAD")   # Ray's placement group strategies we accept


@dataclass(frozen=True)
class RayCluster:
    """Ranks as Ray actors of one placement group on the cluster at ``address``.

    address: "auto" (the cluster this machine belongs to, or RAY_ADDRESS), "host:port" of
        the head's GCS, "ray://head:10001" (Ray Client), or None to use a Ray this notebook
        already connected to with ``ray.init``.
    resources_per_rank: what each rank's actor reserves, e.g. {"GPU": 1, "CPU": 4}; a rank
        with a GPU trains on CUDA with NCCL, otherwise on CPU with gloo.
    placement: "PACK" (fill nodes one after another), "SPREAD" (spread where possible) or
        "STRICT_SPREAD" (one rank per node at most).
    runtime_env: passed to every actor (e.g. {"py_modules": [...], "pip": [...]}) for code the
        cluster's nodes do not have; notebook_launch itself must be installed there.
    """
    address: str | None = "auto"
    resources_per_rank: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    placement: str = "PACK"
    runtime_env: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        """Refuse a bad field when the description is made, not minutes later on the cluster."""
        _check_address(self.address)
        _check_placement(self.placement)
        _check_resources_per_rank(self.resources_per_rank)
        _check_runtime_env(self.runtime_env)

    @property
    def gpus_per_rank(self) -> float:
        return float(self.resources_per_rank.get("GPU", 0))

    @property
    def cpus_per_rank(self) -> float:
        return float(self.resources_per_rank.get("CPU", 0))

    @property
    def device_kind(self) -> DeviceKind:
        """A rank with a GPU trains on CUDA (NCCL); otherwise on CPU (gloo)."""
        return "cuda" if self.gpus_per_rank > 0 else "cpu"


def _check_address(address: object) -> None:
    if address is not None and (not isinstance(address, str) or not address.strip()
                                or any(not ch.isprintable() or ch.isspace() for ch in address)):
        raise LaunchArgumentError(
            f"RayCluster(address=...) must be 'auto', 'host:port', 'ray://host:port' or None "
            f"(the Ray this notebook already initialized), without spaces or control characters; got {address!r}")
    port = _address_port(address)
    if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise LaunchArgumentError(
            f"RayCluster(address={address!r}): the port after the last ':' must be a TCP port number between 1 "
            f"and 65535 (the head's: 6379 for its GCS unless `ray start --head --port` said otherwise, 10001 "
            f"for ray://); got {port!r}")


def _address_port(address: str | None) -> str | None:
    """The port of 'host:port' or 'ray://host:port'; None for 'auto', None and a bare host."""
    if address is None or address == "auto":
        return None
    host_port = address.split("://", 1)[-1]
    if host_port.startswith("[") and "]" in host_port:    # [IPv6]:port
        rest = host_port.split("]", 1)[1]
        return rest[1:] if rest.startswith(":") else None
    return host_port.rsplit(":", 1)[1] if ":" in host_port else None


def _check_placement(placement: object) -> None:
    if placement not in RAY_PLACEMENTS:
        raise LaunchArgumentError(
            f"RayCluster(placement={placement!r}) is not valid; choose one of "
            + ", ".join(repr(p) for p in RAY_PLACEMENTS))


def _check_resources_per_rank(resources_per_rank: object) -> None:
    if not isinstance(resources_per_rank, Mapping) or not resources_per_rank:
        raise LaunchArgumentError(
            f"RayCluster(resources_per_rank=...) must be a non-empty dict such as {{'GPU': 1, 'CPU': 4}}; "
            f"got {resources_per_rank!r}")
    for name, amount in resources_per_rank.items():
        if not isinstance(name, str) or not name or not name.isprintable() or isinstance(amount, bool) \
                or not isinstance(amount, numbers.Real) or not 0 <= float(amount) < math.inf:
            raise LaunchArgumentError(
                f"RayCluster(resources_per_rank=...) maps resource names to finite amounts >= 0; "
                f"got {name!r}: {amount!r}")
    if sum(float(v) for v in resources_per_rank.values()) <= 0:
        raise LaunchArgumentError(
            "RayCluster(resources_per_rank=...) reserves nothing; give each rank at least one resource, "
            "e.g. {'CPU': 1}")


def _check_runtime_env(runtime_env: object) -> None:
    if runtime_env is not None and not isinstance(runtime_env, Mapping):
        raise LaunchArgumentError(
            f"RayCluster(runtime_env=...) must be a dict or None; got {type(runtime_env).__name__}")
    not_names = [key for key in runtime_env or {} if not isinstance(key, str)]
    if not_names:
        raise LaunchArgumentError(
            f"RayCluster(runtime_env=...) maps Ray's runtime_env fields (strings such as 'pip') to values; "
            f"not a field name: {', '.join(map(repr, not_names))}")
    env_vars = (runtime_env or {}).get("env_vars")
    if env_vars is not None and (not isinstance(env_vars, Mapping) or not all(
            isinstance(name, str) and name and "=" not in name and "\0" not in name
            and isinstance(value, str) and "\0" not in value for name, value in env_vars.items())):
        raise LaunchArgumentError(
            f"RayCluster(runtime_env={{'env_vars': ...}}) must map variable names to string values (as the "
            f"environment holds them: no '=' in a name, no NUL), e.g. {{'OMP_NUM_THREADS': '4'}}; "
            f"got {env_vars!r:.120}")
