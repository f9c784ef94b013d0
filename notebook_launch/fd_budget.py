"""Open files a launch needs, checked against RLIMIT_NOFILE before anything opens.

Each local rank costs the notebook's process three pipes (six fds until its fork, three
after), a process fd (the supervisor's sentinel) and its log file. A launch past the soft
limit used to fail midway with a raw ``OSError: [Errno 24]``. Checked first, the soft limit
is raised when the hard limit allows (ranks inherit it, as from a shell's ``ulimit -n``);
otherwise the error says how many ranks fit and how to get more.
"""
from __future__ import annotations

import logging
import os

from .errors import LaunchArgumentError

log = logging.getLogger("notebook_launch")

FDS_PER_RANK = 11       # 4 pipes (8 fds while starting), a result file, a process fd, a log file
FDS_SPARE = 64          # selector, display, kernel sockets opened during the run, the user's files


def fds_in_use() -> int:
    """Open fds of this process (a Jupyter kernel holds dozens of zmq sockets)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def ensure_fd_budget(num_local_ranks: int) -> str | None:
    """Make room for ``num_local_ranks`` ranks, or raise LaunchArgumentError naming the limit.

    Returns a note for the launch line when the soft limit was raised, else None."""
    try:
        import resource
    except ImportError:      # Windows: no RLIMIT_NOFILE
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fixed = fds_in_use() + FDS_SPARE
    needed = fixed + FDS_PER_RANK * num_local_ranks
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return None
    if hard == resource.RLIM_INFINITY or needed <= hard:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, max(needed, 2 * soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.debug("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
        else:
            return (f"raised this process's open-file limit (ulimit -n) from {soft} to {target} "
                    f"for {num_local_ranks} ranks")
    limit = soft if hard == resource.RLIM_INFINITY else max(soft, hard)
    raise LaunchArgumentError(too_few_files_text(num_local_ranks, needed=needed, in_use=fixed - FDS_SPARE,
                                                 soft=soft, hard=hard, fits=(limit - fixed) // FDS_PER_RANK))


def too_few_files_text(num_local_ranks: int, *, needed: int, in_use: int, soft: int, hard: int, fits: int) -> str:
    """What the limit is, what the launch and one rank need, and how to raise the hard limit (which
    this process cannot): a limit too tight for even one rank says so instead of "at most 0 ranks"."""
    shown_hard = "unlimited" if hard < 0 else str(hard)
    fit = (f"At most {fits} rank{'s' if fits != 1 else ''} fit under it: use num_processes={fits}, or raise"
           if fits >= 1 else "Not even one rank fits under it. Raise")
    return (
        f"num_processes={num_local_ranks} needs about {needed} open files in this process, but its open-file "
        f"limit is {soft} (ulimit -n), hard limit {shown_hard}, which a process cannot raise for itself: "
        f"{in_use} files are open already, {FDS_SPARE} are kept spare for the run (selector, display, kernel "
        f"sockets, your own files), and each rank needs {FDS_PER_RANK} (pipes, result file, process handle, "
        f"log file), so one rank needs {in_use + FDS_SPARE + FDS_PER_RANK}. {fit} the limit to {needed} or more "
        f"before starting Jupyter: `ulimit -Hn {needed} && ulimit -n {needed}` in the shell that starts it (the "
        f"hard limit as root, or in /etc/security/limits.conf), LimitNOFILE={needed} in its systemd unit, or "
        f"`docker run --ulimit nofile={needed}:{needed}` for a container.")
