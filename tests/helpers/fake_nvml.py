"""A FAKE NVML (``pynvml``'s names and shapes) for tests: a GPU cannot exist on these machines.

Tests install it as the ``pynvml`` module (``monkeypatch.setitem(sys.modules, "pynvml",
fake_nvml.FakeNvml(...))``): ``notebook_launch/record/gpu_usage.py`` looks pynvml up through importlib, which
finds what ``sys.modules`` holds. The real NVML is checked on a GPU in tests/gpu (the GPU lane)."""
from __future__ import annotations

import types
from dataclasses import dataclass, field


@dataclass
class FakeDevice:
    uuid: str
    total: int
    used: int
    utilization: int
    processes: dict[int, int] = field(default_factory=dict)   # pid -> bytes it holds


class NVMLError(Exception):
    pass


class FakeNvml(types.ModuleType):
    """A stand-in pynvml module over ``devices``; records calls in ``calls``."""

    def __init__(self, devices: list[FakeDevice]) -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.calls: list[str] = []
        self.NVMLError = NVMLError

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDevice:
        for device in self.devices:
            if device.uuid == uuid:
                return device
        raise NVMLError(f"no device {uuid}")

    def nvmlDeviceGetIndex(self, handle: FakeDevice) -> int:
        return self.devices.index(handle)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> types.SimpleNamespace:
        self.calls.append("nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(total=handle.total, used=handle.used, free=handle.total - handle.used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=handle.utilization, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=held) for pid, held in handle.processes.items()]
