"""Open files a launch needs, checked against RLIMIT_NOFILE before anything opens.

Each local rank costs the notebook's process three pipes (six fds until its fork, three
after), a process fd (the supervisor's sentinel) and its log file. A rank on a cluster (Ray,
SLURM) costs four connections back to the notebook and its log file. Node 0 of a multi-node
launch also hosts the rendezvous store, which holds a connection from every node and every rank.
A launch past the soft limit used to fail midway with a raw ``OSError: [Errno 24]`` (200 cluster
ranks at ``ulimit -n 256``). Checked first, the soft limit is raised when the hard limit allows
(ranks inherit it, as from a shell's ``ulimit -n``); otherwise the error says how many ranks fit
and how to get more.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from ..display.words import counted
from ..errors import LaunchArgumentError

log = logging.getLogger("notebook_launch")

FDS_PER_RANK = 11       # 4 pipes (8 fds while starting), a result file, a process fd, a log file
FDS_PER_REMOTE_RANK = 5   # events, stdout, stderr and answers connections, a log file
FDS_SPARE = 64          # selector, display, kernel sockets opened during the run, the user's files
LOCAL_RANK_FILES = "pipes, result file, process handle, log file"
REMOTE_RANK_FILES = "its four connections back to this notebook and its log file"


@dataclass(frozen=True)
class FileNeed:
    """What one launch opens in this process: ``per_rank`` for each of ``ranks`` and ``fixed``
    besides (the rendezvous store's connections from other nodes); ``asked`` names the argument
    ("num_processes=40") and ``what`` what a rank holds open, for the error."""
    ranks: int
    per_rank: int = FDS_PER_RANK
    fixed: int = 0
    asked: str = ""
    what: str = LOCAL_RANK_FILES

    @property
    def described(self) -> str:
        return self.asked or f"num_processes={self.ranks}"


def local_need(num_local_ranks: int, *, num_nodes: int = 1, node_rank: int = 0) -> FileNeed:
    """A local launch; on node 0 of several, the store's connections too (one per node, and one per
    rank of every node, each node running ``num_local_ranks``)."""
    if num_nodes > 1 and node_rank == 0:
        return FileNeed(num_local_ranks, per_rank=FDS_PER_RANK + num_nodes, fixed=num_nodes,
                        asked=f"num_processes={num_local_ranks} on each of num_nodes={num_nodes}",
                        what=f"{LOCAL_RANK_FILES}, and on node 0 one connection to the rendezvous store "
                             f"per rank of every node")
    return FileNeed(num_local_ranks)


def cluster_need(world_size: int) -> FileNeed:
    return FileNeed(world_size, per_rank=FDS_PER_REMOTE_RANK, asked=f"num_processes={world_size} on the cluster",
                    what=REMOTE_RANK_FILES)


def fds_in_use() -> int:
    """Open fds of this process (a Jupyter kernel holds dozens of zmq sockets)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def ensure_fd_budget(need: FileNeed | int) -> str | None:
    """Make room for the launch, or raise LaunchArgumentError naming the limit; an int is that many
    local ranks. Returns a note for the launch line when the soft limit was raised, else None."""
    if isinstance(need, int):
        need = FileNeed(need)
    try:
        import resource
    except ImportError:      # Windows: no RLIMIT_NOFILE
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fixed = fds_in_use() + FDS_SPARE + need.fixed
    needed = fixed + need.per_rank * need.ranks
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return None
    if hard == resource.RLIM_INFINITY or needed <= hard:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, max(needed, 2 * soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:   # past the kernel's fs.nr_open, though "unlimited"
            log.debug("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
        else:
            return (f"raised this process's open-file limit (ulimit -n) from {soft} to {target} "
                    f"for {counted(need.ranks, 'rank')}")
    limit = soft if hard == resource.RLIM_INFINITY else max(soft, hard)
    raise LaunchArgumentError(too_few_files_text(need, needed=needed, in_use=fixed - FDS_SPARE - need.fixed,
                                                 soft=soft, hard=hard, fits=(limit - fixed) // need.per_rank))


def too_few_files_text(need: FileNeed, *, needed: int, in_use: int, soft: int, hard: int, fits: int) -> str:
    """What the limit is, what the launch and one rank need, and how to raise the hard limit (which
    this process cannot): a limit too tight for even one rank says so instead of "at most 0 ranks"."""
    shown_hard = "unlimited" if hard < 0 else str(hard)
    fit = (f"At most {fits} rank{'s' if fits != 1 else ''} fit under it: use num_processes={fits}, or raise"
           if fits >= 1 else "Not even one rank fits under it. Raise")
    store = f", {need.fixed} for the rendezvous store's connections from the nodes" if need.fixed else ""
    return (
        f"{need.described} needs about {needed} open files in this process, but its open-file "
        f"limit is {soft} (ulimit -n), hard limit {shown_hard}, which a process cannot raise for itself: "
        f"{in_use} files are open already, {FDS_SPARE} are kept spare for the run (selector, display, kernel "
        f"sockets, your own files){store}, and each rank needs {need.per_rank} ({need.what}), so one rank "
        f"needs {in_use + FDS_SPARE + need.fixed + need.per_rank}. {fit} the limit to {needed} or more "
        f"before starting Jupyter: `ulimit -Hn {needed} && ulimit -n {needed}` in the shell that starts it (the "
        f"hard limit as root, or in /etc/security/limits.conf), LimitNOFILE={needed} in its systemd unit, or "
        f"`docker run --ulimit nofile={needed}:{needed}` for a container.")
