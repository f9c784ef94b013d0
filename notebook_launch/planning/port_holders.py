"""Who holds a TCP port, asked when the default port (29500) cannot be used and another is picked.

"port 29500 is busy; using port N instead" read like a conflict, whoever held the port. The note now says who
holds it where that can be found, and nothing where the holder is this notebook's own (the ranks of a run it
started, persistent ranks it keeps, a claim its own runs hold) or no process at all (a closed connection's
TIME_WAIT): picking another port is then routine. A port held by this very process (a process group or
TCPStore the notebook made itself) or by another process is named, with its pid and command line.

Linux only, from /proc: the sockets on the port (/proc/net/tcp, tcp6), the processes whose open files are those
sockets (/proc/*/fd), the holder of a launch's port claim (/proc/locks, net.PortReservation's flock). Cheap (read
only when the port was busy, and the search of /proc stops after ``budget`` seconds) and never failing: what
cannot be read (another user's processes, no /proc) counts as unknown.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

LISTEN = "0A"        # the state column of /proc/net/tcp for a listening socket


@dataclass(frozen=True)
class Holder:
    """A process that holds the port: ``pid`` None when a socket's owner could not be found (another user's
    process); ``ours`` when it is the asking process's descendant (ranks it started)."""
    pid: int | None
    command: str = ""
    ours: bool = False


def socket_inodes(table: str, port: int) -> set[int]:
    """The inodes of the sockets bound to ``port`` in a /proc/net/tcp or tcp6 table, bar those no process owns
    (inode 0: a closed connection in TIME_WAIT, which a bind with SO_REUSEADDR never minds)."""
    inodes = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9].isdigit() and int(fields[9]):
            inodes.add(int(fields[9]))
    return inodes


def flock_pids(locks: str, device: int, inode: int) -> set[int]:
    """The pids /proc/locks names as holding a lock on the file (``device``, ``inode``: os.stat's)."""
    where = f"{os.major(device):02x}:{os.minor(device):02x}:{inode}"
    pids = set()
    for line in locks.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5] == where and fields[4].lstrip("-").isdigit() and int(fields[4]) > 0:
            pids.add(int(fields[4]))
    return pids


def note(port: int, chosen: int, holders: list[Holder], own_pid: int) -> str | None:
    """What to say as ``chosen`` replaces ``port``: None where every holder is ours (or none is left)."""
    foreign = [h for h in holders if not h.ours]
    if not foreign:
        return None
    known = [h for h in foreign if h.pid is not None]
    if not known:
        who = "a process this user cannot see"
    elif known[0].pid == own_pid:
        who = f"this process itself (pid {own_pid})"
    else:
        who = f"pid {known[0].pid} ({known[0].command})" if known[0].command else f"pid {known[0].pid}"
    return f"port {port} is held by {who}; using port {chosen} instead"


def find_holders(port: int, claim_file: str, own_pid: int, proc: str = "/proc", budget: float = 0.5) -> list[Holder]:
    """Who holds ``port`` on this machine, as seen by ``own_pid``: the sockets bound to it and the launch claim
    (``claim_file``, a net.PortReservation's lock file). Empty where nothing can be read."""
    inodes: set[int] = set()
    for table in ("net/tcp", "net/tcp6"):
        inodes |= socket_inodes(_read(os.path.join(proc, table)), port)
    pids = _socket_pids(inodes, proc, time.monotonic() + budget)
    holders = [_holder(pid, proc, own_pid) for pid in sorted(pids)]
    if inodes - set().union(set(), *pids.values()):   # a socket whose process was not found
        holders.append(Holder(None))
    try:
        stat = os.stat(claim_file)
    except OSError:   # why: no claim file, no claim
        return holders
    for pid in sorted(flock_pids(_read(os.path.join(proc, "locks")), stat.st_dev, stat.st_ino)):
        # a claim this process holds is its own run's (persistent ranks): ours, unlike a socket it opened
        holders.append(_holder(pid, proc, own_pid, self_is_ours=True))
    return holders


def _socket_pids(inodes: set[int], proc: str, deadline: float) -> dict[int, set[int]]:
    """pid -> the inodes of ``inodes`` it has open, from each /proc/<pid>/fd this user may read."""
    found: dict[int, set[int]] = {}
    if not inodes:
        return found
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    for name in _listdir(proc):
        if time.monotonic() > deadline:
            break
        if not name.isdigit():
            continue
        folder = os.path.join(proc, name, "fd")
        for fd in _listdir(folder):
            try:
                target = os.readlink(os.path.join(folder, fd))
            except OSError:   # why: the process or the fd went away meanwhile
                continue
            if target in wanted:
                found.setdefault(int(name), set()).add(wanted[target])
    return found


def _holder(pid: int, proc: str, own_pid: int, self_is_ours: bool = False) -> Holder:
    # one line whatever the arguments hold (a `python -c` program spans lines: it broke the message in two)
    raw = " ".join(_read(os.path.join(proc, str(pid), "cmdline")).replace("\0", " ").split())
    command = raw if len(raw) <= 80 else raw[:79] + "…"
    ours = self_is_ours if pid == own_pid else own_pid in _ancestors(pid, proc)
    return Holder(pid, command, ours=ours)


def _ancestors(pid: int, proc: str) -> list[int]:
    chain: list[int] = []
    while pid > 1 and len(chain) < 64:
        stat = _read(os.path.join(proc, str(pid), "stat"))
        fields = stat.rsplit(")", 1)[-1].split()   # after the command, which may hold spaces and parentheses
        if len(fields) < 2 or not fields[1].isdigit():
            break
        pid = int(fields[1])
        chain.append(pid)
    return chain


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:   # why: not Linux, or another user's process: unknown, not an error
        return ""


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:   # why: as _read
        return []
