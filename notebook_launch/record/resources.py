"""What a rank uses, as the notebook last sampled it, and the machine's memory: the data the
panel rows, the header, the final picture and the rank logs show (``display.format.resources`` says
it in words; ``supervise/resources.py`` samples it).

Why a module of its own: the run state (``state.py``) holds these, the supervisor fills them and
every display reads them, so they live below all three and import nothing. A rank on another
machine samples itself (``rank/reports/resources.py``) and sends a ``RankUsage`` as plain data
(``usage_record``; the notebook rebuilds it with ``usage_from_record``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class GpuUsage:
    """The rank's GPU, as NVML sees it: the whole device's memory and utilization, and what the
    rank's own process holds there (None where NVML does not list it)."""
    index: int                  # NVML's index of the device
    used: int                   # bytes in use on the device, every process's
    total: int
    utilization: int | None     # percent of the last sample period a kernel ran on it
    process_used: int | None = None   # bytes the rank's process holds on it


@dataclass(frozen=True)
class RankUsage:
    """One rank's process, when last sampled.

    ``rss`` counts every page the process maps, also those it shares: a forked rank shares the
    notebook's pages copy-on-write until it writes them, so ``rss`` overstates what it costs the
    machine. ``uss`` (its private pages: what ending it would free) and ``pss`` (shared pages split
    between the processes mapping them) say what is its own; None where /proc/<pid>/smaps_rollup
    cannot be read."""
    rss: int
    uss: int | None = None
    pss: int | None = None
    cpu_percent: float | None = None   # of one core, since the previous sample (None: first sample)
    cpu_average: float | None = None   # of one core, since the process started
    peak_rss: int = 0
    peak_uss: int | None = None
    gpu: GpuUsage | None = None

    @property
    def shared(self) -> int | None:
        """Resident pages it shares with other processes (the notebook, the other ranks)."""
        return None if self.uss is None else max(0, self.rss - self.uss)


def usage_record(usage: RankUsage) -> dict[str, Any]:
    """``usage`` as plain data: what a RESOURCES event carries (plain values pickle the same
    whatever the two sides' versions of the class)."""
    return dataclasses.asdict(usage)


def usage_from_record(record: Mapping[str, Any]) -> RankUsage:
    """The ``RankUsage`` a RESOURCES event's record says (fields it does not know are left out)."""
    known = {field.name for field in dataclasses.fields(RankUsage)} - {"gpu"}
    gpu = record.get("gpu")
    gpu_known = {field.name for field in dataclasses.fields(GpuUsage)}
    return RankUsage(**{key: value for key, value in record.items() if key in known},
                     gpu=GpuUsage(**{key: value for key, value in gpu.items() if key in gpu_known})
                     if isinstance(gpu, Mapping) else None)


@dataclass(frozen=True)
class MachineMemory:
    """The machine's memory (/proc/meminfo): MemTotal and MemAvailable, in bytes; and what our
    helpers hold beside the ranks (``helpers``: name -> resident bytes, e.g. the warm start process)."""
    total: int
    available: int | None
    helpers: tuple[tuple[str, int], ...] = ()


# Processes of ours that are not ranks but hold memory a user should see beside the machine's (the
# warm start process: ``engines.local.start_client`` registers it while it runs): name -> pid.
_helpers: dict[str, int] = {}


def register_helper(name: str, pid: int | None) -> None:
    """Show ``pid``'s resident memory beside the machine's as ``name`` (None: no longer)."""
    if pid is None:
        _helpers.pop(name, None)
    else:
        _helpers[name] = pid


def helper_pids() -> dict[str, int]:
    return dict(_helpers)


# --- in words: the one wording every display, the final picture and the rank logs share ---------

def size_text(size: int | None) -> str:
    """1536 -> "1.5 KiB"."""
    if size is None:
        return "unknown"
    amount = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{size} bytes" if unit == "bytes" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def gpu_text(gpu: GpuUsage) -> str:
    """'GPU 0 3.1 GiB of 16.0 GiB (this rank 2.9 GiB), 87% busy'."""
    own = f" (this rank {size_text(gpu.process_used)})" if gpu.process_used is not None else ""
    busy = f", {gpu.utilization}% busy" if gpu.utilization is not None else ""
    return f"GPU {gpu.index} {size_text(gpu.used)} of {size_text(gpu.total)}{own}{busy}"


def usage_text(usage: RankUsage, ended: bool = False, own: bool = True) -> str:
    """A rank's row: 'cpu 97% · 820.0 MiB own of 1.2 GiB resident · GPU 0 ...'. A rank that ended
    (the final picture) shows its CPU on average over its life and its peak memory; ``own=False``:
    resident memory only (the form of every row where some rank's own pages were not read)."""
    parts = []
    cpu = usage.cpu_average if ended or usage.cpu_percent is None else usage.cpu_percent
    if cpu is not None:
        parts.append(("avg " if ended else "") + f"cpu {cpu:.0f}%")
    rss, uss = (usage.peak_rss, usage.peak_uss) if ended else (usage.rss, usage.uss)
    peak = "peak " if ended else ""
    parts.append(f"{peak}{size_text(uss)} own of {size_text(rss)} resident" if uss is not None and own
                 else f"{peak}{size_text(rss)} resident")
    if usage.gpu is not None:
        parts.append(gpu_text(usage.gpu))
    return " · ".join(parts)


def usage_log_text(usage: RankUsage) -> str:
    """The line a rank's log gets now and then: everything, PSS and the shared pages too."""
    cpu = f"cpu {usage.cpu_percent:.0f}% of a core" if usage.cpu_percent is not None else "cpu not measured yet"
    if usage.uss is None:
        memory = f"{size_text(usage.rss)} resident (own pages unknown: no smaps_rollup)"
    else:
        memory = (f"{size_text(usage.uss)} own (USS), {size_text(usage.pss)} proportional (PSS), "
                  f"{size_text(usage.rss)} resident, of which {size_text(usage.shared)} shared with other "
                  f"processes (for a forked rank, the notebook's pages it has not written)")
    gpu = f"; {gpu_text(usage.gpu)}" if usage.gpu is not None else ""
    return f"[notebook_launch] resources: {cpu}; {memory}{gpu}"


def usage_end_log_text(usage: RankUsage) -> str:
    """The line a rank's log gets when the rank ended: its whole life's CPU on average and its peak
    memory (every rank's log has one, also a rank that ended before its own pages were first read,
    which got no line while it ran), and its GPU as last sampled."""
    cpu = (f"cpu {usage.cpu_average:.0f}% of a core on average" if usage.cpu_average is not None
           else "cpu not measured")
    own = f"{size_text(usage.peak_uss)} own (USS) at its peak, " if usage.peak_uss is not None else ""
    gpu = f"; last seen {gpu_text(usage.gpu)}" if usage.gpu is not None else ""
    peak = f"{size_text(usage.peak_rss)} resident at its peak"
    return f"[notebook_launch] resources over its life: {cpu}; {own}{peak}{gpu}"


def machine_memory_text(machine: MachineMemory) -> str:
    """'memory 24.0 GiB, 12.3 GiB available'."""
    available = f", {size_text(machine.available)} available" if machine.available is not None else ""
    helpers = "".join(f", {name} {size_text(size)}" for name, size in machine.helpers)
    return f"memory {size_text(machine.total)}{available}{helpers}"
