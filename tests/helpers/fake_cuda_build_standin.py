"""A FAKE CUDA build of torch, for a machine with no GPU and a CPU build of torch.

What it fakes is only what a poisoned fork is made of (torch/cuda/__init__.py and
torch/csrc/utils/device_lazy_init.cpp): ``torch._C._cuda_getDeviceCount`` (what
``torch.cuda.is_available()`` calls without PYTORCH_NVML_BASED_CUDA_CHECK=1, and
``device_count()`` when NVML fails) "poisons fork" as torch's does: from then on every child
forked from this process is "in bad fork" (``torch.cuda._is_in_bad_fork()`` is True there,
False here), and ``torch.cuda.is_initialized()`` stays False. It counts ``gpus`` devices
(0 by default, so launches plan CPU ranks). NVML answers nothing (no libnvidia-ml here)
unless ``nvml_gpus`` is given.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch


class FakeCudaBuildStandIn:
    """The fake's state. ``poisoned``: this process called the fake runtime count;
    ``in_bad_fork``: this process is a child forked after that (set by the at-fork hook)."""

    def __init__(self) -> None:
        self.poisoned = False
        self.in_bad_fork = False
        self.gpus = 0
        self.active = False

    def runtime_device_count(self) -> int:
        self.poisoned = True   # torch: poison_fork() registers its pthread_atfork child handler
        return self.gpus

    def is_in_bad_fork(self) -> bool:
        return self.in_bad_fork

    def after_fork_in_child(self) -> None:
        if self.active and self.poisoned:
            self.in_bad_fork = True


FAKE = FakeCudaBuildStandIn()
os.register_at_fork(after_in_child=FAKE.after_fork_in_child)   # once per process: checks ``active``


def install_fake_cuda_build(monkeypatch, *, gpus: int = 0, nvml_gpus: int | None = None) -> FakeCudaBuildStandIn:
    """Make this CPU torch look like a CUDA build whose runtime poisons fork (undone by ``monkeypatch``)."""
    FAKE.poisoned = FAKE.in_bad_fork = False
    FAKE.gpus = gpus
    monkeypatch.setattr(torch.version, "cuda", "12.4-fake")
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", FAKE.runtime_device_count, raising=False)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", FAKE.is_in_bad_fork)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml",
                        (lambda: -1) if nvml_gpus is None else (lambda: nvml_gpus))
    monkeypatch.setattr(FAKE, "active", True)   # monkeypatch's undo sets it back to False
    return FAKE


def install_in_kernel(gpus: int = 0) -> FakeCudaBuildStandIn:
    """The same, for a notebook kernel (no monkeypatch: the kernel ends with the test)."""
    FAKE.gpus = gpus
    FAKE.active = True
    torch.version.cuda = "12.4-fake"
    torch._C._cuda_getDeviceCount = FAKE.runtime_device_count
    torch.cuda._is_in_bad_fork = FAKE.is_in_bad_fork
    torch.cuda._device_count_nvml = lambda: -1
    return FAKE


@contextlib.contextmanager
def fake_gpus_tracked(monkeypatch, gpus: int = 2) -> Iterator[FakeCudaBuildStandIn]:
    """The FAKE CUDA build with ``gpus`` FAKE GPUs (NVML and the runtime count alike), in a notebook
    whose CUDA tracker has witnessed nothing yet and wraps the fake (as it wraps torch's), without
    the NVML check variable; the tracker forgets the fake again afterwards."""
    from helpers.cuda_tracking_reset import reset_cuda_tracking
    from notebook_launch.notebook import cuda_tracking
    monkeypatch.delenv(cuda_tracking.NVML_CHECK_VARIABLE, raising=False)
    fake = install_fake_cuda_build(monkeypatch, gpus=gpus, nvml_gpus=gpus)
    reset_cuda_tracking()
    cuda_tracking.install()
    try:
        yield fake
    finally:
        reset_cuda_tracking()
