"""What one process uses, read from /proc: its resident memory, its own memory (USS/PSS), its
CPU time, and the machine's memory.

Why a module of its own, below both sides: the notebook reads its local ranks through
``/proc/<pid>`` (``supervise.resources``), and a rank on another machine reads its own through
``/proc/<its pid>`` (``rank.reports.resources``), with the same readers. Standard library only.
"""
from __future__ import annotations

import io
import os
from typing import Mapping

from .resources import MachineMemory

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_text(path: str) -> str | None:
    """The whole file as text (UTF-8), None where it cannot be read. An unbuffered ``io.FileIO``,
    not ``open()``'s text file: /proc's and cgroupfs' small files are read several times per call
    on persistent ranks, and the text layers (buffer, decoder) cost three times the read (issue 45).
    Its fd is closed inside FileIO, never through ``os.close``, like open()'s."""
    try:
        with io.FileIO(path) as file:
            return file.readall().decode()
    except (OSError, ValueError):
        return None


class KeptProcFiles:
    """/proc files read again and again, each opened once and read with ``pread`` from its start:
    a seq_file such as /proc/PID/cgroup is made afresh by every read from offset 0. One read is
    then one syscall instead of three and a file object (9 -> 3 us here): persistent ranks' cgroups
    are read every time they go idle (issue 45). A kept /proc/PID file stays its process's: once
    the process is gone it reads as an error (None), never another process that took the pid.
    Its owner closes the files (``close``; ``keep_only`` the paths still wanted)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def read(self, path: str) -> str | None:
        """The file's text now, None where it cannot be read (as ``read_text``)."""
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            return os.pread(fd, 65536, 0).decode()
        except (OSError, ValueError):
            self._close(path)
            return None

    def keep_only(self, paths: set[str]) -> None:
        """Close every kept file but ``paths``' (the processes that ended, say)."""
        for path in [path for path in self._fds if path not in paths]:
            self._close(path)

    def close(self) -> None:
        self.keep_only(set())

    def _close(self, path: str) -> None:
        os.close(self._fds.pop(path))


def resident(pid: int) -> int | None:
    """``pid``'s resident memory in bytes (statm: pages shared with the notebook count too); None
    once it ended (a process that exited and is not yet reaped shows 0)."""
    parts = (read_text(f"/proc/{pid}/statm") or "").split()
    return int(parts[1]) * PAGE if len(parts) > 1 and parts[1].isdigit() and int(parts[1]) > 0 else None


def own_memory(pid: int) -> tuple[int, int] | None:
    """(USS, PSS) of ``pid`` in bytes, from ``smaps_rollup`` (Linux 4.14+): its private pages, and
    its proportional share of the pages it shares. None where it cannot be read."""
    fields: dict[str, int] = {}
    for line in (read_text(f"/proc/{pid}/smaps_rollup") or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("Pss", "Private_Clean", "Private_Dirty"):
            parts = value.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * 1024
    if "Pss" not in fields or "Private_Clean" not in fields or "Private_Dirty" not in fields:
        return None
    return fields["Private_Clean"] + fields["Private_Dirty"], fields["Pss"]


def cpu_times(pid: int) -> tuple[float, float] | None:
    """(CPU seconds ``pid`` used, user and system; seconds since it started), from /proc: its own
    threads only, not its children's (a DataLoader worker is a process of its own)."""
    stat, uptime = read_text(f"/proc/{pid}/stat"), read_text("/proc/uptime")
    if not stat or not uptime:
        return None
    fields = stat.rpartition(")")[2].split()   # the name in parentheses may hold spaces
    try:
        used = (int(fields[11]) + int(fields[12])) / TICKS   # utime, stime (fields 14, 15 of stat)
        age = float(uptime.split()[0]) - int(fields[19]) / TICKS   # starttime (field 22)
    except (IndexError, ValueError):
        return None
    return used, age


def machine_memory(helpers: Mapping[str, int] | None = None) -> MachineMemory | None:
    """/proc/meminfo's MemTotal and MemAvailable, and the resident memory of ``helpers`` (name -> pid)."""
    found = {}
    for line in (read_text("/proc/meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
            found[key] = int(parts[0]) * 1024
    if "MemTotal" not in found:
        return None
    held = tuple((name, size) for name, pid in (helpers or {}).items() if (size := resident(pid)) is not None)
    return MachineMemory(found["MemTotal"], found.get("MemAvailable"), held)


