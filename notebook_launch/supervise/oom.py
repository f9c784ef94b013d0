"""Out-of-memory ends named: a rank the kernel's OOM killer SIGKILLed, a rank's child (a DataLoader
worker) it killed, and a rank whose allocation failed (``allocation_failure``).

Why a module of its own: "killed by SIGKILL" is what a process that ran the machine (or its memory
cgroup) out of memory shows, and also what any ``kill -9`` shows. Which one it was decides what
the user should do, and only the kernel can say: ``kernel_oom.OomBaseline.verdict`` asks it, the
one verdict of every path (a rank's own death, a child named in a rank's error, a persistent rank
between calls).

A dead process's memory cannot be read any more, so each rank's resident memory (and its
cgroup) is sampled when the supervisor wakes anyway, in the rounds of ``resources.ResourceSampler``
(the one sampler: the panel's resources come from the same reads): no thread, nothing per
training step; the last value of each rank is what the message quotes.

Nothing here changes the run state: the supervisor asks (``MemoryWatch.name_kill``,
``MemoryWatch.name_failure``) and records the answer.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from ..wire.protocol import Failure
from ..record.resources import size_text
from ..diagnose.proc_tasks import descendants
from ..record.proc_usage import machine_memory, read_text, resident
from . import kernel_oom
from .allocation_failure import ADVICE, allocation_text, machine_text
from .kernel_oom import CGROUP_ROOT, KERNEL_LOG_RETRIES, KernelKill, KillVerdict, OomBaseline, cgroup_limit, \
    cgroup_oom_kills, counter, memory_cgroup_of, sigkill_words
from .births import Births
from .resources import SAMPLE_EVERY, ResourceSampler

if TYPE_CHECKING:
    from .outcome import RankEnd

MAX_REMEMBERED_DESCENDANTS = 1024   # processes remembered below each rank (a run may start many)
LOW_HEADROOM = 0.10       # below this share of the memory left, the notebook is warned (once a run)
MAX_NAMED_CHILDREN = 8    # pids named in a rank's error that are looked up in the kernel's records
# the pids a rank's error names: torch's "DataLoader worker (pid 1234) is killed by signal: Killed."
# and "DataLoader worker (pid(s) 1234, 1235) exited unexpectedly"; "pid 1234" in others' words
NAMED_PIDS = re.compile(r"\bpid(?:\(s\))?[ =](\d+(?:, ?\d+)*)")
CHILD_ADVICE = ("What to do: fewer DataLoader workers (num_workers) or a smaller prefetch_factor; a smaller "
                "batch; start fewer ranks (each rank's workers hold memory of their own).")
log = logging.getLogger("notebook_launch")


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


def named_pids(text: str) -> list[int]:
    """The pids ``text`` (a rank's error) names, in order, each once."""
    found: list[int] = []
    for match in NAMED_PIDS.finditer(text):
        for part in match.group(1).split(","):
            pid = int(part)
            if pid not in found:
                found.append(pid)
    return found


def limit_text(kill: KernelKill | None) -> str:
    """'; the limit was its memory cgroup's /x (64.0 MiB), not the machine's' where the kernel log
    says a cgroup's limit was hit."""
    if kill is None or not kill.cgroup:
        return ""
    allowed = cgroup_limit(f"{CGROUP_ROOT}/memory{kill.cgroup}")
    if allowed is None:
        allowed = cgroup_limit(f"{CGROUP_ROOT}{kill.cgroup}")
    return (f"; the limit was its memory cgroup's {kill.cgroup}"
            + (f" ({size_text(allowed)})" if allowed is not None else "") + ", not the machine's")


@dataclass
class Sample:
    """A rank's memory when last sampled."""
    held: int | None
    at: float
    cgroup: str | None


class MemoryWatch:
    """What the kernel's OOM counters were when the run began, and each rank's memory as last
    sampled; from them, whether a rank's SIGKILL was the OOM killer's and what held the memory."""

    def __init__(self, rank_names: Iterable[tuple[int, int]] = (), born_after: tuple[int, int] | None = None) -> None:
        self.births = Births(born_after)   # born_after: leftovers.birth_mark before the ranks started
        self.baseline = OomBaseline()                   # the kernel's OOM counts when the run began
        self.samples: dict[int, Sample] = {}            # local rank -> its last sample
        self.names = dict(rank_names)                    # local rank -> global rank
        self.resources = ResourceSampler()              # the reads, and what the panel shows of them
        self.descendants: dict[int, dict[int, str]] = {}   # local rank -> {pid: command} of each process seen below it
        self.notebook_cgroup = memory_cgroup_of(os.getpid())
        self.warned = False
        self.baseline.see_cgroup(self.notebook_cgroup)

    def begin_call(self, now: float | None = None) -> None:
        """A call on persistent ranks begins with this watch (kept across the pool's calls): the
        OOM counts are read again when the last read is SAMPLE_EVERY old or more (a death during
        the call is then weighed against counts at most that old: the kernel log, read first,
        names the killed pid either way), and the low-memory warning may come once more."""
        now = time.monotonic() if now is None else now
        if now - self.baseline.started >= SAMPLE_EVERY:
            old = self.baseline
            self.baseline = OomBaseline(during=old.during)
            self.baseline.cgroups = dict(old.cgroups)
            for folder in old.cgroup_kills:
                self.baseline.see_cgroup(folder)
        self.warned = False

    def sample(self, pids: dict[int, int], now: float | None = None,
               devices: dict[int, str] | None = None) -> str | None:
        """Sample each live rank (local rank -> pid; ``devices``: local rank -> its device, for
        NVML) when a round of ``self.resources`` is due. Returns the warning to show, once a run,
        when memory runs low (``notebook_at_risk``)."""
        now = time.monotonic() if now is None else now
        if not self.resources.sample(pids, devices or {}, now):
            return None
        walk = _trees_may_have_grown(self.births, pids, self.descendants)
        for local, pid in pids.items():
            usage = self.resources.usage.get(local)
            fresh = local in self.resources.updated and usage is not None
            self.sample_one(local, pid, now, held=usage.rss if fresh and usage is not None else None)
            if walk:
                self.see_descendants(local, pid)
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
        self.samples[local] = Sample(held, now, self.baseline.see_process(pid))

    def see_descendants(self, local: int, pid: int) -> None:
        """Note the processes below a rank (``subprocess.run``'s child, a DataLoader worker) and
        their memory cgroups, while they live: an error that names no pid (``CalledProcessError``
        of a child the OOM killer took) is then still linked to its rank (``unnamed_children_killed``)."""
        seen = self.descendants.setdefault(local, {})
        for child in descendants(pid):
            command = (read_text(f"/proc/{child}/comm") or "?").strip()
            if child not in seen and len(seen) >= MAX_REMEMBERED_DESCENDANTS:
                del seen[next(iter(seen))]   # the oldest: likely long gone
            seen[child] = command
            self.baseline.see_process(child)   # its cgroup as last seen alive (it may have moved to another)

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
        sample = self.samples.get(local)
        verdict = self.baseline.verdict(pid, None if sample is None else sample.cgroup)
        description = sigkill_words(verdict)
        memory = ""
        if verdict.verdict in ("yes", "probably"):
            probably = "probably " if verdict.verdict == "probably" else ""
            memory = (f"rank {self.names.get(local, local)} was {probably}killed by the kernel's out-of-memory "
                      f"killer: {verdict.because}{limit_text(verdict.kill)}.\n"
                      + self.held_text(local, now, verdict.kill) + "\n" + ADVICE)
        assert end.failure is not None
        return dataclasses.replace(end, description=description, error=description,
                                   failure=dataclasses.replace(end.failure, headline=description, memory=memory))

    def held_text(self, dead: int | None, now: float, kill: KernelKill | None) -> str:
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

    # --- a rank's error: an allocation that failed, a child the OOM killer took --------------
    def name_failure(self, failure: Failure, local: int, pid: int | None, payload: Mapping[str, object]) -> Failure:
        """``failure`` (an ERROR a rank sent, ``payload``) with what ran out said: an allocation
        failure (its type said so in the rank: the size asked, what the rank or its GPU held), or a
        child of the rank the error names (a DataLoader worker) that the OOM killer killed (``pid``:
        the rank's, None for a rank of another machine: its children cannot be looked up here)."""
        try:
            held, out_of_memory = payload.get("resident"), payload.get("out_of_memory")
            memory = allocation_text(out_of_memory if isinstance(out_of_memory, str) else None,
                                     failure.exc_message or "", self.names.get(local, local),
                                     self.rank_holding(local, pid, held if isinstance(held, int) else None))
            if memory is None and pid is not None:
                memory = self.children_killed(local, pid, f"{failure.exc_message or ''}\n{failure.traceback}")
        except Exception:   # why: an extra: the exception itself is reported whatever happens here
            log.debug("could not say what ran out of memory", exc_info=True)
            return failure
        return failure if memory is None else dataclasses.replace(failure, memory=memory)

    def children_killed(self, local: int, pid: int | None, text: str) -> str | None:
        """What the kernel says of the rank's children the OOM killer killed: those its error names
        (torch: "DataLoader worker (pid 1234) is killed by signal: Killed."), else those seen below
        it (``see_descendants``: ``subprocess.run``'s ``CalledProcessError`` names none). The
        paragraph for them, None where it killed none (a hand ``kill -9``, a crash: the error says
        enough)."""
        named = [child for child in named_pids(text) if child != pid][:MAX_NAMED_CHILDREN]
        sample = self.samples.get(local)
        killed: list[tuple[int, KillVerdict, str]] = []
        for child in named:
            verdict = self.baseline.verdict(child, None if sample is None else sample.cgroup)
            if verdict.verdict in ("yes", "probably"):
                killed.append((child, verdict, "named in its error: a DataLoader worker or another process it started"))
        if not killed:
            killed = self.unnamed_children_killed(local, named)
        if not killed:
            return None
        rank = self.names.get(local, local)
        lines = []
        for child, verdict, which in killed:
            probably = "probably " if verdict.verdict == "probably" else ""
            held = "" if verdict.kill is None or verdict.kill.held is None else \
                f" It held {size_text(verdict.kill.held)} when it was killed (the kernel log)."
            lines.append(f"rank {rank}'s process {child} ({which}) was {probably}killed by the kernel's "
                         f"out-of-memory killer: {verdict.because}{limit_text(verdict.kill)}.{held}")
        now = time.monotonic()
        return "\n".join(lines) + "\n" + self.held_text(None, now, None) + "\n" + CHILD_ADVICE

    def unnamed_children_killed(self, local: int, named: list[int]) -> list[tuple[int, KillVerdict, str]]:
        """The processes seen below the rank, ended now, that the OOM killer killed for certain: the
        kernel log names the pid, or (where it cannot be read) the memory cgroup the process was in,
        one of its own (not a rank's or the notebook's: theirs count their kills too), counted an OOM
        kill during the run. The machine's count alone is no evidence here: it would name every
        child that ended, killed or not."""
        gone = {child: command for child, command in self.descendants.get(local, {}).items()
                if child not in named and resident(child) is None}
        if not gone:
            return []
        kills = kernel_oom.kernel_log_kills(self.baseline.started)
        for _ in range(KERNEL_LOG_RETRIES):   # the OOM killer writes its record just after its SIGKILL
            if kills is None or gone.keys() & kills.keys() or not self.baseline.machine_counted_kills():
                break
            time.sleep(0.1)
            kills = kernel_oom.kernel_log_kills(self.baseline.started)
        found: list[tuple[int, KillVerdict, str]] = []
        # A count is per cgroup, not per process: one the ranks or the notebook share counts their kills too
        shared = {sample.cgroup for sample in self.samples.values()} | {self.notebook_cgroup}
        for child, command in reversed(gone.items()):   # the newest first
            which = f"{command}, a process the rank started; its error names no pid"
            if kills is not None:
                if child in kills:
                    found.append((child, KillVerdict("yes", f"the kernel log records the kill of its process "
                                                            f"(pid {child})", kills[child]), which))
            else:
                folder = self.baseline.cgroups.get(child)
                folder = None if folder in shared else folder
                before = None if folder is None else self.baseline.cgroup_kills.get(folder)
                now_kills = None if folder is None else cgroup_oom_kills(folder)
                if before is not None and now_kills is not None and now_kills > before:
                    found.append((child, KillVerdict("yes", f"its memory cgroup ({folder}) counted "
                                                            f"{now_kills - before} OOM kill(s) {self.baseline.during}"),
                                  which))
            if len(found) >= MAX_NAMED_CHILDREN:
                break
        return found

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


def _trees_may_have_grown(births: Births, pids: Mapping[int, int],
                          descendants: Mapping[int, Mapping[int, str]]) -> bool:
    """Whether a round must walk the ranks' trees (``births``): a process may have been born below
    a rank or a known descendant since the last round, or one is known (it may have children)."""
    known = {child for seen in descendants.values() for child in seen}
    return births.below(set(pids.values()) | known) or bool(known)
