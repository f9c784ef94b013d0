"""A GPU rank's device, as NVML sees it: memory used, utilization, and what the rank's process
holds there. NVML (``pynvml``, from the ``nvidia-ml-py`` package: the ``gpu`` extra) reads the
driver's counters without a CUDA context, so the notebook's process stays free to fork CUDA ranks.

Why at the top of the package: two sides read it. The notebook, for its local ranks
(``supervise.resources.ResourceSampler.gpu_watch``), and a rank on another machine for itself
(``rank.reports.resources``: a Ray actor, a SLURM rank), where only its own node's driver can answer.
Imported only when a rank has a GPU, and ``pynvml`` only then: a CPU launch never loads it.
It is looked up through ``importlib`` (``sys.modules`` first), which is also where a test's
stand-in NVML goes (``tests/helpers/fake_nvml.py``).
"""
from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from .resources import GpuUsage

log = logging.getLogger("notebook_launch")


def device_index(device: str) -> int | None:
    """"cuda:1" -> 1; "cuda" -> 0; None for what is not a CUDA device."""
    kind, _, number = device.partition(":")
    if kind != "cuda":
        return None
    return int(number) if number.isdigit() else 0 if not number else None


class GpuWatch:
    """NVML, opened once per run; ``usage`` answers for one rank's device."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    @classmethod
    def open(cls) -> "GpuWatch | None":
        """NVML started, or None (no pynvml, no driver): the rows then show no GPU."""
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
        except Exception:   # why: no NVML, or one that fails to start: rows show no device part
            log.debug("no NVML: GPU ranks' rows show no device memory", exc_info=True)
            return None
        try:
            return cls(nvml)
        except Exception:   # why: a driver that cannot list its devices: the rows show no device part
            log.debug("NVML could not list the devices", exc_info=True)
            nvml.nvmlShutdown()
            return None

    def handle_for(self, device: str, pid: int) -> tuple[Any, int] | None:
        """The rank's device: the one whose compute processes include the rank's (what it really
        uses), else the notebook's CUDA_VISIBLE_DEVICES entry for its index (the ranks inherit it)."""
        for index, handle in enumerate(self.handles):
            if self.process_of(handle, pid) is not None:
                return handle, index
        wanted = device_index(device)
        if wanted is None:
            return None
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            visible = [str(i) for i in range(len(self.handles))]
        if wanted >= len(visible):
            return None
        entry = visible[wanted]
        if entry.isdigit():
            index = int(entry)
            return (self.handles[index], index) if index < len(self.handles) else None
        handle = self.nvml.nvmlDeviceGetHandleByUUID(entry)
        return handle, self.nvml.nvmlDeviceGetIndex(handle)

    def process_of(self, handle: Any, pid: int) -> Any:
        """NVML's record of ``pid`` among the device's compute processes, None where it is not
        listed (not using it yet; or another PID namespace, as in some containers)."""
        try:
            processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:   # why: a driver may refuse the list (containers, MIG): own share unknown
            return None
        return next((process for process in processes if process.pid == pid), None)

    def usage(self, device: str, pid: int) -> GpuUsage | None:
        try:
            found = self.handle_for(device, pid)
            if found is None:
                return None
            handle, index = found
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                utilization: int | None = int(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:   # why: some devices (MIG slices) do not report it
                utilization = None
            process = self.process_of(handle, pid)
            held = getattr(process, "usedGpuMemory", None)   # None where the driver does not say
            return GpuUsage(index=index, used=int(memory.used), total=int(memory.total), utilization=utilization,
                            process_used=int(held) if isinstance(held, int) else None)
        except Exception:   # why: one unreadable device leaves that row's device part out, not the run
            log.debug("NVML could not say what %s uses", device, exc_info=True)
            return None

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:   # why: shutting NVML down at the end can fail only harmlessly
            log.debug("nvmlShutdown failed", exc_info=True)
