"""Shared by the CUDA lane's tests: how many GPUs, why the lane skips, kernel prerequisites."""
from __future__ import annotations

import importlib.util

import pytest


def cuda_devices() -> int:
    """GPUs visible here, counted as the launcher counts them: NVML, never the CUDA runtime in
    this process (``torch.cuda.device_count()`` falls back to it when NVML fails, and the
    pytest process is the "notebook" that forks the ranks: it must stay fork-safe)."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.version.cuda:
        return 0
    from notebook_launch.notebook.cuda_tracking import count_gpus_without_poisoning
    return count_gpus_without_poisoning()


def cuda_backend_of(config: str) -> str | None:
    """The backend ``dist.get_backend_config()`` gives CUDA tensors: "cpu:gloo,cuda:nccl" ->
    "nccl"; a config naming one backend for every device ("nccl") -> that backend."""
    entries = [entry.strip() for entry in config.split(",") if entry.strip()]
    for entry in entries:
        device, sep, backend = entry.partition(":")
        if sep and device == "cuda":
            return backend
    if len(entries) == 1 and ":" not in entries[0]:
        return entries[0]
    return None


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.version.cuda:
        return (f"torch {torch.__version__} is a CPU build "
                f"(the CUDA lane runs where a CUDA torch is: scripts/test-gpu.sh)")
    if cuda_devices() == 0:
        return "no CUDA device is visible (nvidia-smi / CUDA_VISIBLE_DEVICES)"
    return None


SKIP_REASON = _skip_reason()


def needs_kernel() -> None:
    """Notebook scenarios need a Jupyter kernel and nbclient (not on every GPU image)."""
    missing = [name for name in ("ipykernel", "nbclient", "nbformat") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/test-gpu.sh installs them, "
                    f"or NOTEBOOK_LAUNCH_WHEELS=folder for a machine without network)")
