"""The SLURM commands the notebook side runs, and what the scheduler says of a job.

Every call goes through the commands a user has on a login node (salloc, srun, scontrol,
scancel): no library, no accounting database (``sacct`` needs slurmdbd, which many clusters
keep from users; ``scontrol show job`` has the state while the job is known). The environment
they get is the notebook's without a job's own ``SLURM_*`` variables: a notebook that itself runs
inside a SLURM job (JupyterHub's batchspawner) would otherwise hand its job's task counts to our
srun as defaults.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import GuardError
from .feasibility import Request, never_starts
from .records import Node, Partition, parse_nodes, parse_partitions

if TYPE_CHECKING:
    from .cluster import SlurmCluster

log = logging.getLogger("notebook_launch")
COMMANDS = ("salloc", "srun", "scontrol", "scancel")
COMMAND_TIMEOUT = 30.0
# the states in which a job holds or waits for nodes; any other is an end
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
               "STAGE_OUT", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED"}
# what each end the scheduler records means, said as the cause of a rank's end
ENDS = {
    "TIMEOUT": "SLURM ended the job at its {limit} time limit (raise SlurmCluster(time=...))",
    "NODE_FAIL": "SLURM ended the job because a node failed (NODE_FAIL: its slurmd stopped answering)",
    "PREEMPTED": "SLURM preempted the job (a job of higher priority took its nodes)",
    "OUT_OF_MEMORY": "SLURM killed the job for using more memory than it asked for (OUT_OF_MEMORY; "
                     "ask for more with extra_options=['--mem=...'])",
    "DEADLINE": "SLURM ended the job at its deadline (DEADLINE: it could no longer start and run its time "
                "limit before its --deadline; give a later deadline or a shorter SlurmCluster(time=...))",
    "BOOT_FAIL": "SLURM could not boot the job's nodes (BOOT_FAIL; `sinfo -R` says why a node is down: "
                 "run again on other nodes or ask the cluster's administrators)",
    "CANCELLED": "SLURM cancelled the job (CANCELLED: scancel, by its user or an administrator; run the "
                 "launch again for a new job)",
}


# what slurmstepd writes into srun's output when it kills a step for its memory: jobacct_gather's
# OverMemoryKill ("StepId=12.1 exceeded memory limit (580710400 > 314572800), being killed") or the
# cgroup's OOM killer ("Detected 1 oom_kill event in StepId=12.1"; before 21.08 "oom-kill event(s)")
STEP_MEMORY_KILL = re.compile(r"exceeded memory limit \((\d+) > (\d+)\)|Detected \d+ oom[-_]kill event")


def step_memory_cause(said: str) -> str | None:
    """What ended a rank whose step SLURM killed for using more memory than the job asked for,
    from srun's output ``said``: the job itself stays RUNNING (its other steps run on), so its
    record never says OUT_OF_MEMORY; only the step's killer says it, and only to srun."""
    found = STEP_MEMORY_KILL.search(said)
    if found is None:
        return None
    used, limit = found.group(1), found.group(2)
    amounts = f": {int(used) / 2**20:.0f} MiB, over its {int(limit) / 2**20:.0f} MiB limit" if used else ""
    return (f"SLURM killed the rank's step for using more memory than the job asked for (out of memory"
            f"{amounts}; ask for more with extra_options=['--mem=...'])")


def slurm_environment() -> dict[str, str]:
    """The notebook's environment for our SLURM commands, without an enclosing job's variables."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith("SLURM_") or name == "SLURM_CONF"}


def check_commands() -> None:
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        raise GuardError(
            f"cluster=SlurmCluster(...) needs SLURM's commands on this machine ({', '.join(missing)} not "
            f"found on PATH): run the notebook on the cluster's login or interactive node (Open OnDemand, "
            f"JupyterHub), where salloc and srun are installed")


def run(*argv: str, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=slurm_environment(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def environment_report() -> str:
    """For ``notebook-launch env``: the SLURM cluster this machine's commands reach (sinfo), one
    entry per partition; nothing is submitted."""
    if shutil.which("sinfo") is None:
        return "no SLURM commands here (sinfo not found; cluster=SlurmCluster(...) runs from a login node)"
    try:
        result = run("sinfo", "-h", "-o", "%P %a %D %C", timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo did not answer ({type(exc).__name__}: {exc})"
    if result.returncode:
        said = (result.stderr.strip().splitlines() or ["no message"])[-1]
        return f"sinfo failed: {said}"
    partitions = []
    for line in result.stdout.splitlines():
        name, avail, nodes, cpus = (line.split() + ["?"] * 4)[:4]
        allocated, idle = (cpus.split("/") + ["?", "?"])[:2]
        partitions.append(f"{name} ({avail}, {nodes} nodes, {idle} CPUs idle, {allocated} allocated)")
    return "partitions " + "; ".join(partitions) if partitions else "sinfo lists no partition"


def salloc_argv(cluster: "SlurmCluster", ranks_per_node: int, job_name: str) -> list[str]:
    """salloc without a shell: the allocation is made (or queued) and salloc returns once it is granted."""
    argv = ["salloc", "--no-shell", f"--job-name={job_name}", f"--nodes={cluster.nodes}",
            f"--ntasks-per-node={ranks_per_node}", f"--cpus-per-task={cluster.cpus_per_rank}"]
    if cluster.gpus_per_rank:
        argv.append(f"--gpus-per-task={cluster.gpus_per_rank}")
    for name in ("partition", "time", "account"):
        value = getattr(cluster, name)
        if value is not None:
            argv.append(f"--{name}={value}")
    return argv + list(cluster.extra_options)


def agent_srun_argv(cluster: "SlurmCluster", job_id: str, node: str, python: str, ranks: int) -> list[str]:
    """One node's ranks: a step of one task on ``node`` holding all its ranks' CPUs, running the
    node's agent (``slurm.node_agent``), which forks the ``ranks``, so the steps of a job's nodes run
    side by side. GPUs are not split per rank: each rank sees its node's GPUs of the job and takes
    ``cuda:LOCAL_RANK``, as under torchrun (untested here: the test machine has none)."""
    argv = ["srun", f"--jobid={job_id}", "--exact", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            f"--cpus-per-task={cluster.cpus_per_rank * ranks}", "--export=ALL", "--quiet", "--input=none"]
    return argv + [python, "-m", "notebook_launch.engines.slurm.node_agent"]


@dataclass(frozen=True)
class JobInfo:
    """The scheduler's record of a job (``scontrol show job``); ``state`` "GONE" once it forgot it."""
    state: str
    reason: str = "None"
    node_list: str = ""
    time_limit: str = ""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def end_cause(self) -> str | None:
        """What ended the job, when the scheduler did (a time limit, a node failure, ...)."""
        state = "TIMEOUT" if self.reason == "TimeLimit" else self.state   # COMPLETING at its limit
        text = ENDS.get(state)
        return text.format(limit=self.time_limit) if text else None


def job_info(job_id: str) -> JobInfo:
    result = run("scontrol", "-o", "show", "job", job_id)
    if result.returncode:
        if "Invalid job id" in result.stderr:
            return JobInfo("GONE")
        raise GuardError(f"scontrol show job {job_id} failed: {result.stderr.strip()}")
    fields = dict(part.split("=", 1) for part in result.stdout.split() if "=" in part)
    return JobInfo(fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None"), fields.get("NodeList", ""),
                   fields.get("TimeLimit", ""))


def node_addresses(node_list: str) -> list[tuple[str, str]]:
    """(name, address) of each node of a hostlist such as ``gpu[01-02]``, in the list's order."""
    names = run("scontrol", "show", "hostnames", node_list)
    if names.returncode:
        raise GuardError(f"scontrol show hostnames {node_list} failed: {names.stderr.strip()}")
    nodes = names.stdout.split()
    shown = run("scontrol", "-o", "show", "node", ",".join(nodes))
    addresses = {}
    for line in shown.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if "NodeName" in fields:
            addresses[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return [(name, addresses.get(name, name)) for name in nodes]


def cancel(job_id: str) -> None:
    result = run("scancel", job_id)
    if result.returncode:
        log.debug("scancel %s: %s", job_id, result.stderr.strip())


def cluster_records() -> tuple[list[Partition], list[Node]] | None:
    """Every partition's limits and every node's size and state, as scontrol says them; None if it
    does not answer (the check it serves is then skipped, never the launch)."""
    try:
        partitions = run("scontrol", "-o", "show", "partition")
        nodes = run("scontrol", "-o", "show", "node")
    except (OSError, subprocess.SubprocessError):
        log.debug("could not ask SLURM for its partitions and nodes", exc_info=True)
        return None
    if partitions.returncode or nodes.returncode:
        log.debug("scontrol show partition/node failed: %s %s", partitions.stderr.strip(), nodes.stderr.strip())
        return None
    return parse_partitions(partitions.stdout), parse_nodes(nodes.stdout)


def why_never_starts(cluster: "SlurmCluster", world_size: int) -> str | None:
    """Why SLURM could never start the job of a launch of ``world_size`` ranks on ``cluster``
    (``feasibility.never_starts`` on what scontrol says now), or None."""
    records = cluster_records()
    return None if records is None else never_starts(Request.of(cluster, world_size), *records)


def check_can_start(cluster: "SlurmCluster", world_size: int) -> None:
    """Refuse, before anything is submitted, a job SLURM would queue and never start (pending
    "PartitionConfig" forever) or refuse with a terse salloc error."""
    why = why_never_starts(cluster, world_size)
    if why:
        raise GuardError(f"SLURM could never start this job: {why}. Nothing was submitted.")



def completing_on(job_id: str) -> str:
    """The nodes (a hostlist, "node[0-1]") where SLURM still ends the job's processes (state
    COMPLETING); "" once it is not completing."""
    result = run("squeue", "-h", "-j", job_id, "-t", "COMPLETING", "-o", "%N")
    return result.stdout.strip() if result.returncode == 0 else ""


def nodes_of(hostlist: str) -> list[Node]:
    """What scontrol says of the nodes of ``hostlist`` (their state: does their slurmd answer?)."""
    result = run("scontrol", "-o", "show", "node", hostlist)
    return parse_nodes(result.stdout) if result.returncode == 0 else []
