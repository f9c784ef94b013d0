"""SLURM as an ``engines.Engine``: a launch (``run.run_on_slurm``) and persistent ranks
(``persistent.start_slurm_ranks``) on one ``SlurmCluster``'s allocation."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..remote.handle import CLUSTER_LINE_PREFIX

if TYPE_CHECKING:
    from ...planning.options import LaunchOptions
    from ...persistent.pool import Ranks
    from .cluster import SlurmCluster


class SlurmEngine:
    """Ranks forked by one agent per node (``srun`` steps of one job), connecting back (``remote``)."""

    name = "slurm"
    line_prefix: str | None = CLUSTER_LINE_PREFIX

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster

    def launch(self, options: LaunchOptions) -> list[Any]:
        from ...planning.options import validate_cluster_launch
        from .run import run_on_slurm
        return run_on_slurm(options, self.cluster, validate_cluster_launch(options))

    def start_ranks(self, parameters: Mapping[str, Any], grace: float) -> Ranks:
        from .persistent import start_slurm_ranks
        return start_slurm_ranks(self.cluster, parameters, grace)
