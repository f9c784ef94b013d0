"""What SLURM's ``scontrol -o show partition`` and ``scontrol -o show node`` say, parsed: the
partitions' limits and the nodes' sizes a job's request is checked against
(``slurm.feasibility``), and the node states a cancelled job's end waits on
(``slurm.allocation``). Pure functions of the commands' text, so they are tested on captured
output without a cluster; ``slurm.scheduler`` runs the commands.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# a field of a one-line record: a key at the start or after a space, its value up to the next key
# (values may hold spaces: "OS=Linux 6.1 #1 SMP", "Reason=Not responding [slurm@...]")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:]*)=")
_UNLIMITED = {"UNLIMITED", "INFINITE", "NONE", "N/A", "(null)", ""}
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)
# a generic resource of a node: "gpu:4", "gpu:a100:4(S:0-1)", "gpu:a100:2(IDX:0-1)"
_GPU_GRES = re.compile(r"^gpu(?::[^:(,]+)?:(\d+)")


def fields(line: str) -> dict[str, str]:
    """One ``scontrol -o`` record: each KEY=value, a value running to the next key."""
    found = list(_KEY.finditer(line))
    record = {}
    for here, after in zip(found, found[1:] + [None]):
        end = after.start() if after is not None else len(line)
        record[here.group(1)] = line[here.end():end].strip()
    return record


def count_or_none(text: str) -> int | None:
    """A limit as scontrol shows it: a whole number, or None for UNLIMITED."""
    return None if text.upper() in _UNLIMITED or not text.isdigit() else int(text)


def seconds_of(limit: str) -> int | None:
    """A SLURM time (``--time``'s forms and scontrol's MaxTime: "30" minutes, "MM:SS", "HH:MM:SS",
    "D-HH", "D-HH:MM", "D-HH:MM:SS") in seconds; None for UNLIMITED/INFINITE/NONE."""
    if limit.upper() in _UNLIMITED:
        return None
    days, _, clock = limit.rpartition("-") if "-" in limit else ("", "", limit)
    parts = [int(part) for part in clock.split(":")]
    if days:   # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    elif len(parts) == 1:   # minutes
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:   # MM:SS
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def megabytes_of(size: str) -> int | None:
    """A memory size as salloc takes it ("64G", "300M", "4096": MB) in MB; None if it is no size."""
    found = _MEMORY.match(size.strip())
    if found is None:
        return None
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[found.group(2).upper()]
    return int(float(found.group(1)) * scale)


def gpus_of(gres: str) -> int:
    """How many GPUs a node's ``Gres=`` offers ("gpu:a100:4(S:0-1),gpu:v100:2": 6; "(null)": 0)."""
    total = 0
    for item in gres.split(","):
        found = _GPU_GRES.match(item.strip())
        if found:
            total += int(found.group(1))
    return total


@dataclass(frozen=True)
class Partition:
    """A partition's limits (``scontrol -o show partition``); None: no limit."""
    name: str
    state: str                      # UP, DOWN (takes jobs, starts none), DRAIN or INACTIVE (takes none)
    default: bool
    max_nodes: int | None
    max_time: str                   # as scontrol shows it ("00:05:00", "1-12:00:00", "UNLIMITED")
    max_cpus_per_node: int | None
    max_mem_per_node: int | None    # MB
    total_nodes: int | None = None

    @property
    def max_seconds(self) -> int | None:
        return seconds_of(self.max_time)


@dataclass(frozen=True)
class Node:
    """A node's size and state (``scontrol -o show node``)."""
    name: str
    cpus: int
    memory: int                     # MB (RealMemory)
    gpus: int
    state: str                      # "IDLE", "MIXED+COMPLETING", "DOWN+NOT_RESPONDING", ...
    partitions: tuple[str, ...]

    @property
    def answers(self) -> bool:
        """Whether its slurmd answers slurmctld (a node not answering is NOT_RESPONDING, or DOWN)."""
        flags = set(self.state.split("+"))
        return not ({"NOT_RESPONDING", "DOWN"} & flags) and not self.state.endswith("*")


def parse_partitions(text: str) -> list[Partition]:
    """Every partition of ``scontrol -o show partition``'s output."""
    partitions = []
    for line in text.splitlines():
        record = fields(line)
        if "PartitionName" not in record:
            continue
        partitions.append(Partition(
            name=record["PartitionName"], state=record.get("State", "UP"), default=record.get("Default") == "YES",
            max_nodes=count_or_none(record.get("MaxNodes", "")), max_time=record.get("MaxTime", "UNLIMITED"),
            max_cpus_per_node=count_or_none(record.get("MaxCPUsPerNode", "")),
            max_mem_per_node=count_or_none(record.get("MaxMemPerNode", "")),
            total_nodes=count_or_none(record.get("TotalNodes", ""))))
    return partitions


def parse_nodes(text: str) -> list[Node]:
    """Every node of ``scontrol -o show node``'s output (CPUs: the effective count, without the
    cores SLURM keeps for itself, where scontrol says it)."""
    nodes = []
    for line in text.splitlines():
        record = fields(line)
        if "NodeName" not in record:
            continue
        cpus = count_or_none(record.get("CPUEfctv", "")) or count_or_none(record.get("CPUTot", "")) or 0
        nodes.append(Node(
            name=record["NodeName"], cpus=cpus, memory=count_or_none(record.get("RealMemory", "")) or 0,
            gpus=gpus_of(record.get("Gres", "")), state=record.get("State", ""),
            partitions=tuple(p for p in record.get("Partitions", "").split(",") if p)))
    return nodes
