"""Whether a SLURM job of a launch's shape can ever start, decided from the cluster's partitions and
nodes (``slurm.records``) before it is submitted, and from the reason the scheduler gives a job
that waits.

SLURM queues a job that asks for more than its partition can ever give (more nodes than it has,
more CPUs per node than any node has, a time limit over its MaxTime, a DOWN partition) and leaves
it "pending (PartitionConfig)" forever; others (more memory or GPUs than a node has, a partition
that does not exist) salloc refuses with a terse "Requested node configuration is not available".
``never_starts`` says, for each, what was asked, what the cluster has and what to do, so the launch
ends before it waits. It is a pure function of the parsed text and the request, tested on captured
``scontrol`` output; ``never_starting_reason`` is the same for a queued job's pending reason (what
the first check cannot see: a QOS or account limit, a constraint in ``extra_options``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .records import Node, Partition, megabytes_of, seconds_of

if TYPE_CHECKING:
    from .cluster import SlurmCluster

# pending reasons that a job keeps until someone changes the cluster or the job: it never starts
NEVER_REASONS = {
    "PartitionConfig": "it asks for more than its partition can ever give (nodes, or CPUs, memory or GPUs per node)",
    "PartitionNodeLimit": "it asks for more nodes than its partition has or allows (MaxNodes)",
    "PartitionTimeLimit": "its time limit is over its partition's MaxTime",
    "PartitionDown": "its partition is DOWN: it starts no job until the cluster's administrators bring it up",
    "PartitionInactive": "its partition is INACTIVE: it starts no job",
    "BadConstraints": "no node has the features its constraints (--constraint) ask for",
    "InvalidAccount": "its account is not valid (SlurmCluster(account=...))",
    "InvalidQOS": "its QOS is not valid (--qos in extra_options)",
    "DependencyNeverSatisfied": "the job it depends on (--dependency) ended in a way that never satisfies it",
}
# pending reasons of a wait that ends, said in words where a timeout ran out during it
WAIT_REASONS = {
    "Resources": "the nodes it needs are busy with other jobs",
    "Priority": "jobs of higher priority are ahead of it",
    "ReqNodeNotAvail": "nodes it needs are down, drained or reserved for now",
    "Dependency": "it waits for the job it depends on (--dependency)",
    "BeginTime": "its start time (--begin) has not come",
    "JobHeldUser": "it is held (scontrol release lets it go)",
    "JobHeldAdmin": "the cluster's administrators hold it",
}
# a QOS's or an account's limit per job (QOSMaxNodePerJobLimit, AssocMaxWallDurationPerJobLimit, ...)
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)Max\w*PerJob")


@dataclass(frozen=True)
class Request:
    """What one job of a launch asks of every node it gets, from ``SlurmCluster`` and its
    ``extra_options`` (``--mem``, ``--mem-per-cpu``, ``--gres=gpu:N``, ``--gpus-per-node``, ``--gpus``)."""
    nodes: int
    ranks_per_node: int
    cpus_per_rank: int
    gpus_per_node: int
    partition: str | None
    time: str | None
    memory_per_node: int | None   # MB; None: the cluster's default

    @property
    def cpus_per_node(self) -> int:
        return self.ranks_per_node * self.cpus_per_rank

    @classmethod
    def of(cls, cluster: "SlurmCluster", world_size: int) -> "Request":
        per_node = world_size // cluster.nodes
        options = dict(option.split("=", 1) for option in cluster.extra_options if "=" in option)
        memory = megabytes_of(options.get("--mem", ""))
        per_cpu = megabytes_of(options.get("--mem-per-cpu", ""))
        if memory == 0:   # --mem=0: all of each node's memory, whatever it is
            memory = None
        if memory is None and per_cpu:
            memory = per_cpu * per_node * cluster.cpus_per_rank
        gpus = cluster.gpus_per_rank * per_node
        for option, per in (("--gres", 1), ("--gpus-per-node", 1), ("--gpus", cluster.nodes)):
            text = options.get(option, "")
            found = re.search(r"(?:^|,)gpu(?::[^:,]+)?:(\d+)" if option == "--gres" else r"(?:^|:)(\d+)$", text)
            if found:
                gpus = max(gpus, math.ceil(int(found.group(1)) / per))
        return cls(cluster.nodes, per_node, cluster.cpus_per_rank, gpus, cluster.partition, cluster.time, memory)


def never_starts(request: Request, partitions: Sequence[Partition], nodes: Sequence[Node]) -> str | None:
    """Why SLURM can never start a job of ``request`` on this cluster, naming what was asked, what
    the cluster has and what to do; None if some partition it may run in can hold it."""
    if request.partition is None:
        default = next((p for p in partitions if p.default), None)
        if default is None:
            return (f"the cluster has no default partition: give SlurmCluster(partition=...) one of "
                    f"{_names(partitions)}")
        chosen = [default]
    else:
        names = request.partition.split(",")   # --partition=a,b: the job runs in the first that can
        unknown = [name for name in names if name not in {p.name for p in partitions}]
        if len(unknown) == len(names):
            return (f"SlurmCluster(partition={request.partition!r}): no such partition; the cluster has "
                    f"{_names(partitions)}")
        chosen = [p for p in partitions if p.name in names]
    problems = [(p, _problems(request, p, [n for n in nodes if p.name in n.partitions])) for p in chosen]
    if any(not found for _, found in problems):
        return None
    return "; and ".join(f"in partition {p.name}, " + "; ".join(found) for p, found in problems)


def _problems(request: Request, partition: Partition, nodes: Sequence[Node]) -> list[str]:
    """What in ``request`` partition ``partition`` (whose nodes are ``nodes``) can never give."""
    found = []
    if partition.state in ("DRAIN", "INACTIVE"):
        found.append(f"the partition is {partition.state}: it takes no job; choose another partition "
                     f"(SlurmCluster(partition=...)) or ask the cluster's administrators")
    elif partition.state == "DOWN":
        found.append("the partition is DOWN: it starts no job until the cluster's administrators bring it up; "
                     "choose another partition (SlurmCluster(partition=...)) or run again once it is UP")
    # the partition's own count where no node record names it (the nodes' sizes are then not checked)
    has = len(nodes) if nodes or partition.total_nodes is None else partition.total_nodes
    most = has if partition.max_nodes is None else min(has, partition.max_nodes)
    if request.nodes > most:
        allows = f", and allows {partition.max_nodes} per job (MaxNodes)" if partition.max_nodes is not None else ""
        found.append(f"SlurmCluster(nodes={request.nodes}) asks for {request.nodes} nodes; the partition has "
                     f"{has}{allows}: ask for at most {most}")
    asked, limit = _seconds(request.time), partition.max_seconds
    if asked is not None and limit is not None and asked > limit:
        found.append(f"SlurmCluster(time={request.time!r}) is over the partition's time limit "
                     f"(MaxTime={partition.max_time}): ask for at most {partition.max_time}, or choose a "
                     f"partition with a longer one")
    found += _per_node_problems(request, partition, nodes)
    return found


def _per_node_problems(request: Request, partition: Partition, nodes: Sequence[Node]) -> list[str]:
    """What one node of the job needs (its ranks' CPUs, memory, GPUs) against the partition's
    limits and its nodes: too few of them hold it all."""
    found, cpus = [], request.cpus_per_node
    shape = (f"{_count(request.ranks_per_node, 'rank')} per node x {_count(request.cpus_per_rank, 'CPU')} "
             f"= {_count(cpus, 'CPU')} per node")
    fewer_cpus = "ask for fewer ranks per node (more nodes) or fewer cpus_per_rank"
    if partition.max_cpus_per_node is not None and cpus > partition.max_cpus_per_node:
        found.append(f"{shape}; the partition allows {partition.max_cpus_per_node} (MaxCPUsPerNode): {fewer_cpus}")
    memory = request.memory_per_node
    if memory is not None and partition.max_mem_per_node is not None and memory > partition.max_mem_per_node:
        found.append(f"--mem asks for {memory} MB per node; the partition allows {partition.max_mem_per_node} MB "
                     f"(MaxMemPerNode): ask for less in extra_options")
    wanted = min(request.nodes, len(nodes))   # too few nodes at all is said already
    if not nodes or found:
        return found
    needs = [("CPUs", cpus, lambda n: n.cpus, shape, fewer_cpus)]
    if memory is not None:
        needs.append(("MB of memory", memory, lambda n: n.memory, f"--mem asks for {memory} MB per node",
                      "ask for less memory in extra_options"))
    if request.gpus_per_node:
        needs.append(("GPUs", request.gpus_per_node, lambda n: n.gpus,
                      f"{_count(request.gpus_per_node, 'GPU')} per node asked for (gres gpu)",
                      "ask for fewer GPUs per rank or per node, or choose a partition with GPU nodes"))
    for what, amount, has, asked, todo in needs:
        holding = sum(has(n) >= amount for n in nodes)
        if holding < wanted:
            most = max(has(n) for n in nodes)
            has_text = (f"only {holding} of its nodes have {amount} {what}" if holding
                        else f"its largest node has {most} {what}" if most else f"none of its nodes has {what}")
            found.append(f"{asked}; {has_text}: {todo}")
    if not found and sum(all(has(n) >= amount for _, amount, has, _, _ in needs) for n in nodes) < wanted:
        found.append(f"fewer than {request.nodes} of its nodes have all of "
                     + ", ".join(f"{amount} {what}" for what, amount, *_ in needs) + " asked for per node")
    return found


def _count(number: int, word: str) -> str:
    return f"{number} {word}{'' if number == 1 else 's'}"


def never_starting_reason(reason: str) -> str | None:
    """What a pending job's ``reason`` means when it keeps the job from ever starting; None for
    a wait that ends (Resources, Priority, a node that is down for now, ...)."""
    if reason in NEVER_REASONS:
        return NEVER_REASONS[reason]
    if _PER_JOB_LIMIT.match(reason):
        return f"it asks for more than its QOS or account allows one job ({reason})"
    return None


def reason_words(reason: str) -> str:
    """A pending reason with what it means, where known: "Resources (the nodes it needs are busy ...)"."""
    meaning = WAIT_REASONS.get(reason) or never_starting_reason(reason)
    return f"{reason} ({meaning})" if meaning else reason


def _seconds(limit: str | None) -> int | None:
    try:
        return None if limit is None else seconds_of(limit)
    except ValueError:
        return None


def _names(partitions: Sequence[Partition]) -> str:
    return ", ".join(p.name + (" (default)" if p.default else "") + ("" if p.state == "UP" else f" ({p.state})")
                     for p in partitions) or "none"
