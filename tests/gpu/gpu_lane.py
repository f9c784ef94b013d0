"""Shared by the CUDA lane's tests: how many GPUs, why the lane skips, kernel prerequisites."""
from __future__ import annotations

import importlib.util

import pytest


def cuda_devices() -> int:
    """GPUs visible here, asked of NVML (torch.cuda.device_count), which leaves fork safe."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.version.cuda:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:
        return 0


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
