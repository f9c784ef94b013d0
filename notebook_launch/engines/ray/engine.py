"""Ray as an ``engines.Engine``: a launch (``run.run_on_ray``) and persistent ranks
(``persistent.start_ray_ranks``) on one ``RayCluster``."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..remote.handle import CLUSTER_LINE_PREFIX

if TYPE_CHECKING:
    from ...planning.options import LaunchOptions
    from ...persistent.pool import Ranks
    from .cluster import RayCluster


class RayEngine:
    """Ranks as Ray actors of one placement group (``launch``, ``gang``), connecting back (``remote``)."""

    name = "ray"
    line_prefix: str | None = CLUSTER_LINE_PREFIX

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster

    def launch(self, options: LaunchOptions) -> list[Any]:
        from ...planning.options import validate_cluster_launch
        from .run import run_on_ray
        return run_on_ray(options, self.cluster, validate_cluster_launch(options))

    def start_ranks(self, parameters: Mapping[str, Any], grace: float) -> Ranks:
        from .persistent import start_ray_ranks
        return start_ray_ranks(self.cluster, parameters, grace)
