"""Whether the kernel's out-of-memory killer killed a process: the one verdict every path asks
(a launch's rank, a persistent rank during a call or between calls, a rank's DataLoader worker or
other child), from the kernel's own records.

Why one function: a SIGKILL is what an OOM kill shows, and also what any ``kill -9`` shows; only
the kernel can say which. Each path once had its own guess ("possibly out of memory" for every
SIGKILL of a persistent rank, a launch's evidence only for the rank's own pid), so one end could
be called both. The evidence, strongest first:

1. the kernel log (``/dev/kmsg``), where readable (often not, in a container): the OOM killer
   writes "Killed process <pid>" for every process it kills, with what that process held;
2. the process's memory cgroup counts the OOM kills of its members (v1 ``memory.oom_control``,
   v2 ``memory.events``: ``oom_kill``), compared with its count when the watch began;
3. ``/proc/vmstat`` ``oom_kill`` counts every OOM kill on the machine: a rise during the watch,
   with nothing better, only says "probably" (another process may have been the one killed).

``OomBaseline`` is those counts when a watch began (a launch, a call, the time since a persistent
call was sent); ``OomBaseline.verdict`` compares. Nothing here changes any state.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Literal

from ..record.proc_usage import read_text

KERNEL_LOG_RECORDS = 100_000   # at most this many kernel log records read at one death
KERNEL_LOG_RETRIES = 5     # reads of the kernel log, 0.1 s apart, while it lacks a kill the machine counted
KERNEL_LOG_SLACK = 60.0   # seconds the kernel log's clock may differ from time.monotonic()
CGROUP_ROOT = "/sys/fs/cgroup"

Verdict = Literal["yes", "probably", "no"]


# --- what the kernel counts ----------------------------------------------------------------

def counter(text: str | None, name: str) -> int | None:
    """The value of the first ``name value`` line of a kernel counter file whose value is a number.
    Found by searching for the line rather than splitting every line: /proc/vmstat has about 170,
    and a launch reads it for its OOM baseline (splitting them took 0.04 ms a read, the search 0.003; issue 45)."""
    if not text:
        return None
    text = "\n" + text
    key = f"\n{name} "
    at = text.find(key)
    while at >= 0:
        end = text.find("\n", at + 1)
        value = text[at + len(key):end if end >= 0 else len(text)].strip()
        if value.isdigit():
            return int(value)
        at = text.find(key, at + 1)
    return None


def machine_oom_kills() -> int | None:
    """How many processes the OOM killer killed on this machine since it booted."""
    return counter(read_text("/proc/vmstat"), "oom_kill")


def memory_cgroup_of(pid: int, read: Callable[[str], str | None] = read_text) -> str | None:
    """The folder of ``pid``'s memory cgroup (v1's memory controller, else v2's), None where
    there is none to read. Read it while the process lives: a dead one is moved to the root.
    ``read``: how /proc/PID/cgroup is read (``proc_usage.KeptProcFiles.read`` where it is kept)."""
    text = read(f"/proc/{pid}/cgroup")
    if text is None:
        return None
    found = _FOLDERS.get(text)
    if found is None:
        found = _memory_folder(text)
        if found is not None:
            if len(_FOLDERS) >= 64:
                _FOLDERS.clear()
            _FOLDERS[text] = found
    return found


# /proc/PID/cgroup's text -> the memory cgroup's folder, as found: a persistent rank's cgroup is
# read every time the ranks go idle (its memory cgroup may have changed during the call), and the
# same text meant the same folder (a v2 folder's memory.events asked once, not per call: issue 45)
_FOLDERS: dict[str, str] = {}


def _memory_folder(text: str) -> str | None:
    """The memory cgroup folder that /proc/PID/cgroup's ``text`` names (see ``memory_cgroup_of``)."""
    unified = None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return f"{CGROUP_ROOT}/memory{path}".rstrip("/")
        if controllers == "":
            unified = f"{CGROUP_ROOT}{path}".rstrip("/")
    if unified is not None and os.path.exists(f"{unified}/memory.events"):
        return unified
    return None


def cgroup_oom_kills(folder: str) -> int | None:
    """The OOM kills the memory cgroup at ``folder`` counted (v1, else v2)."""
    found = counter(read_text(f"{folder}/memory.oom_control"), "oom_kill")
    return found if found is not None else counter(read_text(f"{folder}/memory.events"), "oom_kill")


def cgroup_limit(folder: str) -> int | None:
    """The memory cgroup's limit in bytes, None where it has none (or it cannot be read)."""
    for name in ("memory.limit_in_bytes", "memory.max"):
        text = (read_text(f"{folder}/{name}") or "").strip()
        if text.isdigit():
            return int(text) if int(text) < 1 << 60 else None   # v1's "no limit" is a huge number
    return None


# --- what the kernel log says ----------------------------------------------------------------

@dataclass(frozen=True)
class KernelKill:
    """The kernel log's record of one OOM kill."""
    pid: int
    held: int | None = None         # anon + file + shmem resident bytes when it was killed
    cgroup: str | None = None       # the memory cgroup that hit its limit (None: the whole machine)


KILLED = re.compile(r"Killed process (\d+) \([^)]*\).*?anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB")
CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+),.*?oom_memcg=([^,]*),.*?,pid=(\d+),")


def kernel_log_kills(since: float) -> dict[int, KernelKill] | None:
    """The OOM kills the kernel log records since ``since`` (time.monotonic()), by pid; None where
    the log cannot be read (not root, a container's restriction, no /dev/kmsg)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    kills: dict[int, KernelKill] = {}
    memcg: dict[int, str] = {}
    try:
        for _ in range(KERNEL_LOG_RECORDS):
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except OSError:   # EPIPE: records overwritten while reading; read on
                continue
            prefix, _, text = record.partition(";")
            fields = prefix.split(",")
            if len(fields) < 3 or not fields[2].isdigit() or int(fields[2]) / 1e6 < since - KERNEL_LOG_SLACK:
                continue
            found = CONSTRAINT.search(text)
            if found and found.group(1) == "CONSTRAINT_MEMCG":
                memcg[int(found.group(3))] = found.group(2)
            killed = KILLED.search(text)
            if killed:
                pid = int(killed.group(1))
                held = sum(int(killed.group(i)) for i in (2, 3, 4)) * 1024
                kills[pid] = KernelKill(pid, held, memcg.get(pid))
    finally:
        os.close(fd)
    return kills


# --- the verdict -----------------------------------------------------------------------------

@dataclass(frozen=True)
class KillVerdict:
    """Whether the OOM killer killed a process: ``verdict`` ("yes", "probably", "no"; None: nothing
    here can tell), ``because`` (the evidence in words), the kernel log's record where it has one."""
    verdict: Verdict | None
    because: str = ""
    kill: KernelKill | None = None


class OomBaseline:
    """The kernel's OOM counts when a watch began: the machine's, and each memory cgroup's the
    first time it is seen (``see_cgroup``, while the process in it lives)."""

    def __init__(self, pids: Iterable[int] = (), during: str = "during the run",
                 read: Callable[[str], str | None] = read_text) -> None:
        self.during = during   # the watch in words: "during the run", "since the call before began"
        self.read = read       # how /proc/PID/cgroup is read (``memory_cgroup_of``)
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.machine_kills = machine_oom_kills()
        self.cgroup_kills: dict[str, int | None] = {}   # each cgroup's count when first seen
        self.cgroups: dict[int, str] = {}               # pid -> its memory cgroup, as last seen
        for pid in pids:
            self.see_process(pid)

    def see_process(self, pid: int) -> str | None:
        """Note ``pid``'s memory cgroup (and its count); returns the cgroup."""
        folder = memory_cgroup_of(pid, self.read)
        if folder is not None:
            self.cgroups[pid] = folder
            self.see_cgroup(folder)
        return folder

    def see_cgroup(self, folder: str | None) -> None:
        """Keep a cgroup's OOM count the first time it is seen; one made during the watch counted
        nothing before it (its folder's time is when it was made)."""
        if folder is None or folder in self.cgroup_kills:
            return
        try:
            made_during_watch = os.stat(folder).st_ctime >= self.started_wall
        except OSError:
            return
        self.cgroup_kills[folder] = 0 if made_during_watch else cgroup_oom_kills(folder)

    def machine_counted_kills(self) -> bool:
        """Whether the machine's count of OOM kills rose since the watch began."""
        machine = machine_oom_kills()
        return machine is not None and self.machine_kills is not None and machine > self.machine_kills

    def verdict(self, pid: int, cgroup: str | None = None) -> KillVerdict:
        """Whether the OOM killer killed ``pid`` since the watch began; ``cgroup``: its memory
        cgroup as last seen alive (default: as ``see_process`` saw it)."""
        kills = kernel_log_kills(self.started)
        # The OOM killer sends SIGKILL before it writes its record: where the machine counted a kill,
        # give the record a moment (a death seen first is rare, and only when another task killed it)
        for _ in range(KERNEL_LOG_RETRIES):
            if kills is None or pid in kills or not self.machine_counted_kills():
                break
            time.sleep(0.1)
            kills = kernel_log_kills(self.started)
        if kills is not None:
            if pid in kills:
                return KillVerdict("yes", f"the kernel log records the kill of its process (pid {pid})", kills[pid])
            return KillVerdict("no", f"the kernel log records no OOM kill of its process (pid {pid})")
        folder = cgroup if cgroup is not None else self.cgroups.get(pid)
        before = None if folder is None else self.cgroup_kills.get(folder)
        now_kills = None if folder is None or before is None else cgroup_oom_kills(folder)
        if now_kills is not None and before is not None and now_kills > before:
            return KillVerdict("yes", f"its memory cgroup ({folder}) counted {now_kills - before} OOM kill(s) "
                               f"{self.during}")
        machine = machine_oom_kills()
        if machine is None or self.machine_kills is None:
            return KillVerdict(None, "the kernel's OOM records cannot be read here")
        if machine > self.machine_kills:
            return KillVerdict("probably", f"the machine's count of OOM kills (/proc/vmstat) rose by "
                               f"{machine - self.machine_kills} {self.during}; another process may have been the "
                               "one killed")
        return KillVerdict("no", f"the kernel counted no OOM kill on the machine {self.during}")


def sigkill_words(verdict: KillVerdict) -> str:
    """How a process's SIGKILL is said, from the verdict: the one wording of every path, so that a
    headline and a closing line about the same end agree."""
    if verdict.verdict == "yes":
        return "killed by the kernel's out-of-memory killer (SIGKILL)"
    if verdict.verdict == "probably":
        return "probably killed by the kernel's out-of-memory killer (SIGKILL)"
    if verdict.verdict == "no":
        return f"killed by SIGKILL (not by the kernel's out-of-memory killer: {verdict.because})"
    return f"killed by SIGKILL (whether by the kernel's out-of-memory killer is not known: {verdict.because})"
