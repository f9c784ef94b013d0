"""Out-of-memory ends named: a rank the kernel's OOM killer SIGKILLed, and a rank whose
allocation failed (MemoryError, torch's CPU allocator, ``torch.cuda.OutOfMemoryError``).

Why a module of its own: "killed by SIGKILL" is what a rank that ran the machine (or its memory
cgroup) out of memory shows, and also what any ``kill -9`` shows. Which one it was decides what
the user should do, and only the kernel can say. Its evidence, strongest first:

1. the kernel log (``/dev/kmsg``), where readable (often not, in a container): the OOM killer
   writes "Killed process <pid>" for every process it kills, with what that process held;
2. the rank's memory cgroup counts the OOM kills of its members (v1 ``memory.oom_control``,
   v2 ``memory.events``: ``oom_kill``), compared with its count when the run began;
3. ``/proc/vmstat`` ``oom_kill`` counts every OOM kill on the machine: a rise during the run,
   with nothing better, only says "probably" (another process may have been the one killed).

A dead process's memory cannot be read any more, so each rank's resident memory (and its
cgroup) is sampled when the supervisor wakes anyway, in the rounds of ``resources.ResourceSampler``
(the one sampler: the panel's resources come from the same reads): no thread, nothing per
training step; the last value of each rank is what the message quotes.

Nothing here changes the run state: the supervisor asks (``MemoryWatch.name_kill``,
``MemoryWatch.name_allocation_failure``) and records the answer.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..protocol import Failure
from ..resources import size_text
from ..proc_usage import machine_memory, read_text, resident
from .resources import ResourceSampler

if TYPE_CHECKING:
    from .outcome import RankEnd

LOW_HEADROOM = 0.10       # below this share of the memory left, the notebook is warned (once a run)
KERNEL_LOG_RECORDS = 100_000   # at most this many kernel log records read at one death
KERNEL_LOG_RETRIES = 5     # reads of the kernel log, 0.1 s apart, while it lacks a kill the machine counted
KERNEL_LOG_SLACK = 60.0   # seconds the kernel log's clock may differ from time.monotonic()
CGROUP_ROOT = "/sys/fs/cgroup"
ADVICE = ("What to do: start fewer ranks (num_processes); load the model in the notebook before the launch, "
          "so that forked ranks share its memory instead of each loading a copy; use a smaller batch.")
log = logging.getLogger("notebook_launch")


# --- what the kernel says ----------------------------------------------------------------

def machine_oom_kills() -> int | None:
    """How many processes the OOM killer killed on this machine since it booted."""
    return counter(read_text("/proc/vmstat"), "oom_kill")


def counter(text: str | None, name: str) -> int | None:
    """The value of the ``name value`` line of a kernel counter file."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return None


def memory_cgroup_of(pid: int) -> str | None:
    """The folder of ``pid``'s memory cgroup (v1's memory controller, else v2's), None where
    there is none to read. Read it while the process lives: a dead one is moved to the root."""
    text = read_text(f"/proc/{pid}/cgroup")
    if text is None:
        return None
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


def meminfo() -> dict[str, int]:
    """/proc/meminfo's MemTotal and MemAvailable, in bytes (``resources.machine_memory``)."""
    machine = machine_memory()
    if machine is None:
        return {}
    return {"MemTotal": machine.total} | ({} if machine.available is None else {"MemAvailable": machine.available})


def address_space_limit(pid: int) -> int | None:
    """``pid``'s RLIMIT_AS in bytes, None where it has none."""
    for line in (read_text(f"/proc/{pid}/limits") or "").splitlines():
        if line.startswith("Max address space"):
            soft = line[len("Max address space"):].split()[0]
            return int(soft) if soft.isdigit() else None
    return None


def cgroup_headroom(folder: str) -> tuple[int, int] | None:
    """(what is left, the limit) of a memory cgroup with a limit; what it uses counts no inactive
    file pages (the kernel reclaims those before it kills anyone)."""
    limit = cgroup_limit(folder)
    if limit is None:
        return None
    used = None
    for name in ("memory.usage_in_bytes", "memory.current"):
        text = (read_text(f"{folder}/{name}") or "").strip()
        if text.isdigit():
            used = int(text)
            break
    if used is None:
        return None
    stat = read_text(f"{folder}/memory.stat")
    inactive = counter(stat, "total_inactive_file")
    inactive = counter(stat, "inactive_file") if inactive is None else inactive
    return max(0, limit - max(0, used - (inactive or 0))), limit


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


# --- the words -----------------------------------------------------------------------------

def machine_text() -> str:
    info = meminfo()
    if "MemTotal" not in info:
        return ""
    available = f", {size_text(info['MemAvailable'])} available now" if "MemAvailable" in info else ""
    return f"the machine: {size_text(info['MemTotal'])} in all{available}"


@dataclass
class Sample:
    """A rank's memory when last sampled."""
    held: int | None
    at: float
    cgroup: str | None


class MemoryWatch:
    """What the kernel's OOM counters were when the run began, and each rank's memory as last
    sampled; from them, whether a rank's SIGKILL was the OOM killer's and what held the memory."""

    def __init__(self, rank_names: Iterable[tuple[int, int]] = ()) -> None:
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.machine_kills = machine_oom_kills()
        self.cgroup_kills: dict[str, int | None] = {}   # each cgroup's count when first seen
        self.samples: dict[int, Sample] = {}            # local rank -> its last sample
        self.names = dict(rank_names)                    # local rank -> global rank
        self.resources = ResourceSampler()              # the reads, and what the panel shows of them
        self.notebook_cgroup = memory_cgroup_of(os.getpid())
        self.warned = False
        self.see_cgroup(self.notebook_cgroup)

    def see_cgroup(self, folder: str | None) -> None:
        """Keep a cgroup's OOM count the first time it is seen; one made during the run counted
        nothing before it (its folder's time is when it was made)."""
        if folder is None or folder in self.cgroup_kills:
            return
        try:
            made_during_run = os.stat(folder).st_ctime >= self.started_wall
        except OSError:
            return
        self.cgroup_kills[folder] = 0 if made_during_run else cgroup_oom_kills(folder)

    def sample(self, pids: dict[int, int], now: float | None = None,
               devices: dict[int, str] | None = None) -> str | None:
        """Sample each live rank (local rank -> pid; ``devices``: local rank -> its device, for
        NVML) when a round of ``self.resources`` is due. Returns the warning to show, once a run,
        when memory runs low (``notebook_at_risk``)."""
        now = time.monotonic() if now is None else now
        if not self.resources.sample(pids, devices or {}, now):
            return None
        for local, pid in pids.items():
            usage = self.resources.usage.get(local)
            fresh = local in self.resources.updated and usage is not None
            self.sample_one(local, pid, now, held=usage.rss if fresh and usage is not None else None)
        try:
            return self.notebook_at_risk(pids)
        except Exception:   # why: a warning is an extra: the run goes on without it
            log.debug("could not weigh the memory left", exc_info=True)
            return None

    def notebook_at_risk(self, pids: dict[int, int]) -> str | None:
        """Once a run, when what is left of the machine's memory (or of the notebook's memory
        cgroup's limit) falls below LOW_HEADROOM: what the ranks and the notebook hold, whom the
        OOM killer would likely pick (the biggest), and what to do. Said before anything dies,
        because when the pick is the notebook's own process its whole state goes with it."""
        if self.warned:
            return None
        info = meminfo()
        left, total, where = info.get("MemAvailable"), info.get("MemTotal"), "the machine"
        limited = None if self.notebook_cgroup is None else cgroup_headroom(self.notebook_cgroup)
        if limited is not None and (left is None or limited[0] < left):
            (left, total), where = limited, "the notebook's memory cgroup"
        if left is None or total is None or left >= LOW_HEADROOM * total:
            return None
        self.warned = True
        notebook = resident(os.getpid()) or 0
        held = {local: self.samples[local].held or 0 for local in pids if local in self.samples}
        ranks = ", ".join(f"rank {self.names.get(local, local)} {size_text(size)}"
                          for local, size in sorted(held.items()))
        biggest = max(held, key=lambda local: held[local], default=None)
        if biggest is None or notebook >= held[biggest]:
            who = ("the notebook's own process holds the most, so the kernel's out-of-memory killer would "
                   "likely pick it: the kernel dies with everything it holds, and the ranks with it")
        else:
            who = (f"the kernel's out-of-memory killer would likely pick rank {self.names.get(biggest, biggest)} "
                   f"(it holds the most), and the notebook's process next")
        return (f"notebook_launch: memory is running out: {size_text(left)} of {size_text(total)} left on {where}; "
                f"the ranks hold {ranks or 'nothing sampled yet'} and the notebook {size_text(notebook)} (resident; "
                f"forked ranks count the pages they share with the notebook). If it runs out, {who}. "
                + ADVICE + " Save what you cannot lose now.")

    def sample_one(self, local: int, pid: int, now: float, held: int | None = None) -> None:
        """Keep what the rank holds (``held``: read by this round already; None: read it now) and
        its memory cgroup."""
        if held is None:
            held = resident(pid)
        if held is None:   # ended already: keep what it held before
            return
        folder = memory_cgroup_of(pid)
        self.see_cgroup(folder)
        self.samples[local] = Sample(held, now, folder)

    # --- a SIGKILL --------------------------------------------------------------------------
    def name_kill(self, end: "RankEnd", local: int, pid: int, live: dict[int, int]) -> "RankEnd":
        """``end`` (a rank killed by SIGKILL that we did not stop) said as what it was: the OOM
        killer's (the held memory and what to do with it), or not (where the kernel says so)."""
        if end.failure is None or not end.description.startswith(f"killed by {signal.SIGKILL.name}"):
            return end
        try:
            return self._name_kill(end, local, pid, live)
        except Exception:   # why: evidence is an extra: the plain description stands without it
            log.debug("could not tell whether an OOM kill ended rank %d", local, exc_info=True)
            return end

    def _name_kill(self, end: "RankEnd", local: int, pid: int, live: dict[int, int]) -> "RankEnd":
        now = time.monotonic()
        for other, other_pid in live.items():   # what the ranks still alive hold now
            self.sample_one(other, other_pid, now)
        verdict, because, kill = self.oom_evidence(local, pid)
        rank = self.names.get(local, local)
        if verdict == "no":
            description = f"killed by SIGKILL, not from the kernel's out-of-memory killer ({because})"
            assert end.failure is not None
            return dataclasses.replace(end, description=description, error=description,
                                       failure=dataclasses.replace(end.failure, headline=description))
        if verdict is None:
            return end
        probably = "probably " if verdict == "probably" else ""
        description = f"{probably}killed by the kernel's out-of-memory killer (SIGKILL)"
        limit = ""
        if kill is not None and kill.cgroup:
            allowed = cgroup_limit(f"{CGROUP_ROOT}/memory{kill.cgroup}")
            limit = (f"; the limit was its memory cgroup's {kill.cgroup}"
                     + (f" ({size_text(allowed)})" if allowed is not None else "") + ", not the machine's")
        memory = (f"rank {rank} was {probably}killed by the kernel's out-of-memory killer: {because}{limit}.\n"
                  + self.held_text(local, now, kill) + "\n" + ADVICE)
        assert end.failure is not None
        return dataclasses.replace(end, description=description, error=description,
                                   failure=dataclasses.replace(end.failure, headline=description, memory=memory))

    def oom_evidence(self, local: int, pid: int) -> tuple[str | None, str, KernelKill | None]:
        """("yes" | "probably" | "no" | None (nothing to go by), why, the kernel log's record)."""
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
                return "yes", f"the kernel log records the kill of its process (pid {pid})", kills[pid]
            return "no", "the kernel log records no OOM kill of its process", None
        sample = self.samples.get(local)
        folder = None if sample is None else sample.cgroup
        if folder is not None and self.cgroup_kills.get(folder) is not None:
            now_kills = cgroup_oom_kills(folder)
            before = self.cgroup_kills[folder]
            assert before is not None
            if now_kills is not None and now_kills > before:
                return ("yes", f"its memory cgroup ({folder}) counted {now_kills - before} OOM kill(s) "
                        "during the run", None)
        machine = machine_oom_kills()
        if machine is None or self.machine_kills is None:
            return None, "", None
        if machine > self.machine_kills:
            return ("probably", f"the machine's count of OOM kills (/proc/vmstat) rose by "
                    f"{machine - self.machine_kills} during the run; another process may have been the one killed",
                    None)
        return "no", "the kernel counted no OOM kill on the machine during the run", None

    def machine_counted_kills(self) -> bool:
        """Whether the machine's count of OOM kills rose since the run began."""
        machine = machine_oom_kills()
        return machine is not None and self.machine_kills is not None and machine > self.machine_kills

    def held_text(self, dead: int, now: float, kill: KernelKill | None) -> str:
        """What held the memory: each rank (the dead one as last seen), the notebook, the machine."""
        lines = ["What held memory (resident; forked ranks count the pages they share with the notebook):"]
        for local in sorted(set(self.names) | set(self.samples)):
            sample = self.samples.get(local)
            name = f"rank {self.names.get(local, local)}"
            if local == dead and kill is not None and kill.held is not None:
                lines.append(f"  {name}: {size_text(kill.held)} when it was killed (the kernel log)")
            elif sample is None:
                lines.append(f"  {name}: not sampled")
            elif local == dead:
                lines.append(f"  {name}: {size_text(sample.held)} when last sampled, "
                             f"{max(0.0, now - sample.at):.1f} s before its death was seen")
            else:
                lines.append(f"  {name}: {size_text(sample.held)}")
        lines.append(f"  the notebook: {size_text(resident(os.getpid()))}")
        machine = machine_text()
        if machine:
            lines.append(f"  {machine}")
        return "\n".join(lines)

    # --- an allocation that failed --------------------------------------------------------
    def name_allocation_failure(self, failure: Failure, local: int, pid: int | None,
                                held_when_raised: int | None = None) -> Failure:
        """``failure`` (an ERROR a rank sent) with what ran out said, when it is an allocation
        failure: the rank, the size asked, what the rank (or its GPU) held (``held_when_raised``:
        what the rank said it held as it raised), what to do."""
        try:
            memory = allocation_text(failure.exc_type or "", failure.exc_message or "",
                                     self.names.get(local, local), self.rank_holding(local, pid, held_when_raised))
        except Exception:   # why: an extra: the exception itself is reported whatever happens here
            log.debug("could not describe an allocation failure", exc_info=True)
            return failure
        return failure if memory is None else dataclasses.replace(failure, memory=memory)

    def rank_holding(self, local: int, pid: int | None, held_when_raised: int | None = None) -> str:
        """What the rank holds now (it may have ended: then what it said it held as it raised, or
        when last sampled), and its RLIMIT_AS."""
        held = None if pid is None else resident(pid)
        words = f"it held {size_text(held)} resident"
        if held is None and held_when_raised is not None:
            words = f"it held {size_text(held_when_raised)} resident when it raised"
        elif held is None:
            sample = self.samples.get(local)
            words = "" if sample is None else f"it held {size_text(sample.held)} resident when last sampled"
        limit = None if pid is None else address_space_limit(pid)
        if limit is not None:
            words += f"{'; ' if words else ''}its address space is limited to {size_text(limit)} (RLIMIT_AS)"
        return words


# --- allocation failures, from the exception's text ------------------------------------------

CUDA_ASKED = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)")
CUDA_NEW = re.compile(r"GPU (\d+) has a total capacity of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ [KMGT]?i?B) is free")
CUDA_PROCESS = re.compile(r"this process has ([\d.]+ [KMGT]?i?B) memory in use")
CUDA_TORCH = re.compile(r"([\d.]+ [KMGT]?i?B) is allocated by PyTorch, and ([\d.]+ [KMGT]?i?B) is reserved by "
                        r"PyTorch but unallocated")
CUDA_OLD = re.compile(r"\(GPU (\d+); ([\d.]+ [KMGT]?i?B) total capacity; ([\d.]+ [KMGT]?i?B) already allocated; "
                      r"([\d.]+ [KMGT]?i?B) free; ([\d.]+ [KMGT]?i?B) reserved in total by PyTorch")
CPU_ASKED = re.compile(r"you tried to allocate (\d+) bytes")
NUMPY_ASKED = re.compile(r"Unable to allocate ([\d.]+ [KMGTPE]?i?B) for an array with shape (\S+)")
MEMORY_ERROR_TYPES = ("MemoryError", "_ArrayMemoryError", "OutOfMemoryError")
CUDA_ADVICE = ("What to do: a smaller batch; free what the rank no longer needs (del, then torch.cuda.empty_cache()); "
               "one rank per GPU; where much is reserved but unallocated, set "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the launch.")


def allocation_text(exc_type: str, message: str, rank: int, holding: str) -> str | None:
    """The paragraph that says what ran out, None when the exception is not an allocation failure."""
    held = f"; {holding}" if holding else ""
    if "CUDA out of memory" in message:
        tried = CUDA_ASKED.search(message)
        device = ""
        new, old = CUDA_NEW.search(message), CUDA_OLD.search(message)
        if new:
            device = f"; GPU {new.group(1)} has {new.group(2)} in all, {new.group(3)} free"
            process, torch_held = CUDA_PROCESS.search(message), CUDA_TORCH.search(message)
            if process:
                device += f"; this rank's process held {process.group(1)} of it"
            if torch_held:
                device += (f" ({torch_held.group(1)} allocated by PyTorch, {torch_held.group(2)} reserved by "
                           f"PyTorch but unallocated)")
        elif old:
            device = (f"; GPU {old.group(1)} has {old.group(2)} in all, {old.group(4)} free; PyTorch had "
                      f"{old.group(3)} allocated, {old.group(5)} reserved")
        what = f"it asked for {tried.group(1)}" if tried else "the size asked is not in the message"
        return f"rank {rank} ran out of GPU memory: {what}{device}.\n{CUDA_ADVICE}"
    cpu, array = CPU_ASKED.search(message), NUMPY_ASKED.search(message)
    if cpu:
        asked = f"it asked for {size_text(int(cpu.group(1)))} ({int(cpu.group(1)):,} bytes)"
    elif array:
        asked = f"it asked for {array.group(1)} (an array of shape {array.group(2)})"
    elif exc_type.rsplit(".", 1)[-1] in MEMORY_ERROR_TYPES:
        asked = "the size asked is not in the message (Python's MemoryError does not say it)"
    else:
        return None
    machine = machine_text()
    return (f"rank {rank} ran out of memory: {asked}{held}" + (f"; {machine}" if machine else "") + ".\n"
            + ADVICE)
