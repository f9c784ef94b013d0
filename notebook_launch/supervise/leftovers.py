"""Nothing a rank started outlives the run: its process group dies with it, and strays are swept.

Every rank leads its own process group, and what it starts (subprocess, multiprocessing,
DataLoader workers) stays in that group unless it moves out. When a rank ends, however it
ends (a return, an exception, os._exit, a segfault, SIGKILL), ``end_rank_group`` kills the
group while the rank is still an unreaped zombie: its pid, and so the group id, cannot
have been reused by then. A process that left the group (``setsid``, ``start_new_session=True``,
a daemon) is found at the end of the run, or of each elastic attempt, by ``sweep``: it still
carries the rank's NOTEBOOK_LAUNCH_RUN_ID in its environment, unless it cleared it. Linux only
(/proc and pidfds); elsewhere only the group is killed.
"""
from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("notebook_launch")
RUN_MARK = "NOTEBOOK_LAUNCH_RUN_ID"


def end_rank_group(pid: int) -> None:
    """SIGKILL the process group that rank ``pid`` leads. Call it after the rank exited and
    before it is reaped: until then no other process or group can have that number."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass   # the group is empty (or the rank died before it made its own group)
    except PermissionError:
        log.debug("cannot signal process group %d", pid, exc_info=True)


def sweep(run_id: str) -> list[int]:
    """SIGKILL every process of this user whose environment carries this run's id (a rank's
    descendant that left the rank's process group). Call it once no rank of the run is alive.
    Returns the pids signalled."""
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"):
        return []
    mark = f"{RUN_MARK}={run_id}".encode()
    me = os.getpid()
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        if not _carries(pid, mark):
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue   # it ended meanwhile
        try:
            if _carries(pid, mark):   # still the same process: the pidfd pins it
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(pid)
        except OSError:
            log.debug("could not kill stray process %d of run %s", pid, run_id, exc_info=True)
        finally:
            os.close(pidfd)
    if killed:
        log.debug("run %s: killed %d process(es) that left their rank's group: %s", run_id, len(killed), killed)
    return killed


def _carries(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False   # another user's process, or gone
