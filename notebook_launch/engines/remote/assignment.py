"""What a rank on another machine is told of its place: one typed ``RankAssignment``, made by its
engine's launcher (``ray.launch``, ``slurm.launcher``) and read by its rank side (``ray.actor``,
``slurm.task``), instead of a ``dict[str, Any]`` per engine with keys of its own. ``spec`` builds
the rank's environment with ``plan.rank_environment`` (the one builder a local rank's comes from
too). It crosses as what each engine carries: Ray pickles it as an argument of the actor's call,
SLURM writes it as JSON into the node's step environment (``to_json``, ``from_json``). Rank side:
it imports only the plan and ``net``."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...planning.net import interface_with_address, source_address_toward
from ...wire.plan import DeviceKind, RankSpec, rank_environment


@dataclass(frozen=True)
class RankAssignment:
    """One rank's place in a run on other machines, and the run's numbers it needs."""
    global_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    world_size: int
    master_addr: str
    master_port: int
    device_kind: DeviceKind
    mixed_precision: str
    run_id: str
    cpu_count: int                # the CPUs of this rank's node's ranks together
    attempt: int = 0              # the restart this start is (TORCHELASTIC_RESTART_COUNT)
    max_restarts: int = 0
    interface: str | None = None  # the one gloo and NCCL bind (None: theirs to pick)
    cuda_visible_devices: str | None = None   # the GPUs the engine gave this node's ranks, if it says
    persistent: bool = False      # the rank serves calls until told to stop (``remote.serve``)

    def toward_master(self) -> RankAssignment:
        """This assignment with the interface of this node that reaches rank 0's (a SLURM rank finds
        it on its node; Ray's actor says its own when it describes itself)."""
        source = source_address_toward(self.master_addr)
        return dataclasses.replace(self, interface=interface_with_address(source) if source else None)

    def spec(self, user_env: Mapping[str, str]) -> RankSpec:
        """The rank's environment and device on its node: a local rank's (``rank_environment``), with
        the attempt's restart count, the interface gloo and NCCL bind and the engine's GPUs."""
        env = rank_environment(
            global_rank=self.global_rank, local_rank=self.local_rank, num_processes=self.local_world_size,
            num_nodes=self.num_nodes, node_rank=self.node_rank, world_size=self.world_size,
            master_addr=self.master_addr, master_port=self.master_port, device_kind=self.device_kind,
            mixed_precision=self.mixed_precision, run_id=self.run_id, user_env=user_env, cpu_count=self.cpu_count,
            restart_count=self.attempt, max_restarts=self.max_restarts, interface=self.interface)
        if self.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        device = f"cuda:{self.local_rank}" if self.device_kind == "cuda" else "cpu"
        return RankSpec(self.global_rank, self.local_rank, device, env)

    def node_ranks(self) -> range:
        """The global ranks of this assignment's node (its node's ranks are contiguous)."""
        first = self.node_rank * self.local_world_size
        return range(first, first + self.local_world_size)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankAssignment:
        return cls(**data)
