"""``SlurmCluster``: where ``notebook_launcher(..., cluster=SlurmCluster(...))`` runs its ranks.

A plain description, checked when it is made (every check of its own fields is here, before
anything is submitted); importing it imports nothing heavy and runs no SLURM command. The launch
itself is ``slurm.run``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ...errors import LaunchArgumentError

if TYPE_CHECKING:
    from ...wire.plan import DeviceKind

# SLURM's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or UNLIMITED/INFINITE)
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2}"
                   r"|UNLIMITED|INFINITE)$")
# options SlurmCluster sets from its own fields: given again in extra_options they would contradict them
_OWN_OPTIONS = {"-N": "nodes", "--nodes": "nodes", "-c": "cpus_per_rank", "--cpus-per-task": "cpus_per_rank",
                "--gpus-per-task": "gpus_per_rank", "-p": "partition", "--partition": "partition",
                "-t": "time", "--time": "time", "-A": "account", "--account": "account",
                "-n": "num_processes", "--ntasks": "num_processes", "--ntasks-per-node": "num_processes",
                "-J": "(the job name is the run's)", "--job-name": "(the job name is the run's)"}


@dataclass(frozen=True)
class SlurmCluster:
    """Ranks as tasks of one SLURM job (an allocation of ``nodes`` nodes), ``num_processes`` in all,
    spread evenly over the nodes.

    nodes: how many nodes the job asks for; ``num_processes`` must be a multiple of it.
    cpus_per_rank: CPU cores each rank gets (``--cpus-per-task``).
    gpus_per_rank: GPUs each rank gets (``--gpus-per-task``); > 0 trains on CUDA with NCCL, 0 on CPU with gloo.
    partition, time, account: the job's ``--partition``, ``--time`` limit (SLURM's forms:
        "30", "2:00:00", "1-12:00:00") and ``--account``; None: the cluster's default.
    extra_options: any other salloc/sbatch options, each one string as on the command line, e.g.
        ("--qos=high", "--constraint=a100", "--mem=64G").
    python: the interpreter the ranks run on the nodes; None: the notebook's own (``sys.executable``),
        which must exist at the same path on every node (a shared file system, as HPC homes are).
    """
    nodes: int = 1
    cpus_per_rank: int = 1
    gpus_per_rank: int = 0
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    extra_options: Sequence[str] = ()
    python: str | None = None

    def __post_init__(self) -> None:
        """Refuse a bad field when the description is made, not once the job was queued."""
        _check_count("nodes", self.nodes, 1)
        _check_count("cpus_per_rank", self.cpus_per_rank, 1)
        _check_count("gpus_per_rank", self.gpus_per_rank, 0)
        for name in ("partition", "account"):
            _check_word(name, getattr(self, name))
        if self.time is not None and (not isinstance(self.time, str) or not _TIME.match(self.time)):
            raise LaunchArgumentError(
                f"SlurmCluster(time={self.time!r}) is not a SLURM time limit; use minutes ('30'), "
                f"'HH:MM:SS' ('2:00:00') or 'D-HH:MM:SS' ('1-12:00:00'), or None for the partition's default")
        object.__setattr__(self, "extra_options", _checked_options(self.extra_options))
        if self.python is not None and (not isinstance(self.python, str) or not self.python.startswith("/")
                                        or "\0" in self.python):
            raise LaunchArgumentError(
                f"SlurmCluster(python=...) must be the absolute path of the interpreter on the nodes, "
                f"or None for the notebook's own; got {self.python!r}")

    @property
    def device_kind(self) -> DeviceKind:
        """A rank with a GPU trains on CUDA (NCCL); otherwise on CPU (gloo)."""
        return "cuda" if self.gpus_per_rank > 0 else "cpu"


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise LaunchArgumentError(f"SlurmCluster({name}=...) must be a whole number >= {least}; got {value!r}")


def _check_word(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value
                              or any(ch.isspace() or not ch.isprintable() for ch in value)):
        raise LaunchArgumentError(
            f"SlurmCluster({name}=...) must be a name without spaces (as SLURM's --{name} takes it) or None "
            f"for the cluster's default; got {value!r}")


def _checked_options(options: object) -> tuple[str, ...]:
    if isinstance(options, str) or not isinstance(options, (list, tuple)):
        raise LaunchArgumentError(
            f"SlurmCluster(extra_options=...) must be a list or tuple of salloc options, one string each, "
            f"e.g. ['--qos=high', '--mem=64G']; got {options!r}")
    for option in options:
        if not isinstance(option, str) or not option.startswith("-") or "\0" in option or "\n" in option:
            raise LaunchArgumentError(
                f"SlurmCluster(extra_options=...) takes salloc options such as '--qos=high', each starting "
                f"with '-' (an option's value goes with '=' in the same string); got {option!r}")
        flag = option.split("=", 1)[0]
        owner = _OWN_OPTIONS.get(flag) or next(
            (field for short, field in _OWN_OPTIONS.items() if len(short) == 2 and option.startswith(short)
             and len(option) > 2 and not option.startswith("--")), None)
        if owner is not None:
            raise LaunchArgumentError(
                f"SlurmCluster(extra_options=...) contains {option!r}, which SlurmCluster sets itself from "
                f"{owner}: give it there instead")
    return tuple(options)
