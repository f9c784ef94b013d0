"""``RayCluster``: where ``notebook_launcher(..., cluster=...)`` runs its ranks.

A plain description, checked when it is made; importing it imports nothing of
Ray, so a notebook that never passes ``cluster=`` never pays for Ray (or needs it).
The launch itself is ``run_ray`` (with ``backends.ray_launch.RayLauncher``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from .options import validate_ray_cluster

if TYPE_CHECKING:
    from .plan import DeviceKind

DEFAULT_RESOURCES = {"CPU": 1.0}


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
        validate_ray_cluster(address=self.address, resources_per_rank=self.resources_per_rank,
                             placement=self.placement, runtime_env=self.runtime_env)

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
